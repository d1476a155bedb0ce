"""Quantization family: Quantize, Dequantize, DequantMatMul (spec sections 5.4-5.6).

Weights known at conversion time stay compressed in the package wherever the target has a
compressed-weight op that reproduces the spec's decode exactly:

* iOS18: ``constexpr_blockwise_shift_scale`` (int8 / uint4 data, per-block scale and offset)
  feeding ``linear``; FP8 / FP4 codes through ``constexpr_lut_to_dense``.
* iOS16/17: ``constexpr_affine_dequantize`` (one scale per output channel) feeding ``linear``
  when a block covers all of K; grouped scales are applied by runtime ops on top of the
  compressed integers (int8 via ``constexpr_affine_dequantize`` with unit scale, 4-bit and FP8
  codes via ``constexpr_lut_to_dense``), so the package holds the codes plus the small scale
  table, never the fp weight.
* iOS15 has no constexpr ops: the weight is decoded at conversion time into an fp ``linear``
  weight (exact, but not compressed).

Weights that arrive at run time are decoded with plain MIL ops (cast, gather, mod/floor_div
nibble unpacking, reshape/tile scale expansion, mul, sub) and multiplied with ``matmul``.

Int4 (and NVFP4) weights may be passed either as the logical ``[K, N]`` array of codes 0..15
or packed two codes per byte (``ceil(K*N/2)`` bytes, any shape, even flat index in the low
nibble), which is how upstream stores them behind a Param declared ``[K, N]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir import ops
from rlx_mil.ir.ops import QuantKind
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.dequant_matmul import lower_fp8, lower_gguf, lower_int_block, lower_nvfp4
from rlx_mil.lowering.rules.quant_support import (
    int_values,
    mil_builder,
    to_float,
)
from rlx_mil.lowering.target import Target

# --------------------------------------------------------------------------------------------
# Quantize / Dequantize
# --------------------------------------------------------------------------------------------


def _channel_params(
    ctx: LowerContext, op: ops.Quantize | ops.Dequantize, sizes: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, int | None]:
    """scales (f32) and zero points (int64) shaped to broadcast against the input, and the
    channel axis (None for per-tensor)."""
    scales = np.asarray(op.scales, dtype=np.float32)
    zps = np.asarray(op.zero_points, dtype=np.int64)
    if op.axis is None:
        if scales.size != 1 or zps.size != 1:
            raise ctx.fail(AttributeValueError, f"per-tensor needs one scale and one zero point, got {scales.size} and {zps.size}")
        return scales.reshape(()), zps.reshape(()), None
    axis = op.axis
    if not 0 <= axis < len(sizes):
        raise ctx.fail(AttributeValueError, f"axis {axis} out of range for rank {len(sizes)}")
    if scales.size != sizes[axis] or zps.size != sizes[axis]:
        raise ctx.fail(AttributeValueError, f"per-channel on axis {axis} needs {sizes[axis]} scales and zero points,"
            f" got {scales.size} and {zps.size}"
        )
    bshape = [1] * len(sizes)
    bshape[axis] = sizes[axis]
    return scales.reshape(bshape), zps.reshape(bshape), axis


@lowering(
    notes=(
        "mul by f32 1/scale, ties-away rounding as sign*floor(|v|+0.5), add zero point, clip"
        " [-128, 127], NaN -> 0 (select), cast to int32 (IR I8 values are held as int32); per-channel"
        " scales broadcast along `axis`. fp16 programs round in fp16 (codes may differ by 1)"
    ),
)
def lower_quantize(op: ops.Quantize, ctx: LowerContext) -> Any:
    mb = mil_builder()
    sizes = ctx.input_shape(0).sizes()
    scales, zps, _ = _channel_params(ctx, op, sizes)
    inv = (np.float32(1.0) / scales).astype(np.float32)
    x = to_float(ctx, ctx.var(0), "x_float")
    v = mb.mul(x=x, y=inv.astype(ctx.float_dtype), name=ctx.name("scaled"))
    magnitude = mb.floor(x=mb.add(x=mb.abs(x=v, name=ctx.name("abs")), y=ctx.scalar(0.5), name=ctx.name("half")),
                         name=ctx.name("floor"))
    rounded = mb.mul(x=mb.sign(x=v, name=ctx.name("sign")), y=magnitude, name=ctx.name("round"))
    shifted = mb.add(x=rounded, y=zps.astype(ctx.float_dtype), name=ctx.name("plus_zp"))
    clipped = mb.clip(x=shifted, alpha=ctx.scalar(-128.0), beta=ctx.scalar(127.0), name=ctx.name("clip"))
    # A float -> int cast of NaN is undefined in Core ML; the IR's saturating cast gives 0.
    is_number = mb.equal(x=v, y=v, name=ctx.name("not_nan"))
    finite = mb.select(cond=is_number, a=clipped, b=ctx.scalar(0.0), name=ctx.name("nan_to_zero"))
    return mb.cast(x=finite, dtype="int32", name=ctx.name())


def _stored_codes(ctx: LowerContext, value: np.ndarray, sizes: tuple[int, ...]) -> tuple[np.ndarray, str | None]:
    """Integer codes of a const Dequantize input and the narrowest constexpr storage that holds
    them ("int8", "uint8" or None when neither does)."""
    codes = int_values(ctx, 0, value, np.iinfo(np.int64).min, np.iinfo(np.int64).max).reshape(sizes)
    if codes.size and codes.min() >= -128 and codes.max() <= 127:
        return codes, "int8"
    if codes.size and codes.min() >= 0 and codes.max() <= 255:
        return codes, "uint8"
    return codes, None


@lowering(
    notes=(
        "const input: `constexpr_affine_dequantize` on iOS16+ (int8 or uint8 codes, per-tensor or"
        " per-channel; zero points the code type cannot hold get a unit-scale constexpr plus runtime"
        " sub/mul), decoded fp const on iOS15 or for codes wider than 8 bits; runtime input: cast, sub"
        " zero point, mul scale"
    ),
)
def lower_dequantize(op: ops.Dequantize, ctx: LowerContext) -> Any:
    mb = mil_builder()
    sizes = ctx.input_shape(0).sizes()
    scales, zps, axis = _channel_params(ctx, op, sizes)
    value = ctx.value(0)
    if value is None:
        q = to_float(ctx, ctx.var(0), "codes")
    else:
        codes, storage = _stored_codes(ctx, value, sizes)
        if ctx.target < Target.IOS16 or storage is None or codes.ndim == 0:
            decoded = (codes.astype(np.float32) - zps.astype(np.float32)) * scales
            return ctx.const(decoded.astype(np.float32), "dequant")
        info = np.iinfo(storage)
        data = codes.astype(storage)
        if np.all((zps >= info.min) & (zps <= info.max)):
            per_channel = axis is not None
            return mb.constexpr_affine_dequantize(
                quantized_data=data,
                zero_point=zps.reshape(-1).astype(storage) if per_channel else np.dtype(storage).type(zps),
                scale=scales.reshape(-1).astype(ctx.float_dtype) if per_channel else ctx.float_dtype(scales),
                axis=np.int32(axis or 0), name=ctx.name(),
            )
        q = mb.constexpr_affine_dequantize(
            quantized_data=data, zero_point=np.dtype(storage).type(0), scale=ctx.scalar(1.0),
            axis=np.int32(0), name=ctx.name("codes"),
        )
    shifted = mb.sub(x=q, y=zps.astype(ctx.float_dtype), name=ctx.name("minus_zp"))
    return mb.mul(x=shifted, y=scales.astype(ctx.float_dtype), name=ctx.name())


# --------------------------------------------------------------------------------------------
# DequantMatMul
# --------------------------------------------------------------------------------------------


#: Why the schemes without a decoder are refused: the spec fixes no byte layout for them.
_MLX_REASON = (
    "the spec (part 2, 1.7) names its inputs but not the packing of w_q (word size, bit order, [N, K] or"
    " [K, N]) or the encoding of its scales, so a decoder would be a guess"
)
UNFIXED_LAYOUTS: dict[QuantKind, str] = {
    QuantKind.MLX_AFFINE: _MLX_REASON,
    QuantKind.MLX_MXFP4: _MLX_REASON,
    QuantKind.MLX_MXFP8: _MLX_REASON,
    QuantKind.MXFP4X2_BLOCK: "the spec does not fix how the two residual FP4 planes and their scales are laid out",
}


@lowering(
    notes=(
        "const Int8Block/Int8BlockAsym/Int4Block weights: iOS18 `constexpr_blockwise_shift_scale`"
        " (int8/uint4 [N, K] data, per-block scale, float offset for Asym) -> `linear`, K padded to whole"
        " blocks with x zero-padded; iOS16/17 `constexpr_affine_dequantize` per output channel -> `linear`"
        " when one block spans K, else int8 codes via unit-scale `constexpr_affine_dequantize` / 4-bit codes"
        " via `constexpr_lut_to_dense`, then runtime (w - zp) * scale on [G, bs, N] -> `matmul`; iOS15"
        " decoded fp `linear` weight (uncompressed). Fp8E4m3/Fp8E5m2/Nvfp4Block: `constexpr_lut_to_dense`"
        " (256- or 16-entry LUT) on iOS16+, scales applied at runtime; decoded fp weight on iOS15. GGUF"
        " Q8_0/Q4_0: iOS18 `constexpr_blockwise_shift_scale`, else decoded; other GGUF types decoded to an"
        " fp `linear` weight (Q2_K..Q8_K, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, TQ2_0). Runtime weights:"
        " cast/gather/nibble unpack + scale expansion -> `matmul`; runtime GGUF bytes are rejected. Refused by"
        " name: the GGUF lattice i-quants (IQ1/IQ2/IQ3), TQ1_0, GGUF NVFP4 and the fork formats (Q1_0, Q2_0,"
        " FV5, FV5B, G8_0), and MlxAffine/MlxMxfp4/MlxMxfp8/MxFp4x2Block, whose byte layouts the spec does not"
        " fix (decoding them by guess could be silently wrong)"
    ),
)
def lower_dequant_matmul(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    kind = op.scheme.kind
    if kind.is_gguf:
        return lower_gguf(op, ctx)
    if kind in (QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK):
        return lower_int_block(op, ctx)
    if kind in (QuantKind.FP8_E4M3, QuantKind.FP8_E5M2):
        return lower_fp8(op, ctx)
    if kind is QuantKind.NVFP4_BLOCK:
        return lower_nvfp4(op, ctx)
    raise ctx.unsupported(f"quant scheme {op.scheme} has no lowering: {UNFIXED_LAYOUTS.get(kind, 'no decoder')}")


