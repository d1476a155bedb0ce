"""Compressed-weight (constexpr_*) ops and the iOS17 activation quantize / dequantize.

Decompression is implemented here from the op definitions (not delegated to coremltools), so the
cross-check can compare it with coremltools' `materialized_val_inference`.
"""

from __future__ import annotations

import numpy as np

from rlx_mil.milexec.registry import OpContext, kernel


def _along_axis(param: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    """A scalar or [dim] vector parameter shaped to broadcast along `axis` of a rank-`rank` tensor."""
    param = np.asarray(param)
    if param.ndim == 0 or param.ndim == rank:
        return param
    if axis is None:
        raise ValueError("a vector scale/zero_point needs an axis")
    if axis < 0:
        axis += rank
    shape = [1] * rank
    shape[axis] = param.size
    return param.reshape(shape)


def _axis(ctx: OpContext) -> int | None:
    value = ctx.param("axis")
    return None if value is None else int(value)


@kernel("constexpr_affine_dequantize")
def constexpr_affine_dequantize(ctx: OpContext) -> np.ndarray:
    data = ctx.raw("quantized_data").astype(np.float32)
    axis = _axis(ctx)
    scale = _along_axis(ctx.val("scale").astype(np.float32), data.ndim, axis)
    zero_point = _along_axis(ctx.raw("zero_point").astype(np.float32), data.ndim, axis)
    return scale * (data - zero_point)


def _blockwise(param: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Repeat each block parameter over its block: block size = data dim / param dim."""
    for axis, (full, blocks) in enumerate(zip(shape, param.shape, strict=True)):
        if blocks != full:
            param = np.repeat(param, full // blocks, axis=axis)
    return param


def _shift_scale(data: np.ndarray, scale: np.ndarray, offset: np.ndarray | None) -> np.ndarray:
    values = data.astype(np.float32)
    if offset is not None:
        values = values - _blockwise(offset.astype(np.float32), data.shape)
    return _blockwise(scale.astype(np.float32), data.shape) * values


@kernel("constexpr_blockwise_shift_scale")
def constexpr_blockwise_shift_scale(ctx: OpContext) -> np.ndarray:
    offset = ctx.raw("offset") if ctx.has("offset") else None
    return _shift_scale(ctx.raw("data"), ctx.raw("scale"), offset)


@kernel("constexpr_cast")
def constexpr_cast(ctx: OpContext) -> np.ndarray:
    return ctx.raw("source_val").astype(np.float32)


def _unpack_bits(packed: np.ndarray, nbits: int, count: int) -> np.ndarray:
    """Little-endian (LSB first) n-bit fields packed into bytes -> uint values."""
    bits = np.unpackbits(packed.astype(np.uint8).reshape(-1), bitorder="little")
    fields = bits[: count * nbits].reshape(count, nbits).astype(np.int64)
    return np.asarray((fields << np.arange(nbits)).sum(axis=1))


def _lut_dense(indices: np.ndarray, lut: np.ndarray, vector_axis: int | None) -> np.ndarray:
    """iOS18 LUT decompression: lut [*blocks, 2^n, vector] indexed per block by `indices`."""
    rank = indices.ndim
    vector = lut.shape[-1]
    block_index = [
        (np.arange(n) // (n // blocks)).reshape([-1 if i == axis else 1 for i in range(rank)])
        for axis, (n, blocks) in enumerate(zip(indices.shape, lut.shape[:rank], strict=True))
    ]
    lookup: tuple[np.ndarray, ...] = (*block_index, indices.astype(np.int64))
    picked = lut[lookup]  # indices.shape + [vector]
    if vector == 1:
        return picked[..., 0]
    if vector_axis is None:
        raise ValueError("vector palettization needs vector_axis")
    axis = vector_axis + rank if vector_axis < 0 else vector_axis
    moved = np.moveaxis(picked, -1, axis + 1)
    shape = list(indices.shape)
    shape[axis] *= vector
    return moved.reshape(shape)


@kernel("constexpr_lut_to_dense")
def constexpr_lut_to_dense(ctx: OpContext) -> np.ndarray:
    lut = ctx.raw("lut")
    if ctx.opset >= 18:
        vector_axis = ctx.param("vector_axis")
        return _lut_dense(ctx.raw("indices"), lut, None if vector_axis is None else int(vector_axis))
    shape = ctx.int_list("shape")
    count = int(np.prod(shape))
    nbits = int(np.log2(lut.size))
    return lut[_unpack_bits(ctx.raw("indices"), nbits, count)].reshape(shape)


def _sparse_dense(nonzero: np.ndarray, mask: np.ndarray) -> np.ndarray:
    dense = np.zeros(mask.shape, dtype=nonzero.dtype)
    dense[mask != 0] = nonzero.reshape(-1)
    return dense


@kernel("constexpr_sparse_to_dense")
def constexpr_sparse_to_dense(ctx: OpContext) -> np.ndarray:
    nonzero = ctx.raw("nonzero_data")
    if ctx.opset >= 18:
        return _sparse_dense(nonzero, ctx.raw("mask"))
    shape = ctx.int_list("shape")
    count = int(np.prod(shape))
    mask = _unpack_bits(ctx.raw("mask"), 1, count).reshape(shape)
    return _sparse_dense(nonzero, mask)


@kernel("constexpr_lut_to_sparse")
def constexpr_lut_to_sparse(ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
    mask = ctx.raw("indices_mask")
    vector_axis = ctx.param("vector_axis")
    vector_axis = None if vector_axis is None else int(vector_axis)
    indices = _sparse_dense(ctx.raw("indices_nonzero_data"), mask)
    lut = ctx.raw("lut")
    dense = _lut_dense(indices, lut, vector_axis)
    out_mask = mask
    if lut.shape[-1] > 1 and vector_axis is not None:
        out_mask = np.repeat(mask, lut.shape[-1], axis=vector_axis)
    return out_mask, dense[out_mask != 0].reshape(-1)


@kernel("constexpr_sparse_blockwise_shift_scale")
def constexpr_sparse_blockwise_shift_scale(ctx: OpContext) -> tuple[np.ndarray, np.ndarray]:
    mask = ctx.raw("data_mask")
    dense = _sparse_dense(ctx.raw("nonzero_data"), mask)
    offset = ctx.raw("offset") if ctx.has("offset") else None
    values = _shift_scale(dense, ctx.raw("scale"), offset)
    return mask, values[mask != 0].reshape(-1)


@kernel("quantize")
def quantize(ctx: OpContext) -> np.ndarray:
    x = ctx.val("input").astype(np.float32, copy=False)
    axis = _axis(ctx)
    scale = _along_axis(ctx.val("scale").astype(np.float32), x.ndim, axis)
    out_dtype = ctx.out_dtype()
    q = np.rint(x / scale)
    if ctx.has("zero_point"):
        q = q + _along_axis(ctx.raw("zero_point").astype(np.float32), x.ndim, axis)
    info = np.iinfo(out_dtype)
    return np.clip(q, info.min, info.max)


@kernel("dequantize")
def dequantize(ctx: OpContext) -> np.ndarray:
    data = ctx.raw("input").astype(np.float32)
    axis = _axis(ctx)
    scale = _along_axis(ctx.val("scale").astype(np.float32), data.ndim, axis)
    if ctx.has("zero_point"):
        data = data - _along_axis(ctx.raw("zero_point").astype(np.float32), data.ndim, axis)
    return scale * data
