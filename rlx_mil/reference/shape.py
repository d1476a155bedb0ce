"""Reference kernels of data movement: reshape, transpose, narrow, concat, expand, gather."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, EvaluationError, ShapeError
from rlx_mil.ir.ops import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Reshape,
    Transpose,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import (
    finish,
    float_operands,
    reference_kernel,
    unsigned_axis,
)


def reshape_target(sizes: tuple[int, ...], new_shape: Sequence[int]) -> tuple[int, ...]:
    """Resolve `new_shape` (at most one -1; 0 is a literal size) against `sizes`."""
    if sum(1 for d in new_shape if d == -1) > 1:
        raise AttributeValueError(f"new_shape {list(new_shape)} has more than one -1")
    if any(d < -1 for d in new_shape):
        raise AttributeValueError(f"new_shape {list(new_shape)} has a negative size other than -1")
    numel = math.prod(sizes)
    known = math.prod(d for d in new_shape if d != -1)
    if -1 in new_shape:
        if known == 0 or numel % known != 0:
            raise ShapeError(f"cannot reshape {list(sizes)} to {list(new_shape)}", operand="x")
        return tuple(numel // known if d == -1 else d for d in new_shape)
    if known != numel:
        raise ShapeError(f"cannot reshape {list(sizes)} ({numel} elements) to {list(new_shape)}", operand="x")
    return tuple(new_shape)


@reference_kernel(Reshape)
def _reshape(op: Reshape, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    return finish(x.reshape(reshape_target(x.shape, op.new_shape)), out)


@reference_kernel(Transpose)
def _transpose(op: Transpose, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    if sorted(op.perm) != list(range(x.ndim)):
        raise AttributeValueError(f"perm {list(op.perm)} is not a permutation of 0..{x.ndim - 1}")
    return finish(np.transpose(x, op.perm), out)


@reference_kernel(Narrow)
def _narrow(op: Narrow, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    axis = unsigned_axis(op.axis, x.ndim)
    if op.start < 0 or op.len < 0 or op.start + op.len > x.shape[axis]:
        raise AttributeValueError(
            f"slice start={op.start} len={op.len} does not fit axis {axis} of size {x.shape[axis]}"
        )
    index: list[slice] = [slice(None)] * x.ndim
    index[axis] = slice(op.start, op.start + op.len)
    return finish(x[tuple(index)], out)


@reference_kernel(Concat)
def _concat(op: Concat, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    if not inputs:
        raise ShapeError("Concat needs at least one input")
    first = inputs[0]
    axis = unsigned_axis(op.axis, first.ndim)
    for pos, t in enumerate(inputs[1:], start=1):
        same_rest = t.ndim == first.ndim and all(
            t.shape[d] == first.shape[d] for d in range(first.ndim) if d != axis
        )
        if not same_rest:
            raise ShapeError(
                f"input {pos} {list(t.shape)} does not match input 0 {list(first.shape)} off axis {axis}",
                operand=str(pos),
            )
    if len({t.dtype for t in inputs}) > 1:
        arrays = float_operands(*inputs)
    else:
        arrays = list(inputs)
    return finish(np.concatenate(arrays, axis=axis), out)


def expand_target(sizes: tuple[int, ...], target: Sequence[int]) -> tuple[int, ...]:
    if len(target) < len(sizes):
        raise AttributeValueError(f"target_shape {list(target)} has lower rank than the input {list(sizes)}")
    padded = (1,) * (len(target) - len(sizes)) + tuple(sizes)
    result = []
    for have, want in zip(padded, target, strict=True):
        if want == -1:
            result.append(have)
        elif want < 0:
            raise AttributeValueError(f"target_shape {list(target)} has a negative size other than -1")
        elif have != want and have != 1:
            raise ShapeError(f"cannot expand {list(sizes)} to {list(target)}: only size-1 dims may grow", operand="x")
        else:
            result.append(want)
    return tuple(result)


@reference_kernel(Expand)
def _expand(op: Expand, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    target = expand_target(x.shape, op.target_shape)
    padded = x.reshape((1,) * (len(target) - x.ndim) + x.shape)
    return finish(np.broadcast_to(padded, target), out)


def gather_indices(indices: np.ndarray, limit: int) -> np.ndarray:
    """int64 indices: floats truncate toward zero; every index must lie in [0, limit)."""
    if indices.dtype.kind == "f":
        finite = np.isfinite(indices)
        if not finite.all():
            raise EvaluationError("Gather indices must be finite", [f"{int((~finite).sum())} NaN/inf indices"])
        idx = np.trunc(indices.astype(np.float64)).astype(np.int64)
    else:
        idx = indices.astype(np.int64)
    bad = (idx < 0) | (idx >= limit)
    if bad.any():
        examples = ", ".join(str(int(i)) for i in np.unique(idx[bad])[:5])
        raise EvaluationError(
            "Gather index out of range",
            [f"{int(bad.sum())} indices outside [0, {limit}), e.g. {examples}"],
        )
    return idx


@reference_kernel(Gather)
def _gather(op: Gather, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    table, indices = inputs
    axis = unsigned_axis(op.axis, table.ndim)
    idx = gather_indices(indices, table.shape[axis])
    return finish(np.take(table, idx, axis=axis), out)
