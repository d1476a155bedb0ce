"""Nearest-neighbour resampling: ResizeNearest2x and Interpolate3d (part-2 spec 5.7, 5.8)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.norm import input_sizes, require_float


@lowering(
    notes="`upsample_nearest_neighbor` with scale factors 2 x 2 (x is [N, C, H, W])",
)
def lower_resize_nearest_2x(op: ops.ResizeNearest2x, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 0, "x")
    if len(input_sizes(ctx, 0)) != 4:
        raise ctx.fail(ShapeError, f"x must be [N, C, H, W], got {list(input_sizes(ctx, 0))}", "x")
    return mb.upsample_nearest_neighbor(x=ctx.var(0), scale_factor_height=2, scale_factor_width=2, name=ctx.name())


@lowering(
    notes=(
        "one `gather` per resized axis with source indices min(dst * in // out, in - 1) computed at"
        " conversion (integer arithmetic, as the spec); axes whose size is kept emit nothing"
    ),
)
def lower_interpolate3d(op: ops.Interpolate3d, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    require_float(ctx, 0, "x")
    sizes = input_sizes(ctx, 0)
    if len(sizes) != 5:
        raise ctx.fail(ShapeError, f"x must be [N, C, D, H, W], got {list(sizes)}", "x")
    if len(op.size) != 3 or min(op.size) < 1:
        raise ctx.fail(AttributeValueError, f"size must be three sizes >= 1, got {list(op.size)}")
    y = ctx.var(0)
    resized = [(axis, size_in, size_out) for axis, size_in, size_out in zip((2, 3, 4), sizes[2:], op.size, strict=True)
               if size_in != size_out]
    if not resized:
        return mb.identity(x=y, name=ctx.name())
    for i, (axis, size_in, size_out) in enumerate(resized):
        sources = np.minimum(np.arange(size_out, dtype=np.int64) * size_in // size_out, size_in - 1).astype(np.int32)
        last = i == len(resized) - 1
        y = mb.gather(x=y, indices=sources, axis=axis, name=ctx.name() if last else ctx.name(f"axis{axis}"))
    return y
