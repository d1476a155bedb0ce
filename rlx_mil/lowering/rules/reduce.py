"""Reductions, scans and selection: Softmax, Reduce, Cumsum, TopK (spec section 7); CumProd, CumMax,
ArgMax, ArgMin, Sort, ArgSort (spec part 2, section 3).

MIL has no cumulative product or maximum, and leaves the tie order of `reduce_argmax` and the
stability of `argsort` unspecified, so those ops are spelled out with exact ops: a log-step
prefix scan, an equal-to-extreme first-index search, and a second argsort on unique keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ReduceOp
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.holding import (
    INT_RANGES,
    convert,
    kind_of,
    may_hold_nan,
    to_float,
    to_int32,
)
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.target import Target


def _signed_axis(ctx: LowerContext, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1) or rank == 0:
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _check_same_shape(ctx: LowerContext) -> tuple[int, ...]:
    sizes = ctx.input_shape(0).sizes()
    if ctx.out_shape.sizes() != sizes:
        raise ctx.fail(ShapeError, f"output must keep the input shape {list(sizes)}, declared {list(ctx.out_shape.sizes())}")
    return sizes


@lowering(
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
        raise ctx.fail(AttributeValueError, "axes must not be empty")
    if len(set(op.axes)) != len(op.axes):
        raise ctx.fail(AttributeValueError, f"axes {list(op.axes)} repeat an axis")
    for axis in op.axes:
        if not 0 <= axis < rank:
            raise ctx.fail(AttributeValueError, f"reduce axis {axis} is out of range for rank {rank}")
    axes = sorted(op.axes)
    want = _reduced_sizes(sizes, tuple(axes), op.keep_dim)
    declared = ctx.out_shape.sizes()
    if declared != want and not (want in ((), (1,)) and declared in ((), (1,))):
        raise ctx.fail(ShapeError, f"reducing {list(sizes)} over {axes} gives {list(want)}, declared {list(declared)}")
    if any(sizes[a] == 0 for a in axes) and op.op in (ReduceOp.MAX, ReduceOp.MIN):
        raise ctx.fail(ShapeError, f"{op.op.value} over an empty axis of {list(sizes)}", "x")

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
        raise ctx.fail(ShapeError, "TopK needs rank >= 1", "x")
    n = sizes[-1]
    k = int(op.k)
    if not 1 <= k <= n:
        raise ctx.fail(AttributeValueError, f"k={k} must lie in 1..{n} (the last dim)")
    want = (*sizes[:-1], k)
    if ctx.out_shape.sizes() != want:
        raise ctx.fail(ShapeError, f"output must be {list(want)}, declared {list(ctx.out_shape.sizes())}")

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


# ------------------------------------------------------------------ CumProd / CumMax


def _held(ctx: LowerContext) -> tuple[Any, DType]:
    """Input 0 as the program holds it for arithmetic: floats as they are, the rest as int32."""
    src = ctx.input_shape(0).dtype
    if kind_of(src) == "float":
        return ctx.var(0), DType.F32
    return to_int32(ctx, ctx.var(0), src, "x_int"), DType.I32


def _slab(ctx: LowerContext, x: Any, axis: int, begin: int, size: int, sizes: tuple[int, ...], suffix: str) -> Any:
    from coremltools.converters.mil import Builder as mb

    start = np.zeros(len(sizes), dtype=np.int32)
    start[axis] = begin
    extent = np.asarray(sizes, dtype=np.int32)
    extent[axis] = size
    return mb.slice_by_size(x=x, begin=start, size=extent, name=ctx.name(suffix))


def prefix_scan(
    ctx: LowerContext, x: Any, axis: int, sizes: tuple[int, ...], combine: Callable[..., Any], suffix: str
) -> Any:
    """Inclusive scan of an associative `combine` along `axis` in ceil(log2 n) steps
    (Hillis-Steele): step d combines every element with the one d before it, elements before d
    stay. O(n log n) work and O(n) memory, where the masked [.., n, n] reduction is O(n^2)."""
    from coremltools.converters.mil import Builder as mb

    n = sizes[axis]
    d, step = 1, 0
    while d < n:
        head = _slab(ctx, x, axis, 0, d, sizes, f"{suffix}{step}_head")
        later = _slab(ctx, x, axis, d, n - d, sizes, f"{suffix}{step}_later")
        earlier = _slab(ctx, x, axis, 0, n - d, sizes, f"{suffix}{step}_earlier")
        combined = combine(x=later, y=earlier, name=ctx.name(f"{suffix}{step}_combined"))
        x = mb.concat(values=[head, combined], axis=axis, interleave=False, name=ctx.name(f"{suffix}{step}"))
        d, step = d * 2, step + 1
    return x


def _exclusive(ctx: LowerContext, inclusive: Any, axis: int, sizes: tuple[int, ...], identity: Any) -> Any:
    """Shift right by one along `axis`, `identity` first."""
    from coremltools.converters.mil import Builder as mb

    first = list(sizes)
    first[axis] = 1
    lead = mb.fill(shape=np.asarray(first, dtype=np.int32), value=identity, name=ctx.name("identity"))
    if sizes[axis] == 1:
        return lead
    rest = _slab(ctx, inclusive, axis, 0, sizes[axis] - 1, sizes, "shifted")
    return mb.concat(values=[lead, rest], axis=axis, interleave=False, name=ctx.name("exclusive"))


_SCAN_NOTES = (
    " along any axis as a log-step prefix scan (ceil(log2 n) rounds of slice_by_size + {op} + concat;"
    " O(n) memory, not the O(n^2) masked reduction); exclusive: `fill` of the identity + the"
    " inclusive scan shifted by one. Integers scan in int32 and wrap/convert to the declared dtype"
)


@lowering(
    notes="`mul`" + _SCAN_NOTES.format(op="`mul`") + " (no exp/log form: exact for zeros and negatives).",
)
def lower_cumprod(op: ops.CumProd, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = _check_same_shape(ctx)
    axis = _signed_axis(ctx, op.axis, len(sizes))
    if 0 in sizes:
        raise ctx.unsupported(f"Core ML cannot hold the zero-size tensor {list(sizes)}")
    x, held = _held(ctx)
    result = prefix_scan(ctx, x, axis, sizes, mb.mul, "scan")
    if op.exclusive:
        one = ctx.scalar(1.0) if held is DType.F32 else np.int32(1)
        result = _exclusive(ctx, result, axis, sizes, one)
    return convert(ctx, result, held, ctx.out_shape.dtype, suffix="out")


@lowering(
    notes=(
        "`maximum`" + _SCAN_NOTES.format(op="`maximum`") + ". NaN-ignoring (np.fmax.accumulate): NaNs"
        " scan as -inf and a second int32 scan of the is-number flags puts NaN back where every"
        " element so far is NaN. The exclusive identity is -inf (the dtype's smallest value for integers)."
    ),
)
def lower_cummax(op: ops.CumMax, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = _check_same_shape(ctx)
    axis = _signed_axis(ctx, op.axis, len(sizes))
    if 0 in sizes:
        raise ctx.unsupported(f"Core ML cannot hold the zero-size tensor {list(sizes)}")
    x, held = _held(ctx)
    out_dt = ctx.out_shape.dtype
    nan_aware = held is DType.F32 and may_hold_nan(ctx, 0)
    if nan_aware:
        is_number = mb.equal(x=x, y=x, name=ctx.name("is_number"))
        x = mb.select(cond=is_number, a=x, b=ctx.scalar(-np.inf), name=ctx.name("nan_skipped"))
    result = prefix_scan(ctx, x, axis, sizes, mb.maximum, "scan")
    if nan_aware:
        flags = mb.cast(x=is_number, dtype="int32", name=ctx.name("number_flags"))
        seen = prefix_scan(ctx, flags, axis, sizes, mb.maximum, "seen")
        any_number = mb.greater(x=seen, y=np.int32(0), name=ctx.name("any_number"))
        result = mb.select(cond=any_number, a=result, b=ctx.scalar(np.nan), name=ctx.name("nan_kept"))
    if op.exclusive:
        if held is DType.F32:
            identity: Any = ctx.scalar(-np.inf)
        else:
            identity = np.int32(0 if out_dt is DType.BOOL else INT_RANGES.get(out_dt, INT_RANGES[DType.I32])[0])
        result = _exclusive(ctx, result, axis, sizes, identity)
    return convert(ctx, result, held, out_dt, suffix="out")


# ------------------------------------------------------------------ ArgMax / ArgMin


def _arg_reduce(op: ops.ArgMax | ops.ArgMin, ctx: LowerContext, *, largest: bool) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    axis = int(op.axis)
    if not 0 <= axis < len(sizes):
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {len(sizes)}")
    n = sizes[axis]
    if n == 0 or 0 in sizes:
        raise ctx.fail(ShapeError, f"{op.type_name} over an empty axis of {list(sizes)} has no answer", "x")
    want = tuple(1 if i == axis else d for i, d in enumerate(sizes)) if op.keep_dim else tuple(
        d for i, d in enumerate(sizes) if i != axis
    )
    declared = ctx.out_shape.sizes()
    if declared != want and not (want in ((), (1,)) and declared in ((), (1,))):
        raise ctx.fail(ShapeError, f"output must be {list(want)}, declared {list(declared)}")
    x, held = _held(ctx)
    nan_aware = held is DType.F32 and may_hold_nan(ctx, 0)
    reducer = mb.reduce_max if largest else mb.reduce_min
    if nan_aware:
        extreme = _nan_ignoring_reduce(ctx, reducer, x, -np.inf if largest else np.inf, [axis], True)
    else:
        extreme = reducer(x=x, axes=[axis], keep_dims=True, name=ctx.name("extreme"))
    # The first index holding the extreme (NaN equals nothing): index + n where it misses, min.
    hit = mb.equal(x=x, y=extreme, name=ctx.name("hit"))
    miss = mb.cast(x=mb.logical_not(x=hit, name=ctx.name("miss")), dtype="int32", name=ctx.name("miss_int"))
    iota = np.arange(n, dtype=np.int32).reshape([n if i == axis else 1 for i in range(len(sizes))])
    candidates = mb.add(x=mb.mul(x=miss, y=np.int32(n), name=ctx.name("miss_n")), y=iota, name=ctx.name("candidates"))
    first = mb.reduce_min(x=candidates, axes=[axis], keep_dims=True, name=ctx.name("first"))
    if nan_aware:
        # Upstream's scan never moves past a NaN element 0 (nothing compares greater than it).
        lead = _slab(ctx, x, axis, 0, 1, sizes, "lead")
        lead_nan = mb.not_equal(x=lead, y=lead, name=ctx.name("lead_nan"))
        first = mb.select(cond=lead_nan, a=np.int32(0), b=first, name=ctx.name("first_nan_lead"))
    if not op.keep_dim:
        first = mb.reshape(x=first, shape=np.asarray(want or (1,), dtype=np.int32), name=ctx.name("squeezed"))
    return convert(ctx, first, DType.I32, ctx.out_shape.dtype, suffix="out")


_ARG_NOTES = (
    "The index of the {what} value exactly as upstream's CPU scan: `{reduce}` (NaN-ignoring via select when"
    " the input may hold NaN), `equal`, then `reduce_min` of index + n*miss gives the first index"
    " holding it (ties -> smaller index, independent of `reduce_arg*` tie rules); a NaN element 0"
    " gives 0. Indices cast to float: exact up to 2048 under fp16 precision."
)


@lowering(notes=_ARG_NOTES.format(what="largest", reduce="reduce_max"))
def lower_argmax(op: ops.ArgMax, ctx: LowerContext) -> Any:
    return _arg_reduce(op, ctx, largest=True)


@lowering(notes=_ARG_NOTES.format(what="smallest", reduce="reduce_min"))
def lower_argmin(op: ops.ArgMin, ctx: LowerContext) -> Any:
    return _arg_reduce(op, ctx, largest=False)


# ------------------------------------------------------------------ Sort / ArgSort

#: The second argsort orders int32 keys (group * n + index); groups < 2n with NaN handling.
_MAX_KEY = 2**31 - 1


def _stable_permutation(op: ops.Sort | ops.ArgSort, ctx: LowerContext) -> tuple[Any, Any, DType]:
    """(permutation, held input, holding): the stable sort order along the axis, NaN last."""
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    axis = int(op.axis)
    if not 0 <= axis < len(sizes):
        raise ctx.fail(AttributeValueError, f"axis {axis} is out of range for rank {len(sizes)}")
    if ctx.out_shape.sizes() != sizes:
        raise ctx.fail(ShapeError, f"output must keep the input shape {list(sizes)}, declared {list(ctx.out_shape.sizes())}")
    if 0 in sizes:
        raise ctx.unsupported(f"Core ML cannot hold the zero-size tensor {list(sizes)}")
    n = sizes[axis]
    x, held = _held(ctx)
    if n == 1:
        return ctx.const(np.zeros(sizes, dtype=np.int32), "order"), x, held
    nan_aware = held is DType.F32 and may_hold_nan(ctx, 0)
    groups = 2 * n if nan_aware else n
    if groups * n > _MAX_KEY:
        raise ctx.unsupported(
            f"a stable {op.type_name} of {n} elements needs int32 tie-break keys up to {groups * n}, beyond 2^31"
        )
    key = x
    if nan_aware:
        is_nan = mb.not_equal(x=x, y=x, name=ctx.name("is_nan"))
        key = mb.select(cond=is_nan, a=ctx.scalar(-np.inf if op.descending else np.inf), b=x, name=ctx.name("nan_last"))
    first = mb.argsort(x=key, axis=axis, ascending=not op.descending, name=ctx.name("first_order"))
    # Core ML leaves argsort's order of equal keys open: number the runs of equal values in
    # that order and sort again by (run, NaN flag, original index), keys that are all distinct.
    ordered = mb.gather_along_axis(x=key, indices=first, axis=axis, name=ctx.name("ordered"))
    current = _slab(ctx, ordered, axis, 1, n - 1, sizes, "ordered_next")
    previous = _slab(ctx, ordered, axis, 0, n - 1, sizes, "ordered_prev")
    step = mb.cast(x=mb.not_equal(x=current, y=previous, name=ctx.name("new_run")), dtype="int32", name=ctx.name("new_run_int"))
    lead = list(sizes)
    lead[axis] = 1
    starts = mb.concat(values=[ctx.const(np.zeros(lead, dtype=np.int32), "run0"), step], axis=axis, name=ctx.name("run_starts"))
    group = mb.cumsum(x=starts, axis=axis, name=ctx.name("run"))
    if nan_aware:
        nan_flag = mb.cast(x=is_nan, dtype="int32", name=ctx.name("nan_int"))
        ordered_nan = mb.gather_along_axis(x=nan_flag, indices=first, axis=axis, name=ctx.name("ordered_nan"))
        group = mb.add(x=mb.mul(x=group, y=np.int32(2), name=ctx.name("run2")), y=ordered_nan, name=ctx.name("group"))
    unique = mb.add(x=mb.mul(x=group, y=np.int32(n), name=ctx.name("group_n")), y=first, name=ctx.name("unique_key"))
    second = mb.argsort(x=unique, axis=axis, ascending=True, name=ctx.name("second_order"))
    order = mb.gather_along_axis(x=first, indices=second, axis=axis, name=ctx.name("order"))
    return order, x, held


_SORT_NOTES = (
    "`argsort` (NaN mapped to the last end), then a second `argsort` on int32 keys"
    " (run of equal values, NaN flag, index) that are all distinct, so the result is the stable"
    " order whatever tie order Core ML's argsort has; {rest} Refused (typed) when the keys pass 2^31"
    " (more than 46340 elements per line, 32767 with NaN handling)."
)


@lowering(notes=_SORT_NOTES.format(rest="`gather_along_axis` picks the values."))
def lower_sort(op: ops.Sort, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    order, x, held = _stable_permutation(op, ctx)
    if ctx.input_shape(0).sizes()[op.axis] == 1:
        return convert(ctx, x, held, ctx.out_shape.dtype, suffix="out")
    values = mb.gather_along_axis(x=x, indices=order, axis=int(op.axis), name=ctx.name("values"))
    return convert(ctx, values, held, ctx.out_shape.dtype, suffix="out")


@lowering(notes=_SORT_NOTES.format(rest="the permutation is cast to float (exact up to 2048 under fp16)."))
def lower_argsort(op: ops.ArgSort, ctx: LowerContext) -> Any:
    order, _, _ = _stable_permutation(op, ctx)
    return convert(ctx, order, DType.I32, ctx.out_shape.dtype, suffix="out")
