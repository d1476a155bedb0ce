"""Turn an IR graph plus weights into a coremltools MIL Program, one rule per node."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_mil.errors import (
    ConversionError,
    GraphError,
    RlxMilError,
    ShapeError,
    UnsupportedOpError,
)
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.naming import input_names, mil_identifiers, output_names, state_outputs
from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    Cast,
    Constant,
    Input,
    Param,
    Transpose,
    Where,
)
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS, Shape
from rlx_mil.ir.values import BFLOAT16
from rlx_mil.lowering import rules as _rules  # noqa: F401  (importing the rule modules registers them)
from rlx_mil.lowering.context import (
    LowerContext,
    LowerOptions,
    NameAllocator,
    SharedValues,
    WeightSource,
    compressed_weight,
    fp16_overflow_peak,
    mil_dtype_for,
    program_array,
    warn_fp16_overflow,
)
from rlx_mil.lowering.param_checks import check_params, static_sizes
from rlx_mil.lowering.registry import rule_for
from rlx_mil.lowering.state.kv_cache import POSITION_INPUT, KVCachePlan
from rlx_mil.lowering.state.kv_cache_lowering import KVCacheLowering
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.mil_walk import oversized_outputs
from rlx_mil.progress import complete, expect, tick


@dataclass
class LoweredProgram:
    program: Any
    #: MIL identifier -> IR name, for the model interface.
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)


def live_nodes(graph: Graph) -> set[int]:
    """Ids of the nodes the outputs (and the carried states they publish) depend on; dead
    nodes are not lowered."""
    live: set[int] = set()
    stack = [*graph.outputs, *(s.node for s in state_outputs(graph))]
    while stack:
        i = stack.pop()
        if i in live:
            continue
        live.add(i)
        stack.extend(graph.node(i).inputs)
    return live


def check_tensor_size(node: Node) -> None:
    """A live node's declared tensor must be addressable by Core ML (see MAX_TENSOR_ELEMENTS);
    checked before coremltools could try to allocate or constant-fold it."""
    count = 1
    for size in node.shape.sizes():
        count *= size
    if count > MAX_TENSOR_ELEMENTS:
        raise ShapeError(
            f"declared shape {node.shape} holds {count} elements, more than the {MAX_TENSOR_ELEMENTS}"
            " a Core ML tensor can address (MIL shapes and indices are int32)",
            node=node.id, op=node.op.type_name, name=node.name,
        )


def require_graph(graph: object) -> Graph:
    if isinstance(graph, Graph):
        return graph
    hint = " (load JSON text with Graph.from_json or a file with Graph.from_json_file)" if isinstance(graph, (str, bytes)) else ""
    raise GraphError(f"expected an rlx_mil Graph, got {type(graph).__name__}{hint}")


def decode_constant(op: Constant, shape: Shape, node_id: int) -> np.ndarray:
    sizes = static_sizes(shape, f"constant %{node_id}")
    dtype = shape.dtype.numpy.newbyteorder("<")
    if shape.dtype is DType.BF16:
        raw = np.frombuffer(op.data, dtype="<u2").astype(np.uint32) << 16
        return raw.view(np.float32).reshape(sizes)
    count = int(np.prod(sizes, dtype=np.int64))
    if len(op.data) != count * shape.dtype.itemsize:
        raise ConversionError(
            f"constant %{node_id}: payload has {len(op.data)} bytes, shape {shape} needs"
            f" {count * shape.dtype.itemsize}"
        )
    return np.frombuffer(op.data, dtype=dtype).reshape(sizes).astype(shape.dtype.numpy)


_ROUNDED_STORAGE = {DType.F16: np.dtype(np.float16), DType.BF16: BFLOAT16}

#: The values the top-level graphs lowered inside `weights_shared_across_graphs` share.
_ACROSS_GRAPHS: contextvars.ContextVar[SharedValues | None] = contextvars.ContextVar("rlx_mil_across_graphs", default=None)
#: The scope of Params read inside `weights_shared_across_graphs` (`new_scope` starts at 1).
_SHARED_PARAM_SCOPE = 0


@contextlib.contextmanager
def weights_shared_across_graphs() -> Iterator[SharedValues]:
    """Within the block, the top-level graphs lowered read their Params into one set of
    program arrays: the graphs of one package's functions, converted against one params
    mapping, then hold each weight once (the same array in every function, which the join
    writes once). Constants and MIL vars stay each graph's own."""
    shared = SharedValues()
    token = _ACROSS_GRAPHS.set(shared)
    try:
        yield shared
    finally:
        _ACROSS_GRAPHS.reset(token)
_SAME_VALUES = (ActivationKind.NEG, ActivationKind.ABS, ActivationKind.RELU, ActivationKind.ROUND)


def needs_rounding(node: Node, precision: Precision) -> bool:
    """A node declared narrower than the program float: BF16 always, F16 in fp32 programs."""
    dtype = node.shape.dtype
    return dtype is DType.BF16 or (dtype is DType.F16 and precision is Precision.FP32)


def _value_preserving(graph: Graph, node: Node, family: str) -> bool:
    """Ops whose results are values of their (already rounded) inputs: no rounding needed."""
    op = node.op
    if isinstance(op, Cast) or family == "shape":
        return True
    values = node.inputs[1:] if isinstance(op, Where) else node.inputs  # Where's cond is no value
    same_dtype = all(graph.node(i).shape.dtype is node.shape.dtype for i in values)
    if isinstance(op, Where):
        return same_dtype
    if isinstance(op, Activation) and op.kind in _SAME_VALUES:
        return same_dtype
    return isinstance(op, Binary) and op.op in (BinaryOp.MAX, BinaryOp.MIN) and same_dtype


def _check_intermediates(graph: Graph, func: Any) -> None:
    """Every tensor the rules created (attention scores of a decomposed attention above all)
    within MAX_TENSOR_ELEMENTS, checked before the program reaches ct.convert."""
    for op, var, count in oversized_outputs(func, MAX_TENSOR_ELEMENTS):
        raise ConversionError(
            f"graph {graph.name!r}: the lowering needs the intermediate '{var.name}' ({op.op_type},"
            f" shape {list(var.shape)}) of {count} elements, more than the {MAX_TENSOR_ELEMENTS} Core ML"
            " can address; use smaller shapes (or attention='fused' on iOS18 for long sequences)"
        )


class NodeLowerer:
    """Lowers the nodes of one graph in order, each through its registered rule.

    `env` maps node ids to MIL vars; Input nodes must be bound in `env` before `run`.
    Params and Constants become `const` ops lazily, on first use as a tensor.
    """

    def __init__(
        self,
        graph: Graph,
        params: Mapping[str, np.ndarray],
        *,
        target: Target,
        precision: Precision,
        options: LowerOptions,
        names: NameAllocator,
        live: set[int] | None = None,
        name_prefix: str = "",
        shared: SharedValues | None = None,
        param_scope: int | None = None,
    ) -> None:
        self.graph = graph
        self.params = params
        self.target = target
        self.precision = precision
        self.options = options
        self.names = names
        self.live = live_nodes(graph) if live is None else live
        self.name_prefix = name_prefix
        self.env: dict[int, Any] = {}
        #: node id -> rule lowering that node instead of its registered one (the stateful KV
        #: cache rewrites cache Concats and the attention reading them; shapes are its own).
        self.overrides: Mapping[int, Callable[[LowerContext], Any]] = {}
        #: Node id -> the outer graph's Param, for values bound into a decomposition.
        self.weight_sources: dict[int, WeightSource] = {}
        #: (node id, operand) -> MIL var of the final state a rule wrote back into that operand.
        self.published_states: dict[tuple[int, int], Any] = {}
        # Results are rounded to their declared F16/BF16 type at each node of the graph; the
        # subgraph a fused node is spelled in is rounded once, at the fused node, as the
        # reference computes fused ops.
        self.rounds_results = not name_prefix
        #: Input nodes standing for known values of an enclosing graph (see
        #: `LowerContext.lower_subgraph`): the outer lowerer and node, read only when needed.
        self.outer_values: dict[int, tuple[NodeLowerer, int]] = {}
        self.shared = SharedValues() if shared is None else shared
        self._scope = self.shared.new_scope()
        #: the scope Params are shared under (`weights_shared_across_graphs`: every graph's).
        self._param_scope = self._scope if param_scope is None else param_scope
        # The last raw value read: a rule asking for one input's value several times reads a
        # lazily loaded tensor once, and no more than one raw tensor is held at a time.
        self._last_read: tuple[int, np.ndarray] | None = None

    def weight_source(self, node_id: int) -> WeightSource | None:
        """The Param whose value node `node_id` holds: the Param itself, or a 2-D Param behind a
        Transpose swapping its axes."""
        node = self.graph.node(node_id)
        if isinstance(node.op, Param):
            return WeightSource(node.op.name)
        if node.op.type_name == "Transpose" and len(node.shape.dims) == 2 and tuple(getattr(node.op, "perm", ())) == (1, 0):
            inner = self.weight_source(node.inputs[0])
            return None if inner is None else WeightSource(inner.name, not inner.transposed)
        if node_id in self.outer_values:
            outer, outer_id = self.outer_values[node_id]
            return outer.weight_source(outer_id)
        return self.weight_sources.get(node_id)

    def bind_outer_value(self, node_id: int, outer: NodeLowerer, outer_id: int) -> None:
        self.outer_values[node_id] = (outer, outer_id)

    def value_key(self, node_id: int) -> Hashable | None:
        """What a known value is shared under across the conversion; None for run-time values."""
        if node_id in self.outer_values:
            outer, outer_id = self.outer_values[node_id]
            return outer.value_key(outer_id)
        op = self.graph.node(node_id).op
        if isinstance(op, Param):
            return (self._param_scope, "param", op.name)
        if isinstance(op, Constant):
            return (self._scope, "constant", node_id)
        if isinstance(op, Transpose):
            inner = self.value_key(self.graph.node(node_id).inputs[0])
            return None if inner is None else (inner, "transpose", tuple(op.perm))
        return None

    def publish_state(self, node_id: int, operand: int, var: Any) -> None:
        """Record the final state node `node_id` writes back into its input `operand`."""
        self.published_states[node_id, operand] = var

    def value_of(self, node_id: int) -> np.ndarray | None:
        if node_id in self.outer_values:
            outer, outer_id = self.outer_values[node_id]
            return outer.value_of(outer_id)
        if self._last_read is not None and self._last_read[0] == node_id:
            return self._last_read[1]
        node = self.graph.node(node_id)
        if isinstance(node.op, Param):
            value = np.asarray(self.params[node.op.name])
        elif isinstance(node.op, Constant):
            value = decode_constant(node.op, node.shape, node.id)
        elif isinstance(node.op, Transpose):
            # A transposed weight (e.g. a Hugging Face [out, in] matrix feeding MatMul) is a
            # known value too: a view, so rules like `linear` take the stored layout as is.
            inner = self.value_of(node.inputs[0])
            return None if inner is None else np.transpose(inner, node.op.perm)
        else:
            return None
        self._last_read = (node_id, value)
        return value

    def program_value(self, node_id: int, float_dtype: type[np.floating[Any]], *, transpose: bool = False) -> np.ndarray | None:
        """The known value of `node_id` as the program holds it (see `program_array`), made
        once per conversion; None for run-time values."""
        key = self.value_key(node_id)
        if key is None:
            return None
        node = self.graph.node(node_id)
        held = mil_dtype_for(node.shape.dtype, self.precision)
        dtype = float_dtype if held in ("fp16", "fp32") else {"int32": np.int32, "bool": np.bool_}[held]

        def make() -> np.ndarray:
            value = self.value_of(node_id)
            assert value is not None
            if transpose and value.ndim > 2:  # unit batch dims, checked by the rule
                value = value.reshape(value.shape[-2:])
            storage = _ROUNDED_STORAGE.get(node.shape.dtype) if held in ("fp16", "fp32") else None
            if storage is not None and value.dtype != storage:
                value = value.astype(storage)  # a declared F16/BF16 weight holds such values
            arr = program_array(value, dtype, transpose=transpose)
            peak = fp16_overflow_peak(value, arr)
            if peak is not None and isinstance(key, tuple) and key[1] == "param":
                warn_fp16_overflow(str(key[2]), peak)
            self._last_read = None  # the raw tensor is no longer needed
            return arr

        return self.shared.array((key, np.dtype(dtype).str, transpose), make)

    def var_of(self, node_id: int) -> Any:

        if node_id in self.env:
            return self.env[node_id]
        node = self.graph.node(node_id)
        key = self.value_key(node_id)
        if key is None:
            raise ConversionError(f"node %{node_id} used before it was lowered")
        base = node.op.name if isinstance(node.op, Param) else (node.name or f"const_{node_id}")
        if node.shape.dtype.is_float and self.options.compressor is not None:
            op_name = self.name_prefix + base
            value = self.value_of(node_id)
            assert value is not None
            compressed = compressed_weight(
                self.options, self.weight_source(node_id), value, layout="dense", op_name=lambda: self.names.fresh(op_name)
            )
            if compressed is not None:
                self.env[node_id] = compressed
                return compressed
        float_dtype = np.float16 if self.precision is Precision.FP16 else np.float32
        self.env[node_id] = self.program_const(node_id, float_dtype)
        return self.env[node_id]

    def program_const(self, node_id: int, float_dtype: type[np.floating[Any]], *, transpose: bool = False) -> Any:
        """The const op holding `program_value(node_id, ...)`, one per conversion and block. A
        matrix used both as it is and, through a 2-D Transpose, as a `linear` weight (tied
        embeddings) is one buffer and one const."""
        from coremltools.converters.mil import Builder as mb

        node = self.graph.node(node_id)
        if transpose and isinstance(node.op, Transpose) and tuple(node.op.perm) == (1, 0):
            node_id, transpose = node.inputs[0], False  # the transposed transpose is the matrix itself
            node = self.graph.node(node_id)
        arr = self.program_value(node_id, float_dtype, transpose=transpose)
        if arr is None:
            raise ConversionError(f"node %{node_id} is not known at conversion time")
        base = node.op.name if isinstance(node.op, Param) else (node.name or f"const_{node_id}")

        def make() -> Any:
            return mb.const(val=arr if arr.ndim else arr[()], name=self.names.fresh(self.name_prefix + base))

        return self.shared.var(("const", self.value_key(node_id), arr.dtype.str, transpose), make)

    def context(self, node: Node) -> LowerContext:
        return LowerContext(
            graph=self.graph, node=node, target=self.target, precision=self.precision,
            options=self.options, names=self.names, var_of=self.var_of, value_of=self.value_of,
            lowerer=self,
        )

    def run(self) -> None:
        from rlx_mil.lowering.holding import convert

        graph = self.graph
        for node in graph:
            if node.id not in self.live or node.id in self.env:
                continue
            op = node.op
            if isinstance(op, Input):
                if node.id in self.outer_values:
                    continue
                raise ConversionError(f"input %{node.id} {op.name!r} was not bound")
            if isinstance(op, (Param, Constant)) or (isinstance(op, Transpose) and self.value_key(node.id) is not None):
                continue  # known values become consts only where a rule needs them as tensors
            tick(" ops")  # the command line's bar for this stage, if one counts ops
            override = self.overrides.get(node.id)
            info = rule_for(op, self.target, node=node.id, name=node.name)
            ctx = self.context(node)
            try:
                var = info.rule(op, ctx) if override is None else override(ctx)
                if self.rounds_results and needs_rounding(node, self.precision) and not _value_preserving(graph, node, info.family):
                    var = convert(ctx, var, DType.F32, node.shape.dtype, round_floats=True, suffix="rounded")
            except RlxMilError:
                raise
            except Exception as err:
                raise ConversionError(
                    f"node %{node.id} {node.name or ''} ({op.type_name}): lowering failed inside"
                    f" coremltools: {type(err).__name__}: {err}"
                ) from err
            want = node.shape.sizes()
            got = tuple(var.shape) if var.shape is not None else None
            if override is None and got != want and not (want in ((), (1,)) and got in ((), (1,))):
                raise ConversionError(
                    f"node %{node.id} ({op.type_name}): lowering produced shape {got}, declared {list(want)}"
                )
            self.env[node.id] = var

    def nested(
        self, subgraph: Graph, params: Mapping[str, np.ndarray], *, name_prefix: str, rounds_results: bool = False
    ) -> NodeLowerer:
        """A lowerer for an IR subgraph that spells one node of this graph (fused ops), sharing
        this one's target, precision, options and name allocator. `rounds_results` rounds
        every F16/BF16-declared node as a top-level graph does (control-flow bodies and
        expanded regions, which the reference evaluates node by node)."""
        inner = NodeLowerer(
            subgraph, params, target=self.target, precision=self.precision, options=self.options,
            names=self.names, name_prefix=name_prefix, shared=self.shared,
        )
        inner.rounds_results = rounds_results
        return inner


def lower_graph(
    graph: Graph,
    params: Mapping[str, Any] | None,
    *,
    target: Target,
    precision: Precision,
    options: LowerOptions,
    kv_cache: KVCachePlan | None = None,
) -> LoweredProgram:
    """`kv_cache` (see `rlx_mil.lowering.state.kv_cache`) turns the planned cache inputs/outputs into
    Core ML states."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, types

    graph = require_graph(graph)
    if not graph.outputs:
        raise ConversionError(f"graph {graph.name!r} has no outputs; call set_outputs first")
    live = live_nodes(graph)
    if kv_cache is not None:
        live -= kv_cache.removed_inputs  # read from the state instead
    arrays = check_params(graph, {} if params is None else params, live)

    # Every check that can fail on the graph runs before coremltools sees anything.
    for node in graph:
        if node.id not in live:
            continue
        static_sizes(node.shape, f"node %{node.id} ({node.op.type_name})")
        check_tensor_size(node)
        if not isinstance(node.op, (Input, Param, Constant)):
            rule_for(node.op, target, node=node.id, name=node.name)
        if node.shape.dtype.is_complex:
            raise UnsupportedOpError(
                f"node %{node.id}: complex dtype {node.shape.dtype.value} is outside the supported subset"
            )

    expect(" ops", sum(1 for n in graph if n.id in live and not isinstance(n.op, (Input, Param, Constant))))
    stateful = None if kv_cache is None else KVCacheLowering(kv_cache, graph, precision)
    dropped_inputs = set() if kv_cache is None else set(kv_cache.removed_input_names)
    in_names = [n for n in input_names(graph) if n not in dropped_inputs]
    in_ids = mil_identifiers(in_names, taken=() if stateful is None else stateful.reserved_names())
    out_names = [n for n in output_names(graph) if kv_cache is None or n not in kv_cache.removed_outputs]
    carried = [c for c in state_outputs(graph) if kv_cache is None or c.name not in kv_cache.removed_outputs]
    regular_outputs = len(out_names)
    out_names += [c.name for c in carried]
    out_ids = mil_identifiers(out_names, taken=list(in_ids.values()) + ([] if stateful is None else stateful.reserved_names()))

    placeholders: dict[str, Any] = {}
    same_named: dict[str, list[Node]] = {}
    for n in graph:
        if isinstance(n.op, Input):
            same_named.setdefault(n.op.name, []).append(n)
    for ir_name, group in same_named.items():
        # Same-named Inputs are one feed (as in reference.evaluate): one placeholder for all.
        for other in group[1:]:
            if other.shape != group[0].shape:
                raise ShapeError(
                    f"input {ir_name!r} is declared twice with different shapes (node %{group[0].id}"
                    f" {group[0].shape}, node %{other.id} {other.shape})",
                    node=other.id, op="Input", name=other.name,
                )
    input_nodes = {name: group[0] for name, group in same_named.items()}
    for ir_name, ident in in_ids.items():
        node = input_nodes[ir_name]
        dtype = node.shape.dtype
        io_type = types.int32 if (dtype.is_int) else types.fp32
        if options.fp16_io and dtype is DType.F16:
            io_type = types.fp16
        # Core ML has no rank-0 inputs: a scalar travels as [1] and is reshaped inside.
        shape = (node.shape.sizes() or (1,)) if stateful is None else stateful.input_shape(node)
        placeholders[ident] = mb.placeholder(shape=shape, dtype=io_type, name=ident)
    if stateful is not None:
        placeholders.update(stateful.placeholders())

    names = NameAllocator(set(in_ids.values()) | set(out_ids.values()) | set(placeholders))
    float_mil = "fp16" if precision is Precision.FP16 else "fp32"

    with Function(placeholders, opset_version=target.ct_target) as func:
        across = _ACROSS_GRAPHS.get()
        lowerer = NodeLowerer(
            graph, arrays, target=target, precision=precision, options=options, names=names, live=live,
            shared=across, param_scope=None if across is None else _SHARED_PARAM_SCOPE,
        )
        if stateful is not None:
            stateful.bind(func)
            lowerer.overrides = stateful.overrides()
            stateful.read_recurrent(lowerer.env, names.fresh)
        for ir_name, ident in in_ids.items():
            node = input_nodes[ir_name]
            var = func.inputs[ident]
            if not node.shape.sizes():
                var = mb.reshape(x=var, shape=np.zeros((0,), np.int32), name=names.fresh(f"{ident}_scalar"))
            if var.dtype == types.fp16:  # an fp16 interface input (options.fp16_io) holds fp16 values
                if float_mil == "fp32":
                    var = mb.cast(x=var, dtype="fp32", name=names.fresh(f"{ident}_to_fp32"))
            elif node.shape.dtype.is_float and float_mil == "fp16":
                var = mb.cast(x=var, dtype="fp16", name=names.fresh(f"{ident}_to_fp16"))
            elif needs_rounding(node, precision):  # a BF16 (or F16) input holds only such values
                from rlx_mil.lowering.holding import convert

                var = convert(lowerer.context(node), var, DType.F32, node.shape.dtype, round_floats=True, suffix="rounded")
            elif node.shape.dtype is DType.BOOL:
                var = mb.not_equal(x=var, y=np.float32(0), name=names.fresh(f"{ident}_to_bool"))
            for same in same_named[ir_name]:
                lowerer.env[same.id] = var
        lowerer.run()
        complete(" ops")  # (the estimate counted ops that rules fused into others)
        lowerer._last_read = None  # the program holds what it needs: drop the last raw tensor read
        if stateful is not None:
            stateful.write_recurrent(lowerer.published_states, lowerer.var_of, names.fresh)
        var_of = lowerer.var_of

        outs = []
        kept_outputs = [i for i, n in zip(graph.outputs, output_names(graph), strict=True) if n in out_ids]
        results: list[tuple[Shape, Any]] = [(graph.node(i).shape, var_of(i)) for i in kept_outputs]
        for state in carried:
            published = lowerer.published_states.get((state.node, state.operand))
            if published is None:
                raise ConversionError(f"node %{state.node}: its rule published no final state for output {state.name!r}")
            results.append((graph.node(state.source).shape, published))
        assert len(results) == regular_outputs + len(carried)
        for (out_shape, var), ident in zip(results, out_ids.values(), strict=True):
            if tuple(var.shape) != out_shape.sizes():
                var = mb.reshape(x=var, shape=np.asarray(out_shape.sizes(), dtype=np.int32), name=names.fresh(f"{ident}_shape"))
            dtype = out_shape.dtype
            if options.fp16_io and dtype is DType.F16:
                outs.append(mb.identity(x=var, name=ident) if var.dtype == types.fp16
                            else mb.cast(x=var, dtype="fp16", name=ident))
            elif dtype.is_float or dtype is DType.BOOL:
                if var.dtype == types.fp32:
                    outs.append(mb.identity(x=var, name=ident))
                else:
                    outs.append(mb.cast(x=var, dtype="fp32", name=ident))
            else:
                outs.append(mb.cast(x=var, dtype="int32", name=ident) if var.dtype != types.int32
                            else mb.identity(x=var, name=ident))
        func.set_outputs(outs)
    _check_intermediates(graph, func)

    program = Program()
    program.add_function("main", func)
    interface_inputs = {ident: name for name, ident in in_ids.items()}
    if stateful is not None and kv_cache is not None and kv_cache.pairs:
        interface_inputs[POSITION_INPUT] = POSITION_INPUT
    return LoweredProgram(
        program,
        inputs=interface_inputs,
        outputs={ident: name for name, ident in zip(out_names, out_ids.values(), strict=True)},
    )
