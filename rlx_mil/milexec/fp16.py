"""Fast, exact fp16 -> float32 widening for large tensors.

NumPy's own fp16 -> float32 cast runs at ~3 ns per element here (no SIMD path), which made
widening the weights the largest cost of a decode step. The bit-level form below gives the
identical float32 values for every finite fp16 (normals, subnormals, signed zeros) in four
integer/float passes (~0.45 ns per element), working through an L2-sized chunk at a time so
that no tensor-sized temporary is allocated. Infinities and NaNs are not handled by the bit
form: `widen_into` falls back to NumPy's cast for a chunk that holds one.
"""

from __future__ import annotations

import functools

import numpy as np

#: Elements widened per pass: small enough for the chunk to stay in the L2 cache.
CHUNK = 1 << 18

_KEEP = np.uint32(0x8FFFE000).view(np.int32)  # sign, and the 15 exponent/mantissa bits moved up
_SCALE = np.float32(2.0**112)  # re-biases the exponent (15 -> 127); subnormals come out right too
_LIMIT = np.float32(2.0**16)


def widen_into(source: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write `source` (fp16, any shape) widened to float32 into `out` (float32, same size,
    C-contiguous); returns `out`. Equal to `source.astype(np.float32)` bit for bit."""
    flat_in = np.ascontiguousarray(source).reshape(-1).view(np.int16)
    flat_out = out.reshape(-1)
    bits = flat_out.view(np.int32)
    for start in range(0, flat_in.size, CHUNK):
        stop = min(flat_in.size, start + CHUNK)
        h, b, f = flat_in[start:stop], bits[start:stop], flat_out[start:stop]
        np.copyto(b, h)  # sign-extends: the sign lands in bit 31
        np.left_shift(b, 13, out=b)
        np.bitwise_and(b, _KEEP, out=b)
        np.multiply(f, _SCALE, out=f)
        # An fp16 inf or NaN (exponent 31) comes out of the bit form as a finite |x| >= 2**16,
        # beyond every finite fp16: such a chunk is cast exactly instead.
        if f.max() >= _LIMIT or f.min() <= -_LIMIT:
            np.copyto(f, h.view(np.float16))
    return out


def widen(source: np.ndarray) -> np.ndarray:
    """`source` (fp16) as a new float32 array, through `widen_into`."""
    return widen_into(source, np.empty(source.shape, np.float32))


#: float32 bit patterns: the 13 low mantissa bits fp16 has not, and half of their range.
_DROP = np.int32(-(1 << 13))
_HALF = np.int32(0x0FFF)
#: Finite float32 values in [FP16_NORMAL_MIN, FP16_MAX] (and zeros) round to fp16 by the bit
#: form of `round_into`; fp16 subnormals, overflow, inf and NaN need NumPy's cast.
FP16_NORMAL_MIN = 2.0**-14
FP16_MAX = 65504.0


def round_into(values: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """Round float32 `values` (C-contiguous) in place to the nearest fp16 value, ties to even,
    keeping them float32: equal bit for bit to ``values.astype(np.float16).astype(np.float32)``
    *for zeros and magnitudes in [FP16_NORMAL_MIN, FP16_MAX]* (the caller guarantees the range;
    `round_exact_into` checks it). Five integer passes (~0.3 ns per element) against NumPy's
    ~3 ns cast. `scratch`: an int32 buffer of at least values.size elements, reused."""
    bits = values.reshape(-1).view(np.int32)
    carry = scratch.reshape(-1)[: bits.size] if scratch is not None else np.empty(bits.size, np.int32)
    np.right_shift(bits, 13, out=carry)
    np.bitwise_and(carry, 1, out=carry)
    np.add(carry, _HALF, out=carry)  # round half to even: the kept lowest bit decides a tie
    np.add(bits, carry, out=bits)
    np.bitwise_and(bits, _DROP, out=bits)
    return values


#: Veltkamp's splitting constant for float32 -> 11 significant bits: 2^(24 - 11) + 1.
_SPLIT = np.float32(8193.0)


def round_split_into(values: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """`round_into` in three float passes (Veltkamp's splitting: ``c = v * 8193``, ``v = c -
    (c - v)``) instead of five integer ones, for the same range (zeros and magnitudes in
    [FP16_NORMAL_MIN, FP16_MAX]). With round-half-to-even float32 arithmetic the high part is
    `values` rounded to 11 significant bits, ties to even: `split_rounding_holds` checks that
    on every product an integer-coded weight can hold before a caller relies on it.
    `scratch`: a float32 buffer of at least values.size elements."""
    flat = values.reshape(-1)
    split = scratch.reshape(-1)[: flat.size]
    np.multiply(flat, _SPLIT, out=split)
    np.subtract(split, flat, out=flat)
    np.subtract(split, flat, out=flat)
    return values


@functools.lru_cache(maxsize=64)
def split_rounding_holds(low: int, high: int) -> bool:
    """True when `round_split_into` equals NumPy's fp16 cast on ``scale * k`` for every finite
    normal fp16 scale of either sign and every integer k in [low, high] whose product lies in
    the fp16 normal range: every value a blockwise-scaled integer weight decodes to. Checked
    exhaustively (about 61,000 scales per k), once per range."""
    magnitudes = np.arange(0x0400, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)
    scales = np.concatenate([magnitudes, -magnitudes])
    scratch = np.empty(scales.size, np.float32)
    for k in range(low, high + 1):
        products = scales * np.float32(k)  # exact: 11 bits times at most 13
        size = np.abs(products)
        inside = products[(size == 0) | ((size >= FP16_NORMAL_MIN) & (size <= FP16_MAX))]
        with np.errstate(all="ignore"):
            want = inside.astype(np.float16).astype(np.float32)
        got = round_split_into(inside.copy(), scratch)
        if not np.array_equal(got.view(np.int32), want.view(np.int32)):
            return False
    return True


def round_exact_into(values: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """`round_into` for any float32 values: a chunk holding a value outside the bit form's range
    (subnormal in fp16, beyond FP16_MAX, inf, NaN) is rounded by NumPy's cast instead."""
    flat = values.reshape(-1)
    for start in range(0, flat.size, CHUNK):
        part = flat[start:start + CHUNK]
        magnitude = np.abs(part)
        top = magnitude.max(initial=0.0)
        low = magnitude[magnitude > 0].min(initial=FP16_NORMAL_MIN)
        if top <= FP16_MAX and low >= FP16_NORMAL_MIN:  # NaN fails both comparisons
            round_into(part, scratch)
        else:
            with np.errstate(all="ignore"):
                np.copyto(part, part.astype(np.float16))
    return values
