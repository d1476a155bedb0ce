"""Shape MIL ops: reshapes, transposes, slices, concat/split/stack, tile, pad, fill, gather."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.coreai.registry import RuleContext, numpy_dtype, rule


@rule("reshape", "reshape_like", "expand_dims", "squeeze", "flatten2d")
def reshape(ctx: RuleContext) -> Any:
    out = ctx.out_shape()
    if any(d < 0 for d in out) and ctx.op_type in ("expand_dims", "squeeze"):
        out = _axes_reshape(ctx, ctx.in_shape("x")) or out
    return ctx.reshape(ctx.v("x"), out)


def _axes_reshape(ctx: RuleContext, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """expand_dims / squeeze of a static shape whose MIL output shape is symbolic."""
    if any(d < 0 for d in shape):
        return None
    if ctx.op_type == "expand_dims":
        rank = len(shape) + len(ctx.ints("axes"))
        axes = {a % rank for a in ctx.ints("axes")}
        rest = iter(shape)
        return tuple(1 if a in axes else next(rest) for a in range(rank))
    axes = {a % len(shape) for a in ctx.ints("axes", [a for a, d in enumerate(shape) if d == 1])}
    return tuple(d for a, d in enumerate(shape) if a not in axes)


@rule("transpose")
def transpose(ctx: RuleContext) -> Any:
    perm = [p % ctx.rank("x") for p in ctx.ints("perm")]
    return ctx.ops.transpose(ctx.v("x"), np.asarray(perm, np.uint32))


def static_slice(ctx: RuleContext, x: Any, starts: list[int], stops: list[int], steps: list[int]) -> Any:
    """x[start:stop:step] per axis, with Python's slice semantics already resolved to in-range
    starts/stops; a negative step reverses the axis first."""
    shape = adapter.shape_of(x)
    reverse_axes = [axis for axis, step in enumerate(steps) if step < 0]
    if reverse_axes:
        x = ctx.ops.reverse(x, np.asarray(reverse_axes, np.int32))
        for axis in reverse_axes:
            dim = shape[axis]
            count = len(range(starts[axis], stops[axis], steps[axis]))
            starts[axis] = dim - 1 - starts[axis]
            steps[axis] = -steps[axis]
            stops[axis] = starts[axis] + max(count - 1, 0) * steps[axis] + 1 if count else starts[axis]
    if all(s == 0 for s in starts) and list(stops) == list(shape) and all(s == 1 for s in steps):
        return x
    return ctx.ops.slice_(x, np.asarray(starts, np.int32), np.asarray(stops, np.int32), np.asarray(steps, np.int32))


@rule("slice_by_index")
def slice_by_index(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    rank = len(shape)
    if any(d < 0 for d in shape):
        raise ctx.fail("a slice of a dynamic shape is not supported")
    if not ctx.is_const("begin") or not ctx.is_const("end"):
        return _runtime_slice(ctx, x, shape)
    begin = ctx.ints("begin")
    end = ctx.ints("end")
    stride = ctx.ints("stride", [1] * rank)
    begin_mask = [bool(b) for b in (ctx.param("begin_mask") or [False] * rank)]
    end_mask = [bool(b) for b in (ctx.param("end_mask") or [False] * rank)]
    squeeze_mask = [bool(b) for b in (ctx.param("squeeze_mask") or [False] * rank)]
    starts, stops, steps = [], [], []
    for axis in range(rank):
        b = None if begin_mask[axis] else begin[axis]
        e = None if end_mask[axis] else end[axis]
        if squeeze_mask[axis]:
            b = begin[axis] % shape[axis]
            e, step = b + 1, 1
        else:
            step = stride[axis]
        start, stop, step = slice(b, e, step).indices(shape[axis])
        if step > 0:
            stop = max(stop, start)
        starts.append(start)
        stops.append(stop)
        steps.append(step)
    return ctx.reshape(static_slice(ctx, x, starts, stops, steps), ctx.out_shape())


def _runtime_slice(ctx: RuleContext, x: Any, shape: tuple[int, ...]) -> Any:
    """slice_by_index with a runtime begin (a loop counter): the slice's extent is static (the
    declared output shape), so end = begin + extent."""
    rank = len(shape)
    stride = ctx.ints("stride", [1] * rank)
    if any(s != 1 for s in stride):
        raise ctx.fail("a runtime begin needs unit strides")
    begin_mask = [bool(b) for b in (ctx.param("begin_mask") or [False] * rank)]
    squeeze_mask = [bool(b) for b in (ctx.param("squeeze_mask") or [False] * rank)]
    end_mask = [bool(b) for b in (ctx.param("end_mask") or [False] * rank)]
    begin = ctx.cast(ctx.v("begin"), np.int32)
    dims = ctx.constant(np.asarray(shape, np.int32))
    negative = ctx.ops.broadcasting_greater(ctx.constant(np.int32(0)), begin)
    begin = ctx.ops.broadcasting_where(negative, ctx.ops.broadcasting_add(begin, dims), begin)
    if any(begin_mask):
        begin = ctx.ops.broadcasting_mul(begin, ctx.constant(np.asarray([0 if m else 1 for m in begin_mask], np.int32)))
    out = list(ctx.out_shape())
    extent: list[int] | None = None
    if any(d < 0 for d in out):  # MIL's shape is symbolic; the extent may still be fixed
        extent = _fixed_extent(ctx, shape, begin_mask, end_mask, squeeze_mask)
    else:
        extent = [1 if squeeze_mask[a] else out.pop(0) for a in range(rank)]
    if extent is not None:
        end = ctx.ops.broadcasting_add(begin, ctx.constant(np.asarray(extent, np.int32)))
    else:  # the extent is known at run time only: MIL's end (masked axes to the dim, squeezed ones + 1)
        end = ctx.cast(ctx.v("end"), np.int32)
        negative = ctx.ops.broadcasting_greater(ctx.constant(np.int32(0)), end)
        end = ctx.ops.broadcasting_where(negative, ctx.ops.broadcasting_add(end, dims), end)
        plus_one = ctx.ops.broadcasting_add(begin, ctx.constant(np.int32(1)))
        end = ctx.ops.broadcasting_where(ctx.constant(np.asarray(squeeze_mask)), plus_one, end)
        end = ctx.ops.broadcasting_where(ctx.constant(np.asarray(end_mask)), dims, end)
    sliced = ctx.ops.slice_(x, begin, end, np.ones(rank, np.int32))
    squeezed = [a for a in range(rank) if squeeze_mask[a]]
    if extent is not None:
        return ctx.reshape(sliced, [e for a, e in enumerate(extent) if not squeeze_mask[a]])
    return ctx.ops.shrink_dims(sliced, np.asarray(squeezed, np.int32)) if squeezed else sliced


#: An element of an int vector: (the scalar var it offsets, or None for a constant; offset).
Affine = tuple[Any, int]


def _fixed_extent(ctx: RuleContext, shape: tuple[int, ...], begin_mask: list[bool], end_mask: list[bool],
                  squeeze_mask: list[bool]) -> list[int] | None:
    """The slice's extent per axis when end - begin is the same on every run (a loop body's
    `begin = [i, 0, ...]`, `end = [i + 1, n, ...]`), though MIL gave the slice symbolic dims;
    None when some axis's extent is known at run time only."""
    begin, end = _affine(ctx, ctx.var("begin")), _affine(ctx, ctx.var("end"))
    rank = len(shape)
    if begin is None or end is None or len(begin) != rank or len(end) != rank:
        return None
    extent = []
    for axis in range(rank):
        (b_var, b), (e_var, e) = begin[axis], end[axis]
        if squeeze_mask[axis]:
            extent.append(1)
            continue
        if begin_mask[axis]:
            b_var, b = None, 0
        if end_mask[axis]:
            e_var, e = None, shape[axis]
        if b_var is None and e_var is None:
            start, stop, _ = slice(b, e, 1).indices(shape[axis])
            extent.append(max(stop - start, 0))
        elif b_var is e_var and e >= b:  # the same runtime index on both sides
            extent.append(e - b)
        else:
            return None
    return extent


def _affine(ctx: RuleContext, var: Any, depth: int = 0) -> list[Affine] | None:
    """The elements of an int vector `var` as (scalar var, offset) pairs, through the ops that
    build a slice's bounds (concat, add/sub of constants, reshapes, casts); None when they are
    not of that form."""
    value = ctx.translator.const_value(var)
    if value is not None:
        return [(None, int(v)) for v in np.asarray(value).reshape(-1)]
    op = getattr(var, "op", None)
    if op is not None and depth < 12:
        inputs = dict(op.inputs)
        if op.op_type == "concat" and not _const_param(ctx, inputs.get("interleave"), False):
            parts = [_affine(ctx, v, depth + 1) for v in inputs["values"]]
            if all(p is not None for p in parts):
                return [element for part in parts if part is not None for element in part]
        elif op.op_type in ("add", "sub"):
            x, y = _affine(ctx, inputs["x"], depth + 1), _affine(ctx, inputs["y"], depth + 1)
            combined = _combine(x, y, -1 if op.op_type == "sub" else 1)
            if combined is not None:
                return combined
        elif op.op_type in ("expand_dims", "reshape", "squeeze", "identity", "cast"):
            return _affine(ctx, inputs["x"], depth + 1)
    if all(isinstance(d, (int, np.integer)) and int(d) == 1 for d in getattr(var, "shape", ())):
        return [(var, 0)]  # a scalar known at run time only: itself
    return None


def _combine(x: list[Affine] | None, y: list[Affine] | None, sign: int) -> list[Affine] | None:
    """x + sign * y elementwise (broadcasting a single element), when y is constant (or x is,
    for an addition)."""
    if x is None or y is None:
        return None
    if sign == 1 and any(v is not None for v, _ in y) and all(v is None for v, _ in x):
        x, y = y, x
    if any(v is not None for v, _ in y):
        return None
    if len(y) == 1:
        y = y * len(x)
    if len(x) == 1 and len(y) > 1:
        x = x * len(y)
    if len(x) != len(y):
        return None
    return [(v, a + sign * b) for (v, a), (_, b) in zip(x, y, strict=True)]


def _const_param(ctx: RuleContext, var: Any, default: Any) -> Any:
    if var is None:
        return default
    value = ctx.translator.const_value(var)
    return default if value is None else np.asarray(value).item()


@rule("slice_by_size")
def slice_by_size(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    size = ctx.ints("size")
    if ctx.is_const("begin"):
        begin = ctx.ints("begin")
        stops = [shape[a] if size[a] == -1 else begin[a] + size[a] for a in range(len(shape))]
        return static_slice(ctx, x, list(begin), stops, [1] * len(shape))
    if any(s < 0 for s in size):
        raise ctx.fail("a runtime begin needs a static size")
    begin = ctx.cast(ctx.v("begin"), np.int32)
    end = ctx.ops.broadcasting_add(begin, ctx.constant(size, np.int32))
    return ctx.ops.slice_(x, begin, end, np.ones(len(shape), np.int32))


@rule("concat")
def concat(ctx: RuleContext) -> Any:
    values = ctx.vs("values")
    out = ctx.out_shape()
    axis = int(ctx.param("axis")) % len(out)
    if len(values) == 1:
        return values[0]
    if ctx.param("interleave", False):
        # out[.., i*n + j, ..] = values[j][.., i, ..]: give each value a unit axis after `axis`,
        # join there, and fold the two axes back into one.
        if any(d < 0 for d in out):
            raise ctx.fail("interleave=True needs a static shape")
        pieces = []
        for v in values:
            shape = list(adapter.shape_of(v))
            pieces.append(ctx.reshape(v, [*shape[: axis + 1], 1, *shape[axis + 1:]]))
        return ctx.reshape(ctx.ops.concat(axis + 1, pieces), out)
    return ctx.ops.concat(axis, values)


@rule("split")
def split(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    axis = int(ctx.param("axis")) % len(shape)
    sizes = [ctx.out_shape(i)[axis] for i in range(len(ctx.op.outputs))]
    if any(size < 0 for size in sizes) and shape[axis] >= 0:  # symbolic pieces of a static dim
        sizes = ctx.ints("split_sizes") if ctx.is_const("split_sizes") else [shape[axis] // len(sizes)] * len(sizes)
    pieces, offset = [], 0
    for size in sizes:
        starts, stops = [0] * len(shape), list(shape)
        starts[axis], stops[axis] = offset, offset + size
        pieces.append(static_slice(ctx, x, starts, stops, [1] * len(shape)))
        offset += size
    return tuple(pieces)


@rule("stack")
def stack(ctx: RuleContext) -> Any:
    values = ctx.vs("values")
    out = ctx.out_shape()
    axis = int(ctx.param("axis")) % len(out)
    piece_shape = list(out)
    piece_shape[axis] = 1
    pieces = [ctx.reshape(v, piece_shape) for v in values]
    return pieces[0] if len(pieces) == 1 else ctx.ops.concat(axis, pieces)


@rule("tile")
def tile(ctx: RuleContext) -> Any:
    return ctx.ops.tile(ctx.v("x"), np.asarray(ctx.ints("reps"), np.uint32))


@rule("reverse")
def reverse(ctx: RuleContext) -> Any:
    rank = ctx.rank("x")
    axes = ctx.ints("axes", list(range(rank)))
    return ctx.ops.reverse(ctx.v("x"), np.asarray([a % rank for a in axes], np.int32))


@rule("pad")
def pad(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    rank = ctx.rank("x")
    pads = ctx.ints("pad")
    full = [0] * (2 * rank - len(pads)) + pads
    mode = ctx.param("mode", "constant")
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "replicate"}
    if mode not in modes:
        raise ctx.fail(f"pad mode {mode!r} is not supported")
    value = ctx.scalar(ctx.param("constant_val", 0.0), x)
    return ctx.ops.pad(x, np.asarray(full, np.uint32), value, modes[mode])


def _full(ctx: RuleContext, value: Any) -> Any:
    shape = ctx.out_shape()
    if any(d < 0 for d in shape):
        raise ctx.fail("a fill of a dynamic shape is not supported")
    if ctx.is_const("value"):
        return ctx.constant(np.full(shape, np.asarray(ctx.const("value")), dtype=ctx.out_dtype()))
    return ctx.ops.broadcast_to(ctx.cast(value, ctx.out_dtype()), np.asarray(shape, np.uint32))


@rule("fill")
def fill(ctx: RuleContext) -> Any:
    return _full(ctx, ctx.v("value") if not ctx.is_const("value") else None)


@rule("fill_like")
def fill_like(ctx: RuleContext) -> Any:
    return _full(ctx, ctx.v("value") if not ctx.is_const("value") else None)


@rule("shape")
def shape(ctx: RuleContext) -> Any:
    dims = ctx.in_shape("x")
    if any(d < 0 for d in dims):
        return ctx.cast(ctx.ops.get_shape(ctx.v("x")), np.int32)
    return ctx.constant(np.asarray(dims, np.int32))


@rule("range_1d")
def range_1d(ctx: RuleContext) -> Any:
    if all(ctx.is_const(n) for n in ("start", "end", "step")):
        values = np.arange(ctx.const("start"), ctx.const("end"), ctx.const("step"))
        return ctx.constant(values.astype(ctx.out_dtype()))
    return ctx.ops.range_(ctx.v("start"), ctx.v("end"), ctx.v("step"))


@rule("band_part")
def band_part(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    lower, upper = int(ctx.param("lower", -1)), int(ctx.param("upper", -1))
    rows, cols = np.arange(shape[-2])[:, None], np.arange(shape[-1])[None, :]
    keep = np.ones((shape[-2], shape[-1]), bool)
    if lower >= 0:
        keep &= rows - cols <= lower
    if upper >= 0:
        keep &= cols - rows <= upper
    return ctx.ops.broadcasting_where(ctx.constant(keep), x, ctx.scalar(0, x))


def wrap_indices(ctx: RuleContext, indices: Any, dim: int) -> Any:
    indices = ctx.cast(indices, np.int32)
    negative = ctx.ops.broadcasting_greater(ctx.constant(np.int32(0)), indices)
    return ctx.ops.broadcasting_where(negative, ctx.ops.broadcasting_add(indices, ctx.constant(np.int32(dim))), indices)


@rule("gather")
def gather(ctx: RuleContext) -> Any:
    if int(ctx.param("batch_dims", 0)) != 0:
        raise ctx.fail("batch_dims > 0 is not supported")
    shape = ctx.in_shape("x")
    axis = int(ctx.param("axis", 0)) % len(shape)
    indices = wrap_indices(ctx, ctx.v("indices"), shape[axis])
    index_shape = ctx.in_shape("indices")
    transposed = ctx.translator.transposed_weight(ctx.var("x")) if axis == 0 and len(shape) == 2 else None
    if transposed is not None and all(d >= 0 for d in index_shape):
        # A tied embedding: its rows are the columns of the transposed copy `linear` reads.
        count = int(np.prod(index_shape, dtype=np.int64))
        columns = ctx.ops.broadcast_to(ctx.reshape(indices, [1, count]), np.asarray([shape[1], count], np.uint32))
        rows = ctx.ops.transpose(ctx.ops.gather_along_axis(transposed, columns, np.int32(1)), np.asarray([1, 0], np.uint32))
        return ctx.reshape(rows, [*index_shape, shape[1]])
    x = ctx.v("x")
    perm = [axis, *[a for a in range(len(shape)) if a != axis]]
    moved = x if axis == 0 else ctx.ops.transpose(x, np.asarray(perm, np.uint32))
    gathered = ctx.ops.gather_nd(moved, ctx.reshape(indices, [*index_shape, 1]))
    if axis == 0:
        return gathered
    # gathered: indices dims, then the other axes in order; put the index dims at `axis`.
    k = len(index_shape)
    order = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, k + len(shape) - 1))
    return ctx.ops.transpose(gathered, np.asarray(order, np.uint32))


@rule("gather_along_axis")
def gather_along_axis(ctx: RuleContext) -> Any:
    shape = ctx.in_shape("x")
    axis = int(ctx.param("axis", 0)) % len(shape)
    indices = wrap_indices(ctx, ctx.v("indices"), shape[axis])
    return ctx.ops.gather_along_axis(ctx.v("x"), indices, np.int32(axis))


@rule("gather_nd")
def gather_nd(ctx: RuleContext) -> Any:
    indices = ctx.cast(ctx.v("indices"), np.int32)
    batch_dims = int(ctx.param("batch_dims", 0))
    if batch_dims:
        return batch_gather_nd(ctx, ctx.v("x"), indices, batch_dims)
    return ctx.ops.gather_nd(ctx.v("x"), indices)


@rule("one_hot")
def one_hot(ctx: RuleContext) -> Any:
    indices = ctx.cast(ctx.v("indices"), np.int32)
    depth = int(ctx.param("one_hot_vector_size"))
    axis = int(ctx.param("axis", -1))
    out = ctx.out_shape()
    axis %= len(out)
    index_shape = list(ctx.in_shape("indices"))
    index_shape.insert(axis, 1)
    positions = [1] * len(out)
    positions[axis] = depth
    hot = ctx.ops.broadcasting_equal(ctx.reshape(indices, index_shape),
                                     ctx.constant(np.arange(depth, dtype=np.int32).reshape(positions)))
    dtype = ctx.out_dtype()
    on = ctx.constant(np.asarray(ctx.param("on_value", 1), dtype))
    off = ctx.constant(np.asarray(ctx.param("off_value", 0), dtype))
    return ctx.ops.broadcasting_where(hot, on, off)


@rule("cumsum")
def cumsum(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    axis = int(ctx.param("axis", 0)) % len(shape)
    dtype = numpy_dtype(x)
    work = ctx.cast(x, np.float32) if dtype.kind != "f" else x
    result = ctx.ops.scan(work, np.uint32(axis), np.bool_(bool(ctx.param("reverse", False))), combiner="sum")
    if ctx.param("exclusive", False):
        result = ctx.ops.broadcasting_sub(result, work)
    return ctx.cast(result, ctx.out_dtype())


@rule("slice_update")
def slice_update(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    rank = len(shape)
    stride = ctx.ints("stride", [1] * rank)
    begin_mask = [bool(b) for b in (ctx.param("begin_mask") or [False] * rank)]
    end_mask = [bool(b) for b in (ctx.param("end_mask") or [False] * rank)]
    squeeze_mask = [bool(b) for b in (ctx.param("squeeze_mask") or [False] * rank)]
    update = ctx.v("update")
    if ctx.is_const("begin") and ctx.is_const("end"):
        begin, end = ctx.ints("begin"), ctx.ints("end")
        starts, stops = [], []
        for axis in range(rank):
            b = 0 if begin_mask[axis] else begin[axis] % shape[axis] if begin[axis] < 0 else begin[axis]
            e = b + 1 if squeeze_mask[axis] else shape[axis] if end_mask[axis] else \
                end[axis] + shape[axis] if end[axis] < 0 else end[axis]
            starts.append(b)
            stops.append(e)
        if any(s < 0 for s in stride):
            raise ctx.fail("a negative stride is not supported")
        piece = [len(range(b, e, s)) for b, e, s in zip(starts, stops, stride, strict=True)]
        return ctx.ops.slice_update(x, np.asarray(starts, np.int32), np.asarray(stops, np.int32),
                                    np.asarray(stride, np.int32), ctx.reshape(update, piece))
    if any(s != 1 for s in stride):
        raise ctx.fail("a runtime begin/end needs unit strides")
    begin = ctx.cast(ctx.v("begin"), np.int32)
    if any(begin_mask):
        begin = ctx.ops.broadcasting_mul(begin, ctx.constant(np.asarray([0 if m else 1 for m in begin_mask], np.int32)))
    # The slice's extent is the update's (squeezed axes are 1): end = begin + extent.
    update_shape = list(adapter.shape_of(update))
    piece = []
    for axis in range(rank):
        piece.append(1 if squeeze_mask[axis] else update_shape.pop(0) if update_shape else 1)
    end = ctx.ops.broadcasting_add(begin, ctx.constant(np.asarray(piece, np.int32)))
    return ctx.ops.slice_update(x, begin, end, np.ones(rank, np.int32), ctx.reshape(update, piece))


def batch_gather_nd(ctx: RuleContext, x: Any, indices: Any, batch_dims: int) -> Any:
    """gather_nd whose first `batch_dims` axes are batch axes: the batch coordinates are
    prepended to every index tuple."""
    index_shape = adapter.shape_of(indices)
    coords = []
    for b in range(batch_dims):
        grid = np.arange(index_shape[b], dtype=np.int32).reshape([-1 if a == b else 1 for a in range(len(index_shape) - 1)])
        full = np.broadcast_to(grid, index_shape[:-1])[..., None]
        coords.append(ctx.constant(np.ascontiguousarray(full)))
    return ctx.ops.gather_nd(x, ctx.ops.concat(len(index_shape) - 1, [*coords, indices]))
