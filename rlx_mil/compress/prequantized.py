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

    def encode(self, store: type[np.floating[Any]], code_writer: WriterFactory) -> LinearCodes | LutScaleCodes:
        """The codes with their tables in the program's float type `store`."""
        ...


@dataclass
class LutScaleCodes:
    """Indices into a code book of integers (`lut`, int8) times a per-block scale:
    w = scale * lut[indices] (`constexpr_lut_to_dense` then `constexpr_blockwise_shift_scale`)."""

    indices: np.ndarray
    lut: np.ndarray
    scale: np.ndarray
    bits: int
    sq_error: float
    sq_norm: float
    max_error: float | None = None

    def dequantize(self) -> np.ndarray:
        values = self.lut.astype(np.float32)[self.indices]
        block = values.shape[-1] // self.scale.shape[-1]
        return (np.repeat(self.scale.astype(np.float32), block, axis=-1) * values).astype(np.float32)

    @property
    def relative_error(self) -> float:
        return float(np.sqrt(self.sq_error / self.sq_norm)) if self.sq_norm > 0 else float(np.sqrt(self.sq_error))


def lut_scale_op(codes: LutScaleCodes, name: str, store: CodeStore) -> Any:
    """The iOS18 constexpr chain decoding `codes`."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    dtype = {4: types.np_uint4_dtype, 8: np.uint8}[codes.bits]
    lut = codes.lut.astype(np.int8).reshape([1] * codes.indices.ndim + [codes.lut.size, 1])
    values = mb.constexpr_lut_to_dense(indices=store.hold(codes.indices, dtype), lut=lut, name=f"{name}_codes")
    return mb.constexpr_blockwise_shift_scale(data=values, scale=store.hold(codes.scale), name=name)


def lut_scale_bytes(codes: LutScaleCodes) -> int:
    return (codes.indices.size * codes.bits + 7) // 8 + codes.lut.size + codes.scale.size * codes.scale.dtype.itemsize


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
