"""Graphs that declare C64 tensors, read into rlx_mil's interleaved form (docs/upstream-ops-3.md).

Core ML has no complex type. As upstream's Core ML backend does before lowering
(`promote_c64_to_interleaved_f32`), every C64 tensor `[.., n]` becomes F32 `[.., 2n]` holding
`(re_0, im_0, re_1, im_1, ..)`: the bytes of a C64 Constant are already those pairs. Unlike that
pass, which only rewrites shapes, each op that reads a complex value is rewritten so its value is
the complex op's: a Reshape's target doubles its last dim, a Narrow on the last axis doubles its
start and length, a C64 Fft (upstream's interleaved form) becomes the real-block Fft between two
lane permutations, a complex Mul the product of pairs. An op on C64 values outside that set is
refused by name, never read as real numbers. C128 stays refused (rlx_mil's IR has no f64 pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.node import NodeOrigin
from rlx_mil.ir.ops import (
    Binary,
    BinaryOp,
    ComplexNormSq,
    Concat,
    Conjugate,
    Constant,
    Fft,
    Input,
    Narrow,
    Op,
    Param,
    Reshape,
    Transpose,
)
from rlx_mil.ir.shape import Shape, Static

#: Ops whose value on interleaved pairs is the complex op's value, unchanged.
_UNCHANGED = (Input, Param, Constant, ComplexNormSq, Conjugate)

AddNode = Callable[..., int]


def promoted(shape: Shape, path: str = "shape") -> Shape:
    """A C64 shape `[.., n]` as interleaved F32 `[.., 2n]` (a scalar as `[2]`)."""
    if shape.dtype is not DType.C64:
        return shape
    if not shape.dims:
        return Shape((Static(2),), DType.F32)
    last = shape.dims[-1]
    if not isinstance(last, Static):
        raise UnsupportedOpFormatError(f"{path}: a C64 tensor {shape} needs a static last dim to hold re, im pairs")
    return Shape((*shape.dims[:-1], Static(2 * last.size)), DType.F32)


def add_promoted(
    add: AddNode, shape_of: Callable[[int], Shape], op: Op, inputs: Sequence[int], shape: Shape, complex_ids: set[int],
    path: str, name: str | None, origin: NodeOrigin | None,
) -> int:
    """Add one decoded node whose inputs or output may be C64 (inputs already mapped to the
    interleaved form, `complex_ids` holding those that were C64); its id, recorded there if
    its value is complex."""
    reads = [i in complex_ids for i in inputs]
    makes = shape.dtype is DType.C64
    if not makes and not any(reads):
        return int(add(op, inputs, shape, name=name, origin=origin))
    out = promoted(shape, f"{path}.shape")
    node = _rewrite(add, shape_of, op, list(inputs), reads, shape, out, path, name, origin)
    if makes:
        complex_ids.add(node)
    return node


def _rewrite(add: AddNode, shape_of: Callable[[int], Shape], op: Op, inputs: list[int], reads: list[bool], shape: Shape,
             out: Shape, path: str, name: str | None, origin: NodeOrigin | None) -> int:
    kind = op.type_name
    if isinstance(op, _UNCHANGED):  # leaves make pairs, ComplexNormSq and Conjugate read them
        return int(add(op, inputs, out, name=name, origin=origin))
    if shape.dtype is DType.C64 and all(reads):
        if isinstance(op, Binary) and op.op in (BinaryOp.ADD, BinaryOp.SUB):
            _same_pairs(shape_of, inputs, path, kind)
            return int(add(op, inputs, out, name=name, origin=origin))
        if isinstance(op, Binary) and op.op is BinaryOp.MUL:
            _same_pairs(shape_of, inputs, path, kind)
            return _complex_mul(add, shape_of, inputs, out, name, origin)
        if isinstance(op, (Reshape, Transpose, Narrow, Concat, Fft)):
            return _layout(add, shape_of, op, inputs, out, name, origin)
    reading = "reads" if any(reads) else "makes"
    raise UnsupportedOpFormatError(
        f"{path}: {kind} {reading} C64 values; rlx_mil holds C64 as interleaved F32 pairs and reads only"
        " Input/Param/Constant, ComplexNormSq, Conjugate, Fft, Add/Sub/Mul, Reshape, Transpose, Narrow"
        " and Concat of them"
    )


def _same_pairs(shape_of: Callable[[int], Shape], inputs: list[int], path: str, kind: str) -> None:
    a, b = (shape_of(i) for i in inputs)
    if a.dims[-1:] != b.dims[-1:]:
        raise UnsupportedOpFormatError(f"{path}: {kind} broadcasts along the last axis of C64 values {a}, {b}")


def _layout(add: AddNode, shape_of: Callable[[int], Shape], op: Op, inputs: list[int], out: Shape,
            name: str | None, origin: NodeOrigin | None) -> int:
    """Reshape, Transpose, Narrow, Concat and Fft on interleaved values."""
    x = inputs[0]
    rank = shape_of(x).rank
    if isinstance(op, Reshape):
        return int(add(Reshape(tuple(out.sizes())), inputs, out, name=name, origin=origin))
    if isinstance(op, Narrow) and op.axis == rank - 1:
        return int(add(Narrow(op.axis, 2 * op.start, 2 * op.len), inputs, out, name=name, origin=origin))
    if isinstance(op, (Narrow, Concat)):  # other axes, and the last one for Concat, keep pairs whole
        return int(add(op, inputs, out, name=name, origin=origin))
    pairs = _split_pairs(add, shape_of, x)
    if isinstance(op, Transpose):
        moved = add(Transpose((*op.perm, rank)), [pairs])
        return int(add(Reshape(tuple(out.sizes())), [moved], out, name=name, origin=origin))
    assert isinstance(op, Fft)
    # interleaved [.., N, 2] -> real-block [.., 2, N] -> Fft -> back to [.., N, 2]
    lead = shape_of(pairs).sizes()[:-2]
    n = shape_of(pairs).sizes()[-2]
    swap = (*range(rank - 1), rank, rank - 1)
    block = add(Reshape((*lead, 2 * n)), [add(Transpose(swap), [pairs])])
    spectrum = add(Reshape((*lead, 2, n)), [add(Fft(op.inverse, op.norm), [block])])
    return int(add(Reshape(tuple(out.sizes())), [add(Transpose(swap), [spectrum])], out, name=name, origin=origin))


def _split_pairs(add: AddNode, shape_of: Callable[[int], Shape], x: int) -> int:
    """Interleaved `[.., 2n]` as `[.., n, 2]`."""
    sizes = shape_of(x).sizes()
    return int(add(Reshape((*sizes[:-1], sizes[-1] // 2, 2)), [x]))


def _complex_mul(add: AddNode, shape_of: Callable[[int], Shape], inputs: list[int], out: Shape,
                 name: str | None, origin: NodeOrigin | None) -> int:
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i on `[.., n, 2]` pairs."""
    lhs, rhs = (_split_pairs(add, shape_of, i) for i in inputs)
    axis = shape_of(lhs).rank - 1

    def lane(x: int, k: int) -> int:
        return int(add(Narrow(axis, k, 1), [x]))

    a, b, c, d = lane(lhs, 0), lane(lhs, 1), lane(rhs, 0), lane(rhs, 1)

    def binary(kind: BinaryOp, x: int, y: int) -> int:
        return int(add(Binary(kind), [x, y]))

    re = binary(BinaryOp.SUB, binary(BinaryOp.MUL, a, c), binary(BinaryOp.MUL, b, d))
    im = binary(BinaryOp.ADD, binary(BinaryOp.MUL, a, d), binary(BinaryOp.MUL, b, c))
    product = add(Concat(axis), [re, im])
    return int(add(Reshape(tuple(out.sizes())), [product], out, name=name, origin=origin))
