"""Compressed codes -> the MIL constexpr op that decodes them, per deployment target.

* iOS18: linear codes of any width/granularity as ``constexpr_blockwise_shift_scale``; LUTs of
  1/2/3/4/6/8 bits, per tensor or per grouped channel, as the iOS18 ``constexpr_lut_to_dense``
  (lut ``[*blocks, 2**bits, 1]``).
* iOS16/17: 8-bit codes per tensor or per output channel as ``constexpr_affine_dequantize``;
  per-tensor LUTs of 1/2/4/6/8 bits as the iOS16 ``constexpr_lut_to_dense`` (indices packed
  LSB first). Anything else is a `CompressionError` naming the weight and the target.
* iOS15 has no compressed-weight ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.compress.code_store import CodeStore
from rlx_mil.compress.linear import LinearCodes
from rlx_mil.compress.lowrank import CorrectedCodes
from rlx_mil.compress.palette import PaletteCodes, check_palette_bits
from rlx_mil.compress.schemes import (
    PER_BLOCK,
    PER_GROUPED_CHANNEL,
    LinearScheme,
    Scheme,
)
from rlx_mil.errors import CompressionError
from rlx_mil.lowering.target import Target

IOS16_PALETTE_BITS = (1, 2, 4, 6, 8)


def check_target(scheme: Scheme, target: Target, name: str) -> None:
    """Raise when `target` has no op that holds `scheme`."""
    where = f"weight {name!r}: {scheme.label}"
    if target < Target.IOS16:
        raise CompressionError(f"{where} needs a compressed-weight (constexpr) op; {target.label} has none (use iOS16 or newer)")
    if target >= Target.IOS18:
        return
    if isinstance(scheme, LinearScheme):
        if scheme.float_offset:
            raise CompressionError(f"{where}: a float offset needs iOS18 (constexpr_blockwise_shift_scale); {target.label}'s"
                                   " constexpr_affine_dequantize takes an integer zero point")
        if scheme.bits != 8:
            raise CompressionError(f"{where}: 4-bit linear quantization needs iOS18 (constexpr_blockwise_shift_scale); {target.label}"
                                   " only has 8-bit constexpr_affine_dequantize")
        if scheme.granularity == PER_BLOCK:
            raise CompressionError(f"{where}: per-block scales need iOS18 (constexpr_blockwise_shift_scale); {target.label} has"
                                   " per-tensor or per-channel constexpr_affine_dequantize only")
        return
    if scheme.channel_scale:
        raise CompressionError(f"{where}: a per-channel scale after the LUT needs iOS18 (constexpr_blockwise_shift_scale);"
                               f" {target.label} has none")
    if scheme.granularity == PER_GROUPED_CHANNEL:
        raise CompressionError(f"{where}: per-grouped-channel LUTs need iOS18; {target.label}'s constexpr_lut_to_dense holds one"
                               " table per tensor")
    check_palette_bits(scheme.bits, IOS16_PALETTE_BITS, name, target.label)


def _sub_byte(dtype_name: str) -> Any:
    from coremltools.converters.mil.mil import types

    return {
        "int8": np.int8, "uint8": np.uint8, "int4": types.np_int4_dtype, "uint4": types.np_uint4_dtype,
        "uint1": types.np_uint1_dtype, "uint2": types.np_uint2_dtype, "uint3": types.np_uint3_dtype,
        "uint6": types.np_uint6_dtype,
    }[dtype_name]


def linear_op(codes: LinearCodes, target: Target, name: str, store: CodeStore) -> Any:
    """The constexpr op of linear codes; large tables are held by `store`."""
    from coremltools.converters.mil import Builder as mb

    scheme = codes.scheme
    if target >= Target.IOS18:
        dtype = _sub_byte(scheme.dtype_name)
        kwargs: dict[str, Any] = {}
        if codes.offset is not None:  # integer offsets share the data's type; float ones the scale's
            kwargs["offset"] = store.hold(codes.offset, dtype if codes.offset.dtype.kind in "iu" else None)
        return mb.constexpr_blockwise_shift_scale(
            data=store.hold(codes.data, dtype), scale=store.hold(codes.scale), name=name, **kwargs,
        )
    scale = codes.scale.reshape(-1)
    zero = (np.zeros(scale.shape, codes.data.dtype) if codes.offset is None else codes.offset.reshape(-1))
    if scale.size == 1:
        scale_arg: Any = scale.reshape(())[()]
        zero_arg: Any = zero.reshape(())[()]
    else:
        scale_arg, zero_arg = store.hold(scale), store.hold(zero)
    return mb.constexpr_affine_dequantize(
        quantized_data=store.hold(codes.data), zero_point=zero_arg, scale=scale_arg, axis=np.int32(0), name=name,
    )


def pack_bits(indices: np.ndarray, bits: int) -> np.ndarray:
    """Indices as `bits`-wide fields packed LSB first, one byte after the other (iOS16 LUT form)."""
    flat = np.ascontiguousarray(indices).reshape(-1)
    chunk = 1 << 20  # elements per pass; a multiple of 8 keeps byte boundaries aligned
    parts = []
    for start in range(0, flat.size, chunk):
        part = flat[start:start + chunk].astype(np.uint8)
        fields = ((part[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8)
        parts.append(fields.reshape(-1))
    bitstream = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return np.packbits(bitstream, bitorder="little")


def palette_op(codes: PaletteCodes, target: Target, name: str, store: CodeStore) -> Any:
    """The constexpr op of LUT codes; large index tensors are held by `store`."""
    from coremltools.converters.mil import Builder as mb

    bits = codes.scheme.bits
    shape = codes.indices.shape
    if target >= Target.IOS18:
        lut_shape = [codes.lut.shape[0]] + [1] * (len(shape) - 1) + [1 << bits, 1]
        indices = store.hold(codes.indices, _sub_byte(f"uint{bits}") if bits != 8 else None)
        if codes.channel_scale is None:
            return mb.constexpr_lut_to_dense(indices=indices, lut=store.hold(codes.lut.reshape(lut_shape)), name=name)
        # coremltools' per-channel-scale palettization: the LUT, then the scale of each output
        # channel (for targets before iOS26 its passes store a scaled table per channel).
        values = mb.constexpr_lut_to_dense(indices=indices, lut=store.hold(codes.lut.reshape(lut_shape)), name=f"{name}_lut")
        scale = codes.channel_scale.reshape([shape[0]] + [1] * (len(shape) - 1))
        return mb.constexpr_blockwise_shift_scale(data=values, scale=store.hold(scale), name=name)
    if codes.lut.shape[0] != 1:
        raise CompressionError(f"weight LUT of {codes.lut.shape[0]} groups has no {target.label} form")
    return mb.constexpr_lut_to_dense(
        lut=codes.lut.reshape(-1), indices=store.hold(pack_bits(codes.indices, bits)),
        shape=np.asarray(shape, dtype=np.uint32), name=name,
    )


def packed_bytes(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def compressed_bytes(codes: LinearCodes | PaletteCodes | CorrectedCodes, target: Target | None = None) -> int:
    """Bytes the weight takes in the package: packed codes plus its scale/offset or LUT tables
    (and a low-rank correction's factors). A channel-scaled palette on a `target` before iOS26
    is stored as a scaled table per output channel (coremltools'
    `canonicalize_quantized_lut_pattern`), its scales kept too."""
    if isinstance(codes, CorrectedCodes):
        return compressed_bytes(codes.base, target) + codes.factor_bytes
    if isinstance(codes, LinearCodes):
        bits = codes.scheme.bits
        total = packed_bytes(codes.data.size, bits) + codes.scale.size * codes.scale.dtype.itemsize
        if codes.offset is not None:
            integer = codes.offset.dtype.kind in "iu"
            total += packed_bytes(codes.offset.size, bits) if integer else codes.offset.size * codes.offset.dtype.itemsize
        return total
    tables = codes.lut.size * codes.lut.dtype.itemsize
    if codes.channel_scale is not None:
        scales = codes.channel_scale.size * codes.channel_scale.dtype.itemsize
        tables = scales + (tables if target is not None and target >= Target.IOS26 else
                           codes.channel_scale.size * codes.lut.shape[1] * codes.lut.dtype.itemsize)
    return packed_bytes(codes.indices.size, codes.scheme.bits) + tables
