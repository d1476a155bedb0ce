"""KV cache as Core ML state: finding the cache pattern in a decode graph and lowering it.

A decode graph in upstream's form passes its cache through the interface: per layer an Input
`past_k` (the rows already seen) feeds a `Concat` with the new rows along the attention's
sequence axis, the concatenation is the Attention's k (or v) and is also a graph output
(`new_k`). `plan_kv_cache` finds these pairs (or checks the ones named) and
`rlx_mil.lowering.state.kv_cache_lowering.KVCacheLowering` lowers them as iOS18 state instead:

* each cache becomes an fp16 state of fixed capacity `max_context` in `[B, H_kv, C, D]` order
  (the order `scaled_dot_product_attention` takes keys in), either one state per cache
  (`layout="per_layer"`) or the caches of all layers stacked into one `key_cache` and one
  `value_cache` state `[L, B, H_kv, C, D]` (`layout="stacked"`, the default), or `[L*B, H_kv,
  C, D]` when the program must stay within rank 4 (`rank4=True`, the Neural Engine form);
* the model takes `cache_position: int32[1]`, the number of tokens already in the cache, which
  is also the slot the first new row is written to; the new rows go in with one `slice_update`
  per cache per call, written back with `coreml_update_state`;
* the Attention reads the whole capacity, with a mask built from `cache_position` that hides
  the slots not written yet (and keeps the node's causal / sliding-window / key-padding rule);
* the past Inputs and the cache outputs leave the interface; a Custom key-padding mask input
  `[B, P+n]` becomes `[B, C]`, one flag per cache slot.

fp32 programs cast the new rows to fp16 before the write and the read back to fp32 (Core ML
states are fp16 only).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_mil.errors import GraphError, InvalidOptionError, UnsupportedOpError
from rlx_mil.ir.attention_layout import AttentionLayout, attention_geometry
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.naming import output_names
from rlx_mil.ir.ops import Attention, Concat, Input, MaskType
from rlx_mil.ir.shape import Dynamic
from rlx_mil.lowering.state.recurrent_state import (
    RecurrentState,
    carried_input_names,
    find_recurrent_states,
)
from rlx_mil.lowering.target import Target

#: Name of the write-position input of a stateful model.
POSITION_INPUT = "cache_position"
#: Stacked state names (layout="stacked").
STACKED_STATES = {"k": "key_cache", "v": "value_cache"}
CACHE_LAYOUTS = ("stacked", "per_layer")
#: Core ML on the Neural Engine is reported to fail on state dims that are not multiples of 32
#: (coremltools #2631); checked on the sequence capacity and the head dim.
NEURAL_ENGINE_MULTIPLE = 32


class NeuralEngineWarning(UserWarning):
    """A converted model is expected to run badly (or not at all) on the Neural Engine."""


@dataclass(frozen=True)
class CachePair:
    """One cache: the past Input, its Concat (also a graph output) and the attention reading it."""

    input_id: int
    input_name: str
    concat_id: int
    output_name: str
    role: str  # "k" or "v"
    attention_ids: tuple[int, ...]
    batch: int
    kv_heads: int
    head_dim: int
    new_rows: int
    layer: int = 0

    def state_name(self, layout: str) -> str:
        return STACKED_STATES[self.role] if layout == "stacked" else f"{self.role}_cache_{self.layer}"


@dataclass(frozen=True)
class StateSpec:
    name: str
    shape: tuple[int, ...]


@dataclass
class KVCachePlan:
    """What the stateful lowering changes in one graph."""

    pairs: list[CachePair]
    max_context: int
    layout: str
    #: Custom key-padding mask Inputs (node id) of cache-reading attention, now [B, C].
    mask_inputs: dict[int, tuple[int, ...]] = field(default_factory=dict)
    neural_engine_notes: list[str] = field(default_factory=list)
    #: Mask kinds of the cache-reading attention ("Causal", "SlidingWindow", ...).
    mask_kinds: list[str] = field(default_factory=list)
    #: Carried recurrent states kept as Core ML states too (`rlx_mil.lowering.state.recurrent_state`).
    recurrent: list[RecurrentState] = field(default_factory=list)
    #: Stacked caches fold the layer axis into the batch axis: `[L*B, H_kv, C, D]` (rank 4).
    rank4: bool = False

    @property
    def layers(self) -> int:
        return len({p.layer for p in self.pairs})

    @property
    def removed_inputs(self) -> set[int]:
        return {p.input_id for p in self.pairs} | {r.input_id for r in self.recurrent}

    @property
    def removed_input_names(self) -> set[str]:
        return {p.input_name for p in self.pairs} | {r.input_name for r in self.recurrent}

    @property
    def removed_outputs(self) -> set[str]:
        return {p.output_name for p in self.pairs} | {r.output_name for r in self.recurrent}

    @property
    def query_len(self) -> int:
        return self.pairs[0].new_rows

    def states(self) -> list[StateSpec]:
        return self._cache_states() + [StateSpec(r.state_name, r.shape) for r in self.recurrent]

    def _cache_states(self) -> list[StateSpec]:
        if not self.pairs:
            return []
        first = self.pairs[0]
        if self.layout == "stacked":
            lead: tuple[int, ...] = (self.layers * first.batch,) if self.rank4 else (self.layers, first.batch)
            shape = (*lead, first.kv_heads, self.max_context, first.head_dim)
            return [StateSpec(STACKED_STATES[r], shape) for r in ("k", "v")]
        return [
            StateSpec(p.state_name(self.layout), (p.batch, p.kv_heads, self.max_context, p.head_dim))
            for p in sorted(self.pairs, key=lambda p: (p.layer, p.role))
        ]

    def describe(self) -> dict[str, Any]:
        """The package contract, as stored in the model metadata (see docs/llm.md)."""
        return {
            "cache_position": POSITION_INPUT if self.pairs else None,
            "max_context": self.max_context if self.pairs else None,
            "query_len": self.query_len if self.pairs else None,
            "layout": self.layout,
            "layers": self.layers,
            "states": {s.name: list(s.shape) for s in self.states()},
            "caches": {p.input_name: p.output_name for p in self.pairs},
            "neural_engine_notes": list(self.neural_engine_notes),
            "mask_kinds": list(self.mask_kinds),
            "recurrent_states": {r.input_name: {"state": r.state_name, "output": r.output_name} for r in self.recurrent},
        }


def _fail(message: str, node: Node | None = None) -> GraphError:
    if node is None:
        return GraphError(message)
    return GraphError(message, node=node.id, op=node.op.type_name, name=node.name or getattr(node.op, "name", None))


def _input_name(node: Node) -> str:
    assert isinstance(node.op, Input)
    return node.op.name


def attention_of(node: Node) -> Attention:
    assert isinstance(node.op, Attention)
    return node.op


def _check_pair(graph: Graph, users: Mapping[int, list[int]], past: Node, concat: Node, output_name: str) -> CachePair:
    """`past -> concat -> attention(k|v)`, concat a graph output; typed errors name the node."""
    pattern = "a past-cache Input must feed only a Concat(past, new) along the attention's sequence axis"
    if not isinstance(concat.op, Concat) or len(concat.inputs) != 2 or concat.inputs[0] != past.id:
        raise _fail(
            f"{pattern}; a cache output must be that Concat, with the past Input {past.display_name!r} first",
            concat,
        )
    if users[past.id] != [concat.id]:
        raise _fail(f"{pattern}; it feeds nodes {users[past.id]}", past)
    readers = users[concat.id]
    if not readers:
        raise _fail("the cache Concat feeds no Attention", concat)
    roles: set[str] = set()
    geometry = None
    for reader_id in readers:
        reader = graph.node(reader_id)
        if not isinstance(reader.op, Attention):
            raise _fail(f"the cache Concat may only feed Attention nodes (as k or v), it feeds a {reader.op.type_name} (node %{reader_id})", concat)
        operands = [i for i, src in enumerate(reader.inputs) if src == concat.id]
        if operands not in ([1], [2]):
            raise _fail(f"the cache Concat must be the k or the v of Attention node %{reader_id}, not operand {operands}", concat)
        roles.add("k" if operands == [1] else "v")
        op = reader.op
        shapes = [graph.node(reader.inputs[i]).shape for i in range(3)]
        geo = attention_geometry(shapes[0], shapes[1], shapes[2], op.num_heads, op.head_dim)
        if geometry is not None and geo != geometry:
            raise _fail("the cache Concat feeds Attention nodes of different geometry", concat)
        geometry = geo
        if op.mask_kind.type is MaskType.BIAS:
            raise UnsupportedOpError(
                f"node %{reader_id} (Attention): a Bias mask over the past keys cannot be carried to a stateful"
                " cache; use a Causal, SlidingWindow or Custom (key-padding) mask"
            )
    assert geometry is not None
    if len(roles) != 1:
        raise _fail("the cache Concat is used as both k and v", concat)
    seq = geometry.layout.seq_axis
    if concat.op.axis != seq:
        raise _fail(
            f"the cache Concat joins along axis {concat.op.axis}, but the attention's sequence axis is {seq}"
            f" ({geometry.layout.name} layout)",
            concat,
        )
    new_shape = graph.node(concat.inputs[1]).shape
    try:
        new_sizes = new_shape.sizes()
        batch = 1 if geometry.layout is AttentionLayout.SX else new_sizes[0]
    except ValueError:
        raise _fail(f"the new cache rows have dynamic shape {new_shape}; bind the dims first", concat) from None
    return CachePair(
        input_id=past.id, input_name=_input_name(past), concat_id=concat.id, output_name=output_name,
        role=roles.pop(), attention_ids=tuple(readers), batch=int(batch), kv_heads=geometry.num_kv_heads,
        head_dim=geometry.head_dim, new_rows=int(new_sizes[seq]),
    )


def find_cache_pairs(
    graph: Graph, kv_cache: str | bool | Mapping[str, str], *, skip: Set[str] = frozenset(), required: bool = True
) -> list[CachePair]:
    """The cache pairs of `graph`: every Input -> Concat -> Attention whose Concat is an output
    (`kv_cache="auto"`/True), or exactly the `{input_name: output_name}` pairs given (but the
    carried recurrent state Inputs in `skip`); none found is an error when `required`."""
    users = graph.consumers()
    outputs = dict(zip(output_names(graph), graph.outputs, strict=True))
    output_of = {node_id: name for name, node_id in outputs.items()}
    inputs: dict[str, Node] = {}
    for node in graph:
        if isinstance(node.op, Input):
            inputs.setdefault(node.op.name, node)
    pairs: list[CachePair] = []
    if kv_cache is True or kv_cache == "auto":
        for node in graph:
            if not isinstance(node.op, Input):
                continue
            # A past cache comes first in its Concat; the new rows (which may be Inputs too) second.
            concats = [
                u for u in users[node.id] if isinstance(graph.node(u).op, Concat) and graph.node(u).inputs[0] == node.id
            ]
            feeds_attention = any(
                isinstance(graph.node(r).op, Attention) for c in concats for r in users[c]
            )
            if not feeds_attention:
                continue
            concat = graph.node(concats[0])
            if concat.id not in output_of:
                raise _fail(
                    f"Input {node.op.name!r} feeds a Concat that feeds attention, but the Concat is not a graph"
                    " output, so it is not a KV cache in upstream's decode form (pass kv_cache={input: output}"
                    " to name the caches)",
                    concat,
                )
            pairs.append(_check_pair(graph, users, node, concat, output_of[concat.id]))
        if not pairs and required:
            raise GraphError(
                f"graph {graph.name!r} has no KV cache in upstream's decode form (an Input feeding a Concat along"
                " the attention's sequence axis, whose result is the attention's k or v and a graph output)"
            )
    elif isinstance(kv_cache, Mapping):
        if not kv_cache:
            raise InvalidOptionError("kv_cache={} names no cache")
        for in_name, out_name in kv_cache.items():
            if in_name in skip:
                continue
            if in_name not in inputs:
                raise InvalidOptionError(f"kv_cache: graph {graph.name!r} has no Input named {in_name!r}")
            if out_name not in outputs:
                raise InvalidOptionError(f"kv_cache: graph {graph.name!r} has no output named {out_name!r}")
            pairs.append(_check_pair(graph, users, inputs[in_name], graph.node(outputs[out_name]), out_name))
    else:
        raise InvalidOptionError(f"kv_cache must be 'auto', True or a mapping {{input: output}}, got {kv_cache!r}")
    return _number_layers(graph, pairs) if pairs else []


def _number_layers(graph: Graph, pairs: list[CachePair]) -> list[CachePair]:
    """Layer index of each pair: the order of the attention nodes reading them. Every attention
    that reads a cached k must read a cached v too, and all caches must share one geometry."""
    by_attention: dict[int, dict[str, CachePair]] = {}
    for pair in pairs:
        for att in pair.attention_ids:
            slot = by_attention.setdefault(att, {})
            if pair.role in slot:
                raise _fail(f"Attention node %{att} reads two {pair.role} caches", graph.node(att))
            slot[pair.role] = pair
    layer_of: dict[int, int] = {}
    for att in sorted(by_attention):
        slot = by_attention[att]
        if set(slot) != {"k", "v"}:
            (cached,) = slot
            missing = "v" if cached == "k" else "k"
            raise _fail(f"Attention reads a cached {cached} but its {missing} is not a cache", graph.node(att))
        ids = [slot["k"].concat_id, slot["v"].concat_id]
        known = {layer_of[c] for c in ids if c in layer_of}
        if len(known) > 1:
            raise _fail("Attention reads caches that other Attention nodes pair differently", graph.node(att))
        index = known.pop() if known else len(set(layer_of.values()))
        for c in ids:
            layer_of[c] = index
    numbered = [CachePair(**{**pair.__dict__, "layer": layer_of[pair.concat_id]}) for pair in pairs]
    first = numbered[0]
    for pair in numbered[1:]:
        if (pair.batch, pair.kv_heads, pair.head_dim, pair.new_rows) != (first.batch, first.kv_heads, first.head_dim, first.new_rows):
            raise _fail(
                "all caches must share batch, kv heads, head dim and new-row count to live in one state layout"
                f" (cache {pair.input_name!r} differs from {first.input_name!r})",
                graph.node(pair.concat_id),
            )
    return sorted(numbered, key=lambda p: (p.layer, p.role))


def bind_cache_lengths(graph: Graph, kv_cache: str | bool | Mapping[str, str]) -> Graph:
    """`graph` with dynamic past / total cache lengths bound (past = 1). Decode graphs in
    upstream's form may leave the past length dynamic (its PAST_SEQ symbol); it only sizes the
    past Inputs, their Concats and a key-padding mask, which the state replaces."""
    if not graph.dynamic_symbols():
        return graph
    sizes: dict[int, int] = {}
    for pair in find_cache_pairs(graph, kv_cache, skip=carried_input_names(graph), required=False):
        concat = graph.node(pair.concat_id)
        assert isinstance(concat.op, Concat)
        axis = concat.op.axis
        past = graph.node(pair.input_id).shape.dims[axis]
        past_size = 1 if isinstance(past, Dynamic) else past.size
        if isinstance(past, Dynamic):
            sizes[past.symbol] = 1
        total = concat.shape.dims[axis]
        if isinstance(total, Dynamic):
            sizes[total.symbol] = past_size + pair.new_rows
    return graph.bind(sizes) if sizes else graph


def plan_kv_cache(
    graph: Graph,
    kv_cache: str | bool | Mapping[str, str],
    *,
    max_context: int | None,
    layout: str = "stacked",
    target: Target,
    rank4: bool = False,
) -> KVCachePlan:
    """Check the options and the graph and say what the stateful lowering will do (`rank4`:
    stacked caches as `[L*B, H_kv, C, D]`)."""
    if target < Target.IOS18:
        raise InvalidOptionError(f"kv_cache needs Core ML states, which exist from iOS18 on (target is {target.label})")
    if layout not in CACHE_LAYOUTS:
        raise InvalidOptionError(f"cache_layout must be one of {CACHE_LAYOUTS}, got {layout!r}")
    recurrent = find_recurrent_states(graph, kv_cache)
    pairs = find_cache_pairs(graph, kv_cache, skip={r.input_name for r in recurrent}, required=not recurrent)
    if not pairs:  # only recurrent states: no cache, no capacity, no write position
        return KVCachePlan(pairs=[], max_context=0, layout=layout, recurrent=recurrent, rank4=rank4)
    if isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer)) or max_context < 1:
        raise InvalidOptionError(f"kv_cache needs max_context, the cache capacity in tokens (an int >= 1), got {max_context!r}")
    plan = KVCachePlan(pairs=pairs, max_context=int(max_context), layout=layout, recurrent=recurrent, rank4=rank4)
    if plan.query_len > plan.max_context:
        raise InvalidOptionError(
            f"max_context={max_context} is smaller than the {plan.query_len} new tokens each call writes"
        )
    if POSITION_INPUT in {n.op.name for n in graph if isinstance(n.op, Input)}:
        raise InvalidOptionError(f"the graph already has an Input named {POSITION_INPUT!r}, which a stateful model adds")
    kinds: set[str] = set()
    for pair in pairs:
        for att in pair.attention_ids:
            node = graph.node(att)
            kinds.add(attention_of(node).mask_kind.type.value)
            if attention_of(node).mask_kind.type is MaskType.CUSTOM:
                mask = graph.node(node.inputs[3])
                if not isinstance(mask.op, Input):
                    raise _fail("a Custom mask over cached keys must be a graph Input (it becomes [B, max_context])", mask)
                plan.mask_inputs[mask.id] = (pair.batch, plan.max_context)
    plan.mask_kinds = sorted(kinds)
    for dim, what in ((plan.max_context, "max_context"), (pairs[0].head_dim, "head_dim")):
        if dim % NEURAL_ENGINE_MULTIPLE:
            plan.neural_engine_notes.append(
                f"state dim {what}={dim} is not a multiple of {NEURAL_ENGINE_MULTIPLE}: stateful models with such"
                " dims are reported to fail on the Neural Engine (coremltools #2631); CPU and GPU are unaffected"
            )
    for note in plan.neural_engine_notes:
        warnings.warn(NeuralEngineWarning(note), stacklevel=3)
    return plan
