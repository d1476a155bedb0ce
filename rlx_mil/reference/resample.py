"""Reference kernels of the nearest-neighbour resampling ops (part-2 spec 5.7, 5.8)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.ops import Interpolate3d, ResizeNearest2x
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, reference_kernel


def nearest_sources(size_in: int, size_out: int) -> np.ndarray:
    """Source index of every output cell: `min(dst * in // out, in - 1)` (integer arithmetic,
    so no float rounding decides a cell)."""
    return np.minimum((np.arange(size_out, dtype=np.int64) * size_in) // size_out, size_in - 1)


@reference_kernel(ResizeNearest2x)
def _resize_nearest_2x(op: ResizeNearest2x, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    if x.ndim != 4:
        raise ShapeError(f"x must be [N, C, H, W], got {list(x.shape)}", operand="x")
    return finish(x.repeat(2, axis=2).repeat(2, axis=3), out)


@reference_kernel(Interpolate3d)
def _interpolate3d(op: Interpolate3d, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    if x.ndim != 5:
        raise ShapeError(f"x must be [N, C, D, H, W], got {list(x.shape)}", operand="x")
    if len(op.size) != 3 or min(op.size) < 1:
        raise AttributeValueError(f"size must be three sizes >= 1, got {list(op.size)}")
    for axis, size_out in zip((2, 3, 4), op.size, strict=True):
        x = np.take(x, nearest_sources(x.shape[axis], size_out), axis=axis)
    return finish(x, out)
