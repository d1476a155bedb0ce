"""Upstream's `Custom { name, num_inputs, attrs }` ops. Upstream's Core ML backend lowers one name
itself, `onnx.ScatterND` (3 inputs), and runs the rest of what it knows on the host between Core
ML segments: its own `collective.*` ops and rlx-cpu's ONNX reference kernels. rlx_mil reads each
name whose kernel has an exact IR form as that form (docs/upstream-ops-3.md). Names whose IR form
takes more than one node, or needs the operands' shapes, are decoded to a placeholder op carrying
their attrs (never added to a graph) that the reader hands to the matching `add_*` here:

* `onnx.ScatterND` -> ScatterNd with the reduction its first four attrs bytes give (a
  little-endian i32: 0 none, 1 add, 2 mul, 3 max, 4 min; fewer than four bytes = none);
* `onnx.Mod` (2 inputs) -> Binary Mod: the kernel's float remainder `a - trunc(a / b) * b` (both
  `fmod` attrs) is C fmod, the sign of a, NaN for b = 0; integers give 0 for b = 0, as the IR's;
* `onnx.IsNaN` (1 input) -> Compare Ne of the input with itself (true exactly where it is NaN);
* `onnx.GatherND` (2 inputs) -> GatherNd (`batch_dims` = attrs[0..4] as a little-endian i32,
  negative = 0) on the indices as the kernel reads them: truncated to i64, a negative one
  counted from the end, then clamped into `[0, dim - 1]` (`add_gather_nd` spells that out);
* `onnx.GatherElements` (2 inputs) -> GatherElements (axis = attrs[0..4] as a little-endian i32,
  counted from the end when negative and clamped into the rank) on indices read the same way;
* `onnx.OneHot` (3 inputs: indices, depth, values) -> `values[1]` where the index (truncated to
  i64, `+ depth` when negative) equals its position along the new axis, else `values[0]`: depth
  is the declared output's size on that axis (attrs[0..4], default -1, counted from the end of
  the output's rank), as the kernel takes it; an index still outside `[0, depth)` is all off;
* `onnx.CumProd` (1 or 2 inputs) -> CumProd, between two Reverses when attrs[5] (reverse) is set,
  exclusive = attrs[4]; the axis is input 1 when it is an I64 tensor (a Constant: one read at run
  time is refused), else attrs[0..4] (default 0), counted from the end when negative and clamped
  into the rank, as the kernel reads it;
* `onnx.Einsum` (any number of inputs, the equation as the attrs' UTF-8 bytes) -> each operand
  transposed and reshaped onto all the labels (the output's first), the Mul of them, a Reduce
  Sum over the labels the output drops. The implicit output is the labels seen
  once, sorted, as the kernel takes it. Refused by name: an ellipsis (the kernel refuses it too),
  a label repeated within a term or the output (a diagonal), and a label whose sizes disagree
  (the kernel's strides then read past an operand's data);
* `onnx.ScatterElements` (3 inputs, float data) -> ScatterElements (axis = attrs[0..4], reduction
  = attrs[4..8] as for ScatterND) on the kernel's reading: non-finite data entries zeroed first,
  each index truncated, a negative one read as 0 (not wrapped) and one past the end clamped to
  the last row; rank-1 data skips an index past the end instead (a spare slot that is dropped).
  The kernel maps each index to a data position by the index count, which is ONNX's mapping
  only when the indices have the data's shape, or its shape with 1 along the axis, or the data
  is 1-D (and the updates have the indices' shape): other shapes and integer data (the kernel's
  flat I64 path) are refused by name.

`onnx.AlignmentRange`, `onnx.ExpandI64Align` and `onnx.VocoderWaveformSlice` (Kitten TTS
helpers) are read as Compare / Where forms (`custom_alignment.py`), `onnx.NonZero` as its
kernel's fixed-size form (`custom_nonzero.py`).

The names upstream knows and rlx_mil does not read are refused by name with the reason in
`REFUSED_NAMES`; every other name is refused by name too. `READ_FORMS`, `READ_LIMITS` and
`REFUSED_NAMES` are the coverage doc's table of Custom names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.node import Node, NodeOrigin
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.ops.elementwise import Binary, BinaryOp, Cast, CmpOp, Compare, Where
from rlx_mil.ir.ops.leaf import Constant
from rlx_mil.ir.ops.reduce import CumProd, Reduce, ReduceOp
from rlx_mil.ir.ops.scatter import GatherElements, GatherNd, ScatterElements, ScatterNd, ScatterNdReduction
from rlx_mil.ir.ops.shape import Concat, Narrow, Reshape, Reverse, Transpose
from rlx_mil.ir.serde.codecs import describe, fail, json_array
from rlx_mil.ir.serde.custom_alignment import (
    ALIGNMENT_HELPERS,
    ALIGNMENT_RANGE_NAME,
    EXPAND_I64_ALIGN_NAME,
    VOCODER_WAVEFORM_SLICE_NAME,
    AlignmentHelper,
)
from rlx_mil.ir.serde.custom_nonzero import NON_ZERO_NAME, NonZeroRead
from rlx_mil.ir.shape import Shape, Static

SCATTER_ND_NAME = "onnx.ScatterND"
IS_NAN_NAME = "onnx.IsNaN"
GATHER_ND_NAME = "onnx.GatherND"
GATHER_ELEMENTS_NAME = "onnx.GatherElements"
ONE_HOT_NAME = "onnx.OneHot"
CUM_PROD_NAME = "onnx.CumProd"
EINSUM_NAME = "onnx.Einsum"
SCATTER_ELEMENTS_NAME = "onnx.ScatterElements"
_REDUCTIONS = (ScatterNdReduction.NONE, ScatterNdReduction.ADD, ScatterNdReduction.MUL, ScatterNdReduction.MAX,
               ScatterNdReduction.MIN)


def _scatter_nd(attrs: bytes, path: str) -> ScatterNd:
    code = int.from_bytes(attrs[:4], "little", signed=True) if len(attrs) >= 4 else 0
    if not 0 <= code < len(_REDUCTIONS):
        raise UnsupportedOpFormatError(f"{path}.attrs: {SCATTER_ND_NAME} reduction code {code} is not one of 0..4")
    return ScatterNd(_REDUCTIONS[code])


def _alignment_helper(helper: str, attrs: bytes, path: str) -> Op:
    return AlignmentHelper(helper)


#: name -> (num_inputs, the IR op from the attrs bytes).
READ_AS: dict[str, tuple[int, Callable[[bytes, str], Op]]] = {
    SCATTER_ND_NAME: (3, _scatter_nd),
    "onnx.Mod": (2, lambda attrs, path: Binary(BinaryOp.MOD)),
    IS_NAN_NAME: (1, lambda attrs, path: Compare(CmpOp.NE)),
    GATHER_ND_NAME: (2, lambda attrs, path: GatherNd(max(int.from_bytes(attrs[:4], "little", signed=True), 0)
                                                      if len(attrs) >= 4 else 0)),
    # The axis needs the data's rank: `add_gather_elements` builds the op; this one is a placeholder.
    GATHER_ELEMENTS_NAME: (2, lambda attrs, path: GatherElements(_i32(attrs, 0))),
    # `add_one_hot` builds the nodes; the op here only carries the axis attribute to it.
    ONE_HOT_NAME: (3, lambda attrs, path: OneHotAxis(_i32(attrs, -1))),
    SCATTER_ELEMENTS_NAME: (3, lambda attrs, path: ScatterElementsAttrs(
        _i32(attrs, 0), _scatter_nd(attrs[4:8], path).reduction if len(attrs) >= 8 else ScatterNdReduction.NONE)),
    CUM_PROD_NAME: (1, lambda attrs, path: CumProdAttrs(_i32(attrs, 0), len(attrs) > 4 and attrs[4] != 0,
                                                        len(attrs) > 5 and attrs[5] != 0)),
    # `add_alignment_helper` builds the nodes (custom_alignment.py).
    **{helper: (arity, partial(_alignment_helper, helper)) for helper, arity in ALIGNMENT_HELPERS.items()},
    # `add_non_zero` builds the nodes (custom_nonzero.py).
    NON_ZERO_NAME: (1, lambda attrs, path: NonZeroRead()),
}

#: Names read with another input count as well (CumProd's axis may be an operand).
OTHER_ARITIES = {CUM_PROD_NAME: 2}

#: Each name read here and the IR form it becomes (the coverage doc's table of Custom names).
READ_FORMS: dict[str, str] = {
    SCATTER_ND_NAME: "ScatterNd; reduction = attrs[0..4] as a little-endian i32 (0 none, 1 add, 2 mul, 3 max, 4 min)",
    "onnx.Mod": "Binary Mod (the kernel's remainder is C fmod for either `fmod` byte; integer b = 0 gives 0)",
    IS_NAN_NAME: "Compare Ne of the input with itself",
    GATHER_ND_NAME: "GatherNd (batch_dims = attrs[0..4]) on the indices truncated, wrapped once and clamped as the"
                    " kernel reads them",
    GATHER_ELEMENTS_NAME: "GatherElements (axis = attrs[0..4]) on the indices read as for GatherND",
    ONE_HOT_NAME: "Compare / Where of the indices against positions along the declared output's axis (attrs[0..4])",
    CUM_PROD_NAME: "CumProd (exclusive = attrs[4]), between two Reverses when attrs[5] is set; the axis from a"
                   " Constant input 1 or attrs[0..4]",
    EINSUM_NAME: "each operand Transposed / Reshaped onto all labels, their Mul, a Reduce Sum over the labels the"
                 " output drops (the equation is the attrs' UTF-8)",
    SCATTER_ELEMENTS_NAME: "ScatterElements (axis = attrs[0..4], reduction = attrs[4..8]) after the kernel's zeroing of"
                           " non-finite data, on indices clamped as it clamps them",
    NON_ZERO_NAME: "the kernel's fixed-size form: row-major coordinates of the first cols non-zeros laid out [rank,"
                   " cols] in the declared output, 0 elsewhere (Compare, exclusive Cumsum, Where, Reduce Sum,"
                   " integer Div / Mod)",
    ALIGNMENT_RANGE_NAME: "a Kitten TTS helper: Where(position < frame count, position, 0) over the declared output"
                          " (Constant positions, Compare, Where)",
    EXPAND_I64_ALIGN_NAME: "a Kitten TTS helper: Where(position < shape[0], data, 0), the data flattened and cut or"
                           " zero-padded to the declared output (Reshape, Narrow / Concat, Compare, Where)",
    VOCODER_WAVEFORM_SLICE_NAME: "a Kitten TTS helper: the F32 wave's time axis from sample 10 (Narrow, zero Concat),"
                                 " kept where t < frames * 600 - 20 (the kernel's hard-coded hop and trims; Compare,"
                                 " Where)",
}

#: The forms of a read name that its kernel does not compute as one IR op would: refused by name.
READ_LIMITS: dict[str, str] = {
    SCATTER_ND_NAME: "a reduction code outside 0..4",
    GATHER_ND_NAME: "a dynamic size on an indexed axis (the clamp needs it)",
    GATHER_ELEMENTS_NAME: "a dynamic size on the axis (the clamp needs it)",
    ONE_HOT_NAME: "dynamic shapes, or an output not one rank above the indices",
    CUM_PROD_NAME: "an axis computed at run time",
    EINSUM_NAME: "an ellipsis (the kernel refuses it too), a label repeated within a term (a diagonal), a label"
                 " whose sizes disagree (the kernel then strides past an operand's data)",
    SCATTER_ELEMENTS_NAME: "index shapes the kernel maps by count (not ONNX's mapping), integer data (a flat I64"
                           " path that ignores the axis), dynamic shapes",
    NON_ZERO_NAME: "dynamic shapes, a scalar input (the kernel indexes its strides out of range), more than"
                   " 2^24 output-column x element pairs",
    ALIGNMENT_RANGE_NAME: "dynamic shapes",
    EXPAND_I64_ALIGN_NAME: "dynamic shapes",
    VOCODER_WAVEFORM_SLICE_NAME: "dynamic shapes, a non-F32 wave, an output whose rank or sizes off the time axis"
                                 " differ from the wave's (the kernel then copies rows of another stride)",
}

_COLLECTIVE = (
    "host transport over a process group (all-reduce, send, ...) whose size and rank are not in the graph:"
    " one Core ML program cannot drive it"
)
_NO_KERNEL = (
    "upstream's Core ML backend names it (its integer dtype overrides) but registers no kernel for it: the op"
    " comes from an application's own registry, which the graph does not carry"
)
_KITTEN = (
    "a Kitten TTS helper laying per-token rows of I64 durations end to end (positions are run-time prefix sums);"
    " its trip count is clamped to a process-wide active-token count the host sets before each inference"
    " (`set_active_token_count`), which the graph does not carry"
)

#: Names upstream knows (its `collective.*` kernels, rlx-cpu's ONNX reference kernels, the names
#: its Core ML backend's host path types) that are refused by name, with the reason. Any other
#: name is refused as well: what it computes lives only in a run-time registry.
REFUSED_NAMES: dict[str, str] = {
    **{f"collective.{op}": _COLLECTIVE for op in (
        "all_reduce", "all_gather", "reduce_scatter", "copy_to_parallel", "reduce_from_parallel", "broadcast",
        "reduce", "all_to_all", "ppermute", "send", "recv")},
    "onnx.ConcatFromSequence": _KITTEN,
    "onnx.KittenConcatFromSequence": _KITTEN + " (an alias of onnx.ConcatFromSequence)",
    **dict.fromkeys(("onnx.DynamicQuantizeLinearExport", "onnx.QMatMul", "onnx.QMatMulBaked",
                     "onnx.DynamicQuantizeLSTM", "onnx.AlignmentScatterIndices", "onnx.F0IfSelect"), _NO_KERNEL),
}


@dataclass(frozen=True)
class ScatterElementsAttrs(Op):
    """The attrs of an `onnx.ScatterElements` node while it is read (never added to a graph)."""

    type_name: ClassVar[str] = "onnx.ScatterElements"
    axis: int
    reduction: ScatterNdReduction


@dataclass(frozen=True)
class EinsumEquation(Op):
    """The equation of an `onnx.Einsum` node while it is read (never added to a graph)."""

    type_name: ClassVar[str] = "onnx.Einsum"
    equation: str


@dataclass(frozen=True)
class CumProdAttrs(Op):
    """The attrs of an `onnx.CumProd` node while it is read (never added to a graph)."""

    type_name: ClassVar[str] = "onnx.CumProd"
    axis: int
    exclusive: bool
    reverse: bool


@dataclass(frozen=True)
class OneHotAxis(Op):
    """The axis of an `onnx.OneHot` node while it is read (never added to a graph)."""

    type_name: ClassVar[str] = "onnx.OneHot"
    axis: int


def _i32(attrs: bytes, default: int) -> int:
    return int.from_bytes(attrs[:4], "little", signed=True) if len(attrs) >= 4 else default


def decode_custom(content: object, path: str) -> Op:
    name = content.get("name") if isinstance(content, dict) else None
    num_inputs = content.get("num_inputs") if isinstance(content, dict) else None
    if name == EINSUM_NAME and isinstance(content, dict):
        try:
            return EinsumEquation(_attrs_bytes(content, path).decode("utf-8"))
        except UnicodeDecodeError:
            raise UnsupportedOpFormatError(f"{path}.attrs: the {EINSUM_NAME} equation is not UTF-8") from None
    reading = READ_AS.get(name) if isinstance(name, str) else None
    if reading is None or num_inputs not in (reading[0], OTHER_ARITIES.get(str(name))):
        known = ", ".join([*(f"{n!r} ({arity} inputs)" for n, (arity, _) in READ_AS.items()), repr(EINSUM_NAME)])
        why = REFUSED_NAMES.get(name) if isinstance(name, str) else None
        raise UnsupportedOpFormatError(
            f"{path}: upstream Custom op {name!r} ({describe(num_inputs)} inputs) is not supported by rlx_mil: "
            + (f"{why}" if why else "its meaning lives in upstream's run-time op registry")
            + f"; only {known} are read"
        )
    assert isinstance(content, dict)
    return reading[1](_attrs_bytes(content, path), path)


def _attrs_bytes(content: dict[str, object], path: str) -> bytes:
    attrs = json_array(content.get("attrs", []), f"{path}.attrs")
    raw = [b for b in attrs if type(b) is int and 0 <= b <= 255]
    if len(raw) != len(attrs):
        fail(f"{path}.attrs", f"expected byte values 0..255, got {describe(attrs)}")
    return bytes(raw)


def custom_operands(op_json: object, inputs: Sequence[int]) -> list[int]:
    """The IR op's operands for the node's inputs: IsNaN compares its one input with itself."""
    content = op_json.get("Custom") if isinstance(op_json, dict) else None
    if isinstance(content, dict) and content.get("name") == IS_NAN_NAME and len(inputs) == 1:
        return [inputs[0], inputs[0]]
    return list(inputs)


def custom_name(op_json: object) -> str | None:
    content = op_json.get("Custom") if isinstance(op_json, dict) else None
    name = content.get("name") if isinstance(content, dict) else None
    return name if isinstance(name, str) else None


def add_gather_nd(add: Callable[..., int], data: Shape, indices: Shape, op: GatherNd, inputs: Sequence[int],
                  shape: Shape, name: str | None, origin: NodeOrigin | None) -> int:
    """`onnx.GatherND` as upstream's host kernel reads its indices (`_clamped`)."""
    k = indices.dims[-1] if indices.dims else None
    b = op.batch_dims
    if not isinstance(k, Static) or len(data.dims) < b + k.size or not all(
            isinstance(d, Static) for d in data.dims[b:b + k.size]):
        return add(op, inputs, shape, name=name, origin=origin)  # the shape rule reports it
    dims = [d.size for d in data.dims[b:b + k.size] if isinstance(d, Static)]
    return add(op, [inputs[0], _clamped(add, inputs[1], indices.dtype, dims)], shape, name=name, origin=origin)


def add_gather_elements(add: Callable[..., int], data: Shape, indices: Shape, attrs_axis: int, inputs: Sequence[int],
                        shape: Shape, name: str | None, origin: NodeOrigin | None) -> int:
    """`onnx.GatherElements` as upstream's host kernel reads it: the axis counted from the end
    when negative and clamped into the rank, the indices along it as `_clamped` reads them."""
    rank = len(data.dims)
    axis = min(max(attrs_axis + rank if attrs_axis < 0 else attrs_axis, 0), max(rank - 1, 0))
    op = GatherElements(axis)
    dim = data.dims[axis] if data.dims else None
    if not isinstance(dim, Static):
        return add(op, inputs, shape, name=name, origin=origin)  # the shape rule reports it
    return add(op, [inputs[0], _clamped(add, inputs[1], indices.dtype, [dim.size])], shape, name=name, origin=origin)


def _clamped(add: Callable[..., int], indices: int, dtype: DType, dims: list[int]) -> int:
    """Indices as rlx-cpu's ONNX kernels read them: truncated to i64 (a float one as Rust's
    `as`), `+ dim` when negative, then clamped into `[0, dim - 1]`, so an index out of range
    reads the nearest edge where the IR's gathers would refuse it. `dims` runs along the last
    axis of the indices (one entry broadcasts)."""

    def const(values: list[int]) -> int:
        raw = b"".join(int(v).to_bytes(8, "little", signed=True) for v in values)
        return add(Constant(raw), [], Shape((Static(len(values)),), DType.I64))

    idx = indices if dtype is DType.I64 else add(Cast(DType.I64), [indices])
    dim, top, zero = const(dims), const([max(d - 1, 0) for d in dims]), const([0] * len(dims))
    wrapped = add(Where(), [add(Compare(CmpOp.LT), [idx, zero]), add(Binary(BinaryOp.ADD), [idx, dim]), idx])
    return add(Binary(BinaryOp.MAX), [add(Binary(BinaryOp.MIN), [wrapped, top]), zero])


def add_one_hot(add: Callable[..., int], operands: Sequence[Shape], attrs_axis: int, inputs: Sequence[int],
                shape: Shape, path: str, name: str | None, origin: NodeOrigin | None) -> int:
    """`onnx.OneHot` as rlx-cpu's kernel computes it (`one_hot_fill`), spelled as Compare / Where."""
    if len(inputs) != 3:
        raise UnsupportedOpFormatError(f"{path}: {ONE_HOT_NAME} takes 3 inputs (indices, depth, values), got {len(inputs)}")
    indices = operands[0]
    rank = len(shape.dims)
    if not shape.is_static or rank < 1 or not indices.is_static or len(indices.dims) != rank - 1:
        raise UnsupportedOpFormatError(
            f"{path}: {ONE_HOT_NAME} needs static shapes with the output one rank above the indices,"
            f" got indices {indices} and output {shape}")
    axis = max(rank + attrs_axis, 0) if attrs_axis < 0 else min(attrs_axis, rank - 1)
    depth = shape.sizes()[axis]

    def const(values: list[int], dims: Sequence[int]) -> int:
        raw = b"".join(int(v).to_bytes(8, "little", signed=True) for v in values)
        return add(Constant(raw), [], Shape(tuple(Static(d) for d in dims), DType.I64))

    idx = inputs[0] if indices.dtype is DType.I64 else add(Cast(DType.I64), [inputs[0]])
    zero, size = const([0], [1]), const([depth], [1])
    wrapped = add(Where(), [add(Compare(CmpOp.LT), [idx, zero]), add(Binary(BinaryOp.ADD), [idx, size]), idx])
    sizes = list(indices.sizes())
    column = add(Reshape((*sizes[:axis], 1, *sizes[axis:])), [wrapped])
    positions = const(list(range(depth)), [depth if i == axis else 1 for i in range(rank)])
    hot = add(Compare(CmpOp.EQ), [column, positions])
    off, on = add(Narrow(0, 0, 1), [inputs[2]]), add(Narrow(0, 1, 1), [inputs[2]])
    return add(Where(), [hot, on, off], shape, name=name, origin=origin)


def add_cum_prod(add: Callable[..., int], node_of: Callable[[int], Node], attrs: CumProdAttrs, inputs: Sequence[int],
                 shape: Shape, path: str, name: str | None, origin: NodeOrigin | None) -> int:
    """`onnx.CumProd` as rlx-cpu's kernel (`cumprod`) computes it."""
    if len(inputs) not in (1, 2):
        raise UnsupportedOpFormatError(f"{path}: {CUM_PROD_NAME} takes 1 or 2 inputs, got {len(inputs)}")
    raw = attrs.axis
    if len(inputs) == 2 and node_of(inputs[1]).shape.dtype is DType.I64:
        axis_node = node_of(inputs[1])
        if not isinstance(axis_node.op, Constant) or len(axis_node.op.data) < 8:
            raise UnsupportedOpFormatError(
                f"{path}: {CUM_PROD_NAME} reads its axis from input 1 at run time; only a Constant axis is read")
        raw = int.from_bytes(axis_node.op.data[:8], "little", signed=True)
    rank = max(len(node_of(inputs[0]).shape.dims), 1)
    axis = min(max(raw + rank if raw < 0 else raw, 0), rank - 1)
    x = inputs[0]
    if not attrs.reverse:
        return add(CumProd(axis, attrs.exclusive), [x], shape, name=name, origin=origin)
    scanned = add(CumProd(axis, attrs.exclusive), [add(Reverse((axis,)), [x])])
    return add(Reverse((axis,)), [scanned], shape, name=name, origin=origin)


def add_einsum(add: Callable[..., int], operands: Sequence[Shape], equation: str, inputs: Sequence[int],
               shape: Shape, path: str, name: str | None, origin: NodeOrigin | None) -> int:
    """`onnx.Einsum` as a broadcast product over every label and a sum over the dropped ones."""

    def refuse(why: str) -> UnsupportedOpFormatError:
        return UnsupportedOpFormatError(f"{path}: {EINSUM_NAME} {equation!r}: {why}")

    eq = "".join(equation.split())
    if "..." in eq:
        raise refuse("an ellipsis is not supported (nor by upstream's kernel)")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(inputs):
        raise refuse(f"{len(terms)} terms for {len(inputs)} inputs")
    sizes: dict[str, int] = {}
    for term, operand in zip(terms, operands, strict=True):
        if not operand.is_static or len(term) != len(operand.dims):
            raise refuse(f"term {term!r} does not name each axis of the static {operand}")
        if len(set(term)) != len(term):
            raise refuse(f"term {term!r} repeats a label (a diagonal)")
        for label, size in zip(term, operand.sizes(), strict=True):
            if sizes.setdefault(label, size) != size:
                raise refuse(f"label {label!r} has sizes {sizes[label]} and {size}")
    counts = {label: sum(term.count(label) for term in terms) for label in sizes}
    output = rhs if arrow else "".join(sorted(label for label, n in counts.items() if n == 1))
    if len(set(output)) != len(output) or not set(output) <= set(sizes):
        raise refuse(f"the output {output!r} repeats a label or names one no input has")
    labels = sorted(sizes, key=lambda label: (label not in output, output.find(label), label))
    product = None
    for term, x in zip(terms, inputs, strict=True):
        order = sorted(range(len(term)), key=lambda axis: labels.index(term[axis]))
        if order != list(range(len(term))):
            x = add(Transpose(tuple(order)), [x])
        x = add(Reshape(tuple(sizes[label] if label in term else 1 for label in labels)), [x])
        product = x if product is None else add(Binary(BinaryOp.MUL), [product, x])
    assert product is not None
    dropped = tuple(range(len(output), len(labels)))
    summed = add(Reduce(ReduceOp.SUM, dropped, False), [product]) if dropped else product
    return add(Reshape(tuple(sizes[label] for label in output)), [summed], shape, name=name, origin=origin)


def add_scatter_elements(add: Callable[..., int], operands: Sequence[Shape], attrs: ScatterElementsAttrs,
                         inputs: Sequence[int], shape: Shape, path: str, name: str | None,
                         origin: NodeOrigin | None) -> int:
    """`onnx.ScatterElements` as rlx-cpu's `scatter_elements_f32` computes it, where that is an
    ONNX ScatterElements at all (see the module notes)."""
    if len(inputs) != 3:
        raise UnsupportedOpFormatError(f"{path}: {SCATTER_ELEMENTS_NAME} takes 3 inputs, got {len(inputs)}")
    data, indices, updates = operands
    rank = len(data.dims)
    axis = min(max(attrs.axis + rank if attrs.axis < 0 else attrs.axis, 0), max(rank - 1, 0))
    if not data.dtype.is_float or not (data.is_static and indices.is_static) or rank < 1:
        raise UnsupportedOpFormatError(
            f"{path}: {SCATTER_ELEMENTS_NAME} is read for float data of static shape, got {data}")
    sizes = list(data.sizes())
    shapes = (sizes, [*sizes[:axis], 1, *sizes[axis + 1:]]) if rank > 1 else None  # 1-D: any one length
    if indices.dims != updates.dims or (list(indices.sizes()) not in shapes if shapes else len(indices.dims) != 1):
        raise UnsupportedOpFormatError(
            f"{path}: {SCATTER_ELEMENTS_NAME} indices {indices} and updates {updates} must have data {data}'s shape"
            f" (or 1 along axis {axis}): upstream's kernel maps other shapes by the index count, not as ONNX")

    def const(values: list[int]) -> int:
        raw = b"".join(int(v).to_bytes(8, "little", signed=True) for v in values)
        return add(Constant(raw), [], Shape((Static(1),), DType.I64))

    x = inputs[0]
    float_zero = add(Cast(data.dtype), [const([0])])
    finite = add(Compare(CmpOp.EQ), [add(Binary(BinaryOp.SUB), [x, x]), float_zero])  # false for inf and NaN
    x = add(Where(), [finite, x, float_zero])
    idx = inputs[1] if indices.dtype is DType.I64 else add(Cast(DType.I64), [inputs[1]])
    idx = add(Binary(BinaryOp.MAX), [idx, const([0])])
    op = ScatterElements(axis, attrs.reduction)
    if rank > 1:
        idx = add(Binary(BinaryOp.MIN), [idx, const([sizes[axis] - 1])])
        return add(op, [x, idx, inputs[2]], shape, name=name, origin=origin)
    # 1-D: an index past the end writes nothing; send it to a spare slot that is then dropped.
    past = add(Compare(CmpOp.GE), [idx, const([sizes[0]])])
    idx = add(Where(), [past, const([sizes[0]]), idx])
    padded = add(Concat(0), [x, float_zero])
    return add(Narrow(0, 0, sizes[0]), [add(op, [padded, idx, inputs[2]])], shape, name=name, origin=origin)
