"""Linear (affine) weight quantization with coremltools' formulas.

For each block (the whole tensor, one output channel, or `block_size` input elements of one
output channel) coremltools' `quantize_weight_by_dtype` computes:

* symmetric: lo, hi = -max|w|, max|w|;  asymmetric: lo, hi = min(0, min w), max(0, max w)
* scale = (hi - lo) / (qmax - qmin) with [qmin, qmax] from `LinearScheme.quant_range`
* offset: symmetric unsigned qmax // 2; asymmetric clip(round((qmin*hi - qmax*lo) / (hi - lo)));
  symmetric signed none
* float offset (rlx_mil's ``uint4-float``, iOS18 only; no coremltools counterpart): lo, hi = min w,
  max w; offset = qmin - lo / scale in the program's float type, so a block's range need not
  include zero (llama.cpp's Q4_1 ``d*q + m`` is scale d, offset -m/d)
* q = clip(round(w / scale) + offset, qmin, qmax) (round half to even), w ~= scale * (q - offset)
  (a float offset is added before rounding)

Two deliberate refinements, both within coremltools' own rounding: the scale is rounded to the
program's float dtype *before* the codes are computed (so codes fit the scale Core ML will
use), and an all-zero block gets scale 1 (coremltools would divide 0 by 0).

Weights are processed a slab of output channels at a time, so converting a float16/bfloat16
(possibly memory-mapped) weight never holds more than one slab in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_mil.compress.code_store import CodeWriter, WriterFactory
from rlx_mil.compress.schemes import PER_BLOCK, PER_TENSOR, LinearScheme
from rlx_mil.errors import CompressionError

#: Elements converted to float32 at a time.
SLAB_ELEMENTS = 1 << 22


@dataclass
class LinearCodes:
    """Integer codes in the storage layout plus per-block scale (and offset) tables.

    `data` has the weight's storage shape; `scale` / `offset` have the same rank, with the
    number of blocks on each axis (block size = data dim / table dim)."""

    data: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None
    scheme: LinearScheme
    sq_error: float
    sq_norm: float
    #: Largest |decoded - source| when the codes came from an already quantized source.
    max_error: float | None = None

    def dequantize(self) -> np.ndarray:
        """scale * (data - offset) in float32, exactly as the constexpr op decodes it."""
        values = self.data.astype(np.float32)
        if self.offset is not None:
            values = values - _expand(self.offset.astype(np.float32), values.shape)
        return (_expand(self.scale.astype(np.float32), values.shape) * values).astype(np.float32)

    @property
    def relative_error(self) -> float:
        return float(np.sqrt(self.sq_error / self.sq_norm)) if self.sq_norm > 0 else float(np.sqrt(self.sq_error))


def _expand(table: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    for axis, (full, blocks) in enumerate(zip(shape, table.shape, strict=True)):
        if blocks != full:
            table = np.repeat(table, full // blocks, axis=axis)
    return table


def rows_view(weight: np.ndarray) -> np.ndarray:
    """The weight as [output channels, rest]: rank-1 weights are one row."""
    if weight.ndim <= 1:
        return weight.reshape(1, -1)
    return weight.reshape(weight.shape[0], -1)


def block_count(scheme: LinearScheme, shape: tuple[int, ...], name: str) -> int:
    """Blocks per output channel; a block size that does not divide the input extent is an error."""
    if scheme.granularity != PER_BLOCK:
        return 1
    extent = shape[-1] if len(shape) <= 1 else shape[1]
    if extent % scheme.block_size:
        raise CompressionError(
            f"weight {name!r} {list(shape)}: block size {scheme.block_size} does not divide its input dimension"
            f" {extent}; pick a block size that does (e.g. a rule '{name}=int{scheme.bits}-block{_divisor(extent, scheme.block_size)}')"
            " or per-channel quantization"
        )
    return extent // scheme.block_size


def _divisor(extent: int, wanted: int) -> int:
    """The largest power of two <= `wanted` dividing `extent` (a block size to suggest)."""
    size = 1
    while size * 2 <= wanted and extent % (size * 2) == 0:
        size *= 2
    return size


def finite_slab(slab: np.ndarray, name: str, row: int) -> np.ndarray:
    out = np.asarray(slab, dtype=np.float32)
    if not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out))[0]
        where = (row + int(bad[0]), *map(int, bad[1:]))
        raise CompressionError(
            f"weight {name!r} holds a non-finite value ({out[tuple(bad)]}) at row {where[0]}; NaN/inf weights"
            " cannot be quantized or palettized (exclude the weight with a rule '<name>=none')"
        )
    return out


def _table_shape(shape: tuple[int, ...], channels: int, blocks: int) -> tuple[int, ...]:
    if len(shape) <= 1:
        return (blocks,)
    return (channels, blocks) + (1,) * (len(shape) - 2)


def _scale_from_range(lo: np.ndarray, hi: np.ndarray, scheme: LinearScheme, store: type[np.floating]) -> np.ndarray:
    qmin, qmax = scheme.quant_range
    raw = (hi - lo) / float(qmax - qmin)
    scale = raw.astype(store).astype(np.float64)
    tiny = float(np.finfo(store).smallest_subnormal)
    scale = np.where((scale == 0) & (raw > 0), tiny, scale)
    return np.where(raw == 0, 1.0, scale)


def _offset_from_range(
    lo: np.ndarray, hi: np.ndarray, scheme: LinearScheme, scale: np.ndarray, store: type[np.floating],
) -> np.ndarray | None:
    qmin, qmax = scheme.quant_range
    if scheme.signed and scheme.symmetric:
        return None
    if scheme.float_offset:
        # lo lands on code qmin: w = scale * (q - offset) with offset = qmin - lo / scale, kept
        # in the program's float type (a constant block decodes to lo with scale 1).
        return (qmin - lo / scale).astype(store).astype(np.float64)
    if scheme.symmetric:
        return np.full(lo.shape, qmax // 2, dtype=np.float64)
    span = hi - lo
    with np.errstate(invalid="ignore", divide="ignore"):
        zp = np.rint((qmin * hi - qmax * lo) / np.where(span == 0, 1.0, span))
    zp = np.where(span == 0, 0.0, zp)
    return np.clip(zp, qmin, qmax)


def _block_range(blocks: np.ndarray, scheme: LinearScheme) -> tuple[np.ndarray, np.ndarray]:
    lo = blocks.min(axis=-1).astype(np.float64)
    hi = blocks.max(axis=-1).astype(np.float64)
    if scheme.float_offset:
        return lo, hi
    if scheme.symmetric:
        peak = np.maximum(np.abs(lo), np.abs(hi))
        return -peak, peak
    return np.minimum(0.0, lo), np.maximum(0.0, hi)


def code_dtype(scheme: LinearScheme) -> type[np.integer]:
    """The NumPy container of the codes (4-bit codes live in int8/uint8 until emitted)."""
    return np.int8 if scheme.signed else np.uint8


def quantize_linear(
    weight: np.ndarray, scheme: LinearScheme, store: type[np.floating], name: str = "weight",
    code_writer: WriterFactory = CodeWriter,
) -> LinearCodes:
    """Quantize `weight` (storage layout: output channels on axis 0; any float dtype, bfloat16
    included) slab by slab. `store` is the dtype the scales are kept in (the program float);
    the codes go to `code_writer` a slab at a time (`CodeStore.writer`: straight to a file)."""
    shape = tuple(int(d) for d in weight.shape)
    rows = rows_view(weight)
    channels, width = rows.shape
    blocks = block_count(scheme, shape, name)
    qmin, qmax = scheme.quant_range
    data = code_writer((channels, width), np.dtype(code_dtype(scheme)))
    table_rows = 1 if scheme.granularity == PER_TENSOR else channels
    scale = np.empty((table_rows, blocks), dtype=np.float64)
    offset = None if not scheme.has_offset else np.empty((table_rows, blocks), dtype=np.float64)
    step = max(1, SLAB_ELEMENTS // max(width, 1))

    if scheme.granularity == PER_TENSOR:
        lo_all, hi_all = np.inf, -np.inf
        for r0 in range(0, channels, step):
            slab = finite_slab(rows[r0:r0 + step], name, r0)
            lo_all, hi_all = min(lo_all, float(slab.min())), max(hi_all, float(slab.max()))
        lo, hi = _block_range(np.array([[[lo_all, hi_all]]]), scheme)
        s_all = _scale_from_range(lo, hi, scheme, store)
        scale[:] = s_all[0]
        if offset is not None:
            zp = _offset_from_range(lo, hi, scheme, s_all, store)
            assert zp is not None
            offset[:] = zp[0]

    sq_error = sq_norm = 0.0
    for r0 in range(0, channels, step):
        slab = finite_slab(rows[r0:r0 + step], name, r0).reshape(-1, blocks, width // blocks)
        if scheme.granularity == PER_TENSOR:
            s = np.broadcast_to(scale[0], slab.shape[:2])
            z = None if offset is None else np.broadcast_to(offset[0], slab.shape[:2])
        else:
            lo, hi = _block_range(slab, scheme)
            s = _scale_from_range(lo, hi, scheme, store)
            z = _offset_from_range(lo, hi, scheme, s, store)
            scale[r0:r0 + step] = s
            if offset is not None:
                assert z is not None
                offset[r0:r0 + step] = z
        sq_norm += float(np.sum(np.square(slab, dtype=np.float64)))
        # One float64 working array, updated in place (a slab's temporaries dominate the
        # encoder's memory): q = clip(rint(w / s) + z), then the error of s * (q - z).
        q = np.divide(slab, s[..., None])
        if z is not None and scheme.float_offset:
            q += z[..., None]
            np.rint(q, out=q)
        else:
            np.rint(q, out=q)
            if z is not None:
                q += z[..., None]
        np.clip(q, qmin, qmax, out=q)
        data.put(r0, q.reshape(q.shape[0], width))
        if z is not None:
            q -= z[..., None]
        q *= s[..., None]
        q -= slab
        sq_error += float(np.sum(np.square(q, out=q)))

    tshape = _table_shape(shape, table_rows, blocks)
    return LinearCodes(
        data=data.result().reshape(shape),
        scale=scale.astype(store).reshape(tshape),
        offset=None if offset is None else offset.astype(store if scheme.float_offset else code_dtype(scheme)).reshape(tshape),
        scheme=scheme,
        sq_error=sq_error,
        sq_norm=sq_norm,
    )
