"""Reference Quantize, Dequantize and DequantMatMul, with the weight decoders (spec 5.4-5.6).

Legacy schemes (Int8Block, Int8BlockAsym, Int4Block, Fp8E4m3, Fp8E5m2, Nvfp4Block) store
the weight as `[K, N]`; GGUF schemes store llama.cpp blocks of a `[N, K]` weight (each output
row's K values contiguous), so `y = x @ W.T` for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, EvaluationError, ShapeError, UnsupportedOpError
from rlx_mil.ir.ops import Dequantize, DequantMatMul, Quantize, QuantKind, QuantScheme
from rlx_mil.ir.ops.quant import BLOCK_KINDS
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import as_float, finish, reference_kernel, sizes_of

# ------------------------------------------------------------------------------ Quantize


def _channel_params(
    shape: tuple[int, ...], axis: int | None, scales: Sequence[float], zero_points: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Scales and zero points shaped to broadcast against a tensor of `shape`."""
    if len(scales) != len(zero_points):
        raise AttributeValueError(f"{len(scales)} scales but {len(zero_points)} zero_points")
    s = np.asarray(scales, dtype=np.float32)
    z = np.asarray(zero_points, dtype=np.float32)
    if axis is None:
        if len(scales) != 1:
            raise AttributeValueError(f"per-tensor quantization takes one scale, got {len(scales)}")
        return s.reshape(()), z.reshape(())
    if not 0 <= axis < len(shape):
        raise AttributeValueError(f"axis {axis} is out of range for rank {len(shape)}")
    if len(scales) != shape[axis]:
        raise AttributeValueError(
            f"per-channel quantization along axis {axis} needs {shape[axis]} scales, got {len(scales)}"
        )
    bshape = [1] * len(shape)
    bshape[axis] = shape[axis]
    return s.reshape(bshape), z.reshape(bshape)


def round_half_away(v: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (Rust `f32::round`), exactly for float32 input."""
    w = np.asarray(v, dtype=np.float64)  # |v| + 0.5 is exact in float64 for any float32 v
    return np.copysign(np.floor(np.abs(w) + 0.5), w)


def quantize(
    x: np.ndarray, axis: int | None, scales: Sequence[float], zero_points: Sequence[int]
) -> np.ndarray:
    """`clip(round_half_away(x * (1/s)) + zp, -128, 127)` as int8; NaN maps to 0 (spec 5.4)."""
    s, z = _channel_params(x.shape, axis, scales, zero_points)
    v = as_float(x, np.dtype(np.float32))
    with np.errstate(all="ignore"):
        inv = np.float32(1.0) / s
        scaled = v * inv
        q = np.clip(round_half_away(scaled) + z.astype(np.float64), -128.0, 127.0)
    return np.where(np.isnan(q), 0.0, q).astype(np.int8)


def dequantize(
    q: np.ndarray, axis: int | None, scales: Sequence[float], zero_points: Sequence[int]
) -> np.ndarray:
    """`(q - zp) * s` in float32 (spec 5.5)."""
    s, z = _channel_params(q.shape, axis, scales, zero_points)
    return (as_float(q) - z) * s


@reference_kernel(Quantize)
def _quantize(op: Quantize, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(quantize(inputs[0], op.axis, op.scales, op.zero_points), out)


@reference_kernel(Dequantize)
def _dequantize(op: Dequantize, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(dequantize(inputs[0], op.axis, op.scales, op.zero_points), out)


# ------------------------------------------------------------------------------ code tables


def _e4m3fn_table() -> np.ndarray:
    """OCP FP8 E4M3FN: bias 7, subnormals m * 2^-9, exponent 15 is a normal binade,
    only S.1111.111 is NaN (max 448)."""
    codes = np.arange(256)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 0x7).astype(np.float64)
    magnitude = np.where(
        exponent == 0, mantissa * 2.0**-9, (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    )
    magnitude[(codes & 0x7F) == 0x7F] = np.nan
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


def _e5m2_table() -> np.ndarray:
    """FP8 E5M2, IEEE style: bias 15, subnormals m * 2^-16, exponent 31 is inf/NaN."""
    codes = np.arange(256)
    exponent = (codes >> 2) & 0x1F
    mantissa = (codes & 0x3).astype(np.float64)
    with np.errstate(over="ignore"):
        magnitude = np.where(
            exponent == 0, mantissa * 2.0**-16, (1.0 + mantissa / 4.0) * np.exp2(exponent - 15.0)
        )
    magnitude[exponent == 31] = np.where(mantissa[exponent == 31] == 0, np.inf, np.nan)
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


E4M3FN = _e4m3fn_table()
E5M2 = _e5m2_table()
#: FP4 E2M1 values by 4-bit code.
E2M1 = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32
)


def as_bytes(a: np.ndarray) -> np.ndarray:
    """Packed weight bytes as flat uint8 (int8 arrays reinterpret two's complement)."""
    values = np.asarray(a)
    if values.dtype.kind == "f":
        values = values.astype(np.int64)
    return (values.astype(np.int64) & 0xFF).astype(np.uint8).reshape(-1)


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    return E4M3FN[as_bytes(codes)].reshape(np.shape(codes))


def decode_e5m2(codes: np.ndarray) -> np.ndarray:
    return E5M2[as_bytes(codes)].reshape(np.shape(codes))


def four_bit_codes(w_q: np.ndarray, count: int) -> np.ndarray:
    """The `count` 4-bit codes of a weight fed either packed (ceil(count/2) bytes, see
    `unpack_nibbles`) or unpacked, one code 0..15 per element of the logical `[K, N]` shape
    (upstream declares 4-bit weights with their logical shape)."""
    packed_size = (count + 1) // 2
    if w_q.size == count and (count != packed_size or w_q.size == 0):
        values = np.asarray(w_q).reshape(-1)
        if values.size and (values.min() < 0 or values.max() > 15):
            raise EvaluationError(
                "unpacked 4-bit codes must lie in 0..15",
                [f"w_q holds values in [{values.min()}, {values.max()}]"],
            )
        return values.astype(np.uint8)
    return unpack_nibbles(w_q, count)


def unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """4-bit codes over a flat index: byte f // 2, even f in the low nibble, odd f in the high."""
    raw = as_bytes(packed)
    need = (count + 1) // 2
    if raw.size != need:
        raise ShapeError(
            f"a 4-bit weight must hold {count} codes or ceil({count}/2) = {need} packed bytes, got {raw.size}",
            operand="w_q",
        )
    codes = np.empty(2 * raw.size, dtype=np.uint8)
    codes[0::2] = raw & 0xF
    codes[1::2] = raw >> 4
    return codes[:count]


# ------------------------------------------------------------------------------ legacy schemes


def _block_rows(values: np.ndarray, k: int, n: int, block: int, operand: str) -> np.ndarray:
    """A `[ceil(K/bs), N]` per-block table expanded to `[K, N]`."""
    groups = -(-k // block)
    if values.size != groups * n:
        raise ShapeError(
            f"{operand} must be [ceil({k}/{block}), {n}] = [{groups}, {n}], got shape {list(values.shape)}",
            operand=operand,
        )
    table = as_float(values).reshape(groups, n)
    return np.repeat(table, block, axis=0)[:k]


def _columns_from_table(table: np.ndarray, k: int, block: int, operand: str) -> int:
    groups = -(-k // block)
    if table.size == 0 or table.size % groups != 0:
        raise ShapeError(
            f"{operand} must be [ceil({k}/{block}), N] = [{groups}, N], got shape {list(table.shape)}",
            operand=operand,
        )
    return table.size // groups


def _legacy_weight(scheme: QuantScheme, k: int, w_q: np.ndarray, scale: np.ndarray, third: np.ndarray) -> np.ndarray:
    """Reconstruct the `[K, N]` f32 weight of a non-GGUF scheme."""
    kind = scheme.kind
    if kind in (QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM):
        assert scheme.block_size is not None
        n = _columns_from_table(scale, k, scheme.block_size, "scale")
        if w_q.size != k * n:
            raise ShapeError(f"w_q must be [K, N] = [{k}, {n}], got shape {list(w_q.shape)}", operand="w_q")
        codes = as_float(w_q.astype(np.int8) if w_q.dtype.kind in "iu" else w_q).reshape(k, n)
        scales = _block_rows(scale, k, n, scheme.block_size, "scale")
        if kind is QuantKind.INT8_BLOCK_ASYM:
            zero = _block_rows(third, k, n, scheme.block_size, "zp")
            return (codes - zero) * scales
        return codes * scales
    if kind is QuantKind.INT4_BLOCK:
        assert scheme.block_size is not None
        n = _columns_from_table(scale, k, scheme.block_size, "scale")
        codes = four_bit_codes(w_q, k * n).astype(np.float32).reshape(k, n)
        return codes * _block_rows(scale, k, n, scheme.block_size, "scale")
    if kind in (QuantKind.FP8_E4M3, QuantKind.FP8_E5M2):
        if w_q.size % k != 0 or w_q.size == 0:
            raise ShapeError(f"w_q must be [K, N] with K = {k}, got shape {list(w_q.shape)}", operand="w_q")
        n = w_q.size // k
        table = E4M3FN if kind is QuantKind.FP8_E4M3 else E5M2
        weight = table[as_bytes(w_q)].reshape(k, n)
        if scale.size == 0:
            return weight
        if scale.size not in (1, n):
            raise ShapeError(f"scale must be [N] = [{n}] (or one value), got shape {list(scale.shape)}", operand="scale")
        return weight * as_float(scale).reshape(-1)
    if kind is QuantKind.NVFP4_BLOCK:
        n = _columns_from_table(scale, k, 16, "block_scale")
        codes = four_bit_codes(w_q, k * n).reshape(k, n)
        block = decode_e4m3(as_bytes(scale))
        block = np.where(np.isnan(block), np.float32(0), block)  # NaN scale bytes count as 0
        if third.size != 1:
            raise ShapeError(f"global_scale must hold one value, got shape {list(third.shape)}", operand="global_scale")
        return E2M1[codes] * _block_rows(block, k, n, 16, "block_scale") * as_float(third).reshape(())
    raise UnsupportedOpError(f"DequantMatMul: no reference decoder for scheme {scheme}")


# ------------------------------------------------------------------------------ GGUF


def _f16(block: np.ndarray, start: int) -> np.ndarray:
    """Little-endian f16 at byte `start` of every block row, as float32 `[blocks, 1]`."""
    return np.ascontiguousarray(block[:, start : start + 2]).view("<f2").astype(np.float32)


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b, 0)
    return d * b[:, 2:34].view(np.int8).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b, 0)
    qs = b[:, 2:18]
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32) - 8  # low nibbles first
    return d * codes


def _q8_k(b: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4").astype(np.float32)
    return d * b[:, 4:260].view(np.int8).astype(np.float32)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs of a Q4_K/Q5_K block's 12 scale bytes.

    Sub-blocks 0-3 use the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks 4-7
    take their low nibbles from bytes 8-11 and their top two bits from the spare top bits of
    bytes 0-3 (scales) and 4-7 (mins).
    """
    s = scales.astype(np.int32)
    lo_sc, lo_m, packed = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo_sc & 0x3F, (packed & 0xF) | ((lo_sc >> 6) << 4)], axis=1)
    mn = np.concatenate([lo_m & 0x3F, (packed >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _nibble_pairs(qs: np.ndarray, chunk: int) -> np.ndarray:
    """Codes of `qs` laid out as consecutive chunks: each `chunk` bytes give `chunk` low
    nibbles then `chunk` high nibbles."""
    grouped = qs.reshape(qs.shape[0], -1, 1, chunk)
    return np.concatenate([grouped & 0xF, grouped >> 4], axis=2).reshape(qs.shape[0], -1)


def _bit_planes(bits: np.ndarray, width: int, planes: int, chunk: int) -> np.ndarray:
    """`width`-bit fields: plane p of every `chunk`-byte group is `(byte >> p*width) & mask`."""
    grouped = bits.reshape(bits.shape[0], -1, 1, chunk).astype(np.int32)
    shifts = (np.arange(planes) * width).reshape(1, 1, planes, 1)
    return ((grouped >> shifts) & ((1 << width) - 1)).reshape(bits.shape[0], -1)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    q = _nibble_pairs(b[:, 16:144], 32).astype(np.float32).reshape(-1, 8, 32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    high = _bit_planes(b[:, 16:48], 1, 8, 32)  # bit p of qh[l] is the 5th bit of sub-block p
    low = _nibble_pairs(b[:, 48:176], 32)
    q = (low.astype(np.int32) | (high << 4)).astype(np.float32).reshape(-1, 8, 32)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).reshape(-1, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql, qh = b[:, 0:128], b[:, 128:192]
    scales = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    low = _nibble_pairs(ql, 64)  # per 128-element half: 64 low nibbles, then 64 high nibbles
    high = _bit_planes(qh, 2, 4, 32)  # per half: four 32-element planes of 2 bits
    q = (low.astype(np.int32) | (high << 4)).astype(np.float32) - 32
    return ((d * scales)[:, :, None] * q.reshape(-1, 16, 16)).reshape(-1, 256)


def _q2_k(b: np.ndarray) -> np.ndarray:
    scales = b[:, 0:16].astype(np.int32)
    d, dmin = _f16(b, 80), _f16(b, 82)
    q = _bit_planes(b[:, 16:80], 2, 4, 32).astype(np.float32).reshape(-1, 16, 16)
    dl = (d * (scales & 0xF).astype(np.float32))[:, :, None]
    ml = (dmin * (scales >> 4).astype(np.float32))[:, :, None]
    return (dl * q - ml).reshape(-1, 256)


def _q3_k(b: np.ndarray) -> np.ndarray:
    hmask, qs, packed = b[:, 0:32], b[:, 32:96], b[:, 96:108].astype(np.int32)
    d = _f16(b, 108)
    # 16 six-bit scales: low nibbles from bytes 0-7 (low halves first), top two bits from
    # bytes 8-11 (two bits per scale, four scales per byte).
    low = np.concatenate([packed[:, 0:8] & 0xF, packed[:, 0:8] >> 4], axis=1)
    high = ((packed[:, None, 8:12] >> (2 * np.arange(4)).reshape(1, 4, 1)) & 3).reshape(-1, 16)
    scales = ((low | (high << 4)) - 32).astype(np.float32)
    q = _bit_planes(qs, 2, 4, 32)
    missing_high = 1 - _bit_planes(hmask, 1, 8, 32)  # a clear hmask bit subtracts 4
    values = (q - 4 * missing_high).astype(np.float32).reshape(-1, 16, 16)
    return ((d * scales)[:, :, None] * values).reshape(-1, 256)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b, 0), _f16(b, 2)
    qs = b[:, 4:20]
    return d * np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float32) + m


def _five_bit_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1 codes 0..31: nibbles of qs (low nibbles first) plus bit j of the
    little-endian 32-bit qh as bit 4 of element j."""
    high = np.ascontiguousarray(qh).view("<u4").astype(np.uint32)  # [blocks, 1]
    bits = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    return (np.concatenate([qs & 0xF, qs >> 4], axis=1) | (bits << 4)).astype(np.float32)


def _q5_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * (_five_bit_codes(b[:, 2:6], b[:, 6:22]) - 16)


def _q5_1(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * _five_bit_codes(b[:, 4:8], b[:, 8:24]) + _f16(b, 2)


#: The IQ4_NL / IQ4_XS non-linear 4-bit code book.
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
#: MXFP4 code -> twice its E2M1 value (llama.cpp's table; the E8M0 scale is halved to match).
MXFP4_DOUBLED = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _iq4_nl(b: np.ndarray) -> np.ndarray:
    qs = b[:, 2:18]
    return _f16(b, 0) * IQ4_VALUES[np.concatenate([qs & 0xF, qs >> 4], axis=1)]


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    """256 elements: f16 d, 16-bit high scale bits, 4 bytes of low scale nibbles, 128 bytes of
    codes; sub-block i (32 elements) has the 6-bit scale ls_i and factor d * (ls_i - 32)."""
    d = _f16(b, 0)
    high = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.int32)  # [blocks, 1]
    sub = np.arange(8)
    low = (b[:, 4 + sub // 2].astype(np.int32) >> (4 * (sub % 2))) & 0xF
    scales = (low | (((high >> (2 * sub)) & 3) << 4)) - 32  # [blocks, 8]
    qs = b[:, 8:136].reshape(-1, 8, 16)
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=2)  # [blocks, 8, 32]
    return ((d * scales)[:, :, None] * IQ4_VALUES[codes]).reshape(-1, 256)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    """One E8M0 byte e (scale 2^(e-128) with the doubled code book) and 16 bytes of E2M1 codes."""
    scale = np.ldexp(np.float32(1), b[:, 0:1].astype(np.int32) - 128).astype(np.float32)
    qs = b[:, 1:17]
    return scale * MXFP4_DOUBLED[np.concatenate([qs & 0xF, qs >> 4], axis=1)]


def _tq2_0(b: np.ndarray) -> np.ndarray:
    """64 bytes of 2-bit codes then f16 d; value (q - 1) * d. Element 128*j + 32*l + m is bits
    2l..2l+1 of byte 32*j + m."""
    qs = b[:, :64].reshape(-1, 2, 1, 32)
    shifts = (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)
    q = ((qs >> shifts) & 3).astype(np.float32).reshape(-1, 256)
    return _f16(b, 64) * (q - 1)


#: scheme -> (elements per block, bytes per block, block decoder to `[blocks, elements]`)
GGUF_FORMATS: dict[QuantKind, tuple[int, int, Callable[[np.ndarray], np.ndarray]]] = {
    QuantKind.GGUF_Q8_0: (32, 34, _q8_0),
    QuantKind.GGUF_Q4_0: (32, 18, _q4_0),
    QuantKind.GGUF_Q2K: (256, 84, _q2_k),
    QuantKind.GGUF_Q3K: (256, 110, _q3_k),
    QuantKind.GGUF_Q4K: (256, 144, _q4_k),
    QuantKind.GGUF_Q5K: (256, 176, _q5_k),
    QuantKind.GGUF_Q6K: (256, 210, _q6_k),
    QuantKind.GGUF_Q8K: (256, 292, _q8_k),
    # Newest upstream only (spec part 2, section 1.7), llama.cpp's block layouts:
    QuantKind.GGUF_Q4_1: (32, 20, _q4_1),
    QuantKind.GGUF_Q5_0: (32, 22, _q5_0),
    QuantKind.GGUF_Q5_1: (32, 24, _q5_1),
    QuantKind.GGUF_IQ4NL: (32, 18, _iq4_nl),
    QuantKind.GGUF_IQ4XS: (256, 136, _iq4_xs),
    QuantKind.GGUF_MXFP4: (32, 17, _mxfp4),
    QuantKind.GGUF_TQ2_0: (256, 66, _tq2_0),
}


def gguf_dequantize(kind: QuantKind, packed: np.ndarray, k: int) -> np.ndarray:
    """The `[N, K]` float32 weight held in llama.cpp blocks of `kind`."""
    if kind not in GGUF_FORMATS:
        raise UnsupportedOpError(f"DequantMatMul: no reference decoder for GGUF scheme {kind.value}")
    elems, nbytes, decode = GGUF_FORMATS[kind]
    if k % elems != 0:
        raise ShapeError(f"{kind.value} needs K to be a multiple of {elems}, got K = {k}", operand="x")
    raw = as_bytes(packed)
    row_bytes = k // elems * nbytes
    if row_bytes == 0 or raw.size % row_bytes != 0 or raw.size == 0:
        raise ShapeError(
            f"{kind.value} weight bytes ({raw.size}) are not a whole number of rows of {row_bytes} bytes (K = {k})",
            operand="packed_w",
        )
    rows = raw.size // row_bytes
    blocks = decode(raw.reshape(-1, nbytes))
    return blocks.reshape(rows, k)


# ------------------------------------------------------------------------------ DequantMatMul


def dequant_weight(scheme: QuantScheme, k: int, weights: Sequence[np.ndarray]) -> np.ndarray:
    """The float32 weight as `[K, N]` (GGUF weights are transposed from their `[N, K]`)."""
    if scheme.kind.is_gguf:
        return gguf_dequantize(scheme.kind, weights[0], k).T
    if scheme.kind not in BLOCK_KINDS:
        raise UnsupportedOpError(f"DequantMatMul: no reference decoder for scheme {scheme}")
    w_q, scale, third = weights
    return _legacy_weight(scheme, k, w_q, scale, third)


def dequant_matmul(scheme: QuantScheme, x: np.ndarray, weights: Sequence[np.ndarray]) -> np.ndarray:
    """`x @ W` with W decoded from the packed operands; x's leading dims kept."""
    if x.ndim < 1:
        raise ShapeError("x must have rank >= 1", operand="x")
    k = x.shape[-1]
    w = dequant_weight(scheme, k, weights)
    rows = as_float(x).reshape(-1, k)
    y = rows @ w
    return y.reshape((*x.shape[:-1], w.shape[1]))


@reference_kernel(DequantMatMul)
def _dequant_matmul(op: DequantMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    y = dequant_matmul(op.scheme, inputs[0], inputs[1:])
    sizes = sizes_of(out)
    if None not in sizes and tuple(sizes) != y.shape and math.prod(s or 0 for s in sizes) == y.size:
        y = y.reshape(tuple(s or 0 for s in sizes))  # declared as flattened [m, N]
    return finish(y, out)
