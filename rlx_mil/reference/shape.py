"""Reference kernels of data movement: reshape, transpose, narrow, concat, expand, gather, and
the structural ops of spec part 2, section 3: pad, slice, tile, trilu, reverse."""

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
    Pad,
    PadKind,
    Reshape,
    Reverse,
    Slice,
    Tile,
    Transpose,
    Trilu,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import (
    finish,
    float_operands,
    reference_kernel,
    to_dtype,
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


_NP_PAD_MODES = {PadKind.REFLECT: "reflect", PadKind.REPLICATE: "edge", PadKind.CIRCULAR: "wrap"}


@reference_kernel(Pad)
def _pad(op: Pad, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """`np.pad` axis by axis (spec part 2, 3.4); the constant converts to the dtype with Cast semantics."""
    x = finish(inputs[0], out)
    if len(op.pads) != x.ndim:
        raise AttributeValueError(f"pads needs {x.ndim} (before, after) pairs, got {len(op.pads)}")
    kind = op.mode.kind
    if kind is PadKind.CONSTANT:
        fill = to_dtype(np.asarray(np.float32(op.mode.value or 0.0)), out.dtype)
        return np.pad(x, op.pads, mode="constant", constant_values=fill)
    for axis, (before, after) in enumerate(op.pads):
        limit = x.shape[axis] - 1 if kind is PadKind.REFLECT else x.shape[axis]
        if max(before, after) > limit or (x.shape[axis] == 0 and (before or after)):
            raise AttributeValueError(f"{kind.value} padding of axis {axis} (size {x.shape[axis]}) by {[before, after]}")
    return np.pad(x, op.pads, mode=_NP_PAD_MODES[kind])  # type: ignore[call-overload]


def slice_indices(size: int, start: int, length: int, step: int) -> np.ndarray:
    """The positions `start + j*step`, j < length; every one must lie in [0, size)."""
    if step == 0:
        raise AttributeValueError("step must not be 0")
    idx = start + step * np.arange(length, dtype=np.int64)
    if length and (idx.min() < 0 or idx.max() >= size):
        raise AttributeValueError(
            f"indices {start} .. {int(idx[-1])} (start {start}, len {length}, step {step}) leave the axis of size {size}"
        )
    return idx


@reference_kernel(Slice)
def _slice(op: Slice, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    axis = unsigned_axis(op.axis, x.ndim)
    return finish(np.take(x, slice_indices(x.shape[axis], op.start, op.len, op.step), axis=axis), out)


@reference_kernel(Tile)
def _tile(op: Tile, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    if len(op.reps) != x.ndim or any(r < 1 for r in op.reps):
        raise AttributeValueError(f"reps must hold one count >= 1 per axis of {list(x.shape)}, got {list(op.reps)}")
    return finish(np.tile(x, op.reps), out)


@reference_kernel(Trilu)
def _trilu(op: Trilu, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """Select semantics (spec part 2, section 9 Q17): the dropped triangle is 0 even where x is NaN/inf."""
    x = finish(inputs[0], out)
    if x.ndim < 2:
        raise ShapeError(f"Trilu needs rank >= 2, got {list(x.shape)}", operand="x")
    return np.triu(x, op.diagonal) if op.upper else np.tril(x, op.diagonal)


@reference_kernel(Reverse)
def _reverse(op: Reverse, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    for axis in op.axes:
        unsigned_axis(axis, x.ndim, "reverse axis")
    if len(set(op.axes)) != len(op.axes):
        raise AttributeValueError(f"axes must be unique, got {list(op.axes)}")
    return finish(np.flip(x, axis=tuple(op.axes)) if op.axes else x, out)
