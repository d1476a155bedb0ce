"""Scatter / gather: ScatterAdd, ScatterNd, ScatterElements, GatherNd, GatherElements (spec part 2, section 4).

All five lower natively: MIL `scatter`, `scatter_nd`, `scatter_along_axis`, `gather_nd` and
`gather_along_axis`, on every target. Indices become int32 with IR Cast semantics (float
indices truncate toward zero; float indices fed through an fp32 program input are cast from
fp32, so ids above 2048 stay exact under fp16 precision) and negative ones are wrapped
explicitly (iOS17+ scatter/gather treat a negative index as out of bounds). Constant indices
are range-checked at conversion; run-time indices out of range are undefined on Core ML (the
reference and the executor refuse them).

MIL's scatter/gather hold fp16, fp32 and int32: Bool data travels as int32 and narrow integer
results are wrapped back to their dtype. Max/Min reductions ignore NaN like the reference
(fmax/fmin): NaN updates and NaN data are routed around MIL `max`/`min`, whose NaN handling
is left to the compute unit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ScatterNdReduction
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.holding import convert, kind_of, may_hold_nan, to_int32
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.target import Target

_MODES = {
    ScatterNdReduction.NONE: "update",
    ScatterNdReduction.ADD: "add",
    ScatterNdReduction.MUL: "mul",
    ScatterNdReduction.MAX: "max",
    ScatterNdReduction.MIN: "min",
}




def _check_numel(ctx: LowerContext, sizes: tuple[int, ...]) -> None:
    if int(np.prod(sizes)) == 0:
        raise ctx.unsupported(f"Core ML cannot hold the zero-size tensor {list(sizes)}")


def _trunc_to_int32(ctx: LowerContext, var: Any, suffix: str) -> Any:
    """Float index values truncated toward zero, as int32 (in the float type `var` holds)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    zero = np.float32(0.0) if var.dtype == types.fp32 else np.float16(0.0)
    negative = mb.less(x=var, y=zero, name=ctx.name(f"{suffix}_neg"))
    up = mb.ceil(x=var, name=ctx.name(f"{suffix}_ceil"))
    down = mb.floor(x=var, name=ctx.name(f"{suffix}_floor"))
    whole = mb.select(cond=negative, a=up, b=down, name=ctx.name(f"{suffix}_trunc"))
    return mb.cast(x=whole, dtype="int32", name=ctx.name(suffix))


def index_var(ctx: LowerContext, i: int, dims: np.ndarray, *, negative: bool = True) -> Any:
    """Input `i` (indices) as int32 in `[0, dim)`; `dims` broadcasts against the indices (a
    scalar, or one size per coordinate along the last axis for the ND ops)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    dims = np.asarray(dims, dtype=np.int64)
    value = ctx.value(i)
    if value is not None:
        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            if not np.isfinite(arr).all():
                raise ctx.fail(AttributeValueError, "constant indices must be finite", "indices")
            arr = np.trunc(arr.astype(np.float64))
        idx = arr.astype(np.int64)
        bound = np.broadcast_to(dims, idx.shape)
        low = -bound if negative else np.zeros_like(bound)
        bad = (idx < low) | (idx >= bound)
        if bad.any():
            at = tuple(int(v) for v in np.argwhere(bad)[0])
            allowed = f"[-{bound[at]}, {bound[at]})" if negative else f"[0, {bound[at]})"
            raise ctx.fail(AttributeValueError, f"constant index {int(idx[at])} at {list(at)} is outside {allowed}", "indices"
            )
        return ctx.const(np.where(idx < 0, idx + bound, idx).astype(np.int32), "indices")
    var = ctx.var(i)
    src = ctx.input_shape(i).dtype
    if kind_of(src) != "float":
        idx = to_int32(ctx, var, src, "indices_int")
    else:
        source = getattr(var, "op", None)
        if source is not None and source.op_type == "cast" and source.x.dtype == types.fp32 and var.dtype == types.fp16:
            var = source.x
        idx = _trunc_to_int32(ctx, var, "indices_int")
    if not negative:
        return idx
    is_negative = mb.less(x=idx, y=np.int32(0), name=ctx.name("indices_neg"))
    shifted = mb.add(x=idx, y=dims.astype(np.int32), name=ctx.name("indices_wrapped"))
    return mb.select(cond=is_negative, a=shifted, b=idx, name=ctx.name("indices"))


def held(ctx: LowerContext, i: int) -> tuple[Any, DType]:
    """Input `i` in a holding MIL scatter/gather accept (Bool goes through int32)."""
    dtype = ctx.input_shape(i).dtype
    if dtype is DType.BOOL:
        return to_int32(ctx, ctx.var(i), dtype, f"input{i}_int"), DType.I32
    return ctx.var(i), dtype


def finish(ctx: LowerContext, result: Any, dtype: DType, reduction: ScatterNdReduction) -> Any:
    """The scatter result in the node's dtype: combining reductions round floats to F16/BF16
    and wrap narrow integers, as the reference's arithmetic in that dtype does."""
    out = ctx.out_shape.dtype
    if dtype.is_float:
        combining = reduction in (ScatterNdReduction.ADD, ScatterNdReduction.MUL)
        return convert(ctx, result, DType.F32, out, round_floats=combining, suffix="out")
    return convert(ctx, result, DType.I32, out, suffix="out")


def _nan_ignoring_scatter(
    ctx: LowerContext, scatter: Any, data: Any, updates: Any, reduction: ScatterNdReduction, dtype: DType,
) -> Any:
    """Max/Min that ignore NaN (fmax/fmin): NaNs become the reduction's identity, and a
    destination whose data was NaN and got no number stays NaN. `scatter(data, updates, mode)`
    emits one scatter with this node's indices."""
    from coremltools.converters.mil import Builder as mb

    if not dtype.is_float or reduction not in (ScatterNdReduction.MAX, ScatterNdReduction.MIN):
        return scatter(data, updates, _MODES[reduction])
    data_nan = may_hold_nan(ctx, 0)
    updates_nan = may_hold_nan(ctx, 2)
    if not data_nan and not updates_nan:
        return scatter(data, updates, _MODES[reduction])
    identity = ctx.scalar(-np.inf if reduction is ScatterNdReduction.MAX else np.inf)
    is_number = mb.equal(x=updates, y=updates, name=ctx.name("updates_number"))
    clean_updates = mb.select(cond=is_number, a=updates, b=identity, name=ctx.name("updates_clean"))
    if not data_nan:
        return scatter(data, clean_updates, _MODES[reduction])
    data_is_nan = mb.not_equal(x=data, y=data, name=ctx.name("data_nan"))
    clean_data = mb.select(cond=data_is_nan, a=identity, b=data, name=ctx.name("data_clean"))
    combined = scatter(clean_data, clean_updates, _MODES[reduction])
    ones = mb.cast(x=is_number, dtype=ctx.mil_float, name=ctx.name("updates_counted"))
    zeros = mb.fill(shape=np.asarray(ctx.input_shape(0).sizes(), dtype=np.int32), value=ctx.scalar(0.0), name=ctx.name("no_numbers"))
    numbers = scatter(zeros, ones, "add")
    got_none = mb.equal(x=numbers, y=ctx.scalar(0.0), name=ctx.name("got_no_number"))
    stays_nan = mb.logical_and(x=data_is_nan, y=got_none, name=ctx.name("stays_nan"))
    return mb.select(cond=stays_nan, a=data, b=combined, name=ctx.name("nan_kept"))


# ------------------------------------------------------------------------------ ScatterAdd


@lowering(
    notes=(
        "`scatter` (mode add) of the updates onto `fill` zeros of the declared shape, along the"
        " node's axis (no transposes); empty updates give the zeros. Indices must lie in"
        " [0, dim): constant ones are checked."
    ),
)
def lower_scatter_add(op: ops.ScatterAdd, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.out_shape.sizes()
    updates_sizes = ctx.input_shape(0).sizes()
    axis = int(op.axis)
    if not 0 <= axis < len(sizes):
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {len(sizes)}", "axis")
    _check_numel(ctx, sizes)
    dtype = ctx.input_shape(0).dtype
    hold = DType.I32 if not dtype.is_float else dtype
    zero = ctx.scalar(0.0) if dtype.is_float else np.int32(0)
    zeros = mb.fill(shape=np.asarray(sizes, dtype=np.int32), value=zero, name=ctx.name("zeros"))
    if int(np.prod(updates_sizes)) == 0:
        return finish(ctx, zeros, hold, ScatterNdReduction.ADD)
    updates, _ = held(ctx, 0)
    indices = index_var(ctx, 1, np.asarray(sizes[axis]), negative=False)
    result = mb.scatter(data=zeros, indices=indices, updates=updates, axis=axis, mode="add", name=ctx.name("scatter"))
    return finish(ctx, result, hold, ScatterNdReduction.ADD)


# ------------------------------------------------------------------------------ ScatterNd


@lowering(
    notes=(
        "`scatter_nd` with mode update/add/mul/max/min; Max/Min route NaN around MIL max/min"
        " (fmax/fmin semantics). Duplicate indices with reduction None are undefined on Core"
        " ML (the reference lets the last write win)."
    ),
)
def lower_scatter_nd(op: ops.ScatterNd, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    data_sizes = ctx.input_shape(0).sizes()
    idx_sizes = ctx.input_shape(1).sizes()
    _check_numel(ctx, data_sizes)
    k = idx_sizes[-1]
    if not 1 <= k <= len(data_sizes):
        raise ctx.fail(ShapeError, f"indices hold {k} coordinates; data has rank {len(data_sizes)}", "indices")
    data, dtype = held(ctx, 0)
    if int(np.prod(idx_sizes[:-1])) == 0:
        return finish(ctx, data, dtype, ScatterNdReduction.NONE)
    updates, _ = held(ctx, 2)
    indices = index_var(ctx, 1, np.asarray(data_sizes[:k]))

    def scatter(into: Any, values: Any, mode: str) -> Any:
        return mb.scatter_nd(data=into, indices=indices, updates=values, mode=mode, name=ctx.name(f"scatter_{mode}"))

    return finish(ctx, _nan_ignoring_scatter(ctx, scatter, data, updates, op.reduction, dtype), dtype, op.reduction)


# ------------------------------------------------------------------------------ ScatterElements


def _coordinates(ctx: LowerContext, idx: Any, shape: tuple[int, ...], axis: int) -> Any:
    """Full coordinates [*shape, rank] of every index position, the axis one from `idx`."""
    from coremltools.converters.mil import Builder as mb

    parts = []
    for d in range(len(shape)):
        if d == axis:
            parts.append(mb.expand_dims(x=idx, axes=[-1], name=ctx.name("coord_axis")))
        else:
            grid = np.indices(shape)[d][..., None].astype(np.int32)
            parts.append(ctx.const(grid, f"coord{d}"))
    return mb.concat(values=parts, axis=-1, name=ctx.name("coords"))


@lowering(
    notes=(
        "`scatter_along_axis` with mode update/add/mul/max/min when indices span data off the"
        " axis; smaller indices scatter with `scatter_nd` on full coordinates. Max/Min ignore"
        " NaN; duplicates with reduction None are undefined on Core ML."
    ),
)
def lower_scatter_elements(op: ops.ScatterElements, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    data_sizes = ctx.input_shape(0).sizes()
    idx_sizes = ctx.input_shape(1).sizes()
    rank = len(data_sizes)
    if not -rank <= op.axis < rank:
        raise ctx.fail(AttributeValueError, f"axis {op.axis} is out of range for rank {rank}", "axis")
    axis = op.axis % rank
    _check_numel(ctx, data_sizes)
    data, dtype = held(ctx, 0)
    if int(np.prod(idx_sizes)) == 0:
        return finish(ctx, data, dtype, ScatterNdReduction.NONE)
    updates, _ = held(ctx, 2)
    indices = index_var(ctx, 1, np.asarray(data_sizes[axis]))
    spans = all(idx_sizes[d] == data_sizes[d] for d in range(rank) if d != axis)
    coords = None if spans else _coordinates(ctx, indices, idx_sizes, axis)

    def scatter(into: Any, values: Any, mode: str) -> Any:
        if coords is None:
            return mb.scatter_along_axis(
                data=into, indices=indices, updates=values, axis=axis, mode=mode, name=ctx.name(f"scatter_{mode}")
            )
        return mb.scatter_nd(data=into, indices=coords, updates=values, mode=mode, name=ctx.name(f"scatter_{mode}"))

    return finish(ctx, _nan_ignoring_scatter(ctx, scatter, data, updates, op.reduction, dtype), dtype, op.reduction)


# ------------------------------------------------------------------------------ gathers


@lowering(
    notes=(
        "`gather_nd`; batch_dims > 0 uses MIL's batch_dims from iOS16 and, on iOS15, batch"
        " coordinates prepended to the indices. Negative batch_dims counts as 0."
    ),
)
def lower_gather_nd(op: ops.GatherNd, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    data_sizes = ctx.input_shape(0).sizes()
    idx_sizes = ctx.input_shape(1).sizes()
    b = max(int(op.batch_dims), 0)
    k = idx_sizes[-1]
    if b + k > len(data_sizes) or k < 1:
        raise ctx.fail(ShapeError, f"batch_dims {b} + {k} coordinates exceed the rank of data {list(data_sizes)}", "indices")
    _check_numel(ctx, ctx.out_shape.sizes())
    data, dtype = held(ctx, 0)
    indices = index_var(ctx, 1, np.asarray(data_sizes[b:b + k]))
    if b and ctx.target >= Target.IOS16:
        result = mb.gather_nd(x=data, indices=indices, batch_dims=b, name=ctx.name("gather"))
    else:
        if b:
            positions = idx_sizes[:-1]
            grids = [ctx.const(np.indices(positions)[d][..., None].astype(np.int32), f"batch{d}") for d in range(b)]
            indices = mb.concat(values=[*grids, indices], axis=-1, name=ctx.name("batched_indices"))
        result = mb.gather_nd(x=data, indices=indices, name=ctx.name("gather"))
    return convert(ctx, result, dtype, ctx.out_shape.dtype, suffix="out")


@lowering(
    notes="`gather_along_axis`; data is first sliced (`slice_by_size`) to the extent of smaller indices off the axis.",
)
def lower_gather_elements(op: ops.GatherElements, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    data_sizes = ctx.input_shape(0).sizes()
    idx_sizes = ctx.input_shape(1).sizes()
    rank = len(data_sizes)
    if not -rank <= op.axis < rank:
        raise ctx.fail(AttributeValueError, f"axis {op.axis} is out of range for rank {rank}", "axis")
    axis = op.axis % rank
    _check_numel(ctx, idx_sizes)
    data, dtype = held(ctx, 0)
    window = tuple(data_sizes[d] if d == axis else idx_sizes[d] for d in range(rank))
    if window != data_sizes:
        data = mb.slice_by_size(
            x=data, begin=np.zeros(rank, dtype=np.int32), size=np.asarray(window, dtype=np.int32),
            name=ctx.name("window"),
        )
    indices = index_var(ctx, 1, np.asarray(data_sizes[axis]))
    result = mb.gather_along_axis(x=data, indices=indices, axis=axis, name=ctx.name("gather"))
    return convert(ctx, result, dtype, ctx.out_shape.dtype, suffix="out")
