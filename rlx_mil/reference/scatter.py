"""Reference kernels of scatter / gather: ScatterAdd, ScatterNd, ScatterElements, GatherNd, GatherElements.

Semantics (spec part 2, section 4): ONNX opset-16. Indices are truncated toward zero (float
indices) and, except for ScatterAdd, may be negative (counting from the end). An index out of
range is an EvaluationError (upstream's CPU clamps; rlx_mil refuses, section 9 Q25/Q26).
Updates apply in row-major order of the index positions: with reduction None the last write
to a destination wins; Max/Min ignore NaN (upstream's `f32::max`/`f32::min`, NumPy's
fmax/fmin); integer data wraps on overflow as two's-complement arithmetic does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rlx_mil.errors import EvaluationError
from rlx_mil.ir.ops import (
    GatherElements,
    GatherNd,
    ScatterAdd,
    ScatterElements,
    ScatterNd,
    ScatterNdReduction,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, reference_kernel, signed_axis, static_sizes, unsigned_axis

_COMBINE: dict[ScatterNdReduction, Callable[..., None]] = {
    ScatterNdReduction.ADD: np.add.at,
    ScatterNdReduction.MUL: np.multiply.at,
    ScatterNdReduction.MAX: np.fmax.at,
    ScatterNdReduction.MIN: np.fmin.at,
}


def decode_indices(indices: np.ndarray, op: str) -> np.ndarray:
    """Index values as int64: float indices truncate toward zero; NaN/inf is an error."""
    arr = np.asarray(indices)
    if arr.dtype.kind == "f":
        finite = np.isfinite(arr)
        if not finite.all():
            raise EvaluationError(f"{op} indices must be finite", [f"{int((~finite).sum())} NaN/inf indices"])
        return np.trunc(arr.astype(np.float64)).astype(np.int64)
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    return arr.astype(np.int64)


def resolve_indices(idx: np.ndarray, dims: np.ndarray | int, op: str, *, negative: bool = True) -> np.ndarray:
    """Wrap negative indices (when allowed) and refuse any outside `[-dim, dim)` / `[0, dim)`."""
    dims = np.broadcast_to(np.asarray(dims, dtype=np.int64), idx.shape)
    low = -dims if negative else np.zeros_like(dims)
    bad = (idx < low) | (idx >= dims)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        allowed = f"[-{dims[where]}, {dims[where]})" if negative else f"[0, {dims[where]})"
        raise EvaluationError(
            f"{op} index out of range",
            [f"{int(bad.sum())} indices outside their dim, e.g. {int(idx[where])} at {list(where)} (allowed {allowed})"],
        )
    return np.where(idx < 0, idx + dims, idx)


def working_copy(data: np.ndarray) -> np.ndarray:
    """`data` in the dtype the scatter computes in: float32 (float64 for F64), ints as they are."""
    if data.dtype.kind == "f" and data.dtype != np.float64:
        return data.astype(np.float32)
    return data.copy()


def _updates_like(updates: np.ndarray, out: np.ndarray) -> np.ndarray:
    return updates.astype(out.dtype, copy=False)


def scatter_flat(
    out: np.ndarray, rows: np.ndarray, updates: np.ndarray, reduction: ScatterNdReduction
) -> None:
    """Apply `updates[i]` to `out[rows[i]]` (rows index the first axis of `out`) in order of i."""
    with np.errstate(over="ignore", invalid="ignore"):
        if reduction is ScatterNdReduction.NONE:
            # Last write wins: keep, per destination, the last position that writes it.
            reversed_first = np.unique(rows[::-1], return_index=True)[1]
            last = len(rows) - 1 - reversed_first
            out[rows[last]] = updates[last]
        else:
            _COMBINE[reduction](out, rows, updates)


@reference_kernel(ScatterAdd)
def _scatter_add(op: ScatterAdd, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    updates, indices = inputs
    axis = unsigned_axis(op.axis, updates.ndim)
    sizes = static_sizes(out, "ScatterAdd")
    result = working_copy(np.zeros(sizes, dtype=updates.dtype))
    idx = resolve_indices(decode_indices(indices, "ScatterAdd").reshape(-1), sizes[axis], "ScatterAdd", negative=False)
    moved = np.moveaxis(result, axis, 0)
    scatter_flat(moved, idx, _updates_like(np.moveaxis(updates, axis, 0), result), ScatterNdReduction.ADD)
    return finish(result, out)


@reference_kernel(ScatterNd)
def _scatter_nd(op: ScatterNd, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    data, indices, updates = inputs
    result = working_copy(data)
    idx = decode_indices(indices, "ScatterNd")
    k = idx.shape[-1]
    coords = resolve_indices(idx.reshape(-1, k), np.asarray(data.shape[:k]), "ScatterNd")
    rows = np.ravel_multi_index(tuple(coords.T), data.shape[:k]) if coords.size else np.zeros(0, np.int64)
    flat = result.reshape((int(np.prod(data.shape[:k])), *data.shape[k:]))
    flat_updates = _updates_like(updates, result).reshape((len(rows), *data.shape[k:]))
    scatter_flat(flat, rows, flat_updates, op.reduction)
    return finish(result, out)


def _element_rows(data_shape: tuple[int, ...], idx: np.ndarray, axis: int) -> np.ndarray:
    """Flat destinations in `data` of every index position (row-major)."""
    grid: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    full = np.broadcast_arrays(*grid)
    return np.ravel_multi_index(tuple(g.reshape(-1) for g in full), data_shape)


@reference_kernel(ScatterElements)
def _scatter_elements(op: ScatterElements, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    data, indices, updates = inputs
    axis = signed_axis(op.axis, data.ndim)
    result = working_copy(data)
    idx = resolve_indices(decode_indices(indices, "ScatterElements"), data.shape[axis], "ScatterElements")
    rows = _element_rows(data.shape, idx, axis) if idx.size else np.zeros(0, np.int64)
    scatter_flat(result.reshape(-1), rows, _updates_like(updates, result).reshape(-1), op.reduction)
    return finish(result, out)


@reference_kernel(GatherNd)
def _gather_nd(op: GatherNd, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    data, indices = inputs
    b = max(int(op.batch_dims), 0)
    idx = decode_indices(indices, "GatherNd")
    k = idx.shape[-1]
    coords = resolve_indices(idx, np.asarray(data.shape[b:b + k]), "GatherNd")
    batch = int(np.prod(data.shape[:b]))
    per_batch = coords.reshape((batch, -1, k))
    blocks = data.reshape((batch, *data.shape[b:]))
    picked = [block[tuple(c.T)] for block, c in zip(blocks, per_batch, strict=True)]
    inner = data.shape[b + k:]
    result = np.stack(picked) if picked else np.zeros((0, 0, *inner), data.dtype)
    return finish(result.reshape((*idx.shape[:-1], *inner)), out)


@reference_kernel(GatherElements)
def _gather_elements(op: GatherElements, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    data, indices = inputs
    axis = signed_axis(op.axis, data.ndim)
    idx = resolve_indices(decode_indices(indices, "GatherElements"), data.shape[axis], "GatherElements")
    grid: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    return finish(data[tuple(grid)], out)


__all__ = ["decode_indices", "resolve_indices", "scatter_flat", "working_copy"]
