"""KV cache as Core ML state: finding the cache pattern in a decode graph and lowering it.

A decode graph in upstream's form passes its cache through the interface: per layer an Input
`past_k` (the rows already seen) feeds a `Concat` with the new rows along the attention's
sequence axis, the concatenation is the Attention's k (or v) and is also a graph output
(`new_k`). `plan_kv_cache` finds these pairs (or checks the ones named) and
`KVCacheLowering` lowers them as iOS18 state instead:

* each cache becomes an fp16 state of fixed capacity `max_context` in `[B, H_kv, C, D]` order
  (the order `scaled_dot_product_attention` takes keys in), either one state per cache
  (`layout="per_layer"`) or the caches of all layers stacked into one `key_cache` and one
  `value_cache` state `[L, B, H_kv, C, D]` (`layout="stacked"`, the default);
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

from rlx_mil.errors import ConversionError, GraphError, InvalidOptionError, UnsupportedOpError
from rlx_mil.ir.attention_layout import AttentionLayout, attention_geometry
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.ops import Attention, Concat, Input, MaskType
from rlx_mil.ir.shape import Dynamic, Shape
from rlx_mil.lower.recurrent_state import (
    RecurrentState,
    carried_input_names,
    find_recurrent_states,
    read_states,
    write_states,
)
from rlx_mil.lower.target import Precision, Target
from rlx_mil.naming import output_names

#: user_defined_metadata key holding the stateful package contract (KVCachePlan.describe).
LLM_METADATA_KEY = "rlx_mil.llm"
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
    #: Carried recurrent states kept as Core ML states too (`rlx_mil.lower.recurrent_state`).
    recurrent: list[RecurrentState] = field(default_factory=list)

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
            shape = (self.layers, first.batch, first.kv_heads, self.max_context, first.head_dim)
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


def _attention(node: Node) -> Attention:
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
) -> KVCachePlan:
    """Check the options and the graph and say what the stateful lowering will do."""
    if target < Target.IOS18:
        raise InvalidOptionError(f"kv_cache needs Core ML states, which exist from iOS18 on (target is {target.label})")
    if layout not in CACHE_LAYOUTS:
        raise InvalidOptionError(f"cache_layout must be one of {CACHE_LAYOUTS}, got {layout!r}")
    recurrent = find_recurrent_states(graph, kv_cache)
    pairs = find_cache_pairs(graph, kv_cache, skip={r.input_name for r in recurrent}, required=not recurrent)
    if not pairs:  # only recurrent states: no cache, no capacity, no write position
        return KVCachePlan(pairs=[], max_context=0, layout=layout, recurrent=recurrent)
    if isinstance(max_context, bool) or not isinstance(max_context, (int, np.integer)) or max_context < 1:
        raise InvalidOptionError(f"kv_cache needs max_context, the cache capacity in tokens (an int >= 1), got {max_context!r}")
    plan = KVCachePlan(pairs=pairs, max_context=int(max_context), layout=layout, recurrent=recurrent)
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
            kinds.add(_attention(node).mask_kind.type.value)
            if _attention(node).mask_kind.type is MaskType.CUSTOM:
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


# ------------------------------------------------------------------------------ lowering
class KVCacheLowering:
    """Emits the state reads/writes and the cache-reading attention for one MIL function."""

    def __init__(self, plan: KVCachePlan, graph: Graph, precision: Precision) -> None:
        self.plan = plan
        self.graph = graph
        self.precision = precision
        self.pairs = {p.concat_id: p for p in plan.pairs}
        self.attention_ids = {a for p in plan.pairs for a in p.attention_ids}
        self.position: Any = None
        self.state_vars: dict[str, Any] = {}
        self._latest: dict[str, Any] = {}  # state name -> the value last written
        self._masks: dict[Any, Any] = {}

    # -- interface ----------------------------------------------------------------------------
    def reserved_names(self) -> list[str]:
        return [POSITION_INPUT, *(s.name for s in self.plan.states())] if self.plan.pairs else [s.name for s in self.plan.states()]

    def placeholders(self) -> dict[str, Any]:
        """The write-position input and one fp16 state per cache (or per stacked cache)."""
        from coremltools.converters.mil import Builder as mb
        from coremltools.converters.mil.mil import types

        made: dict[str, Any] = {}
        if self.plan.pairs:
            made[POSITION_INPUT] = mb.placeholder(shape=(1,), dtype=types.int32, name=POSITION_INPUT)
        for spec in self.plan.states():
            made[spec.name] = mb.state_tensor_placeholder(shape=spec.shape, dtype=types.fp16)
        return made

    def input_shape(self, node: Node) -> tuple[int, ...]:
        if node.id in self.plan.mask_inputs:
            return self.plan.mask_inputs[node.id]
        return node.shape.sizes() or (1,)

    def bind(self, func: Any) -> None:
        self.position = func.inputs.get(POSITION_INPUT)
        self.state_vars = {s.name: func.inputs[s.name] for s in self.plan.states()}

    def read_recurrent(self, env: dict[int, Any], name: Any) -> None:
        read_states(self.plan.recurrent, self.state_vars, self.precision, env, name)

    def write_recurrent(self, published: Mapping[tuple[int, int], Any], name: Any) -> None:
        write_states(self.plan.recurrent, self.state_vars, self.precision, published, name)

    def overrides(self) -> dict[int, Any]:
        """Node id -> rule replacing the node's own lowering."""
        rules: dict[int, Any] = {cid: self.lower_cache_concat for cid in self.pairs}
        rules.update({aid: self.lower_cached_attention for aid in self.attention_ids})
        return rules

    # -- cache write and read -----------------------------------------------------------------
    def _int_vector(self, parts: list[Any], ctx: Any, what: str) -> Any:
        from coremltools.converters.mil import Builder as mb

        values = [np.array([p], np.int32) if isinstance(p, int) else p for p in parts]
        return mb.concat(values=values, axis=0, name=ctx.name(what))

    def lower_cache_concat(self, ctx: Any) -> Any:
        """Write the new rows at `cache_position`; return the whole cache `[B, H_kv, C, D]`."""
        from coremltools.converters.mil import Builder as mb

        from rlx_mil.lower.attention_masks import split_heads

        pair = self.pairs[ctx.node.id]
        dims = self._dims(self.graph.node(pair.attention_ids[0]))
        new = split_heads(ctx.var(1), dims, dims.kv_heads, pair.new_rows, ctx, f"{pair.role}_rows")
        if self.precision is Precision.FP32:
            new = mb.cast(x=new, dtype="fp16", name=ctx.name("rows_fp16"))
        b, h, c, d, n = pair.batch, pair.kv_heads, self.plan.max_context, pair.head_dim, pair.new_rows
        pos = self.position
        end_pos = mb.add(x=pos, y=np.int32(n), name=ctx.name("end_position"))
        state_name = pair.state_name(self.plan.layout)
        current = self._latest.get(state_name)
        if current is None:
            current = mb.read_state(input=self.state_vars[state_name], name=ctx.name("read_state"))
        if self.plan.layout == "stacked":
            layer = pair.layer
            begin = self._int_vector([layer, 0, 0, pos, 0], ctx, "write_begin")
            end = self._int_vector([layer + 1, b, h, end_pos, d], ctx, "write_end")
            rows = mb.expand_dims(x=new, axes=[0], name=ctx.name("rows_stacked"))
        else:
            begin = self._int_vector([0, 0, pos, 0], ctx, "write_begin")
            end = self._int_vector([b, h, end_pos, d], ctx, "write_end")
            rows = new
        updated = mb.slice_update(x=current, update=rows, begin=begin, end=end, name=ctx.name("cache_write"))
        written = mb.coreml_update_state(state=self.state_vars[state_name], value=updated, name=ctx.name("cache_state"))
        self._latest[state_name] = written
        cache = written
        if self.plan.layout == "stacked":
            cache = mb.slice_by_index(
                x=written, begin=[pair.layer, 0, 0, 0, 0], end=[pair.layer + 1, b, h, c, d],
                squeeze_mask=[True, False, False, False, False], name=ctx.name("cache_layer"),
            )
        if self.precision is Precision.FP32:
            cache = mb.cast(x=cache, dtype="fp32", name=ctx.name("cache_fp32"))
        return cache

    def _dims(self, attention: Node) -> Any:
        from rlx_mil.lower.attention_masks import Dims

        op = attention.op
        assert isinstance(op, Attention)
        shapes = [self.graph.node(attention.inputs[i]).shape for i in range(3)]
        geo = attention_geometry(shapes[0], shapes[1], shapes[2], op.num_heads, op.head_dim)
        q_sizes = shapes[0].sizes()
        batch = 1 if geo.layout is AttentionLayout.SX else q_sizes[0]
        return Dims(geo.layout, batch, geo.num_heads, geo.num_kv_heads, q_sizes[geo.layout.seq_axis], self.plan.max_context, op.head_dim)

    # -- masks ----------------------------------------------------------------------------------
    def _written(self, ctx: Any, n: int) -> Any:
        """Bool `[C]`: the slots holding a key after this call's write (slot < position + n)."""
        from coremltools.converters.mil import Builder as mb

        key = ("written", n)
        if key not in self._masks:
            slots = np.arange(self.plan.max_context, dtype=np.int32)
            end = mb.add(x=self.position, y=np.int32(n), name=ctx.name("written_end"))
            self._masks[key] = mb.less(x=slots, y=end, name=ctx.name("slots_written"))
        return self._masks[key]

    def _window_keep(self, ctx: Any, dims: Any, window: int | None) -> Any:
        """Bool `[G*Sq, C]`: folded query row g*Sq + i (at position `cache_position + i`) sees
        slot j when j <= position + i (and j >= position + i - window)."""
        from coremltools.converters.mil import Builder as mb

        key = ("window", dims.group, dims.q_len, window)
        if key in self._masks:
            return self._masks[key]
        rows = np.tile(np.arange(dims.q_len, dtype=np.int32), dims.group).reshape(dims.rows, 1)
        row_pos = mb.add(x=self.position, y=rows, name=ctx.name("row_positions"))
        slots = np.arange(self.plan.max_context, dtype=np.int32)
        keep = mb.less_equal(x=slots, y=row_pos, name=ctx.name("mask_causal"))
        if window is not None:
            oldest = mb.sub(x=row_pos, y=np.int32(window), name=ctx.name("window_oldest"))
            recent = mb.greater_equal(x=slots, y=oldest, name=ctx.name("mask_recent"))
            keep = mb.logical_and(x=keep, y=recent, name=ctx.name("mask_window"))
        self._masks[key] = keep
        return keep

    def _masking(self, node: Node, dims: Any, ctx: Any) -> tuple[Any, Any, Any]:
        """(keep mask, live-rows flag or None, fallback mask for rows with no visible key)."""
        from coremltools.converters.mil import Builder as mb

        kind = _attention(node).mask_kind
        if kind.type is MaskType.CAUSAL:
            return self._window_keep(ctx, dims, None), None, None
        if kind.type is MaskType.SLIDING_WINDOW:
            return self._window_keep(ctx, dims, kind.window), None, None
        written = self._written(ctx, dims.q_len)
        if kind.type is MaskType.NONE:
            return written, None, None
        assert kind.type is MaskType.CUSTOM
        mask_shape: Shape = self.graph.node(node.inputs[3]).shape
        key = ("custom", node.inputs[3])
        if key not in self._masks:
            raw = mb.reshape(x=ctx.var(3), shape=[dims.batch, 1, 1, self.plan.max_context], name=ctx.name("mask_slots"))
            if mask_shape.dtype.is_float:
                flags = mb.greater_equal(x=raw, y=ctx.scalar(0.5), name=ctx.name("mask_flags"))
            elif mask_shape.dtype.is_int:
                flags = mb.greater_equal(x=raw, y=np.int32(1), name=ctx.name("mask_flags"))
            else:
                flags = raw
            keep = mb.logical_and(x=flags, y=written, name=ctx.name("mask_keep"))
            kept = mb.cast(x=keep, dtype=ctx.mil_float, name=ctx.name("mask_kept"))
            any_kept = mb.reduce_max(x=kept, axes=[-1], keep_dims=True, name=ctx.name("mask_any_kept"))
            live = mb.greater(x=any_kept, y=ctx.scalar(0.5), name=ctx.name("mask_live_rows"))
            self._masks[key] = (keep, live)
        keep, live = self._masks[key]
        return keep, live, written

    # -- attention ------------------------------------------------------------------------------
    def lower_cached_attention(self, ctx: Any) -> Any:
        from coremltools.converters.mil import Builder as mb

        from rlx_mil.lower.attention_masks import fold_groups, merge_heads, split_heads, unfold_groups
        from rlx_mil.lower.rules.attention import score_scale_factor, use_fused

        node = ctx.node
        op = node.op
        dims = self._dims(node)
        q = split_heads(ctx.var(0), dims, dims.heads, dims.q_len, ctx, "q")
        q = fold_groups(q, dims, ctx, "q")
        k, v = ctx.var(1), ctx.var(2)
        if tuple(k.shape) != (dims.batch, dims.kv_heads, dims.kv_len, dims.head_dim):
            raise ConversionError(f"node %{node.id}: cached k has shape {k.shape}, expected the cache layout")
        keep, live, fallback = self._masking(node, dims, ctx)
        if live is not None:
            # A row whose key-padding mask hides every written key averages the written keys,
            # as the stateless graph does over its P+n keys: unmask them and zero the query.
            dead = mb.logical_not(x=live, name=ctx.name("mask_dead_rows"))
            revive = mb.logical_and(x=dead, y=fallback, name=ctx.name("mask_revived"))
            keep = mb.logical_or(x=keep, y=revive, name=ctx.name("mask_keep_live"))
            q = mb.select(cond=live, a=q, b=ctx.scalar(0.0), name=ctx.name("q_live"))
        if use_fused(op, ctx):
            factor = score_scale_factor(op)
            if factor is not None:
                q = mb.mul(x=q, y=ctx.scalar(factor), name=ctx.name("q_scaled"))
            out = mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=keep, name=ctx.name("sdpa"))
        else:
            from rlx_mil.lower.attention_masks import Masking
            from rlx_mil.lower.rules.attention import _probabilities

            probs = _probabilities(q, k, float(op.scale), op.softcap, Masking(keep=keep), ctx)
            out = mb.matmul(x=probs, y=v, name=ctx.name("context"))
        out = unfold_groups(out, dims, ctx, "out")
        return merge_heads(out, dims, dims.heads, dims.q_len, ctx.out_shape.sizes(), ctx, "out")
