"""Compressed weights: MIL's constexpr ops as Core AI's compression ops, which keep the
compressed form in the asset (`blockwise_shift_scale`, `lut_to_dense`). Sub-byte codes are
stored bit-packed (the adapter's `packed_constant`); an fp16 package's scales and tables stay
fp16 (the package's bytes), the decompressed weight cast to the held float type."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.coreai.registry import RuleContext, rule


def sub_byte_kind(var: Any) -> str | None:
    """'int4', 'uint4', 'uint3'... for a sub-byte var; None otherwise."""
    from coremltools.converters.mil.mil import types

    sym = var.sym_type
    primitive = sym.get_primitive() if types.is_tensor(sym) else sym
    name = types.builtin_to_string(primitive)
    return name if name in {"int1", "uint1", "int2", "uint2", "int3", "uint3", "int4", "uint4", "int6", "uint6"} else None


def codes(ctx: RuleContext, name: str) -> Any:
    """Integer codes input `name` as a Core AI constant: packed when sub-byte."""
    var = ctx.var(name)
    values = np.asarray(ctx.const(name))
    kind = sub_byte_kind(var)
    if kind is not None:
        return adapter.packed_constant(values, kind)
    return adapter.constant(values.astype(ctx.translator.held_dtype(var), copy=False))


def _float(ctx: RuleContext, name: str) -> np.ndarray:
    """Float input `name` in its stored type: fp16 stays fp16, others take the held type."""
    value = np.asarray(ctx.const(name))
    return value if value.dtype == np.float16 else value.astype(ctx.out_dtype(), copy=False)


def _held(ctx: RuleContext, value: Any) -> Any:
    """A decompressed weight in the type the translation holds floats in."""
    return ctx.cast(value, ctx.out_dtype())


@rule("constexpr_blockwise_shift_scale")
def constexpr_blockwise_shift_scale(ctx: RuleContext) -> Any:
    data = codes(ctx, "data")
    scale = _float(ctx, "scale")
    integer_data = np.asarray(ctx.const("data")).dtype.kind in "iu"
    if not integer_data:
        raise ctx.fail("float data (an fp8 shift-scale) is not supported")
    offset = ctx.const("offset") if ctx.has("offset") else None
    data_dtype = ctx.translator.held_dtype(ctx.var("data"))
    if offset is None:
        offset1 = np.zeros(scale.shape, data_dtype)
        offset2 = np.zeros(scale.shape, scale.dtype)
    elif np.asarray(offset).dtype.kind in "iu":
        offset1 = np.asarray(offset).astype(data_dtype)
        offset2 = np.zeros(scale.shape, scale.dtype)
    else:
        # scale * (q - offset) = scale * q + (-scale * offset)
        offset1 = np.zeros(scale.shape, data_dtype)
        offset2 = (-scale * np.asarray(offset, np.float32)).astype(scale.dtype)
    kind = sub_byte_kind(ctx.var("data"))
    offset1_value = _zeros_like(ctx, offset1, kind) if not offset1.any() else \
        adapter.packed_constant(offset1, kind) if kind is not None else adapter.constant(offset1)
    offset2_value = _zeros_like(ctx, offset2) if not offset2.any() else adapter.constant(offset2)
    return _held(ctx, ctx.ops.blockwise_shift_scale(data, adapter.constant(scale), offset1_value, offset2_value))


def _zeros_like(ctx: RuleContext, array: np.ndarray, kind: str | None = None) -> Any:
    """Zeros of `array`'s shape and dtype, stored as one scalar (not an array the size of the
    scales: for an embedding that was 3.5 MB of zeros in the asset)."""
    zero = adapter.packed_constant(np.zeros((), array.dtype), kind) if kind else adapter.constant(np.zeros((), array.dtype))
    return ctx.ops.broadcast_to(zero, np.asarray(array.shape, np.uint32))


@rule("constexpr_affine_dequantize")
def constexpr_affine_dequantize(ctx: RuleContext) -> Any:
    data = np.asarray(ctx.const("quantized_data"))
    axis = int(ctx.param("axis", 0)) % data.ndim
    shape = [1] * data.ndim
    scale = _float(ctx, "scale")
    zero = np.asarray(ctx.const("zero_point"))
    if scale.size > 1:
        shape[axis] = scale.size
    scale = np.broadcast_to(scale.reshape(shape if scale.size > 1 else [1] * data.ndim), shape).copy()
    zero = np.broadcast_to(zero.reshape(shape if zero.size > 1 else [1] * data.ndim), shape).astype(data.dtype)
    return _held(ctx, ctx.ops.blockwise_shift_scale(adapter.constant(data), adapter.constant(scale),
                                                    adapter.constant(zero), adapter.constant(np.zeros(shape, scale.dtype))))


@rule("constexpr_lut_to_dense")
def constexpr_lut_to_dense(ctx: RuleContext) -> Any:
    indices = codes(ctx, "indices")
    lut = _float(ctx, "lut")
    rank = ctx.rank("indices")
    axis = int(ctx.param("vector_axis", 0) or 0) % rank if lut.shape[-1] > 1 else 0
    return _held(ctx, ctx.ops.lut_to_dense(indices, adapter.constant(lut), np.int16(axis)))


@rule("constexpr_cast")
def constexpr_cast(ctx: RuleContext) -> Any:
    source = np.asarray(ctx.const("source_val"))
    if source.dtype == np.float16:  # stored as the package stores it
        return _held(ctx, adapter.constant(source))
    return ctx.constant(source.astype(ctx.out_dtype()))
