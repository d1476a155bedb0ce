"""Reductions, scans and selection: Softmax, Reduce, Cumsum, TopK (spec section 7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ReduceOp
from rlx_mil.lower.context import LowerContext
from rlx_mil.lower.registry import declare_unsupported, lowering
from rlx_mil.lower.rules.elementwise import convert, kind_of, shape_error, to_float, to_int32
from rlx_mil.lower.target import Target


def _attribute_error(ctx: LowerContext, message: str) -> AttributeValueError:
    return AttributeValueError(message, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name)


def _signed_axis(ctx: LowerContext, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1) or rank == 0:
        raise _attribute_error(ctx, f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _check_same_shape(ctx: LowerContext) -> tuple[int, ...]:
    sizes = ctx.input_shape(0).sizes()
    if ctx.out_shape.sizes() != sizes:
        raise shape_error(ctx, f"output must keep the input shape {list(sizes)}, declared {list(ctx.out_shape.sizes())}")
    return sizes


@lowering(
    ops.Softmax, family="reduce",
    notes="`softmax` on any axis (negative axes normalised); non-float inputs are cast to float first.",
)
def lower_softmax(op: ops.Softmax, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = _check_same_shape(ctx)
    axis = _signed_axis(ctx, op.axis, len(sizes))
    x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "x_float")
    y = mb.softmax(x=x, axis=axis, name=ctx.name())
    return convert(ctx, y, DType.F32, ctx.out_shape.dtype, suffix="out")


def _reduced_sizes(sizes: tuple[int, ...], axes: tuple[int, ...], keep_dim: bool) -> tuple[int, ...]:
    if keep_dim:
        return tuple(1 if i in axes else d for i, d in enumerate(sizes))
    return tuple(d for i, d in enumerate(sizes) if i not in axes)


def _nan_ignoring_reduce(ctx: LowerContext, reducer: Callable[..., Any], x: Any, fill: float, axes: list[int], keep: bool) -> Any:
    """np.fmax.reduce / np.fmin.reduce: NaNs are skipped (replaced by the identity -inf/+inf),
    and a slice of NaNs only gives NaN. MIL reduce_max/min leave NaN to the compute unit."""
    from coremltools.converters.mil import Builder as mb

    is_nan = mb.not_equal(x=x, y=x, name=ctx.name("is_nan"))
    cleaned = mb.select(cond=is_nan, a=ctx.scalar(fill), b=x, name=ctx.name("nan_skipped"))
    reduced = reducer(x=cleaned, axes=axes, keep_dims=keep, name=ctx.name("reduced"))
    nan_count = mb.cast(x=is_nan, dtype=ctx.mil_float, name=ctx.name("nan_flags"))
    all_nan = mb.reduce_min(x=nan_count, axes=axes, keep_dims=keep, name=ctx.name("all_nan_flag"))
    all_nan_bool = mb.greater(x=all_nan, y=ctx.scalar(0.5), name=ctx.name("all_nan"))
    return mb.select(cond=all_nan_bool, a=ctx.scalar(np.nan), b=reduced, name=ctx.name())


@lowering(
    ops.Reduce, family="reduce",
    notes=(
        "reduce_sum / reduce_mean / reduce_max / reduce_min / reduce_prod over the axes with"
        " keep_dims (rank-0 result when every axis goes). Max/Min on floats skip NaN like"
        " np.fmax.reduce (not_equal + select before, reduce_min of the NaN flags + select after)."
        " Integer Sum/Max/Min/Prod stay int32; integer Mean computes in float."
    ),
)
def lower_reduce(op: ops.Reduce, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    rank = len(sizes)
    if not op.axes:
        raise _attribute_error(ctx, "axes must not be empty")
    if len(set(op.axes)) != len(op.axes):
        raise _attribute_error(ctx, f"axes {list(op.axes)} repeat an axis")
    for axis in op.axes:
        if not 0 <= axis < rank:
            raise _attribute_error(ctx, f"reduce axis {axis} is out of range for rank {rank}")
    axes = sorted(op.axes)
    want = _reduced_sizes(sizes, tuple(axes), op.keep_dim)
    declared = ctx.out_shape.sizes()
    if declared != want and not (want in ((), (1,)) and declared in ((), (1,))):
        raise shape_error(ctx, f"reducing {list(sizes)} over {axes} gives {list(want)}, declared {list(declared)}")
    if any(sizes[a] == 0 for a in axes) and op.op in (ReduceOp.MAX, ReduceOp.MIN):
        raise shape_error(ctx, f"{op.op.value} over an empty axis of {list(sizes)}", "x")

    reducers: dict[ReduceOp, Callable[..., Any]] = {
        ReduceOp.SUM: mb.reduce_sum, ReduceOp.MEAN: mb.reduce_mean, ReduceOp.MAX: mb.reduce_max,
        ReduceOp.MIN: mb.reduce_min, ReduceOp.PROD: mb.reduce_prod,
    }
    src_dt, out_dt = ctx.input_shape(0).dtype, ctx.out_shape.dtype
    keep = bool(op.keep_dim)
    if kind_of(src_dt) != "float" and op.op is not ReduceOp.MEAN:
        x = to_int32(ctx, ctx.var(0), src_dt, "x_int")
        result = reducers[op.op](x=x, axes=axes, keep_dims=keep, name=ctx.name())
        return convert(ctx, result, DType.I32, out_dt, suffix="out")
    x = to_float(ctx, ctx.var(0), src_dt, "x_float")
    if op.op in (ReduceOp.MAX, ReduceOp.MIN):
        fill = -np.inf if op.op is ReduceOp.MAX else np.inf
        result = _nan_ignoring_reduce(ctx, reducers[op.op], x, fill, axes, keep)
    else:
        result = reducers[op.op](x=x, axes=axes, keep_dims=keep, name=ctx.name())
    return convert(ctx, result, DType.F32, out_dt, suffix="out")


@lowering(
    ops.Cumsum, family="reduce",
    notes="`cumsum` on any axis with exclusive=True/False; integer inputs stay int32.",
)
def lower_cumsum(op: ops.Cumsum, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = _check_same_shape(ctx)
    axis = _signed_axis(ctx, op.axis, len(sizes))
    src_dt, out_dt = ctx.input_shape(0).dtype, ctx.out_shape.dtype
    if kind_of(src_dt) == "float":
        x, held = ctx.var(0), DType.F32
    else:
        x, held = to_int32(ctx, ctx.var(0), src_dt, "x_int"), DType.I32
    result = mb.cumsum(x=x, axis=axis, exclusive=bool(op.exclusive), name=ctx.name())
    return convert(ctx, result, held, out_dt, suffix="out")


@lowering(
    ops.TopK, family="reduce",
    notes=(
        "`topk` (descending, sorted; values only on iOS16+) picks the k values; their indices are"
        " then recovered stably (ties -> smaller index) from equal/cumsum/reduce_sum over a"
        " [..., k, N] comparison, since Core ML does not specify topk's tie order. Indices are"
        " returned as floats (cast), exact up to 2048 under fp16 precision, 2^24 under fp32."
    ),
)
def lower_topk(op: ops.TopK, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    if not sizes:
        raise shape_error(ctx, "TopK needs rank >= 1", "x")
    n = sizes[-1]
    k = int(op.k)
    if not 1 <= k <= n:
        raise _attribute_error(ctx, f"k={k} must lie in 1..{n} (the last dim)")
    want = (*sizes[:-1], k)
    if ctx.out_shape.sizes() != want:
        raise shape_error(ctx, f"output must be {list(want)}, declared {list(ctx.out_shape.sizes())}")

    src_dt = ctx.input_shape(0).dtype
    if kind_of(src_dt) == "float":
        # The reference's stable argsort of -x ranks NaN after every number; Core ML leaves
        # NaN's rank in topk unspecified, and NaN never equals the picked value, so the index
        # recovery below would return 0 for it. As -inf, NaN ranks last (tied with a genuine
        # -inf by index, the one order that still differs from the reference).
        is_nan = mb.not_equal(x=ctx.var(0), y=ctx.var(0), name=ctx.name("is_nan"))
        x = mb.select(cond=is_nan, a=ctx.scalar(-np.inf), b=ctx.var(0), name=ctx.name("nan_last"))
    else:
        x = to_int32(ctx, ctx.var(0), src_dt, "x_int")
    if ctx.target >= Target.IOS16:
        values = mb.topk(x=x, k=k, axis=-1, ascending=False, sort=True, return_indices=False, name=ctx.name("values"))
    else:
        values, _ = mb.topk(x=x, k=k, axis=-1, ascending=False, name=ctx.name("values"))
    rank = len(sizes)
    # match[..., r, j]: element j carries the r-th largest value.
    row = mb.expand_dims(x=x, axes=[rank - 1], name=ctx.name("row"))  # [..., 1, N]
    column = mb.expand_dims(x=values, axes=[rank], name=ctx.name("column"))  # [..., k, 1]
    match = mb.equal(x=row, y=column, name=ctx.name("match"))
    # How many equal values precede rank r among the picked ones: r takes that many + 1-th match.
    picked_row = mb.expand_dims(x=values, axes=[rank - 1], name=ctx.name("picked_row"))  # [..., 1, k]
    same = mb.equal(x=column, y=picked_row, name=ctx.name("same_value"))  # [..., k, k]
    earlier = np.tril(np.ones((k, k), dtype=bool), -1)
    same_earlier = mb.logical_and(x=same, y=earlier, name=ctx.name("same_earlier"))
    ties_before = mb.reduce_sum(
        x=mb.cast(x=same_earlier, dtype="int32", name=ctx.name("same_earlier_int")),
        axes=[rank], keep_dims=True, name=ctx.name("ties_before"),
    )  # [..., k, 1]
    match_int = mb.cast(x=match, dtype="int32", name=ctx.name("match_int"))
    seen = mb.cumsum(x=match_int, axis=rank, name=ctx.name("matches_so_far"))  # [..., k, N]
    wanted = mb.add(x=ties_before, y=np.int32(1), name=ctx.name("wanted"))
    is_wanted = mb.equal(x=seen, y=wanted, name=ctx.name("is_wanted"))
    hit = mb.logical_and(x=match, y=is_wanted, name=ctx.name("hit"))
    out_dt = ctx.out_shape.dtype
    # (MIL select would take its shape from the branches alone, so multiply instead.)
    if kind_of(out_dt) == "int":
        hit_int = mb.cast(x=hit, dtype="int32", name=ctx.name("hit_int"))
        terms = mb.mul(x=hit_int, y=np.arange(n, dtype=np.int32), name=ctx.name("index_terms"))
        index = mb.reduce_sum(x=terms, axes=[rank], keep_dims=False, name=ctx.name("index"))
        return convert(ctx, index, DType.I32, out_dt, suffix="out")
    # Float indices are summed in the program float (one non-zero term per row: exact).
    hit_float = mb.cast(x=hit, dtype=ctx.mil_float, name=ctx.name("hit_float"))
    terms = mb.mul(x=hit_float, y=np.arange(n).astype(ctx.float_dtype), name=ctx.name("index_terms"))
    index = mb.reduce_sum(x=terms, axes=[rank], keep_dims=False, name=ctx.name())
    return convert(ctx, index, DType.F32, out_dt, suffix="out")


# Ops of this family without a rule yet; conversion names the op and the reason.
declare_unsupported(ops.CumProd, "not lowered yet (masked `reduce_prod`)")
declare_unsupported(ops.CumMax, "not lowered yet (masked `reduce_max` with `select`)")
declare_unsupported(ops.ArgMax, "not lowered yet (`reduce_argmax` + tie/NaN fix-up)")
declare_unsupported(ops.ArgMin, "not lowered yet (`reduce_argmin` + tie/NaN fix-up)")
declare_unsupported(ops.Sort, "not lowered yet (`argsort` + index tiebreak + `gather_along_axis`)")
declare_unsupported(ops.ArgSort, "not lowered yet (`argsort` + index tiebreak)")
