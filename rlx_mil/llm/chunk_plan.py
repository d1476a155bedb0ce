"""Planning a chunked set: which layers go into which package so that every chunk's weight
file stays under a byte limit (docs/deploying.md, "Chunked packages").

The plan is made from the graph alone, before any weight is read: each Param's bytes in the
package follow from its shape, the compute precision and the compression scheme it will get.
Consecutive layer segments (`rlx_mil.ir.cut.layer_segments`) are packed greedily: a chunk
takes segments while the weights they read together (a Param read by two segments of one
chunk counts once; a tied embedding read by the first and the last chunk is stored in both)
stay within the limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import RlxMilError
from rlx_mil.ir import Graph
from rlx_mil.ir.cut import Segment, constant_key, layer_segments
from rlx_mil.ir.ops import Constant, Input, Param
from rlx_mil.units import human_bytes

#: The Input every chunk that embeds tokens reads (the LLM package contract, docs/llm.md).
TOKEN_INPUT = "input_ids"
#: Bytes Core ML's weight file may add per stored tensor (each blob is 64-byte aligned with a header).
BLOB_OVERHEAD = 128
#: Room each chunk keeps for what the lowering adds (constant masks, index tables) besides the
#: graph's own Params and Constants: a fixed part and a fraction of the planned bytes.
CHUNK_MARGIN = (2048, 0.005)


class ChunkingError(RlxMilError):
    """A model cannot be split into chunks under the requested limit (or has no layer boundary)."""


def state_inputs(graph: Graph) -> set[str]:
    """Names of the graph's per-layer state Inputs: past K/V caches and carried recurrent states."""
    from rlx_mil.lowering.state.kv_cache import bind_cache_lengths, find_cache_pairs
    from rlx_mil.lowering.state.recurrent_state import find_recurrent_states

    bound = bind_cache_lengths(graph, "auto")
    recurrent = find_recurrent_states(bound, "auto")
    names = {r.input_name for r in recurrent}
    names |= {p.input_name for p in find_cache_pairs(bound, "auto", skip=names, required=False)}
    return names


def data_inputs(graph: Graph) -> set[str]:
    """The Inputs the cut follows: the token ids and the state Inputs (every other Input, such as
    `position_ids`, is fed to each chunk that reads it)."""
    names = {n.op.name for n in graph if isinstance(n.op, Input)}
    if TOKEN_INPUT not in names:
        raise ChunkingError(f"graph {graph.name!r} has no {TOKEN_INPUT!r} Input; chunking cuts LLM decoder graphs")
    return {TOKEN_INPUT} | state_inputs(graph)


def _scheme_bytes(scheme: Any, shape: tuple[int, ...], itemsize: int) -> int:
    from rlx_mil.compress import LinearScheme, PaletteScheme
    from rlx_mil.compress.schemes import PER_CHANNEL, PER_TENSOR

    count = int(np.prod(shape, dtype=np.int64))
    rows = shape[0] if shape else 1
    if isinstance(scheme, LinearScheme):
        codes = (count * scheme.bits + 7) // 8
        groups = 1 if scheme.granularity == PER_TENSOR else rows if scheme.granularity == PER_CHANNEL \
            else -(-count // scheme.block_size)
        per_group = itemsize + (itemsize if scheme.float_offset else (scheme.bits + 7) // 8 if scheme.has_offset else 0)
        return codes + groups * per_group
    if isinstance(scheme, PaletteScheme):
        codes = (count * scheme.bits + 7) // 8
        tables = 1 if scheme.granularity == PER_TENSOR else -(-rows // scheme.group_size)
        return codes + tables * (1 << scheme.bits) * itemsize
    return count * itemsize  # a scheme kept from the source (GGUF codes): bounded by the float size


def planned_param_bytes(
    graph: Graph, *, precision: str = "fp16", compress: Any = None, target: str = "iOS18",
) -> dict[str, int]:
    """Bytes each Param of `graph` will take in the package's weight file (an upper bound: small
    constants Core ML keeps inline are counted too), from shapes, precision and `compress`."""
    from rlx_mil.lowering.target import Precision, Target

    prec = Precision.parse(precision)
    itemsize = 2 if prec is Precision.FP16 else 4
    schemes: dict[str, Any] = {}
    budget: float | None = None
    if compress is not None:
        from rlx_mil.compress import WeightCompressor, parse_compress
        from rlx_mil.compress.schemes import AUTO_BUDGETS

        config = parse_compress(compress)
        if config is None:
            pass
        elif config.auto is not None:
            # The mix is chosen per chunk under the same budget (a fraction of the fp16 bytes).
            budget = config.budget if config.budget is not None else AUTO_BUDGETS[config.auto]
        else:
            schemes = WeightCompressor(config, graph, Target.parse(target), prec, None).schemes
    out: dict[str, int] = {}
    for node in graph:
        if isinstance(node.op, Constant):
            count = int(np.prod(node.shape.sizes(), dtype=np.int64))
            out[constant_key(node.id)] = count * (itemsize if node.shape.dtype.is_float else node.shape.dtype.itemsize)
            continue
        if not isinstance(node.op, Param):
            continue
        shape = node.shape.sizes()
        size = itemsize if node.shape.dtype.is_float else node.shape.dtype.itemsize
        name = node.op.name
        if name in schemes:
            stored = _scheme_bytes(schemes[name], shape, itemsize)
        elif budget is not None and node.shape.dtype.is_float and len(shape) > 1:
            stored = int(np.ceil(int(np.prod(shape, dtype=np.int64)) * 2 * budget * 1.25))
        else:
            stored = int(np.prod(shape, dtype=np.int64)) * size
        out[name] = stored + BLOB_OVERHEAD
    return out


@dataclass(frozen=True)
class ChunkPlan:
    """Which consecutive segments each chunk holds and the weight bytes it is planned at."""

    segments: tuple[Segment, ...]
    groups: tuple[int, ...]
    planned_bytes: tuple[int, ...]
    limit: int

    def layers(self, chunk: int) -> list[str]:
        start = sum(self.groups[:chunk])
        return [key for s in self.segments[start:start + self.groups[chunk]] for key in s.layers]


def _with_margin(total: int) -> int:
    return total + CHUNK_MARGIN[0] + int(total * CHUNK_MARGIN[1])


def smallest_limit(graph: Graph, sizes: Mapping[str, int]) -> int:
    """The smallest chunk limit `graph` can be planned under (`sizes`: Param -> bytes): its
    largest layer segment alone, with the planning margin, plus one byte."""
    segments = layer_segments(graph, data_inputs(graph))
    return max(_with_margin(sum(sizes[p] for p in s.params)) for s in segments) + 1


def plan_chunks(graph: Graph, sizes: Mapping[str, int], limit: int) -> ChunkPlan:
    """Pack `graph`'s layer segments into as few consecutive chunks as keep each chunk's weights
    (`sizes`: Param -> bytes) under `limit`; a segment alone not under it is a ChunkingError
    naming its layers."""
    segments = layer_segments(graph, data_inputs(graph))
    if len(segments) < 2:
        raise ChunkingError(
            f"graph {graph.name!r} has no layer boundary to cut at (its Params carry no numbered layer such as"
            " 'model.layers.0.'), so it cannot be chunked"
        )
    groups: list[int] = []
    planned: list[int] = []
    current: set[str] = set()
    for segment in segments:
        alone = _with_margin(sum(sizes[p] for p in segment.params))
        if alone >= limit:
            raise ChunkingError(
                f"layer {segment.label} alone needs {human_bytes(alone)} ({alone} bytes) of weights, more than the"
                f" chunk limit {human_bytes(limit)} ({limit} bytes); this model needs chunk_bytes >="
                f" {smallest_limit(graph, sizes)} at this precision and compression, or compress the weights more"
            )
        union = current | segment.params
        total = _with_margin(sum(sizes[p] for p in union))
        if groups and total < limit:
            groups[-1] += 1
            planned[-1] = total
            current = union
        else:
            groups.append(1)
            planned.append(alone)
            current = set(segment.params)
    return ChunkPlan(tuple(segments), tuple(groups), tuple(planned), limit)


def check_same_cut(plan: ChunkPlan, name: str, graph: Graph) -> None:
    """Every function of the set must cut at the decode graph's boundaries."""
    segments = layer_segments(graph, data_inputs(graph))
    want = [s.layers for s in plan.segments]
    got = [s.layers for s in segments]
    if want != got:
        raise ChunkingError(f"function {name!r} has other layer boundaries than decode ({got} vs {want})")


def chunk_count_text(counts: Sequence[int]) -> str:
    return "+".join(str(c) for c in counts)
