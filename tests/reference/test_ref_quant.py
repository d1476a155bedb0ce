"""Quantize, Dequantize and DequantMatMul: hand-built byte examples and loop-based decoders."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from refgraph import assert_product_close, graph_with_params, run_kernel, run_op, shape

from rlx_mil.errors import EvaluationError, ShapeError
from rlx_mil.ir import DType, Graph, QuantScheme
from rlx_mil.ir.ops import Dequantize, DequantMatMul, Input, Param, Quantize, QuantKind
from rlx_mil.reference import decode_e4m3, decode_e5m2, evaluate, gguf_dequantize, unpack_nibbles

# ------------------------------------------------------------------------------ Quantize


def _round_away(v: float) -> float:
    return math.copysign(math.floor(abs(v) + 0.5), v)


def test_quantize_rounds_ties_away_and_multiplies_by_reciprocal() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997], np.float32)
    q = run_op(Quantize(None, [1.0], [0]), [x], x.shape, DType.I8)
    assert q.dtype == np.int8 and q.tolist() == [1, 2, 3, -1, -3, 0]
    # -18.75 * f32(1/0.3) is exactly -62.5 (rounds to -63); -18.75 / 0.3 would be -62.499996.
    q = run_op(Quantize(None, [0.3], [5]), [np.array([-18.75], np.float32)], [1], DType.I8)
    assert q.tolist() == [-58]


def test_quantize_clips_and_maps_nan_to_zero() -> None:
    x = np.array([1000.0, -1000.0, np.nan, np.inf, -np.inf], np.float32)
    q = run_op(Quantize(None, [0.5], [10]), [x], x.shape, DType.I8)
    assert q.tolist() == [127, -128, 0, 127, -128]


@given(data=st.data())
def test_quantize_dequantize_per_channel(data: st.DataObject) -> None:
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    axis = data.draw(st.sampled_from([None, *range(len(shape))]))
    channels = 1 if axis is None else shape[axis]
    scales = data.draw(st.lists(st.floats(0.015625, 4.0, width=32), min_size=channels, max_size=channels))
    zps = data.draw(st.lists(st.integers(-20, 20), min_size=channels, max_size=channels))
    x = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(-300, 300, width=32)))
    q = run_op(Quantize(axis, scales, zps), [x], shape, DType.I8)
    deq = run_op(Dequantize(axis, scales, zps), [q], shape, DType.F32)
    for idx in np.ndindex(*shape):
        c = 0 if axis is None else idx[axis]
        inv = np.float32(1.0) / np.float32(scales[c])
        want_q = min(max(_round_away(float(np.float32(x[idx]) * inv)) + zps[c], -128), 127)
        assert q[idx] == want_q
        assert deq[idx] == np.float32(np.float32(want_q - zps[c]) * np.float32(scales[c]))


# ------------------------------------------------------------------------------ FP8 / FP4 codes


def test_e4m3_known_codes() -> None:
    codes = np.array([0x7E, 0x08, 0x01, 0x38, 0x40, 0x80, 0xFE, 0x77, 0x07, 0x79], np.uint8)
    want = [448.0, 2.0**-6, 2.0**-9, 1.0, 2.0, -0.0, -448.0, 240.0, 7 * 2.0**-9, 288.0]
    assert decode_e4m3(codes).tolist() == want
    assert np.isnan(decode_e4m3(np.array([0x7F, 0xFF], np.uint8))).all()
    # Exponent 15 is a normal binade in E4M3FN: 0x78 = 256, not inf.
    assert decode_e4m3(np.array([0x78], np.uint8))[0] == 256.0


def test_e4m3_table_matches_bitwise_definition() -> None:
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 0xF, code & 7
        if e == 15 and m == 7:
            assert np.isnan(decode_e4m3(np.array([code], np.uint8))[0])
            continue
        value = sign * (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
        assert decode_e4m3(np.array([code], np.uint8))[0] == value


def test_e5m2_is_the_high_byte_of_float16() -> None:
    codes = np.arange(256, dtype=np.uint16)
    as_half = (codes << 8).astype(np.uint16).view(np.float16).astype(np.float32)
    got = decode_e5m2(codes.astype(np.uint8))
    np.testing.assert_array_equal(got, as_half)
    assert decode_e5m2(np.array([0x7C, 0x01, 0x7B], np.uint8)).tolist() == [np.inf, 2.0**-16, 57344.0]


def test_nibble_order_is_low_first() -> None:
    assert unpack_nibbles(np.array([0x21, 0x43, 0xF5], np.uint8), 6).tolist() == [1, 2, 3, 4, 5, 15]
    assert unpack_nibbles(np.array([0xA7, 0x0C], np.uint8), 3).tolist() == [7, 10, 12]
    with pytest.raises(ShapeError):
        unpack_nibbles(np.array([0x21], np.uint8), 6)


# ------------------------------------------------------------------------------ legacy DequantMatMul

X = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0], [0.5, -1.0, 2.0]], np.float32)


def _dqmm(scheme: QuantScheme, x: np.ndarray, weights: list[np.ndarray], n: int) -> np.ndarray:
    names = ["x", "w_q", "scale", "zp"][: 1 + len(weights)]
    params = dict(zip(names[1:], weights, strict=True))
    return graph_with_params(DequantMatMul(scheme), {"x": x}, params, names, [*x.shape[:-1], n])


def test_int8_block_symmetric_ignores_zp() -> None:
    w_q = np.array([[1, -2], [3, 4], [-128, 127]], np.int8)
    scale = np.array([[0.5, 2.0], [0.25, 1.0]], np.float32)  # block 2: rows 0-1, then row 2
    zp = np.full((2, 2), 99.0, np.float32)
    y = _dqmm(QuantScheme.int8_block(2), X, [w_q, scale, zp], 2)
    w = np.array([[0.5, -4.0], [1.5, 8.0], [-32.0, 127.0]])
    np.testing.assert_allclose(y, X.astype(np.float64) @ w, rtol=1e-6)


def test_int8_block_asym_subtracts_zp() -> None:
    w_q = np.array([[1, -2], [3, 4], [-128, 127]], np.int8)
    scale = np.array([[0.5, 2.0], [0.25, 1.0]], np.float32)
    zp = np.array([[1.0, -2.0], [0.0, 27.0]], np.float32)
    y = _dqmm(QuantScheme.int8_block_asym(2), X, [w_q, scale, zp], 2)
    w = np.array([[0.0, 0.0], [1.0, 12.0], [-32.0, 100.0]])
    np.testing.assert_allclose(y, X.astype(np.float64) @ w, rtol=1e-6)


def test_int4_block_unsigned_nibbles_packed_or_logical() -> None:
    codes = np.array([[1, 2, 3], [4, 5, 15]])  # K=2, N=3, flat order 1 2 3 4 5 15
    packed = np.array([0x21, 0x43, 0xF5], np.uint8)
    scale = np.array([[1.0, 0.5, 2.0]], np.float32)
    zp = np.full((1, 3), 7.0, np.float32)
    x = np.array([[1.0, 0.0], [1.0, 2.0]], np.float32)
    want = x.astype(np.float64) @ (codes * np.array([1.0, 0.5, 2.0]))
    # Declared with the logical [K, N] shape as upstream does, fed packed.
    y = graph_packed_int4(x, packed, scale, zp)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    y_logical = _dqmm(QuantScheme.int4_block(4), x, [codes.astype(np.int8), scale, zp], 3)
    np.testing.assert_allclose(y_logical, want, rtol=1e-6)


def graph_packed_int4(x: np.ndarray, packed: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """Int4Block with w_q declared [K, N] I8 but fed as ceil(K*N/2) packed bytes."""
    k, n = x.shape[-1], scale.shape[-1]
    g = Graph("int4")
    xi = g.add_node(Input("x"), [], shape(x.shape), name="x")
    wi = g.add_node(Param("w"), [], shape([k, n], DType.I8), name="w")
    si = g.add_node(Param("s"), [], shape(scale.shape), name="s")
    zi = g.add_node(Param("z"), [], shape(zp.shape), name="z")
    y = g.add_node(DequantMatMul(QuantScheme.int4_block(4)), [xi, wi, si, zi], shape([x.shape[0], n]), name="y")
    g.set_outputs([y])
    return evaluate(g, {"x": x}, {"w": packed, "s": scale, "z": zp})["y"]


def test_fp8_weights_with_per_column_scale() -> None:
    w_q = np.array([[0x38, 0x7E], [0x08, 0xB8]], np.uint8)  # [[1, 448], [2^-6, -1]]
    scale = np.array([2.0, 0.5], np.float32)
    x = np.array([[1.0, 64.0]], np.float32)
    y = _dqmm(QuantScheme(QuantKind.FP8_E4M3), x, [w_q, scale, np.zeros(1, np.float32)], 2)
    np.testing.assert_allclose(y, [[1.0 * 2 + 64 * 2.0**-6 * 2, 448 * 0.5 - 64 * 0.5]], rtol=1e-7)
    w5 = np.array([[0x3C, 0x40], [0xC0, 0x01]], np.uint8)  # [[1, 2], [-2, 2^-16]]
    y5 = _dqmm(QuantScheme(QuantKind.FP8_E5M2), x, [w5, scale, np.zeros(1, np.float32)], 2)
    np.testing.assert_allclose(y5, [[2.0 - 128 * 2, 1.0 + 64 * 2.0**-16 * 0.5]], rtol=1e-7)


def test_nvfp4_block() -> None:
    k, n = 32, 2
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, size=(k, n))
    flat = codes.reshape(-1)
    packed = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    block_scale = np.array([[0x38, 0x40], [0x30, 0x7F]], np.uint8)  # [[1, 2], [0.5, NaN -> 0]]
    lut = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    scales = np.array([[1.0, 2.0], [0.5, 0.0]])
    w = np.array([[lut[codes[p, j]] * scales[p // 16, j] * 0.25 for j in range(n)] for p in range(k)])
    x = rng.standard_normal((3, k)).astype(np.float32)
    y = run_kernel(
        DequantMatMul(QuantScheme(QuantKind.NVFP4_BLOCK)),
        [x, packed, block_scale, np.array([0.25], np.float32)], [3, n],
    )
    assert_product_close(y, x, w)


@given(data=st.data())
def test_block_schemes_match_loop_decoder(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from([QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK]))
    k, n, bs, m = (data.draw(st.integers(1, 7)) for _ in range(4))
    groups = -(-k // bs)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    scale = rng.uniform(0.1, 2.0, (groups, n)).astype(np.float32)
    zp = rng.uniform(-3, 3, (groups, n)).astype(np.float32)
    if kind is QuantKind.INT4_BLOCK:
        nbytes = (k * n + 1) // 2
        w_q = rng.integers(0, 256, nbytes).astype(np.uint8)
        code = [(int(w_q[f // 2]) >> (4 * (f % 2))) & 0xF for f in range(k * n)]
    else:
        w_q = rng.integers(-128, 128, (k, n)).astype(np.int8)
        code = [int(v) for v in w_q.reshape(-1)]
    w = np.zeros((k, n))
    for p in range(k):
        for j in range(n):
            offset = float(zp[p // bs, j]) if kind is QuantKind.INT8_BLOCK_ASYM else 0.0
            w[p, j] = (code[p * n + j] - offset) * float(scale[p // bs, j])
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = run_kernel(DequantMatMul(QuantScheme(kind, bs)), [x, w_q, scale, zp], [m, n])
    assert_product_close(y, x, w)


def test_unpacked_int4_codes_out_of_range_is_an_error() -> None:
    with pytest.raises(EvaluationError, match=r"0\.\.15"):
        run_kernel(
            DequantMatMul(QuantScheme.int4_block(2)),
            [np.ones((1, 2), np.float32), np.array([[16, 0], [1, 2]], np.int8), np.ones((1, 2), np.float32),
             np.zeros((1, 2), np.float32)],
            [1, 2],
        )


# ------------------------------------------------------------------------------ GGUF


def _f16_bytes(v: float) -> bytes:
    return struct.pack("<e", v)


def test_gguf_q8_0_hand_built() -> None:
    rows = []
    for r, d in enumerate((0.5, -0.25)):
        qs = bytes((i - 16 + r) & 0xFF for i in range(32))
        rows.append(_f16_bytes(d) + qs)
    packed = np.frombuffer(b"".join(rows), np.uint8)
    w = gguf_dequantize(QuantKind.GGUF_Q8_0, packed, 32)
    want = np.array([[0.5 * (i - 16) for i in range(32)], [-0.25 * (i - 15) for i in range(32)]])
    np.testing.assert_array_equal(w, want)
    x = np.arange(64, dtype=np.float32).reshape(2, 32) / 10
    y = run_op(DequantMatMul(QuantScheme(QuantKind.GGUF_Q8_0)), [x, packed.reshape(2, 34)], [2, 2],
               dtypes=[DType.F32, DType.U8])
    np.testing.assert_allclose(y, x.astype(np.float64) @ want.T, rtol=1e-6)


def test_gguf_q4_0_hand_built() -> None:
    qs = bytes(((i % 16) | ((15 - i % 16) << 4)) for i in range(16))
    block = _f16_bytes(0.25) + qs
    w = gguf_dequantize(QuantKind.GGUF_Q4_0, np.frombuffer(block, np.uint8), 32)
    low = [0.25 * ((i % 16) - 8) for i in range(16)]
    high = [0.25 * ((15 - i % 16) - 8) for i in range(16)]
    assert w.tolist() == [low + high]


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def _half(b: bytes) -> float:
    return float(np.float32(struct.unpack("<e", b)[0]))


def _loop_q4_k(b: bytes) -> list[float]:
    d, dmin, sc, qs = _half(b[0:2]), _half(b[2:4]), b[4:16], b[16:144]
    y: list[float] = []
    for j in range(4):
        s1, m1 = _scale_min_k4(2 * j, sc)
        s2, m2 = _scale_min_k4(2 * j + 1, sc)
        chunk = qs[32 * j : 32 * j + 32]
        y += [d * s1 * (c & 0xF) - dmin * m1 for c in chunk]
        y += [d * s2 * (c >> 4) - dmin * m2 for c in chunk]
    return y


def _loop_q5_k(b: bytes) -> list[float]:
    d, dmin, sc, qh, qs = _half(b[0:2]), _half(b[2:4]), b[4:16], b[16:48], b[48:176]
    y: list[float] = []
    for j in range(4):
        s1, m1 = _scale_min_k4(2 * j, sc)
        s2, m2 = _scale_min_k4(2 * j + 1, sc)
        chunk = qs[32 * j : 32 * j + 32]
        y += [d * s1 * ((c & 0xF) + (16 if qh[t] & (1 << (2 * j)) else 0)) - dmin * m1 for t, c in enumerate(chunk)]
        y += [d * s2 * ((c >> 4) + (16 if qh[t] & (2 << (2 * j)) else 0)) - dmin * m2 for t, c in enumerate(chunk)]
    return y


def _loop_q6_k(b: bytes) -> list[float]:
    ql, qh = b[0:128], b[128:192]
    sc = struct.unpack("<16b", b[192:208])
    d = _half(b[208:210])
    y = [0.0] * 256
    for half in range(2):
        lo, hi, s = ql[64 * half :], qh[32 * half :], sc[8 * half :]
        for t in range(32):
            i = t // 16
            q1 = ((lo[t] & 0xF) | (((hi[t] >> 0) & 3) << 4)) - 32
            q2 = ((lo[t + 32] & 0xF) | (((hi[t] >> 2) & 3) << 4)) - 32
            q3 = ((lo[t] >> 4) | (((hi[t] >> 4) & 3) << 4)) - 32
            q4 = ((lo[t + 32] >> 4) | (((hi[t] >> 6) & 3) << 4)) - 32
            base = 128 * half + t
            y[base], y[base + 32] = d * s[i] * q1, d * s[i + 2] * q2
            y[base + 64], y[base + 96] = d * s[i + 4] * q3, d * s[i + 6] * q4
    return y


def _loop_q2_k(b: bytes) -> list[float]:
    scales, qs, d, dmin = b[0:16], b[16:80], _half(b[80:82]), _half(b[82:84])
    y: list[float] = []
    index = 0
    for half in range(2):
        q = qs[32 * half :]
        for shift in (0, 2, 4, 6):
            for part in range(2):
                sc = scales[index]
                index += 1
                y += [d * (sc & 0xF) * ((q[16 * part + t] >> shift) & 3) - dmin * (sc >> 4) for t in range(16)]
    return y


def _loop_q3_k(b: bytes) -> list[float]:
    hmask, qs, raw, d = b[0:32], b[32:96], b[96:108], _half(b[108:110])
    # 16 six-bit scales via the 32-bit word shuffle of the C reference.
    words = list(struct.unpack("<3I", raw))
    tmp = words[2]
    k1, k2 = 0x03030303, 0x0F0F0F0F
    aux = [
        (words[0] & k2) | (((tmp >> 0) & k1) << 4),
        (words[1] & k2) | (((tmp >> 2) & k1) << 4),
        ((words[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((words[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ]
    scales = struct.unpack("<16b", struct.pack("<4I", *aux))
    y: list[float] = []
    index, bit = 0, 1
    for half in range(2):
        q = qs[32 * half :]
        for shift in (0, 2, 4, 6):
            for part in range(2):
                dl = d * (scales[index] - 32)
                index += 1
                for t in range(16):
                    pos = 16 * part + t
                    y.append(dl * (((q[pos] >> shift) & 3) - (0 if hmask[pos] & bit else 4)))
            bit <<= 1
    return y


def _loop_q8_k(b: bytes) -> list[float]:
    d = struct.unpack("<f", b[0:4])[0]
    return [d * v for v in struct.unpack("<256b", b[4:260])]


IQ4 = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _loop_q4_1(b: bytes) -> list[float]:
    d, m = _half(b[0:2]), _half(b[2:4])
    return [d * (c & 0xF) + m for c in b[4:20]] + [d * (c >> 4) + m for c in b[4:20]]


def _loop_q5(b: bytes, with_min: bool) -> list[float]:
    d = _half(b[0:2])
    m = _half(b[2:4]) if with_min else 0.0
    start = 4 if with_min else 2
    qh = struct.unpack("<I", b[start : start + 4])[0]
    qs = b[start + 4 : start + 20]
    offset = 0 if with_min else 16
    lo = [d * ((c & 0xF) + 16 * ((qh >> j) & 1) - offset) + m for j, c in enumerate(qs)]
    hi = [d * ((c >> 4) + 16 * ((qh >> (j + 16)) & 1) - offset) + m for j, c in enumerate(qs)]
    return lo + hi


def _loop_iq4_nl(b: bytes) -> list[float]:
    d = _half(b[0:2])
    return [d * IQ4[c & 0xF] for c in b[2:18]] + [d * IQ4[c >> 4] for c in b[2:18]]


def _loop_iq4_xs(b: bytes) -> list[float]:
    d = _half(b[0:2])
    scales_h = struct.unpack("<H", b[2:4])[0]
    y: list[float] = []
    for ib in range(8):
        ls = ((b[4 + ib // 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4)
        qs = b[8 + 16 * ib : 24 + 16 * ib]
        y += [d * (ls - 32) * IQ4[c & 0xF] for c in qs] + [d * (ls - 32) * IQ4[c >> 4] for c in qs]
    return y


def _loop_mxfp4(b: bytes) -> list[float]:
    scale = 2.0 ** (b[0] - 127)  # E8M0, times the plain E2M1 values
    return [scale * E2M1_VALUES[c & 0xF] for c in b[1:17]] + [scale * E2M1_VALUES[c >> 4] for c in b[1:17]]


def _loop_tq2_0(b: bytes) -> list[float]:
    d = _half(b[64:66])
    return [d * (((b[j + m] >> (2 * lane)) & 3) - 1) for j in (0, 32) for lane in range(4) for m in range(32)]


LOOP_DECODERS = {
    QuantKind.GGUF_Q4_1: (20, _loop_q4_1, (0, 2)),
    QuantKind.GGUF_Q5_0: (22, lambda b: _loop_q5(b, False), (0,)),
    QuantKind.GGUF_Q5_1: (24, lambda b: _loop_q5(b, True), (0, 2)),
    QuantKind.GGUF_IQ4NL: (18, _loop_iq4_nl, (0,)),
    QuantKind.GGUF_IQ4XS: (136, _loop_iq4_xs, (0,)),
    QuantKind.GGUF_MXFP4: (17, _loop_mxfp4, ()),
    QuantKind.GGUF_TQ2_0: (66, _loop_tq2_0, (64,)),
    QuantKind.GGUF_Q2K: (84, _loop_q2_k, (80, 82)),
    QuantKind.GGUF_Q3K: (110, _loop_q3_k, (108,)),
    QuantKind.GGUF_Q4K: (144, _loop_q4_k, (0, 2)),
    QuantKind.GGUF_Q5K: (176, _loop_q5_k, (0, 2)),
    QuantKind.GGUF_Q6K: (210, _loop_q6_k, (208,)),
    QuantKind.GGUF_Q8K: (292, _loop_q8_k, ()),
}


@pytest.mark.parametrize("kind", list(LOOP_DECODERS))
def test_gguf_blocks_match_loop_decoder(kind: QuantKind) -> None:
    nbytes, loop, half_offsets = LOOP_DECODERS[kind]
    rng = np.random.default_rng(len(kind.value))
    n_rows, k = 3, 512
    elems = 256 if nbytes > 66 or kind is QuantKind.GGUF_TQ2_0 else 32
    raw = bytearray(rng.integers(0, 256, n_rows * (k // elems) * nbytes, dtype=np.uint8).tobytes())
    for block in range(n_rows * (k // elems)):
        base = block * nbytes
        for off in half_offsets:  # finite, moderate f16 scales
            raw[base + off : base + off + 2] = _f16_bytes(float(rng.uniform(-0.1, 0.1)))
        if kind is QuantKind.GGUF_Q8K:
            raw[base : base + 4] = struct.pack("<f", float(rng.uniform(-0.1, 0.1)))
        if kind is QuantKind.GGUF_MXFP4:  # E8M0 exponents around 2^0, subnormal 2^-128 included
            raw[base] = int(rng.choice([0, 1, 120, 127, 130]))
    packed = np.frombuffer(bytes(raw), np.uint8)
    w = gguf_dequantize(kind, packed, k)
    blocks = [bytes(raw[i * nbytes : (i + 1) * nbytes]) for i in range(n_rows * (k // elems))]
    want = np.array([v for blk in blocks for v in loop(blk)]).reshape(n_rows, k)
    np.testing.assert_allclose(w, want, rtol=1e-6, atol=1e-7)
    x = rng.standard_normal((2, k)).astype(np.float32)
    y = run_kernel(DequantMatMul(QuantScheme(kind)), [x, packed.reshape(n_rows, -1)], [2, n_rows])
    assert_product_close(y, x, want.T)


def test_gguf_rejects_bad_sizes() -> None:
    with pytest.raises(ShapeError, match="multiple of 32"):
        run_kernel(DequantMatMul(QuantScheme(QuantKind.GGUF_Q8_0)), [np.ones((1, 31), np.float32), np.zeros(34, np.uint8)], [1, 1])
    with pytest.raises(ShapeError, match="whole number of rows"):
        run_kernel(DequantMatMul(QuantScheme(QuantKind.GGUF_Q8_0)), [np.ones((1, 32), np.float32), np.zeros(35, np.uint8)], [1, 1])
