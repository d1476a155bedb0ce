"""What a lowering rule sees: its node, already-lowered inputs, target, precision, naming."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from rlx_mil.errors import ConversionError, GraphError, PrecisionWarning, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.naming import generated_name, mil_identifier
from rlx_mil.ir.ops import Op
from rlx_mil.ir.shape import Shape
from rlx_mil.lowering.target import Precision, Target

GraphErrorT = TypeVar("GraphErrorT", bound=GraphError)


class Compressor(Protocol):
    """What the lowering asks of weight compression: which weights it compresses, and the
    constexpr var standing for one (the lowering never imports `rlx_mil.compress`)."""

    def scheme_for(self, source: WeightSource | None) -> object | None:
        """The scheme the Param `source` is compressed with, None where it stays float."""

    def compress(
        self, source: WeightSource, value: np.ndarray, *, layout: str, op_name: Callable[[], str]
    ) -> Any | None:
        """The MIL var decoding `value` (None where it stays float)."""

    def correction(self, weight: Any) -> tuple[Any, Any] | None:
        """For a var `compress` gave: the consts (B [r, in], A [out, r]) of a low-rank correction
        each `linear` using it adds on the activation side, ``x B^T A^T``; None without one."""


class Lowerer(Protocol):
    """What a `LowerContext` asks of the driver lowering its graph (`program.NodeLowerer`):
    weights as shared consts, states, and lowerers for the subgraphs and bodies of a node."""

    name_prefix: str
    env: dict[int, Any]

    @property
    def shared(self) -> SharedValues: ...

    def weight_source(self, node_id: int) -> WeightSource | None: ...

    def value_key(self, node_id: int) -> Hashable | None: ...

    def bind_outer_value(self, node_id: int, outer: Any, outer_id: int) -> None: ...

    def program_const(self, node_id: int, float_dtype: type[np.floating[Any]], *, transpose: bool = False) -> Any: ...

    def publish_state(self, node_id: int, operand: int, var: Any) -> None: ...

    def nested(
        self, subgraph: Graph, params: dict[str, np.ndarray], *, name_prefix: str, rounds_results: bool = False
    ) -> Lowerer: ...

    def run(self) -> None: ...

    def var_of(self, node_id: int) -> Any: ...


@dataclass(frozen=True)
class LowerOptions:
    """Options that steer rule choices (not numerics)."""

    #: "auto": the best form per target; "fused": force Core ML's fused
    #: scaled_dot_product_attention (an error where impossible); "decomposed": never fuse.
    attention: str = "auto"
    #: Weight compression (`rlx_mil.compress.WeightCompressor` implements it), or None for
    #: float weights.
    compressor: Compressor | None = field(default=None, compare=False)
    #: The Neural Engine form (`deploy="ane"`): attention masks filled with fp16-safe values
    #: whatever the precision, RmsNorm / LayerNorm through MIL's `layer_norm` (RmsNorm over
    #: `[x, -x]`, whose mean is zero).
    neural_engine: bool = False
    #: Inputs and outputs the graph declares F16 are fp16 in the Core ML interface (iOS16+),
    #: not float32: the contract of packages an app feeds fp16 arrays (WhisperKit's).
    fp16_io: bool = False


@dataclass(frozen=True)
class WeightSource:
    """The Param a value known at conversion time comes from; `transposed`: the value is that
    (2-D) Param transposed, as a Transpose node feeding a matmul makes it."""

    name: str
    transposed: bool = False


def compressed_weight(
    options: LowerOptions, source: WeightSource | None, value: np.ndarray, *, layout: str,
    op_name: Callable[[], str],
) -> Any | None:
    """The one place a float weight may become a compressed constexpr op instead of a const.

    Returns the op's output when the conversion compresses the Param `source`, else None (the
    caller makes its usual const). `value` is the raw array (any float dtype); layout "kn"
    means a [K, N] matmul weight that `linear` holds as [N, K], "dense" the array as is."""
    if options.compressor is None or source is None:
        return None
    return options.compressor.compress(source, value, layout=layout, op_name=op_name)


class NameAllocator:
    """Unique, Core ML-legal op names derived from IR node names."""

    def __init__(self, reserved: set[str] | None = None) -> None:
        self._used: set[str] = set(reserved or ())

    def reserve(self, name: str) -> None:
        self._used.add(name)

    def fresh(self, base: str) -> str:
        base = mil_identifier(base)
        name, k = base, 1
        while name in self._used:
            name, k = f"{base}_{k}", k + 1
        self._used.add(name)
        return name


# ---------------------------------------------------------------------- weights to program arrays

#: Source rows per block when a weight is cast and transposed in one pass: the strided writes of
#: a block stay in cache, so the transpose costs little more than the cast itself.
TRANSPOSE_BLOCK_ROWS = 256
FP16_MAX = 65504.0
#: Elements per pass of the fp16 overflow check (temporaries of a few MB whatever the weight).
_CHECK_BLOCK = 1 << 20


def program_array(value: Any, dtype: type[np.generic] | np.dtype[Any], *, transpose: bool = False) -> np.ndarray:
    """`value` as a program holds it: cast to `dtype` and, with `transpose`, its two axes swapped.

    The cast comes before any layout change and both happen in one pass over the source into
    one new C-contiguous array; a source already in that dtype and layout (e.g. a memory-mapped
    fp16 tensor) is returned as it is, uncopied. Sources may be float32/float16/bfloat16
    (ml_dtypes) or integer/bool arrays, lazily read or not.
    """
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    want = np.dtype(dtype)
    if not transpose:
        return np.ascontiguousarray(arr, dtype=want)
    if arr.ndim != 2:
        raise ConversionError(f"only a matrix can be transposed into a weight, got shape {list(arr.shape)}")
    if arr.T.flags.c_contiguous:  # stored [N, K] already (e.g. a transposed view of a checkpoint)
        return np.ascontiguousarray(arr.T, dtype=want)
    rows, cols = arr.shape
    out = np.empty((cols, rows), dtype=want)
    for start in range(0, rows, TRANSPOSE_BLOCK_ROWS):
        stop = min(start + TRANSPOSE_BLOCK_ROWS, rows)
        out[:, start:stop] = arr[start:stop].T
    return out


def fp16_overflow_peak(source: np.ndarray, held: np.ndarray) -> float | None:
    """The largest finite magnitude of `source` when casting it to fp16 (`held`) made a finite
    value infinite, else None. The common case costs one integer pass over `held`."""
    if held.dtype != np.float16 or held.size == 0 or source.dtype == np.float16:
        return None
    # Block by block: a whole-array mask would cost 1.5x the held weight in temporaries.
    bits = held.reshape(-1).view(np.uint16)
    if not any(((bits[i:i + _CHECK_BLOCK] & 0x7FFF) >= 0x7C00).any() for i in range(0, bits.size, _CHECK_BLOCK)):
        return None  # no inf or NaN in fp16
    flat = np.asarray(source).reshape(-1)
    peak = 0.0
    for i in range(0, flat.size, _CHECK_BLOCK):
        wide = flat[i:i + _CHECK_BLOCK].astype(np.float32)
        finite = wide[np.isfinite(wide)]
        peak = max(peak, float(np.max(np.abs(finite))) if finite.size else 0.0)
    return peak if peak > FP16_MAX else None


def warn_fp16_overflow(name: str, peak: float) -> None:
    warnings.warn(
        PrecisionWarning(
            f"param {name!r}: values up to {peak:.4g} exceed fp16's range ({FP16_MAX:g}) and"
            " become +-inf under precision='fp16'; use precision='fp32' or rescale them"
        ),
        stacklevel=4,
    )


class SharedValues:
    """What one conversion makes once and every node shares.

    `array`: a Param/Constant in the form the program holds it (cast, and transposed for
    `linear`), made on first use, so a weight used by several nodes (tied embeddings, RoPE
    tables) is read and cast once and both uses point at the same buffer. `var`: MIL vars that
    depend only on shapes, such as the causal mask of every attention layer with the same
    geometry; keyed by the block they live in, so a var is never used outside its scope.
    """

    def __init__(self) -> None:
        self._arrays: dict[Hashable, np.ndarray] = {}
        self._vars: dict[Hashable, Any] = {}
        self._scopes = 0

    def new_scope(self) -> int:
        """A token no other lowerer of this conversion has: Params of different (sub)graphs
        may share a name without sharing a value."""
        self._scopes += 1
        return self._scopes

    def array(self, key: Hashable, make: Callable[[], np.ndarray]) -> np.ndarray:
        if key not in self._arrays:
            self._arrays[key] = make()
        return self._arrays[key]

    def var(self, key: Hashable, make: Callable[[], Any]) -> Any:
        from coremltools.converters.mil.mil.block import curr_block

        scoped = (id(curr_block()), key)
        if scoped not in self._vars:
            self._vars[scoped] = make()
        return self._vars[scoped]


class LowerContext:
    """Handed to each lowering rule for one node.

    Inputs are lowered lazily: `var(i)` materialises a Param/Constant as a `const` only when a
    rule asks for it as a tensor, so a rule that reads raw weights through `value(i)` (e.g.
    quantized weights becoming `constexpr_*` ops) leaves no uncompressed copy behind.
    """

    def __init__(
        self,
        *,
        graph: Graph,
        node: Node,
        target: Target,
        precision: Precision,
        options: LowerOptions,
        names: NameAllocator,
        var_of: Callable[[int], Any],
        value_of: Callable[[int], np.ndarray | None],
        lowerer: Lowerer | None = None,
    ) -> None:
        self.graph = graph
        self.node = node
        self.target = target
        self.precision = precision
        self.options = options
        self._names = names
        self._var_of = var_of
        self._value_of = value_of
        self._lowerer = lowerer

    # ------------------------------------------------------------------ the node
    @property
    def op(self) -> Op:
        return self.node.op

    @property
    def out_shape(self) -> Shape:
        return self.node.shape

    @property
    def num_inputs(self) -> int:
        return len(self.node.inputs)

    def input_shape(self, i: int) -> Shape:
        return self.graph.node(self.node.inputs[i]).shape

    def input_node(self, i: int) -> Node:
        return self.graph.node(self.node.inputs[i])

    # ------------------------------------------------------------------ values
    def var(self, i: int) -> Any:
        """The MIL var of input `i`, in the dtype `mil_dtype` gives its IR dtype."""
        return self._var_of(self.node.inputs[i])

    def node_var(self, node_id: int) -> Any:
        """The MIL var of graph node `node_id` (lowered before this node): for rules that look
        through an input to the tensor it was made from."""
        return self._var_of(node_id)

    def vars(self) -> list[Any]:
        return [self.var(i) for i in range(self.num_inputs)]

    def weight_source(self, i: int) -> WeightSource | None:
        """The Param input `i`'s value comes from (also inside a decomposition), else None."""
        lowerer = self._lowerer
        return None if lowerer is None else lowerer.weight_source(self.node.inputs[i])

    def value(self, i: int) -> np.ndarray | None:
        """The NumPy value of input `i` when it is a Param or Constant (known at conversion
        time), else None. Raw: quantized bytes stay as given."""
        return self._value_of(self.node.inputs[i])

    def compresses(self, i: int) -> bool:
        """Whether this conversion compresses the weight behind input `i`: a rule that would fold
        the value into its op (a norm scale, a RoPE table) must then take it as `var(i)`, which
        is the compressed constexpr op."""
        compressor = self.options.compressor
        return compressor is not None and compressor.scheme_for(self.weight_source(i)) is not None

    def known_value(self, i: int) -> np.ndarray | None:
        """`value(i)` for a rule free to fold it into its op; None when it is not known at
        conversion time or is compressed (see `compresses`)."""
        return None if self.compresses(i) else self.value(i)

    def _driver(self, what: str) -> Lowerer:
        if self._lowerer is None:
            raise self.error(f"this context cannot {what} (it was built without a lowerer)")
        return self._lowerer

    def weight(self, i: int, *, transpose: bool = False) -> Any:
        """The const op of input `i`'s known value (Param/Constant, with any unit leading dims
        dropped when `transpose`) as the program holds floats, fp16 or fp32; `transpose` swaps
        the axes of a matrix into the [N, K] layout of `linear`. Made once per conversion and
        shared by every node using it (a tied embedding and its transposed use included)."""
        return self._driver("hold weights").program_const(self.node.inputs[i], self.float_dtype, transpose=transpose)

    def value_key(self, i: int) -> Hashable | None:
        """What input `i`'s known value is shared under in this conversion (None at run time)."""
        return self._driver("share values").value_key(self.node.inputs[i])

    def shared_var(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The var `make()` builds, built once per conversion for each `key` (which must
        capture everything the var depends on) and reused by every node asking for it."""
        return self._driver("share values").shared.var(key, make)

    def publish_state(self, operand: int, var: Any) -> None:
        """Hand over the final state this node writes back into its input `operand` (one of
        `op.carried_operands()`); the driver makes it an extra output `<state input>_out`, or
        the write of a Core ML state."""
        if operand not in self.op.carried_operands():
            raise self.error(f"input {operand} is not a carried state operand")
        if self._lowerer is None:
            raise self.error("this context cannot publish a state (it was built without a lowerer)")
        self._lowerer.publish_state(self.node.id, operand, var)

    # ------------------------------------------------------------------ dtypes and consts
    @property
    def float_dtype(self) -> type[np.floating[Any]]:
        """NumPy dtype that float tensors are held in inside the program."""
        return np.float16 if self.precision is Precision.FP16 else np.float32

    @property
    def mil_float(self) -> str:
        """MIL dtype string of float tensors inside the program ("fp16" or "fp32")."""
        return "fp16" if self.precision is Precision.FP16 else "fp32"

    def mil_dtype(self, dtype: DType) -> str:
        """MIL dtype string in which IR values of `dtype` are held inside the program."""
        return mil_dtype_for(dtype, self.precision)

    def const(self, value: Any, suffix: str = "const") -> Any:
        """A `const` op. Float values take the program's float dtype; ints become int32
        (Core ML's index type) unless already a narrower int type; bools stay bool."""
        from coremltools.converters.mil import Builder as mb

        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            arr = arr.astype(self.float_dtype)
        elif (arr.dtype.kind in "iu" and arr.dtype.itemsize > 4) or arr.dtype == np.uint32:
            arr = arr.astype(np.int32)
        val: Any = arr if arr.ndim else arr[()]
        return mb.const(val=val, name=self.name(suffix))

    def scalar(self, value: float) -> Any:
        """A float scalar in the program's float dtype, as an inline op argument."""
        return self.float_dtype(value)

    # ------------------------------------------------------------------ decompositions
    def lower_subgraph(
        self,
        subgraph: Graph,
        bindings: dict[int, int],
        params: dict[str, np.ndarray] | None = None,
    ) -> list[Any]:
        """Lower an IR `subgraph` that spells this node as simpler IR ops, each through its own
        registered rule, and return the vars of its outputs.

        `bindings` maps each Input node id of `subgraph` to the index of this node's input it
        stands for; a bound input that is a Param/Constant of the outer graph keeps its value,
        so weight-aware rules (e.g. `linear`) still see it. `params` supplies the subgraph's
        own Params.
        """
        if self._lowerer is None:
            raise self.error("this context cannot lower a subgraph (it was built without a lowerer)")
        inner = self._lowerer.nested(subgraph, dict(params or {}), name_prefix=f"{self.base_name}_")
        lowerer = self._lowerer
        for sub_id, outer_index in bindings.items():
            outer_id = self.node.inputs[outer_index]
            key = lowerer.value_key(outer_id)  # known at conversion time: a weight-aware rule sees it
            if key is not None:
                inner.bind_outer_value(sub_id, lowerer, outer_id)
            else:
                inner.env[sub_id] = self.var(outer_index)
        inner.run()
        return [inner.var_of(i) for i in subgraph.outputs]

    def lower_body(self, body: Graph, operands: list[Any], suffix: str) -> list[Any]:
        """Lower a control-flow body (or an expanded region) into the current MIL block: its
        Input nodes, in node-id order, take the MIL vars `operands`; every node is rounded to
        its declared type as in the top-level graph. Returns the vars of its outputs."""
        if self._lowerer is None:
            raise self.error("this context cannot lower a body (it was built without a lowerer)")
        inner = self._lowerer.nested(body, {}, name_prefix=f"{self.base_name}_{suffix}_", rounds_results=True)
        inputs = [node for node in body.nodes if node.op.type_name == "Input"]
        if len(inputs) != len(operands):
            raise self.error(f"{suffix} takes {len(inputs)} operands, got {len(operands)}")
        for node, var in zip(inputs, operands, strict=True):
            inner.env[node.id] = var
        inner.run()
        return [inner.var_of(i) for i in body.outputs]

    # ------------------------------------------------------------------ names and errors
    @property
    def base_name(self) -> str:
        node = self.node
        prefix = getattr(self._lowerer, "name_prefix", "")
        return prefix + (node.name if node.name else generated_name(self.graph, node.id))

    def name(self, suffix: str = "") -> str:
        """A fresh op name derived from the node's name."""
        return self._names.fresh(f"{self.base_name}_{suffix}" if suffix else self.base_name)

    def unsupported(self, message: str) -> UnsupportedOpError:
        """An error naming this node and op, for a variant this target/option cannot express."""
        return UnsupportedOpError(f"node %{self.node.id} {self.base_name!r} ({self.op.type_name}): {message}")

    def fail(self, error_type: type[GraphErrorT], message: str, operand: str | None = None) -> GraphErrorT:
        """A typed graph error (`ShapeError`, `DTypeError`, `AttributeValueError`, ...) naming this
        node, its op and name, and the operand at fault where one is given: `raise ctx.fail(...)`."""
        return error_type(message, node=self.node.id, op=self.op.type_name, name=self.node.name, operand=operand)

    def error(self, message: str) -> ConversionError:
        return ConversionError(f"node %{self.node.id} {self.base_name!r} ({self.op.type_name}): {message}")

    def require_target(self, minimum: Target, what: str) -> None:
        if self.target < minimum:
            raise self.unsupported(f"{what} needs target {minimum.label} or newer (asked for {self.target.label})")


def mil_dtype_for(dtype: DType, precision: Precision) -> str:
    if dtype.is_float:
        return "fp16" if precision is Precision.FP16 else "fp32"
    if dtype is DType.BOOL:
        return "bool"
    if dtype.is_int:
        return "int32"
    raise UnsupportedOpError(f"dtype {dtype.value} has no Core ML representation")
