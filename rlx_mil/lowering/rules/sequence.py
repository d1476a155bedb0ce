"""KvAppend and Roll: slices + `concat` (upstream's own rewrites of both, spec part 2 section 1.11)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir import ops
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering


def axis_slice(ctx: LowerContext, x: Any, axis: int, start: int, stop: int, suffix: str) -> Any:
    """`x[start:stop]` along `axis` (static sizes)."""
    from coremltools.converters.mil import Builder as mb

    sizes = [int(d) for d in x.shape]
    begin, end = [0] * len(sizes), list(sizes)
    begin[axis], end[axis] = start, stop
    return mb.slice_by_index(x=x, begin=np.asarray(begin, np.int32), end=np.asarray(end, np.int32),
                             name=ctx.name(suffix))


@lowering(
    notes="pos = 0: the row itself; else `concat` of the cache's first pos rows (`slice_by_index`) and the row.",
)
def lower_kv_append(op: ops.KvAppend, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    capacity = ctx.input_shape(0).sizes()[op.axis]
    if op.pos >= capacity:
        raise ctx.fail(ShapeError, f"pos {op.pos} is past the cache's capacity {capacity}", "cache")
    row = ctx.var(1)
    if op.pos == 0:
        return row
    kept = axis_slice(ctx, ctx.var(0), op.axis, 0, op.pos, "kept")
    return mb.concat(values=[kept, row], axis=op.axis, name=ctx.name())


@lowering(
    notes="Per (shift, dim) pair with k = shift mod n != 0: `concat` of the last k and the first n - k slices.",
)
def lower_roll(op: ops.Roll, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    x = ctx.var(0)
    sizes = ctx.input_shape(0).sizes()
    for i, (shift, dim) in enumerate(zip(op.shifts, op.dims, strict=True)):
        n = sizes[dim]
        k = shift % n if n else 0
        if k == 0:
            continue
        tail = axis_slice(ctx, x, dim, n - k, n, f"tail{i}")
        head = axis_slice(ctx, x, dim, 0, n - k, f"head{i}")
        x = mb.concat(values=[tail, head], axis=dim, name=ctx.name(f"roll{i}"))
    if x is ctx.var(0):
        return mb.identity(x=x, name=ctx.name())
    return x
