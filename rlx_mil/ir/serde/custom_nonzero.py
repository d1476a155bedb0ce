"""Upstream's `onnx.NonZero` as rlx-cpu's kernel computes it (`NonZeroKernel`): not ONNX's
value-sized output but the node's declared one. The flat output of L elements holds, for the
input's rank r and `cols = L // r`, the row-major coordinates of the first `cols` non-zero
elements laid out `[r, cols]` (coordinate d of the c-th non-zero at `d * cols + c`); every other
element is 0. (NaN is non-zero, as `v != 0.0` says.)

That is a static computation: each element's rank among the non-zeros is an exclusive Cumsum of
the non-zero mask; column c holds the flat position whose rank is c (a Compare against the
column numbers and a Reduce Sum of the positions where it matches: at most one does, and none
gives 0, the kernel's fill); the coordinates are that position divided by the strides, modulo
the sizes. The comparison is `[cols, size]`, so it is read up to `NONZERO_MAX_PAIRS` elements;
a scalar input (whose strides the kernel indexes out of range) and dynamic shapes are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.node import NodeOrigin
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.ops.elementwise import Binary, BinaryOp, Cast, CmpOp, Compare, Where
from rlx_mil.ir.ops.leaf import Constant
from rlx_mil.ir.ops.reduce import Cumsum, Reduce, ReduceOp
from rlx_mil.ir.ops.shape import Concat, Reshape
from rlx_mil.ir.shape import Shape, Static

NON_ZERO_NAME = "onnx.NonZero"
#: The largest `cols * input size` comparison read (16M elements of I64 in the reference).
NONZERO_MAX_PAIRS = 1 << 24


@dataclass(frozen=True)
class NonZeroRead(Op):
    """An `onnx.NonZero` node while it is read (never added to a graph)."""

    type_name: ClassVar[str] = "onnx.NonZero"


def add_non_zero(add: Callable[..., int], operands: Sequence[Shape], inputs: Sequence[int], shape: Shape, path: str,
                 name: str | None, origin: NodeOrigin | None) -> int:
    """The IR nodes of `onnx.NonZero` on its one input; returns the output node."""
    if len(inputs) != 1:
        raise UnsupportedOpFormatError(f"{path}: {NON_ZERO_NAME} takes 1 input, got {len(inputs)}")
    operand, x = operands[0], inputs[0]
    if not operand.is_static or not shape.is_static or not operand.dims or not math.prod(shape.sizes()):
        raise UnsupportedOpFormatError(
            f"{path}: {NON_ZERO_NAME} is read for a static input of rank >= 1 and a static, non-empty output, got"
            f" {operand} -> {shape}")
    sizes = list(operand.sizes())
    rank, size, total = len(sizes), math.prod(sizes), math.prod(shape.sizes())
    cols = total // rank
    if cols * size > NONZERO_MAX_PAIRS:
        raise UnsupportedOpFormatError(
            f"{path}: {NON_ZERO_NAME} compares {cols} output columns with {size} elements; more than"
            f" {NONZERO_MAX_PAIRS} pairs is refused")

    def const(values: Sequence[int], dims: Sequence[int]) -> int:
        return add(Constant(np.asarray(values, np.int64).tobytes()), [], Shape(tuple(Static(d) for d in dims), DType.I64))

    zero = const([0], [1])
    flat_parts: list[int] = []
    if cols and size:
        flat = add(Reshape((size,)), [x]) if rank != 1 else x
        nonzero = add(Compare(CmpOp.NE), [flat, add(Cast(operand.dtype), [zero])])
        rank_of = add(Cumsum(0, True), [add(Cast(DType.I64), [nonzero])])
        rank_of = add(Reshape((1, size)), [add(Where(), [nonzero, rank_of, const([-1], [1])])])
        hit = add(Compare(CmpOp.EQ), [rank_of, const(range(cols), [cols, 1])])
        where = add(Reduce(ReduceOp.SUM, (1,), False), [add(Where(), [hit, const(range(size), [1, size]), zero])])
        strides = [math.prod(sizes[d + 1:]) for d in range(rank)]
        for d in range(rank):
            coord = add(Binary(BinaryOp.DIV), [where, const([strides[d]], [1])]) if strides[d] != 1 else where
            coord = add(Binary(BinaryOp.MOD), [coord, const([sizes[d]], [1])]) if d else coord
            flat_parts.append(coord)
    elif cols:
        flat_parts.append(const([0] * (rank * cols), [rank * cols]))
    if total > rank * cols:
        flat_parts.append(const([0] * (total - rank * cols), [total - rank * cols]))
    out = flat_parts[0] if len(flat_parts) == 1 else add(Concat(0), flat_parts)
    if shape.dtype is not DType.I64:
        out = add(Cast(shape.dtype), [out])
    return add(Reshape(tuple(shape.sizes())), [out], shape, name=name, origin=origin)
