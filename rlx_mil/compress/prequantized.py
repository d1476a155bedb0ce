"""Weights that arrive already quantized (a GGUF file's blocks): their codes become the
package's compressed weights as they are, never decoded to float on the way.

A params mapping that holds such weights offers `prequantized_weights()`: Param name -> a
`PrequantizedWeight`, whose `encode` gives the codes (`LinearCodes`, or `LutScaleCodes` for
non-linear code books) in the storage layout `[out, in]`, a slab of rows at a time. The
conversion then compresses those Params with a `PrequantizedScheme` (whatever else `compress`
asks for the other weights), the lowering sees a zero-size placeholder for their values (so
the float weight is never made), and `dequantized_params` decodes the same codes for the
reference, so verification stays exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rlx_mil.compress.code_store import CodeStore, WriterFactory
from rlx_mil.compress.linear import LinearCodes
from rlx_mil.lowering.target import Target


@dataclass(frozen=True)
class PrequantizedScheme:
    """The scheme of a weight whose source already quantized it; `label` names the source
    format (e.g. "gguf-Q4_K")."""

    label: str


class PrequantizedWeight(Protocol):
    #: The source format, e.g. "gguf-Q4_K".
    label: str
    #: The Param's shape, `[out, in]`.
    shape: tuple[int, ...]

    def encode(self, store: type[np.floating[Any]], code_writer: WriterFactory,
               target: Target = Target.IOS18) -> LinearCodes | LutScaleCodes:
        """The codes with their tables in the program's float type `store`, in the form the
        ops of `target` hold best."""
        ...


@dataclass
class LutScaleCodes:
    """Indices into a code book of integers (`lut`, int8) with a per-block scale and (optional,
    float) offset: w = scale * (lut[indices] - offset) (`constexpr_lut_to_dense` then
    `constexpr_blockwise_shift_scale`)."""

    indices: np.ndarray
    lut: np.ndarray
    scale: np.ndarray
    bits: int
    sq_error: float
    sq_norm: float
    max_error: float | None = None
    offset: np.ndarray | None = None
    #: The split form (`split`): the integer code is `lut[indices]` (one `bits`-wide index into
    #: a float table of the program's type: GGUF's 2-, 3- and 6-bit codes before iOS26) or, with
    #: `high` given, `lut[indices] + 2^bits * high` (a code one bit wider than any index type
    #: Core ML has, 5 bits: a `bits`-wide and a 1-bit index into their own tables, summed); then
    #: w = scale * code + `bias` (offset unused), the arithmetic in the program's float at run
    #: time (`split_op`), since no constexpr op before iOS26 scales a table's output per block.
    split: bool = False
    high: np.ndarray | None = None
    bias: np.ndarray | None = None

    def dequantize(self) -> np.ndarray:
        """scale * (lut[indices] - offset) in float32, as the two constexpr ops decode it (the
        split form: as its run-time ops compute it, in the tables' float type)."""
        if self.split:
            return self.split_values(self.indices, self.high, self.scale, self.bias)
        values = self.lut.astype(np.float32)[self.indices]
        block = values.shape[-1] // self.scale.shape[-1]
        if self.offset is not None:
            values = values - np.repeat(self.offset.astype(np.float32), block, axis=-1)
        return (np.repeat(self.scale.astype(np.float32), block, axis=-1) * values).astype(np.float32)

    def split_values(self, low: np.ndarray, high: np.ndarray | None, scale: np.ndarray,
                     bias: np.ndarray | None) -> np.ndarray:
        """Rows of the split form as its run-time ops compute them, in `scale`'s float type."""
        dt = scale.dtype
        codes = self.lut.astype(dt)[low]
        if high is not None:
            codes = (codes + (high.astype(dt) * dt.type(1 << self.bits))).astype(dt)
        block = codes.shape[-1] // scale.shape[-1]
        values = (codes.reshape(*scale.shape, block) * scale[..., None]).astype(dt)
        if bias is not None:
            values = (values + bias.astype(dt)[..., None]).astype(dt)
        return values.reshape(codes.shape).astype(np.float32)

    @property
    def relative_error(self) -> float:
        return float(np.sqrt(self.sq_error / self.sq_norm)) if self.sq_norm > 0 else float(np.sqrt(self.sq_error))


#: Index widths of `constexpr_lut_to_dense` (iOS18 and later).
LUT_INDEX_BITS = (1, 2, 3, 4, 6, 8)


def lut_scale_op(codes: LutScaleCodes, name: str, store: CodeStore) -> Any:
    """The constexpr chain decoding `codes`: `constexpr_lut_to_dense` (one int8 table of
    2^bits entries) then `constexpr_blockwise_shift_scale`. Core ML keeps that order from iOS26
    on; for earlier targets coremltools re-orders it into a shift-scaled table per block."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    if codes.split:
        return split_op(codes, name, store)
    if codes.bits not in LUT_INDEX_BITS or codes.lut.size != 1 << codes.bits:
        raise ValueError(f"{name}: a LUT of {codes.lut.size} entries for {codes.bits}-bit indices")
    dtype = np.uint8 if codes.bits == 8 else getattr(types, f"np_uint{codes.bits}_dtype")
    lut = codes.lut.astype(np.int8).reshape([1] * codes.indices.ndim + [codes.lut.size, 1])
    values = mb.constexpr_lut_to_dense(indices=store.hold(codes.indices, dtype), lut=lut, name=f"{name}_codes")
    extra = {} if codes.offset is None else {"offset": store.hold(codes.offset)}
    return mb.constexpr_blockwise_shift_scale(data=values, scale=store.hold(codes.scale), name=name, **extra)


def split_op(codes: LutScaleCodes, name: str, store: CodeStore) -> Any:
    """The split form: `bits`-wide indices into `lut` (a float table of the program's type) —
    plus, for a 5-bit code, 1-bit indices into [0, 2^bits], the two `constexpr_lut_to_dense`
    summed — the integer code, exact in fp16 and fp32; then times the block scale plus the
    block bias at run time. Before iOS26 a `constexpr_blockwise_shift_scale` can follow no
    table (and Core ML has no 5-bit index), so the package holds the code's own width rather
    than int8 / 4-bit containers plus per-block tables."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    assert codes.split
    dt = codes.scale.dtype
    rows, cols = codes.indices.shape
    groups = codes.scale.shape[-1]
    table = codes.lut.astype(dt).reshape(1, 1, -1, 1)
    if codes.bits not in LUT_INDEX_BITS or table.size != 1 << codes.bits:
        raise ValueError(f"{name}: a LUT of {table.size} entries for {codes.bits}-bit indices")
    index_type = np.uint8 if codes.bits == 8 else getattr(types, f"np_uint{codes.bits}_dtype")
    if codes.high is None:
        values = mb.constexpr_lut_to_dense(indices=store.hold(codes.indices, index_type), lut=table, name=f"{name}_codes")
    else:
        low = mb.constexpr_lut_to_dense(indices=store.hold(codes.indices, index_type), lut=table, name=f"{name}_low")
        high = mb.constexpr_lut_to_dense(indices=store.hold(codes.high, types.np_uint1_dtype),
                                         lut=np.asarray([0, 1 << codes.bits], dt).reshape(1, 1, 2, 1), name=f"{name}_high")
        values = mb.add(x=low, y=high, name=f"{name}_codes")
    values = mb.reshape(x=values, shape=np.asarray([rows, groups, cols // groups], np.int32), name=f"{name}_blocks")
    values = mb.mul(x=values, y=codes.scale.reshape(rows, groups, 1), name=f"{name}_scaled")
    if codes.bias is not None:
        values = mb.add(x=values, y=codes.bias.astype(dt).reshape(rows, groups, 1), name=f"{name}_biased")
    return mb.reshape(x=values, shape=np.asarray([rows, cols], np.int32), name=name)


def lut_scale_bytes(codes: LutScaleCodes) -> int:
    tables = codes.scale.size * codes.scale.dtype.itemsize
    if codes.offset is not None:
        tables += codes.offset.size * codes.offset.dtype.itemsize
    if codes.split:  # float tables (of 2^bits entries, and 2 for a 1-bit part), the biases
        tables += codes.lut.size * codes.scale.dtype.itemsize
        if codes.high is not None:
            tables += (codes.high.size + 7) // 8 + 2 * codes.scale.dtype.itemsize
        tables += 0 if codes.bias is None else codes.bias.size * codes.bias.dtype.itemsize
        return (codes.indices.size * codes.bits + 7) // 8 + tables
    return (codes.indices.size * codes.bits + 7) // 8 + codes.lut.size + tables


def carried_weights(params: Any) -> Mapping[str, PrequantizedWeight]:
    """The prequantized weights a params mapping carries (empty when it has none)."""
    get = getattr(params, "prequantized_weights", None)
    return get() if callable(get) else {}


class PlaceholderParams(Mapping[str, Any]):
    """`params` as the lowering reads them when `names` are prequantized: those Params are
    zero-size NaN placeholders of their shape (the compressor takes their codes instead; a
    rule that folded one into an op would give NaN, never a silently wrong weight)."""

    def __init__(self, params: Mapping[str, Any], names: Mapping[str, PrequantizedWeight]) -> None:
        self._params = params
        self._names = names

    def __getitem__(self, name: str) -> Any:
        weight = self._names.get(name)
        if weight is None:
            return self._params[name]
        return np.broadcast_to(np.float32(np.nan), weight.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __contains__(self, name: object) -> bool:
        return name in self._params

    def shape_of(self, name: str) -> tuple[int, ...]:
        weight = self._names.get(name)
        if weight is not None:
            return tuple(weight.shape)
        meta = getattr(self._params, "shape_of", None)
        return tuple(meta(name)) if callable(meta) else tuple(np.shape(self._params[name]))

    def dtype_of(self, name: str) -> np.dtype[Any]:
        if name in self._names:
            return np.dtype(np.float32)
        meta = getattr(self._params, "dtype_of", None)
        return meta(name) if callable(meta) else np.asarray(self._params[name]).dtype
