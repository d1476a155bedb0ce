"""Reference kernels of the reductions: softmax, reduce, cumsum, top-k, and the scans, arg-reductions
and sorts of spec part 2, section 3 (CumProd, CumMax, ArgMax, ArgMin, Sort, ArgSort)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import (
    ArgMax,
    ArgMin,
    ArgSort,
    CumMax,
    CumProd,
    Cumsum,
    Reduce,
    ReduceOp,
    Softmax,
    Sort,
    TopK,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import (
    finish,
    float_operands,
    reference_kernel,
    signed_axis,
    unsigned_axis,
)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    (v,) = float_operands(x)
    with np.errstate(all="ignore"):
        e = np.exp(v - v.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


@reference_kernel(Softmax)
def _softmax(op: Softmax, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    axis = signed_axis(op.axis, inputs[0].ndim)
    return finish(softmax(inputs[0], axis), out)


def reduce(kind: ReduceOp, x: np.ndarray, axes: Sequence[int], keep_dim: bool) -> np.ndarray:
    rank = x.ndim
    if not axes:
        raise AttributeValueError("axes must not be empty")
    if len(set(axes)) != len(axes):
        raise AttributeValueError(f"axes {list(axes)} repeat an axis")
    for a in axes:
        unsigned_axis(a, rank, "reduce axis")
    (v,) = float_operands(x)
    ax = tuple(axes)
    with np.errstate(all="ignore"):
        if kind is ReduceOp.SUM:
            return np.sum(v, axis=ax, keepdims=keep_dim)
        if kind is ReduceOp.MEAN:
            count = math.prod(v.shape[a] for a in ax)
            return np.sum(v, axis=ax, keepdims=keep_dim) / v.dtype.type(count)
        if kind is ReduceOp.PROD:
            return np.prod(v, axis=ax, keepdims=keep_dim)
        if any(v.shape[a] == 0 for a in ax):
            raise ShapeError(f"{kind.value} over an empty axis of {list(x.shape)}", operand="x")
        ufunc = np.fmax if kind is ReduceOp.MAX else np.fmin
        return np.asarray(ufunc.reduce(v, axis=ax, keepdims=keep_dim))  # type: ignore[call-overload]


@reference_kernel(Reduce)
def _reduce(op: Reduce, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(reduce(op.op, inputs[0], op.axes, op.keep_dim), out)


def cumsum(x: np.ndarray, axis: int, exclusive: bool) -> np.ndarray:
    (v,) = float_operands(x)
    inclusive = np.cumsum(v, axis=axis, dtype=v.dtype)
    if not exclusive:
        return inclusive
    # Shift rather than subtract x, so y_i is exactly the sum of x_j for j < i.
    shifted = np.zeros_like(inclusive)
    index: list[slice] = [slice(None)] * v.ndim
    index[axis] = slice(1, None)
    head: list[slice] = [slice(None)] * v.ndim
    head[axis] = slice(0, -1)
    if v.shape[axis] > 1:
        shifted[tuple(index)] = inclusive[tuple(head)]
    return shifted


@reference_kernel(Cumsum)
def _cumsum(op: Cumsum, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    axis = signed_axis(op.axis, inputs[0].ndim)
    return finish(cumsum(inputs[0], axis, op.exclusive), out)


def top_k_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values along the last axis, descending, ties by smaller index."""
    if x.ndim < 1:
        raise ShapeError("TopK needs rank >= 1", operand="x")
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise AttributeValueError(f"k={k} must lie in 1..{n} (the last dim)")
    (v,) = float_operands(x)
    order = np.argsort(-v, axis=-1, kind="stable")
    return order[..., :k].astype(np.float32)


@reference_kernel(TopK)
def _top_k(op: TopK, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(top_k_indices(inputs[0], op.k), out)


def shift_exclusive(inclusive: np.ndarray, axis: int, identity: np.generic) -> np.ndarray:
    """The exclusive scan from the inclusive one: shifted right by one, `identity` first."""
    shifted = np.full_like(inclusive, identity)
    body: list[slice] = [slice(None)] * inclusive.ndim
    body[axis] = slice(1, None)
    head: list[slice] = [slice(None)] * inclusive.ndim
    head[axis] = slice(0, -1)
    shifted[tuple(body)] = inclusive[tuple(head)]
    return shifted


def _scan_operand(x: np.ndarray) -> np.ndarray:
    """Integers (and Bool as 0/1) scan exactly in int64; floats in float32 (float64 for F64)."""
    if x.dtype.kind in "biu":
        return x.astype(np.int64)
    return float_operands(x)[0]


def smallest_value(dtype: DType, held: np.dtype) -> np.generic:
    """The identity of a running maximum in `dtype`: -inf for floats, else the smallest value."""
    if held.kind == "f":
        return held.type(-np.inf)
    if dtype is DType.BOOL:
        return held.type(0)
    return held.type(np.iinfo(dtype.numpy).min)


@reference_kernel(CumProd)
def _cumprod(op: CumProd, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """`np.cumprod` along any axis (spec part 2, 3.9); integers wrap into the declared dtype."""
    x = _scan_operand(inputs[0])
    axis = signed_axis(op.axis, x.ndim)
    with np.errstate(all="ignore"):
        inclusive = np.cumprod(x, axis=axis, dtype=x.dtype)
    result = shift_exclusive(inclusive, axis, x.dtype.type(1)) if op.exclusive else inclusive
    return finish(result, out)


@reference_kernel(CumMax)
def _cummax(op: CumMax, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """Running NaN-ignoring maximum (`np.fmax.accumulate`): NaN only while every element so far
    is NaN. The exclusive form starts from -inf (the dtype's smallest value for integers)."""
    x = _scan_operand(inputs[0])
    axis = signed_axis(op.axis, x.ndim)
    inclusive = np.fmax.accumulate(x, axis=axis) if x.size else x
    if not op.exclusive:
        return finish(inclusive, out)
    return finish(shift_exclusive(inclusive, axis, smallest_value(out.dtype, x.dtype)), out)


def arg_extreme(x: np.ndarray, axis: int, keep_dim: bool, *, largest: bool) -> np.ndarray:
    """Upstream's CPU scan (spec part 2, 3.10) in closed form: the first index holding the
    NaN-ignoring extreme (strict comparisons keep the first of equal values, -0.0 == 0.0), and
    index 0 when element 0 is NaN (nothing compares past it)."""
    if x.shape[axis] == 0:
        raise ShapeError(f"the arg-reduction axis {axis} of {list(x.shape)} is empty", operand="x")
    v = _scan_operand(x)
    moved = np.moveaxis(v, axis, -1)
    extreme = (np.fmax if largest else np.fmin).reduce(moved, axis=-1, keepdims=True)
    first = np.argmax(moved == extreme, axis=-1)
    if moved.dtype.kind == "f":
        first = np.where(np.isnan(moved[..., 0]), 0, first)
    idx = first.astype(np.float32)
    return np.expand_dims(idx, axis) if keep_dim else idx


@reference_kernel(ArgMax)
def _argmax(op: ArgMax, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    return finish(arg_extreme(x, unsigned_axis(op.axis, x.ndim), op.keep_dim, largest=True), out)


@reference_kernel(ArgMin)
def _argmin(op: ArgMin, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    return finish(arg_extreme(x, unsigned_axis(op.axis, x.ndim), op.keep_dim, largest=False), out)


def stable_order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """The stable sort permutation along `axis` (spec part 2, 3.11): equal values keep ascending
    index order in both directions, NaN sorts last in both."""
    v = _scan_operand(x)
    if not descending:
        return np.argsort(v, axis=axis, kind="stable")
    if v.dtype.kind == "f":
        return np.argsort(-v, axis=axis, kind="stable")
    # Integers: sort the reversed line ascending, then read it backwards (no negation overflow).
    n = v.shape[axis]
    backwards = np.argsort(np.flip(v, axis=axis), axis=axis, kind="stable")
    return np.flip(n - 1 - backwards, axis=axis)


@reference_kernel(Sort)
def _sort(op: Sort, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    axis = unsigned_axis(op.axis, x.ndim)
    return finish(np.take_along_axis(x, stable_order(x, axis, op.descending), axis=axis), out)


@reference_kernel(ArgSort)
def _argsort(op: ArgSort, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    axis = unsigned_axis(op.axis, x.ndim)
    return finish(stable_order(x, axis, op.descending).astype(np.float32), out)
