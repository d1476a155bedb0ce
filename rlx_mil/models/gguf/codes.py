"""llama.cpp blocks -> the codes and block tables of Core ML's constexpr ops (iOS18 and iOS26),
taken field by field from the blocks (the weight is never decoded to float on the way).

Every format is `w = scale * q + bias` per block of one output row (bias absent for the
symmetric ones) with the row's integer codes q as stored: `constexpr_blockwise_shift_scale`
holds it as `scale * (q - offset)`:

| type | data | block | scale | offset | exact? |
|---|---|---|---|---|---|
| Q8_0 | int8 q | 32 | d | - | yes |
| Q4_0 | uint4 q | 32 | d | 8 | yes |
| Q5_0 | int8 q - 16 | 32 | d | - | yes |
| Q4_1 / Q5_1 | uint4 / uint8 q | 32 | d | -m / d (float) | the offset rounds to the program's float |
| Q4_K / Q5_K | uint4 / uint8 q | 32 | d * sc | dmin * m / (d * sc) (float) | scale and offset round |
| Q2_K | uint4 q (2-bit codes widened; split: uint2) | 16 | d * sc | dmin * m / (d * sc) (float); split: bias -dmin * m | scale and offset round (split: exact in fp32) |
| Q3_K | int4 q - 4 * (high bit clear) (split: uint3) | 16 | d * (sc - 32) | - | scale rounds |
| Q6_K | int8 q - 32 (split: uint6) | 16 | d * sc | - | scale rounds |
| IQ4_NL | LUT of the 16 int8 code values + uint4 index | 32 | d | - | yes |
| IQ4_XS | LUT + uint4 index | 32 | d * (ls - 32) | - | scale rounds |

On iOS26, where Core ML runs a `constexpr_lut_to_dense` followed by a per-block
`constexpr_blockwise_shift_scale` in that order, the codes of the 2-, 3-, 5- and 6-bit types
are indices of their own width (`Format.lut_bits`: uint2, uint3, uint6) into the table of
their integer values (`lut_low + arange(2^bits)`, int8) with the same block scale and offset:
the same values as the iOS18 form, in fewer bits.

Before iOS26, where no `constexpr_blockwise_shift_scale` may follow a table, the 2-, 3-, 5-
and 6-bit types (`Format.split_bits`) are held split instead: the code q - lut_low is an index
of its own width (uint2, uint3, uint6) into the float table lut_low + arange(2^bits) (one exact
`constexpr_lut_to_dense`), or for the 5-bit types (Core ML has no 5-bit index; int8 codes cost
1.5-1.64x the file) q = low + 16 * high, a 4-bit index into lut_low + arange(16) plus a 1-bit
index into [0, 16], the two tables summed; then times llama.cpp's own scale plus its bias (m,
-dmin * m) at run time: the code's own bits (not 4- or 8-bit containers), and in fp32 the
`gguf` package's decode bit for bit.

A sub-block whose scale is 0 (or rounds to 0) but whose min is not holds one value c: its
codes become 0 with scale c and offset -1. The error of every weight — max |decoded -
llama.cpp's decode| — is measured while its codes are made and reported per tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.compress.code_store import WriterFactory
from rlx_mil.compress.linear import LinearCodes
from rlx_mil.compress.prequantized import LutScaleCodes
from rlx_mil.compress.schemes import PER_BLOCK, LinearScheme
from rlx_mil.ir.ops import QuantKind
from rlx_mil.lowering.target import Target
from rlx_mil.reference.quant import (
    GGUF_FORMATS,
    IQ4_VALUES,
    _bit_planes,
    _f16,
    _five_bit_codes,
    _k_scale_min,
    _nibble_pairs,
)

#: Elements decoded at a time.
SLAB_ELEMENTS = 1 << 19


@dataclass
class Fields:
    """One slab of rows: codes as stored (int16 [rows, K]), scale and bias [rows, K / block]
    (float64; bias None for symmetric formats)."""

    q: np.ndarray
    scale: np.ndarray
    bias: np.ndarray | None


def _decoded_slabs(raw_rows: np.ndarray, n: int, k: int, nbytes: int, fmt: Format) -> Iterator[tuple[int, int, np.ndarray, Fields]]:
    """(first row, rows, their blocks, the blocks decoded by `fmt`) for slabs of about
    SLAB_ELEMENTS weights: a tensor is never decoded whole."""
    step = max(1, SLAB_ELEMENTS // k)
    for r0 in range(0, n, step):
        rows = np.ascontiguousarray(raw_rows[r0:r0 + step])
        count = rows.shape[0]
        blocks = rows.reshape(-1, nbytes)
        yield r0, count, blocks, fmt.decode(blocks, count)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int16)


def _rows(values: np.ndarray, rows: int) -> np.ndarray:
    return np.asarray(values, np.float64).reshape(rows, -1)


def _q8_0(b: np.ndarray, rows: int) -> Fields:
    return Fields(b[:, 2:34].view(np.int8).astype(np.int16).reshape(rows, -1), _rows(_f16(b, 0), rows), None)


def _q4_0(b: np.ndarray, rows: int) -> Fields:
    return Fields(_nibbles(b[:, 2:18]).reshape(rows, -1), _rows(_f16(b, 0), rows), None)


def _q4_1(b: np.ndarray, rows: int) -> Fields:
    return Fields(_nibbles(b[:, 4:20]).reshape(rows, -1), _rows(_f16(b, 0), rows), _rows(_f16(b, 2), rows))


def _q5_0(b: np.ndarray, rows: int) -> Fields:
    q = _five_bit_codes(b[:, 2:6], b[:, 6:22]).astype(np.int16) - 16
    return Fields(q.reshape(rows, -1), _rows(_f16(b, 0), rows), None)


def _q5_1(b: np.ndarray, rows: int) -> Fields:
    q = _five_bit_codes(b[:, 4:8], b[:, 8:24]).astype(np.int16)
    return Fields(q.reshape(rows, -1), _rows(_f16(b, 0), rows), _rows(_f16(b, 2), rows))


def _q4_k(b: np.ndarray, rows: int) -> Fields:
    d, dmin = _f16(b, 0).astype(np.float64), _f16(b, 2).astype(np.float64)
    sc, mn = _k_scale_min(b[:, 4:16])
    q = _nibble_pairs(b[:, 16:144], 32).astype(np.int16)
    return Fields(q.reshape(rows, -1), _rows(d * sc, rows), _rows(-(dmin * mn), rows))


def _q5_k(b: np.ndarray, rows: int) -> Fields:
    d, dmin = _f16(b, 0).astype(np.float64), _f16(b, 2).astype(np.float64)
    sc, mn = _k_scale_min(b[:, 4:16])
    high = _bit_planes(b[:, 16:48], 1, 8, 32)
    q = (_nibble_pairs(b[:, 48:176], 32).astype(np.int16) | (high.astype(np.int16) << 4))
    return Fields(q.reshape(rows, -1), _rows(d * sc, rows), _rows(-(dmin * mn), rows))


def _q6_k(b: np.ndarray, rows: int) -> Fields:
    low = _nibble_pairs(b[:, 0:128], 64).astype(np.int16)
    high = _bit_planes(b[:, 128:192], 2, 4, 32).astype(np.int16)
    scales = b[:, 192:208].view(np.int8).astype(np.float64)
    d = _f16(b, 208).astype(np.float64)
    return Fields(((low | (high << 4)) - 32).reshape(rows, -1), _rows(d * scales, rows), None)


def _q2_k(b: np.ndarray, rows: int) -> Fields:
    scales = b[:, 0:16].astype(np.int32)
    d, dmin = _f16(b, 80).astype(np.float64), _f16(b, 82).astype(np.float64)
    q = _bit_planes(b[:, 16:80], 2, 4, 32).astype(np.int16)
    return Fields(q.reshape(rows, -1), _rows(d * (scales & 0xF), rows), _rows(-(dmin * (scales >> 4)), rows))


def _q3_k(b: np.ndarray, rows: int) -> Fields:
    hmask, qs, packed = b[:, 0:32], b[:, 32:96], b[:, 96:108].astype(np.int32)
    d = _f16(b, 108).astype(np.float64)
    low = np.concatenate([packed[:, 0:8] & 0xF, packed[:, 0:8] >> 4], axis=1)
    high = ((packed[:, None, 8:12] >> (2 * np.arange(4)).reshape(1, 4, 1)) & 3).reshape(-1, 16)
    scales = ((low | (high << 4)) - 32).astype(np.float64)
    q = _bit_planes(qs, 2, 4, 32) - 4 * (1 - _bit_planes(hmask, 1, 8, 32))
    return Fields(q.astype(np.int16).reshape(rows, -1), _rows(d * scales, rows), None)


def _iq4_nl(b: np.ndarray, rows: int) -> Fields:
    return Fields(_nibbles(b[:, 2:18]).reshape(rows, -1), _rows(_f16(b, 0), rows), None)


def _iq4_xs(b: np.ndarray, rows: int) -> Fields:
    d = _f16(b, 0).astype(np.float64)
    high = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.int32)
    sub = np.arange(8)
    low = (b[:, 4 + sub // 2].astype(np.int32) >> (4 * (sub % 2))) & 0xF
    scales = (low | (((high >> (2 * sub)) & 3) << 4)) - 32
    qs = b[:, 8:136].reshape(-1, 8, 16)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2).astype(np.int16)
    return Fields(q.reshape(rows, -1), _rows(d * scales, rows), None)


@dataclass(frozen=True)
class Format:
    kind: QuantKind
    decode: Callable[[np.ndarray, int], Fields]
    #: Elements sharing one scale (and offset).
    block: int
    #: Code container: "int8", "uint8", "int4", "uint4"; "lut4": indices into IQ4_VALUES.
    data: str
    #: A constant integer offset (Q4_0's 8), else None.
    int_offset: int | None = None
    #: w = scale * q + bias: a float offset per block.
    biased: bool = False
    #: The block scale and offset in llama.cpp's field names (for the docs).
    scale_text: str = "d"
    offset_text: str = "-"
    #: iOS26: the codes q as `lut_bits`-wide indices q - lut_low into the int8 table
    #: lut_low + arange(2^lut_bits) (None: the iOS18 form on every target).
    lut_bits: int | None = None
    lut_low: int = 0
    #: Before iOS26 (`split_form`): the width of the codes held split, q - lut_low as indices
    #: into the float table lut_low + arange(2^bits) (5: 4-bit indices into lut_low + arange(16)
    #: plus 1-bit ones into [0, 16], summed), then scale and bias at run time.
    split_bits: int | None = None


FORMATS: dict[str, Format] = {
    "Q8_0": Format(QuantKind.GGUF_Q8_0, _q8_0, 32, "int8"),
    "Q4_0": Format(QuantKind.GGUF_Q4_0, _q4_0, 32, "uint4", int_offset=8, scale_text="d", offset_text="8"),
    "Q4_1": Format(QuantKind.GGUF_Q4_1, _q4_1, 32, "uint4", biased=True, scale_text="d", offset_text="-m / d (float)"),
    "Q5_0": Format(QuantKind.GGUF_Q5_0, _q5_0, 32, "int8", lut_bits=6, lut_low=-16, split_bits=5),
    "Q5_1": Format(QuantKind.GGUF_Q5_1, _q5_1, 32, "uint8", biased=True, scale_text="d", offset_text="-m / d (float)",
                   lut_bits=6, split_bits=5),
    "Q2_K": Format(QuantKind.GGUF_Q2K, _q2_k, 16, "uint4", biased=True, scale_text="d * sc",
                   offset_text="dmin * m / (d * sc) (float)", lut_bits=2, split_bits=2),
    "Q3_K": Format(QuantKind.GGUF_Q3K, _q3_k, 16, "int4", scale_text="d * (sc - 32)", offset_text="-", lut_bits=3, lut_low=-4,
                   split_bits=3),
    "Q4_K": Format(QuantKind.GGUF_Q4K, _q4_k, 32, "uint4", biased=True, scale_text="d * sc", offset_text="dmin * m / (d * sc) (float)"),
    "Q5_K": Format(QuantKind.GGUF_Q5K, _q5_k, 32, "uint8", biased=True, scale_text="d * sc",
                   offset_text="dmin * m / (d * sc) (float)", lut_bits=6, split_bits=5),
    "Q6_K": Format(QuantKind.GGUF_Q6K, _q6_k, 16, "int8", scale_text="d * sc", offset_text="-", lut_bits=6, lut_low=-32,
                   split_bits=6),
    "IQ4_NL": Format(QuantKind.GGUF_IQ4NL, _iq4_nl, 32, "lut4"),
    "IQ4_XS": Format(QuantKind.GGUF_IQ4XS, _iq4_xs, 32, "lut4", scale_text="d * (ls - 32)", offset_text="-"),
}
#: Formats whose codes and tables are the file's exactly (in fp16 and fp32 programs).
EXACT = frozenset({"Q8_0", "Q4_0", "Q5_0", "IQ4_NL"})


def lut_form(type_name: str, target: Target) -> bool:
    """Whether `type_name`'s codes are LUT indices then a block scale on `target`: IQ4 always,
    the types with a `lut_bits` width from iOS26 on."""
    fmt = FORMATS[type_name]
    return fmt.data == "lut4" or (fmt.lut_bits is not None and target >= Target.IOS26)


def split_form(type_name: str, target: Target) -> bool:
    """Whether `type_name`'s codes are held split (a table of the code's own width, or 4-bit +
    1-bit tables summed; scale and bias at run time) on `target`: before iOS26, where no block
    scale may follow a table; iOS26 keeps its all-constexpr form (uint2, uint3, uint6)."""
    return FORMATS[type_name].split_bits is not None and target < Target.IOS26


def _scheme(fmt: Format) -> LinearScheme:
    bits = 4 if fmt.data.endswith("4") else 8
    signed = fmt.data.startswith("int")
    return LinearScheme(bits=bits, signed=signed, symmetric=signed, granularity=PER_BLOCK, block_size=fmt.block)


def _tables(fmt: Format, f: Fields, store: type[np.floating[Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Codes, scale and offset (float64) of one slab as the constexpr op holds them."""
    scale = f.scale.astype(store).astype(np.float64)
    if fmt.data == "lut4":  # no code book entry is 0: a zero scale stays 0
        return f.q, scale, None
    zero = scale == 0
    offset: np.ndarray | None = None
    fill = 0
    if f.bias is not None:
        constant = zero & (f.bias != 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            offset = np.where(zero, 0.0, -f.bias / np.where(zero, 1.0, scale))
        # An offset beyond the program float's range (a tiny scale, a large min) cannot be held:
        # the block is taken as its min, like a zero scale (the report shows the error).
        constant |= ~np.isfinite(offset.astype(store))
        zero |= constant
        # A zero scale with a non-zero min: every element is the min c; codes 0, scale c, offset -1.
        offset = np.where(constant, -1.0, offset)
        scale = np.where(constant, f.bias.astype(store).astype(np.float64), np.where(zero, 1.0, scale))
    else:
        if fmt.int_offset is not None:
            offset = np.full(scale.shape, float(fmt.int_offset))
            fill = fmt.int_offset
        scale = np.where(zero, 1.0, scale)
    q = np.where(np.repeat(zero, fmt.block, axis=1), fill, f.q) if zero.any() else f.q
    return q, scale, offset


def encode(raw_rows: np.ndarray, type_name: str, shape: tuple[int, int], store: type[np.floating[Any]],
           code_writer: WriterFactory, target: Target = Target.IOS18) -> LinearCodes | LutScaleCodes:
    """The codes of a `[N, K]` weight held as llama.cpp blocks of `type_name` (`raw_rows`:
    `[N, row bytes]`), a slab of rows at a time, with its error against llama.cpp's decode;
    in the LUT-then-scale form where `lut_form` says so for `target`."""
    fmt = FORMATS[type_name]
    n, k = shape
    _, nbytes, exact_decode = GGUF_FORMATS[fmt.kind]
    if split_form(type_name, target):
        return _split(raw_rows, fmt, shape, store, code_writer)
    lut = fmt.data == "lut4"
    indexed = lut_form(type_name, target) and not lut  # integer codes as indices q - lut_low
    scheme = _scheme(fmt)
    container = np.uint8 if lut or indexed or not scheme.signed else np.int8
    data = code_writer((n, k), np.dtype(container))
    groups = k // fmt.block
    scales = np.empty((n, groups), np.float64)
    offsets = np.empty((n, groups), np.float64) if fmt.int_offset is not None or fmt.biased else None
    sq_error = sq_norm = max_error = 0.0
    for r0, count, blocks, f in _decoded_slabs(raw_rows, n, k, nbytes, fmt):
        q, scale, offset = _tables(fmt, f, store)
        stored_scale = scale.astype(store).astype(np.float32)
        if lut:
            values = IQ4_VALUES[q]
        else:
            values = q.astype(np.float32)
            if offset is not None:
                stored_offset = offset.astype(store).astype(np.float32) if fmt.int_offset is None else offset.astype(np.float32)
                values = values - np.repeat(stored_offset, fmt.block, axis=1)
                assert offsets is not None
                offsets[r0:r0 + count] = offset
        decoded = np.repeat(stored_scale, fmt.block, axis=1) * values
        want = exact_decode(blocks).reshape(count, k)
        diff = decoded.astype(np.float64) - want
        sq_error += float(np.sum(diff * diff))
        sq_norm += float(np.sum(np.square(want, dtype=np.float64)))
        max_error = max(max_error, float(np.max(np.abs(diff))) if diff.size else 0.0)
        data.put(r0, (q - fmt.lut_low if indexed else q).astype(container))
        scales[r0:r0 + count] = scale
    codes = data.result()
    if lut:
        return LutScaleCodes(indices=codes, lut=IQ4_VALUES.astype(np.int8), scale=scales.astype(store), bits=4,
                             sq_error=sq_error, sq_norm=sq_norm, max_error=max_error)
    if indexed:
        assert fmt.lut_bits is not None and fmt.int_offset is None
        table = (fmt.lut_low + np.arange(1 << fmt.lut_bits)).astype(np.int8)
        return LutScaleCodes(indices=codes, lut=table, scale=scales.astype(store), bits=fmt.lut_bits,
                             sq_error=sq_error, sq_norm=sq_norm, max_error=max_error,
                             offset=None if offsets is None else offsets.astype(store))
    offset_table = None
    if offsets is not None:
        offset_table = offsets.astype(container) if fmt.int_offset is not None else offsets.astype(store)
    return LinearCodes(data=codes, scale=scales.astype(store), offset=offset_table, scheme=scheme,
                       sq_error=sq_error, sq_norm=sq_norm, max_error=max_error)



def _split(raw_rows: np.ndarray, fmt: Format, shape: tuple[int, int], store: type[np.floating[Any]],
           code_writer: WriterFactory) -> LutScaleCodes:
    """The split form: w = scale * table[q - lut_low] + bias (5-bit codes: table[low] + 16 *
    high) with llama.cpp's own scale (d; the K-quants d * sc) and bias (m; Q2_K / Q5_K -dmin * m)
    in the program's float, so in fp32 the package's weights are llama.cpp's
    (`gguf.quants.dequantize`) bit for bit, and a zero scale needs no special case."""
    n, k = shape
    _, nbytes, exact_decode = GGUF_FORMATS[fmt.kind]
    assert fmt.split_bits is not None
    two = fmt.split_bits == 5  # no 5-bit index: a 4-bit and a 1-bit one
    bits = 4 if two else fmt.split_bits
    groups = k // fmt.block
    low = code_writer((n, k), np.dtype(np.uint8))
    high = code_writer((n, k), np.dtype(np.uint8)) if two else None
    scales = np.empty((n, groups), store)
    biases = np.empty((n, groups), store) if fmt.biased else None
    codes = LutScaleCodes(indices=np.empty((0, 0), np.uint8), lut=(fmt.lut_low + np.arange(1 << bits)).astype(np.int8),
                          scale=scales, bits=bits, sq_error=0.0, sq_norm=0.0, max_error=0.0, split=True)
    sq_error = sq_norm = max_error = 0.0
    mask = (1 << bits) - 1
    for r0, count, blocks, f in _decoded_slabs(raw_rows, n, k, nbytes, fmt):
        q = (f.q - fmt.lut_low).astype(np.uint8)
        scale = f.scale.astype(store)  # float64 products of exact fields: one rounding
        bias = None if f.bias is None else f.bias.astype(store)
        want = np.asarray(exact_decode(blocks), np.float64).reshape(count, k)
        diff = codes.split_values(q & mask, q >> bits if two else None, scale, bias).astype(np.float64) - want
        sq_error += float(np.sum(diff * diff))
        sq_norm += float(np.sum(want * want))
        max_error = max(max_error, float(np.max(np.abs(diff))) if diff.size else 0.0)
        low.put(r0, q & mask)
        if high is not None:
            high.put(r0, q >> bits)
        scales[r0:r0 + count] = scale
        if biases is not None and bias is not None:
            biases[r0:r0 + count] = bias
    codes.indices, codes.bias = low.result(), biases
    codes.high = None if high is None else high.result()
    codes.sq_error, codes.sq_norm, codes.max_error = sq_error, sq_norm, max_error
    return codes
