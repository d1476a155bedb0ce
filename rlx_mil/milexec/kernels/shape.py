"""Shape, layout, indexing, gather/scatter and tensor-construction ops.

The ops that only move data (reshape, transpose, squeeze, slices, split...) read their input
as stored (`ctx.raw`): an fp16 value stays fp16, since widening it to float32 and rounding the
result back gives the same values at two full passes over the tensor (in Whisper's TextDecoder,
which projects the encoder output again at every token, most of a step's time)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rlx_mil.milexec.registry import OpContext, kernel

# -- reshaping ---------------------------------------------------------------------------------


@kernel("reshape")
def reshape(ctx: OpContext) -> np.ndarray:
    x = ctx.raw("x")
    target = ctx.int_list("shape")
    if 0 in target:
        if ctx.opset >= 17:
            # iOS17: a 0 copies the input dim at the same position counted from the right,
            # or 1 where the input has no such dim.
            offset = x.ndim - len(target)
            target = [
                (x.shape[i + offset] if 0 <= i + offset < x.ndim else 1) if d == 0 else d
                for i, d in enumerate(target)
            ]
        else:
            if len(target) != x.ndim:
                raise ctx.error(f"shape {target} has a 0 but its length differs from rank {x.ndim}")
            target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


@kernel("reshape_like")
def reshape_like(ctx: OpContext) -> np.ndarray:
    x = ctx.raw("x")
    refs = ctx.vals("ref_tensors")
    begins = [int(b) for b in ctx.vals("begins")]
    ends = [int(e) for e in ctx.vals("ends")]
    end_masks = [bool(m) for m in ctx.vals("end_masks")]
    shape: list[int] = []
    for ref, begin, end, to_end in zip(refs, begins, ends, end_masks, strict=True):
        shape.extend(ref.shape[begin:] if to_end else ref.shape[begin:end])
    return x.reshape(shape)


@kernel("expand_dims")
def expand_dims(ctx: OpContext) -> np.ndarray:
    x = ctx.raw("x")
    return np.expand_dims(x, axis=tuple(ctx.int_list("axes")))


@kernel("squeeze")
def squeeze(ctx: OpContext) -> np.ndarray:
    x = ctx.raw("x")
    if not ctx.has("axes") or ctx.param("axes") is None:
        return np.squeeze(x)
    # Like PyTorch: listed axes whose size is not 1 are left alone.
    axes = [a + x.ndim if a < 0 else a for a in ctx.int_list("axes")]
    return np.squeeze(x, axis=tuple(a for a in axes if x.shape[a] == 1))


@kernel("transpose")
def transpose(ctx: OpContext) -> np.ndarray:
    return np.transpose(ctx.raw("x"), ctx.int_list("perm"))


@kernel("flatten2d")
def flatten2d(ctx: OpContext) -> np.ndarray:
    x = ctx.raw("x")
    axis = int(ctx.param("axis", 1))
    if axis < 0:
        axis += x.ndim
    return x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))


# -- slicing -----------------------------------------------------------------------------------


def _bool_list(ctx: OpContext, name: str, rank: int) -> list[bool]:
    if not ctx.has(name) or ctx.param(name) is None:
        return [False] * rank
    return [bool(v) for v in np.asarray(ctx.raw(name)).reshape(-1)]


def _index_slices(ctx: OpContext, rank: int) -> tuple[tuple[slice, ...], list[int]]:
    """numpy slices for slice_by_index / slice_update, and the axes squeeze_mask removes."""
    begin = ctx.int_list("begin")
    end = ctx.int_list("end")
    stride = ctx.int_list("stride") if ctx.param("stride") is not None else [1] * rank
    begin_mask = _bool_list(ctx, "begin_mask", rank)
    end_mask = _bool_list(ctx, "end_mask", rank)
    squeeze_mask = _bool_list(ctx, "squeeze_mask", rank)
    if not len(begin) == len(end) == len(stride) == rank:
        raise ctx.error(f"begin/end/stride lengths {len(begin)}/{len(end)}/{len(stride)} != rank {rank}")
    slices: list[slice] = []
    for axis in range(rank):
        if squeeze_mask[axis]:
            start = begin[axis]
            slices.append(slice(start, start + 1 if start != -1 else None, 1))
            continue
        slices.append(
            slice(
                None if begin_mask[axis] else begin[axis],
                None if end_mask[axis] else end[axis],
                stride[axis],
            )
        )
    return tuple(slices), [a for a in range(rank) if squeeze_mask[a]]


@kernel("slice_by_index")
def slice_by_index(ctx: OpContext) -> np.ndarray:
    x = ctx.raw("x")  # data movement: the stored values (a KV cache is not widened whole)
    slices, squeeze_axes = _index_slices(ctx, x.ndim)
    out = x[slices]
    return np.squeeze(out, axis=tuple(squeeze_axes)) if squeeze_axes else out


@kernel("slice_update")
def slice_update(ctx: OpContext) -> np.ndarray:
    # In the stored dtype: a pure copy (no arithmetic), and a KV-cache state is not widened
    # to float32 on every write. At the input's last use its buffer takes the rows in place.
    x = ctx.raw("x")
    if not ctx.donatable("x"):
        x = x.copy()
    slices, _ = _index_slices(ctx, x.ndim)
    target = x[slices]
    x[slices] = ctx.raw("update").reshape(target.shape)
    return x


@kernel("slice_by_size")
def slice_by_size(ctx: OpContext) -> np.ndarray:
    x = ctx.raw("x")
    begin = ctx.int_list("begin")
    size = ctx.int_list("size")
    slices = []
    for axis, (b, s) in enumerate(zip(begin, size, strict=True)):
        if b < 0:
            b += x.shape[axis]
        slices.append(slice(b, None) if s < 0 else slice(b, b + s))
    return x[tuple(slices)]


@kernel("sliding_windows")
def sliding_windows(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    axis = int(ctx.param("axis"))
    if axis < 0:
        axis += x.ndim
    size = int(ctx.param("size"))
    stride = int(ctx.param("stride", 1))
    windows = sliding_window_view(x, size, axis=axis)
    step = [slice(None)] * windows.ndim
    step[axis] = slice(None, None, stride)
    return np.moveaxis(windows[tuple(step)], -1, axis + 1)


# -- joining and splitting ---------------------------------------------------------------------


@kernel("concat")
def concat(ctx: OpContext) -> np.ndarray:
    values = ctx.vals("values")
    axis = int(ctx.param("axis"))
    if all(v.ndim == 0 for v in values):
        return np.stack(values)
    if ctx.param("interleave", False):
        if axis < 0:
            axis += values[0].ndim
        stacked = np.stack(values, axis=axis + 1)
        shape = list(values[0].shape)
        shape[axis] *= len(values)
        return stacked.reshape(shape)
    return np.concatenate(values, axis=axis)


@kernel("split")
def split(ctx: OpContext) -> tuple[np.ndarray, ...]:
    x = ctx.raw("x")
    axis = int(ctx.param("axis"))
    if ctx.has("split_sizes") and ctx.param("split_sizes") is not None:
        sizes = ctx.int_list("split_sizes")
    else:
        count = int(ctx.param("num_splits"))
        if x.shape[axis] % count:
            raise ctx.error(f"dim {x.shape[axis]} does not divide into {count} splits")
        sizes = [x.shape[axis] // count] * count
    if sum(sizes) != x.shape[axis]:
        raise ctx.error(f"split sizes {sizes} do not add up to dim {x.shape[axis]}")
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@kernel("stack")
def stack(ctx: OpContext) -> np.ndarray:
    return np.stack(ctx.vals("values"), axis=int(ctx.param("axis")))


@kernel("tile")
def tile(ctx: OpContext) -> np.ndarray:
    return np.tile(ctx.val("x"), ctx.int_list("reps"))


@kernel("pad")
def pad(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    amounts = ctx.int_list("pad")
    if len(amounts) % 2 or len(amounts) // 2 > x.ndim:
        raise ctx.error(f"pad has {len(amounts)} entries for a rank-{x.ndim} input")
    widths = [(0, 0)] * (x.ndim - len(amounts) // 2) + [
        (amounts[2 * i], amounts[2 * i + 1]) for i in range(len(amounts) // 2)
    ]
    mode = str(ctx.param("mode", "constant"))
    if mode == "constant":
        fill = ctx.val("constant_val") if ctx.has("constant_val") else np.float32(0)
        return np.pad(x, widths, mode="constant", constant_values=fill)
    if mode in ("reflect", "replicate"):
        return np.pad(x, widths, mode="reflect" if mode == "reflect" else "edge")
    raise ctx.error(f"unknown pad mode {mode!r}")


@kernel("reverse")
def reverse(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    if not ctx.has("axes") or ctx.param("axes") is None:
        return np.flip(x)
    return np.flip(x, axis=tuple(ctx.int_list("axes")))


@kernel("reverse_sequence")
def reverse_sequence(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    lengths = ctx.val("lengths").reshape(-1)
    seq_axis = int(ctx.param("seq_axis", 0)) % x.ndim
    batch_axis = int(ctx.param("batch_axis", 0)) % x.ndim
    out = x.copy()
    for b, length in enumerate(lengths):
        length = int(length)
        index: list[Any] = [slice(None)] * x.ndim
        index[batch_axis] = b
        index[seq_axis] = slice(0, length)
        src = x[tuple(index)]
        seq_in_src = seq_axis - (1 if batch_axis < seq_axis else 0)
        out[tuple(index)] = np.flip(src, axis=seq_in_src)
    return out


# -- construction ------------------------------------------------------------------------------


@kernel("fill")
def fill(ctx: OpContext) -> np.ndarray:
    value = ctx.val("value") if ctx.has("value") else np.float32(0)
    return np.full(ctx.int_list("shape"), value)


@kernel("fill_like")
def fill_like(ctx: OpContext) -> np.ndarray:
    value = ctx.val("value") if ctx.has("value") else np.float32(0)
    return np.full(ctx.raw("ref_tensor").shape, value)


@kernel("range_1d")
def range_1d(ctx: OpContext) -> np.ndarray:
    start, end, step = ctx.val("start"), ctx.val("end"), ctx.val("step")
    return np.arange(start.item(), end.item(), step.item())


@kernel("shape")
def shape(ctx: OpContext) -> np.ndarray:
    return np.asarray(ctx.raw("x").shape, dtype=np.int32)


@kernel("band_part")
def band_part(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    lower = int(ctx.param("lower", -1))
    upper = int(ctx.param("upper", -1))
    rows, cols = x.shape[-2:]
    m = np.arange(rows)[:, None]
    n = np.arange(cols)[None, :]
    keep = ((lower < 0) | (m - n <= lower)) & ((upper < 0) | (n - m <= upper))
    return np.where(keep, x, np.zeros_like(x))


@kernel("one_hot")
def one_hot(ctx: OpContext) -> np.ndarray:
    indices = ctx.val("indices")
    depth = int(np.asarray(ctx.val("one_hot_vector_size")).reshape(-1)[0])
    axis = int(ctx.param("axis", -1))
    on = ctx.val("on_value") if ctx.has("on_value") else np.int32(1)
    off = ctx.val("off_value") if ctx.has("off_value") else np.int32(0)
    hot = indices[..., None] == np.arange(depth)
    out = np.where(hot, on, off)
    rank = indices.ndim + 1
    return np.moveaxis(out, -1, axis if axis >= 0 else axis + rank)


@kernel("cumsum")
def cumsum(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    axis = int(ctx.param("axis", 0))
    if ctx.param("reverse", False):
        x = np.flip(x, axis=axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype if x.dtype.kind == "f" else np.int64)
    if ctx.param("exclusive", False):
        # Shift by one: the first element is 0, the last input element is dropped.
        index: list[Any] = [slice(None)] * x.ndim
        index[axis] = slice(0, -1)
        zeros_shape = list(x.shape)
        zeros_shape[axis] = 1
        out = np.concatenate([np.zeros(zeros_shape, dtype=out.dtype), out[tuple(index)]], axis=axis)
    if ctx.param("reverse", False):
        out = np.flip(out, axis=axis)
    return out


@kernel("non_zero")
def non_zero(ctx: OpContext) -> np.ndarray:
    return np.transpose(np.nonzero(ctx.val("x"))).astype(np.int32)


# -- sorting -----------------------------------------------------------------------------------


def _order(x: np.ndarray, axis: int, ascending: bool) -> np.ndarray:
    # Stable, so equal keys keep input order.
    keys = x if ascending else (-x if x.dtype.kind != "u" else np.iinfo(x.dtype).max - x)
    return np.argsort(keys, axis=axis, kind="stable")


@kernel("argsort")
def argsort(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    return _order(x, int(ctx.param("axis", -1)), bool(ctx.param("ascending", False)))


@kernel("topk")
def topk(ctx: OpContext) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    x = ctx.val("x")
    axis = int(ctx.param("axis", -1))
    k = int(ctx.param("k", 1))
    if k < 0:
        k = x.shape[axis]
    order = _order(x, axis, bool(ctx.param("ascending", False)))
    index: list[Any] = [slice(None)] * x.ndim
    index[axis] = slice(0, k)
    indices = order[tuple(index)]
    values = np.take_along_axis(x, indices, axis=axis)
    if not ctx.param("return_indices", True):
        return values
    return values, indices


# -- gather / scatter --------------------------------------------------------------------------


def _checked_indices(ctx: OpContext, indices: np.ndarray, dim: int | np.ndarray, what: str) -> np.ndarray:
    """Bounds-check gather/scatter indices and resolve negative ones where the opset allows them.

    Up to iOS16 an index may be negative (-dim <= i < 0 counts from the end). From iOS17 negative
    indices are out of bounds. Out-of-bound indices raise: with validate_indices=True Core ML
    raises too, with False its result is undefined, and a converted program must not rely on it.
    """
    indices = indices.astype(np.int64)
    negative_ok = ctx.opset < 17
    low = -np.asarray(dim) if negative_ok else 0
    bad = (indices < low) | (indices >= dim)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        bound = int(np.broadcast_to(dim, indices.shape)[first])
        allowed = f"[-{bound}, {bound})" if negative_ok else f"[0, {bound})"
        consequence = (
            "Core ML raises (validate_indices=True)"
            if bool(ctx.param("validate_indices", False))
            else "the result is undefined on device"
        )
        raise ctx.error(
            f"{what} index {int(indices[first])} at {first} is outside {allowed} "
            f"(opset iOS{ctx.opset}); {consequence}"
        )
    return np.where(indices < 0, indices + dim, indices)


@kernel("gather")
def gather(ctx: OpContext) -> np.ndarray:
    streamed = ctx.streamed("x")
    axis = int(ctx.param("axis", 0))
    batch_dims = int(ctx.param("batch_dims", 0))
    if streamed is not None and axis in (0, -len(streamed.shape)) and batch_dims == 0:
        # A compressed embedding table: only the rows asked for are decoded.
        return streamed.take(_checked_indices(ctx, ctx.val("indices"), streamed.shape[0], "gather"))
    x = ctx.raw("x")  # data movement: an embedding table is not widened whole
    if axis < 0:
        axis += x.ndim
    indices = _checked_indices(ctx, ctx.val("indices"), x.shape[axis], "gather")
    if batch_dims == 0:
        return np.take(x, indices, axis=axis)
    batch_shape = x.shape[:batch_dims]
    flat_x = x.reshape((-1, *x.shape[batch_dims:]))
    flat_i = indices.reshape((-1, *indices.shape[batch_dims:]))
    parts = [np.take(xb, ib, axis=axis - batch_dims) for xb, ib in zip(flat_x, flat_i, strict=True)]
    stacked = np.stack(parts)
    return stacked.reshape(batch_shape + stacked.shape[1:])


@kernel("gather_along_axis")
def gather_along_axis(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    axis = int(ctx.param("axis", 0))
    indices = _checked_indices(ctx, ctx.val("indices"), x.shape[axis], "gather_along_axis")
    return np.take_along_axis(x, indices, axis=axis)


@kernel("gather_nd")
def gather_nd(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    batch_dims = int(ctx.param("batch_dims", 0))
    raw = ctx.val("indices").astype(np.int64)
    depth = raw.shape[-1]
    dims = np.asarray(x.shape[batch_dims : batch_dims + depth])
    indices = _checked_indices(ctx, raw, dims, "gather_nd")
    batch_shape = x.shape[:batch_dims]
    flat_x = x.reshape((-1, *x.shape[batch_dims:]))
    flat_i = indices.reshape((len(flat_x), -1, depth))
    parts = [xb[tuple(np.moveaxis(ib, -1, 0))] for xb, ib in zip(flat_x, flat_i, strict=True)]
    out_shape = (*batch_shape, *indices.shape[batch_dims:-1], *x.shape[batch_dims + depth :])
    return np.stack(parts).reshape(out_shape)


_SCATTER_UFUNCS: dict[str, np.ufunc] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "max": np.maximum,
    "min": np.minimum,
}


def _scatter_into(
    ctx: OpContext, data: np.ndarray, index: tuple[np.ndarray, ...], updates: np.ndarray
) -> np.ndarray:
    out = data.copy()
    mode = str(ctx.param("mode", "add"))
    if mode == "update":
        out[index] = updates
        return out
    ufunc = _SCATTER_UFUNCS.get(mode)
    if ufunc is None:
        raise ctx.error(f"unknown scatter mode {mode!r}")
    ufunc.at(out, index, updates)
    return out


@kernel("scatter")
def scatter(ctx: OpContext) -> np.ndarray:
    data = ctx.val("data")
    axis = int(ctx.param("axis", 0))
    if axis < 0:
        axis += data.ndim
    indices = _checked_indices(ctx, ctx.val("indices").reshape(-1), data.shape[axis], "scatter")
    moved = np.moveaxis(data, axis, 0)
    updates = np.moveaxis(ctx.val("updates"), axis, 0)
    return np.moveaxis(_scatter_into(ctx, moved, (indices,), updates), 0, axis)


@kernel("scatter_along_axis")
def scatter_along_axis(ctx: OpContext) -> np.ndarray:
    data = ctx.val("data")
    axis = int(ctx.param("axis", 0))
    if axis < 0:
        axis += data.ndim
    indices = _checked_indices(ctx, ctx.val("indices"), data.shape[axis], "scatter_along_axis")
    grid: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    grid[axis] = indices
    return _scatter_into(ctx, data, tuple(grid), ctx.val("updates"))


@kernel("scatter_nd")
def scatter_nd(ctx: OpContext) -> np.ndarray:
    data = ctx.val("data")
    raw = ctx.val("indices").astype(np.int64)
    depth = raw.shape[-1]
    indices = _checked_indices(ctx, raw, np.asarray(data.shape[:depth]), "scatter_nd")
    return _scatter_into(ctx, data, tuple(np.moveaxis(indices, -1, 0)), ctx.val("updates"))


# -- spatial rearrangements --------------------------------------------------------------------


def _blocks_to_space(x: np.ndarray, block: int, channel_major: bool) -> np.ndarray:
    n, c, h, w = x.shape
    out_c = c // (block * block)
    if channel_major:  # PyTorch pixel_shuffle: channel index = c * b * b + i * b + j
        y = x.reshape(n, out_c, block, block, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:  # TensorFlow depth_to_space: channel index = (i * b + j) * C + c
        y = x.reshape(n, block, block, out_c, h, w).transpose(0, 3, 4, 1, 5, 2)
    return y.reshape(n, out_c, h * block, w * block)


def _space_to_blocks(x: np.ndarray, block: int, channel_major: bool) -> np.ndarray:
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // block, block, w // block, block)
    if channel_major:
        y = y.transpose(0, 1, 3, 5, 2, 4)
    else:
        y = y.transpose(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * block * block, h // block, w // block)


@kernel("depth_to_space")
def depth_to_space(ctx: OpContext) -> np.ndarray:
    return _blocks_to_space(ctx.val("x"), int(ctx.param("block_size")), channel_major=False)


@kernel("space_to_depth")
def space_to_depth(ctx: OpContext) -> np.ndarray:
    return _space_to_blocks(ctx.val("x"), int(ctx.param("block_size")), channel_major=False)


@kernel("pixel_shuffle")
def pixel_shuffle(ctx: OpContext) -> np.ndarray:
    return _blocks_to_space(ctx.val("x"), int(ctx.param("upscale_factor")), channel_major=True)


@kernel("pixel_unshuffle")
def pixel_unshuffle(ctx: OpContext) -> np.ndarray:
    return _space_to_blocks(ctx.val("x"), int(ctx.param("downscale_factor")), channel_major=True)


@kernel("upsample_nearest_neighbor")
def upsample_nearest_neighbor(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    out = x
    for axis, name in ((-2, "scale_factor_height"), (-1, "scale_factor_width")):
        scale = float(ctx.param(name, 1))
        size_in = x.shape[axis]
        size_out = int(np.floor(size_in * scale))
        source = np.minimum(np.floor(np.arange(size_out) / scale).astype(np.int64), size_in - 1)
        out = np.take(out, source, axis=axis)
    return out
