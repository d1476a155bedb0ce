"""Reference kernels of the reductions: softmax, reduce, cumsum, top-k."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.ops import (
    Cumsum,
    Reduce,
    ReduceOp,
    Softmax,
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
