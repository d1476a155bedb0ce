"""Reference kernels of ScaledDequantize, ScaledMatMul and ScaledGroupedMatMul: codes decoded
exactly (ml_dtypes' OCP FP8/FP6/FP4 and E8M0 types), times their block scale, in float32."""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from rlx_mil.ir.ops.scaled import (
    ScaledDequantize,
    ScaledFormat,
    ScaledGroupedMatMul,
    ScaledMatMul,
    ScaleKind,
    ScaleLayout,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import finish, reference_kernel
from rlx_mil.reference.shape import gather_indices

_ML_DTYPES = {
    ScaledFormat.F8E4M3: ml_dtypes.float8_e4m3fn, ScaledFormat.F8E5M2: ml_dtypes.float8_e5m2,
    ScaledFormat.F8E4M3_FNUZ: ml_dtypes.float8_e4m3fnuz, ScaledFormat.F8E5M2_FNUZ: ml_dtypes.float8_e5m2fnuz,
    ScaledFormat.F6E2M3: ml_dtypes.float6_e2m3fn, ScaledFormat.F6E3M2: ml_dtypes.float6_e3m2fn,
    ScaledFormat.F4E2M1: ml_dtypes.float4_e2m1fn,
}


def code_table(fmt: ScaledFormat) -> np.ndarray:
    """float32 value of every code of `fmt` (2^bits entries)."""
    return np.arange(2**fmt.bits, dtype=np.uint8).view(_ML_DTYPES[fmt]).astype(np.float32)


#: OCP E8M0 (2^(b - 127), 255 = NaN) and FP8 E4M3 (NVFP4 group scales) by byte.
E8M0_TABLE = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
E4M3_TABLE = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def code_values(fmt: ScaledFormat, codes: np.ndarray) -> np.ndarray:
    """Decoded codes; a sub-byte format reads the low `bits` of each byte."""
    return code_table(fmt)[np.asarray(codes).astype(np.int64) & (2**fmt.bits - 1)]


def scale_values(layout: ScaleLayout, scale: np.ndarray, k: int) -> np.ndarray:
    """The per-element scale along the last axis (`[.., k]`), or the tensor's scalar."""
    if layout.kind is ScaleKind.PER_TENSOR:
        return np.asarray(scale, np.float32).reshape(())
    table = E8M0_TABLE if layout.kind is ScaleKind.BLOCK_MX_E8M0 else E4M3_TABLE
    per_block = table[np.asarray(scale).astype(np.int64) & 0xFF]
    return np.repeat(per_block, layout.block, axis=-1)[..., :k]


def dequantize(fmt: ScaledFormat, layout: ScaleLayout, codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    values = code_values(fmt, codes)
    with np.errstate(invalid="ignore", over="ignore"):
        return values * scale_values(layout, scale, values.shape[-1])


@reference_kernel(ScaledDequantize)
def _scaled_dequantize(op: ScaledDequantize, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(dequantize(op.format, op.scale_layout, inputs[0], inputs[1]), out)


@reference_kernel(ScaledMatMul)
def _scaled_matmul(op: ScaledMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    lhs = dequantize(op.lhs_format, op.scale_layout, inputs[0], inputs[2])
    rhs = dequantize(op.rhs_format, op.scale_layout, inputs[1], inputs[3])
    with np.errstate(invalid="ignore", over="ignore"):
        y = lhs @ rhs.T
        if op.has_bias:
            y = y + np.asarray(inputs[4], np.float32)
    return finish(y, out)


@reference_kernel(ScaledGroupedMatMul)
def _scaled_grouped_matmul(op: ScaledGroupedMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = dequantize(op.lhs_format, op.scale_layout, inputs[0], inputs[2])
    w = dequantize(op.rhs_format, op.scale_layout, inputs[1], inputs[3])
    experts = gather_indices(inputs[4], w.shape[0])
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.einsum("mk,mnk->mn", x, w[experts])
        if op.has_bias:
            y = y + np.asarray(inputs[5], np.float32)[experts]
    return finish(y, out)
