"""DequantMatMul weight schemes as MIL (spec 5.6): the integer block schemes, FP8, NVFP4 and
GGUF, each choosing compressed constexpr ops per target (see rlx_mil/lowering/rules/quant.py for
the overview); the rule in rules/quant.py dispatches on the scheme."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir import ops
from rlx_mil.ir.ops import QuantKind
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.rules.quant_support import (
    E4M3_SCALE_VALUES,
    E4M3_VALUES,
    E5M2_VALUES,
    FP4_E2M1_VALUES,
    NVFP4_GROUP,
    apply_groups,
    byte_codes,
    decode_int_block,
    decode_rows,
    float_values,
    group_expand,
    int8_codes,
    int_values,
    linear,
    matmul,
    matmul_dims,
    mil_builder,
    nibble_codes,
    pack_nibbles,
    pad_k,
    pad_rows,
    param_error,
    to_float,
)
from rlx_mil.lowering.target import Target
from rlx_mil.reference.quant import GGUF_FORMATS, gguf_dequantize


def block_tables(
    ctx: LowerContext, op: ops.DequantMatMul, k: int, n: int
) -> tuple[int, int, np.ndarray | None, np.ndarray | None]:
    """Block size, group count and the const scale / zero-point tables ([G, N]; None when the
    input is not known at conversion time or, for the zero point, unused by the scheme)."""
    block = int(op.scheme.block_size or 0)
    groups = -(-k // block)
    if groups == 1:
        block = k  # one block spans K: no padding to a block size beyond K
    scale_value = ctx.value(2)
    scale = None if scale_value is None else float_values(ctx, 2, scale_value, (groups, n))
    zp = None
    if op.scheme.kind is QuantKind.INT8_BLOCK_ASYM:
        zp_value = ctx.value(3)
        zp = None if zp_value is None else float_values(ctx, 3, zp_value, (groups, n))
    return block, groups, scale, zp



# ---------------------------------------------------------------- integer block schemes


def lower_int_block(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    kind = op.scheme.kind
    k, n = matmul_dims(ctx)
    block, groups, scale, zp = block_tables(ctx, op, k, n)
    w_value = ctx.value(1)
    asym = kind is QuantKind.INT8_BLOCK_ASYM
    if w_value is None or scale is None or (asym and zp is None):
        return _int_block_runtime(op, ctx, k, n, block, groups, scale, zp, w_value)

    if kind is QuantKind.INT4_BLOCK:
        codes: np.ndarray = nibble_codes(ctx, 1, w_value, k, n)
    else:
        codes = int8_codes(ctx, 1, w_value, (k, n))
    x = ctx.var(0)
    if ctx.target >= Target.IOS18:
        return _int_block_ios18(ctx, x, codes, scale, zp, kind, k, n, block, groups)
    if ctx.target >= Target.IOS16:
        return _int_block_ios16(ctx, x, codes, scale, zp, kind, k, n, block, groups)
    weight = decode_int_block(kind, codes, scale, zp, block)
    return linear(ctx, x, weight.T.astype(ctx.float_dtype))


def _int8_zero_points(zp: np.ndarray | None) -> np.ndarray | None:
    """The zero points as int8 when they are whole numbers in int8 range (exactly what the
    integer-offset forms of the constexpr ops can hold), else None."""
    if zp is None or not np.all(zp == np.trunc(zp)) or not np.all((zp >= -128) & (zp <= 127)):
        return None
    return zp.astype(np.int8)


def _int_block_ios18(
    ctx: LowerContext, x: Any, codes: np.ndarray, scale: np.ndarray, zp: np.ndarray | None,
    kind: QuantKind, k: int, n: int, block: int, groups: int, nibble_bias: int = 0,
) -> Any:
    """`constexpr_blockwise_shift_scale` weight [N, Kp] -> `linear`. `nibble_bias` is a
    uniform offset subtracted from 4-bit codes (GGUF Q4_0 centres its codes on 8)."""
    from coremltools.converters.mil.mil import types

    mb = mil_builder()
    padded_k = groups * block
    data = np.ascontiguousarray(pad_rows(codes, padded_k).T)  # [N, Kp]: the `linear` orientation
    kwargs: dict[str, Any] = {}
    if kind is QuantKind.INT4_BLOCK:
        data = data.astype(types.np_uint4_dtype)
        if nibble_bias:
            kwargs["offset"] = np.full((n, groups), nibble_bias, dtype=types.np_uint4_dtype)
    else:
        data = data.astype(np.int8)
        if zp is not None:
            whole = _int8_zero_points(zp)
            offset = whole if whole is not None else zp.astype(ctx.float_dtype)
            kwargs["offset"] = np.ascontiguousarray(offset.T)
    weight = mb.constexpr_blockwise_shift_scale(
        data=data, scale=np.ascontiguousarray(scale.T).astype(ctx.float_dtype), name=ctx.name("weight"), **kwargs
    )
    return linear(ctx, pad_k(ctx, x, k, padded_k), weight)


def _int_block_ios16(
    ctx: LowerContext, x: Any, codes: np.ndarray, scale: np.ndarray, zp: np.ndarray | None,
    kind: QuantKind, k: int, n: int, block: int, groups: int, nibble_bias: int = 0,
) -> Any:
    """One block spanning K: per-channel `constexpr_affine_dequantize` -> `linear`. Otherwise
    the codes stay compressed in a constexpr and the block tables apply at run time."""
    mb = mil_builder()
    whole_zp = _int8_zero_points(zp)
    if kind is not QuantKind.INT4_BLOCK and groups == 1 and (zp is None or whole_zp is not None):
        zero_point = np.zeros(n, np.int8) if whole_zp is None else whole_zp.reshape(n)
        weight = mb.constexpr_affine_dequantize(
            quantized_data=np.ascontiguousarray(codes.T).astype(np.int8), zero_point=zero_point,
            scale=scale.reshape(n).astype(ctx.float_dtype), axis=np.int32(0), name=ctx.name("weight"),
        )
        return linear(ctx, x, weight)
    padded_k = groups * block
    padded = pad_rows(codes, padded_k)
    if kind is QuantKind.INT4_BLOCK:
        w_codes = mb.constexpr_lut_to_dense(
            lut=(np.arange(16) - nibble_bias).astype(ctx.float_dtype), indices=pack_nibbles(padded),
            shape=np.array([groups, block, n], dtype=np.uint32), name=ctx.name("codes"),
        )
    else:
        w_codes = mb.constexpr_affine_dequantize(
            quantized_data=padded.reshape(groups, block, n).astype(np.int8), zero_point=np.int8(0),
            scale=ctx.scalar(1.0), axis=np.int32(0), name=ctx.name("codes"),
        )
    weight = apply_groups(ctx, w_codes, scale, zp)
    return matmul(ctx, pad_k(ctx, x, k, padded_k), weight)


def _runtime_nibbles(ctx: LowerContext, index: int, k: int, n: int) -> Any:
    """Int32 codes [K, N] of a 4-bit weight known only at run time."""
    mb = mil_builder()
    sizes = ctx.input_shape(index).sizes()
    var = ctx.var(index)
    count = int(np.prod(sizes, dtype=np.int64))
    if tuple(sizes) == (k, n):
        return var
    if count != (k * n + 1) // 2:
        raise ctx.fail(AttributeValueError, f"4-bit weight input {list(sizes)}: expected [{k}, {n}] codes or {(k * n + 1) // 2} packed bytes"
        )
    flat = mb.reshape(x=var, shape=[count], name=ctx.name("bytes"))
    # +256 then mod 256 maps I8 (-128..127) and U8 (0..255) bytes to 0..255 with positive operands only.
    unsigned = mb.mod(x=mb.add(x=flat, y=np.int32(256), name=ctx.name("bytes_shift")), y=np.int32(256),
                      name=ctx.name("bytes_u8"))
    low = mb.mod(x=unsigned, y=np.int32(16), name=ctx.name("low"))
    high = mb.floor_div(x=unsigned, y=np.int32(16), name=ctx.name("high"))
    pairs = mb.stack(values=[low, high], axis=1, name=ctx.name("pairs"))
    codes = mb.reshape(x=pairs, shape=[2 * count], name=ctx.name("codes_flat"))
    if 2 * count != k * n:
        codes = mb.slice_by_size(x=codes, begin=[0], size=[k * n], name=ctx.name("codes_trim"))
    return mb.reshape(x=codes, shape=[k, n], name=ctx.name("codes"))


def _runtime_table(ctx: LowerContext, index: int, table: np.ndarray | None, groups: int, n: int) -> Any:
    if table is not None:
        return ctx.const(table, f"in{index}")
    sizes = ctx.input_shape(index).sizes()
    if int(np.prod(sizes, dtype=np.int64)) != groups * n:
        raise ctx.fail(AttributeValueError, f"input {index} has shape {list(sizes)}, [{groups}, {n}] is needed")
    return to_float(ctx, ctx.var(index), f"in{index}_float")


def _int_block_runtime(
    op: ops.DequantMatMul, ctx: LowerContext, k: int, n: int, block: int, groups: int,
    scale: np.ndarray | None, zp: np.ndarray | None, w_value: np.ndarray | None,
) -> Any:
    mb = mil_builder()
    kind = op.scheme.kind
    if w_value is not None:
        codes = nibble_codes(ctx, 1, w_value, k, n) if kind is QuantKind.INT4_BLOCK else int8_codes(ctx, 1, w_value, (k, n))
        w = ctx.const(codes.astype(np.float32), "codes")
    elif kind is QuantKind.INT4_BLOCK:
        w = to_float(ctx, _runtime_nibbles(ctx, 1, k, n), "codes_float")
    else:
        sizes = ctx.input_shape(1).sizes()
        if tuple(sizes) != (k, n):
            raise ctx.fail(AttributeValueError, f"weight input has shape {list(sizes)}, [{k}, {n}] is needed")
        w = to_float(ctx, ctx.var(1), "codes_float")
    if kind is QuantKind.INT8_BLOCK_ASYM:
        zp_rows = (ctx.const(decode_rows(zp, block, k), "zp") if zp is not None
                   else group_expand(ctx, _runtime_table(ctx, 3, None, groups, n), groups, block, k, n, "zp"))
        w = mb.sub(x=w, y=zp_rows, name=ctx.name("minus_zp"))
    scale_rows = (ctx.const(decode_rows(scale, block, k), "scale") if scale is not None
                  else group_expand(ctx, _runtime_table(ctx, 2, None, groups, n), groups, block, k, n, "scale"))
    w = mb.mul(x=w, y=scale_rows, name=ctx.name("w"))
    return matmul(ctx, ctx.var(0), w)


# ---------------------------------------------------------------- FP8


def _reshaped(ctx: LowerContext, var: Any, shape: list[int], suffix: str) -> Any:
    if list(var.shape) == shape:
        return var
    return mil_builder().reshape(x=var, shape=shape, name=ctx.name(suffix))


def _fp8_scale(ctx: LowerContext, n: int) -> np.ndarray | Any | None:
    """The per-column scale: None when absent (an empty input reads as all ones), a NumPy
    [N] (or one-value) array when known at conversion time, else a runtime var."""
    value = ctx.value(2)
    if value is not None:
        flat = np.asarray(value, dtype=np.float32).reshape(-1)
        if flat.size not in (0, 1, n):
            raise param_error(ctx, 2, f"{flat.size} scales; one per output column ({n}) or a single one is needed")
        return flat if flat.size else None
    count = int(np.prod(ctx.input_shape(2).sizes(), dtype=np.int64))
    if count == 0:
        return None
    if count not in (1, n):
        raise ctx.fail(AttributeValueError, f"FP8 scale input has {count} values; one per output column ({n}) or one is needed")
    return _reshaped(ctx, to_float(ctx, ctx.var(2), "scale_float"), [count], "scale_vec")


def lower_fp8(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    mb = mil_builder()
    k, n = matmul_dims(ctx)
    table = E4M3_VALUES if op.scheme.kind is QuantKind.FP8_E4M3 else E5M2_VALUES
    scale = _fp8_scale(ctx, n)
    w_value = ctx.value(1)
    x = ctx.var(0)
    if w_value is None:
        sizes = ctx.input_shape(1).sizes()
        if int(np.prod(sizes, dtype=np.int64)) != k * n:
            raise ctx.fail(AttributeValueError, f"FP8 weight input {list(sizes)}: [{k}, {n}] codes are needed")
        w = _gather_lut(ctx, _reshaped(ctx, ctx.var(1), [k, n], "codes_kn"), table, 256, "w_fp8")
    else:
        codes = byte_codes(ctx, 1, w_value, (k, n))
        if ctx.target < Target.IOS16:
            decoded = table[codes]
            if scale is None or isinstance(scale, np.ndarray):
                weight = decoded if scale is None else decoded * scale
                return linear(ctx, x, weight.T.astype(ctx.float_dtype))
            w = ctx.const(decoded, "w_fp8")
        elif ctx.target >= Target.IOS18:
            w = mb.constexpr_lut_to_dense(
                indices=codes, lut=table.astype(ctx.float_dtype).reshape(1, 1, 256, 1), name=ctx.name("codes"),
            )
        else:
            w = mb.constexpr_lut_to_dense(
                lut=table.astype(ctx.float_dtype), indices=codes.reshape(-1),
                shape=np.array([k, n], dtype=np.uint32), name=ctx.name("codes"),
            )
    if scale is not None:
        factor = scale.astype(ctx.float_dtype) if isinstance(scale, np.ndarray) else scale
        w = mb.mul(x=w, y=factor, name=ctx.name("w"))
    return matmul(ctx, x, w)


def _gather_lut(ctx: LowerContext, codes: Any, table: np.ndarray, size: int, suffix: str) -> Any:
    """table[codes] at run time; codes are int32 bytes (negative I8 bytes wrap to 128..255)."""
    mb = mil_builder()
    if size == 256:
        codes = mb.mod(x=mb.add(x=codes, y=np.int32(256), name=ctx.name(f"{suffix}_shift")), y=np.int32(256),
                       name=ctx.name(f"{suffix}_u8"))
    return mb.gather(x=table.astype(ctx.float_dtype), indices=codes, axis=0, name=ctx.name(suffix))


# ---------------------------------------------------------------- NVFP4


def lower_nvfp4(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    from coremltools.converters.mil.mil import types

    mb = mil_builder()
    k, n = matmul_dims(ctx)
    groups = -(-k // NVFP4_GROUP)
    x = ctx.var(0)
    w_value, bs_value, gs_value = ctx.value(1), ctx.value(2), ctx.value(3)
    block_scale = None if bs_value is None else E4M3_SCALE_VALUES[byte_codes(ctx, 2, bs_value, (groups, n))]
    global_scale = None
    if gs_value is not None:
        flat = np.asarray(gs_value, dtype=np.float32).reshape(-1)
        if flat.size != 1:
            raise param_error(ctx, 3, f"global scale has {flat.size} values, 1 is needed")
        global_scale = flat[0]

    if w_value is not None and block_scale is not None and global_scale is not None:
        codes = nibble_codes(ctx, 1, w_value, k, n)
        if ctx.target < Target.IOS16:
            rows = np.arange(k) // NVFP4_GROUP
            weight = FP4_E2M1_VALUES[codes] * block_scale[rows] * global_scale
            return linear(ctx, x, weight.T.astype(ctx.float_dtype))
        padded_k = groups * NVFP4_GROUP
        padded = pad_rows(codes, padded_k)
        if ctx.target >= Target.IOS18:
            values = mb.constexpr_lut_to_dense(
                indices=padded.reshape(groups, NVFP4_GROUP, n).astype(types.np_uint4_dtype),
                lut=FP4_E2M1_VALUES.astype(ctx.float_dtype).reshape(1, 1, 1, 16, 1), name=ctx.name("codes"),
            )
        else:
            values = mb.constexpr_lut_to_dense(
                lut=FP4_E2M1_VALUES.astype(ctx.float_dtype), indices=pack_nibbles(padded),
                shape=np.array([groups, NVFP4_GROUP, n], dtype=np.uint32), name=ctx.name("codes"),
            )
        w = mb.mul(x=values, y=block_scale.reshape(groups, 1, n).astype(ctx.float_dtype), name=ctx.name("times_block"))
        w = mb.mul(x=w, y=ctx.scalar(float(global_scale)), name=ctx.name("times_global"))
        w = mb.reshape(x=w, shape=[padded_k, n], name=ctx.name("w"))
        return matmul(ctx, pad_k(ctx, x, k, padded_k), w)

    # Run-time decode: gather the LUTs, expand the block scales along K.
    if w_value is not None:
        w = ctx.const(FP4_E2M1_VALUES[nibble_codes(ctx, 1, w_value, k, n)], "w_fp4")
    else:
        w = _gather_lut(ctx, _runtime_nibbles(ctx, 1, k, n), FP4_E2M1_VALUES, 16, "w_fp4")
    if block_scale is not None:
        scale_rows = ctx.const(decode_rows(block_scale, NVFP4_GROUP, k), "block_scale")
    else:
        sizes = ctx.input_shape(2).sizes()
        if int(np.prod(sizes, dtype=np.int64)) != groups * n:
            raise ctx.fail(AttributeValueError, f"block scale input {list(sizes)}: [{groups}, {n}] is needed")
        table = _gather_lut(ctx, _reshaped(ctx, ctx.var(2), [groups, n], "block_codes"), E4M3_SCALE_VALUES, 256,
                            "block_scale")
        scale_rows = group_expand(ctx, table, groups, NVFP4_GROUP, k, n, "block_scale")
    w = mb.mul(x=w, y=scale_rows, name=ctx.name("times_block"))
    if global_scale is not None:
        w = mb.mul(x=w, y=ctx.scalar(float(global_scale)), name=ctx.name("w"))
    else:
        sizes = ctx.input_shape(3).sizes()
        if int(np.prod(sizes, dtype=np.int64)) != 1:
            raise ctx.fail(AttributeValueError, f"global scale input {list(sizes)}: one value is needed")
        g = _reshaped(ctx, to_float(ctx, ctx.var(3), "global_float"), [1], "global")
        w = mb.mul(x=w, y=g, name=ctx.name("w"))
    return matmul(ctx, x, w)


# ---------------------------------------------------------------- GGUF

#: GGUF formats that are exactly a block-scaled integer code: (elements, bytes per block).
_UNDECODED_GGUF_REASON = (
    "its block layout (lattice code books of the IQ1/IQ2/IQ3 i-quants, TQ1_0's base-3 packing, GGUF"
    " NVFP4, the PrismML/Fermion/Pestle fork formats) is not fixed by the spec, so a decoder would be a guess"
)
GGUF_AFFINE = {QuantKind.GGUF_Q8_0: (32, 34), QuantKind.GGUF_Q4_0: (32, 18)}


def gguf_codes(kind: QuantKind, raw: np.ndarray, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes [K, N] (int8, or 4-bit 0..15 for Q4_0) and the fp16 block scales d [K/32, N] of a
    Q8_0 / Q4_0 weight stored as [N, K] blocks."""
    elems, nbytes = GGUF_AFFINE[kind]
    blocks = raw.reshape(n, k // elems, nbytes)
    d = np.ascontiguousarray(blocks[:, :, 0:2]).view("<f2").reshape(n, k // elems).astype(np.float32)
    if kind is QuantKind.GGUF_Q8_0:
        codes = np.ascontiguousarray(blocks[:, :, 2:34]).view(np.int8).reshape(n, k)
    else:
        qs = blocks[:, :, 2:18]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, k)  # low nibbles are elements 0..15
    return np.ascontiguousarray(codes.T), np.ascontiguousarray(d.T)


def lower_gguf(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    from rlx_mil.errors import GraphError
    from rlx_mil.reference.quant import as_bytes

    kind = op.scheme.kind
    if kind not in GGUF_FORMATS:
        raise ctx.unsupported(f"GGUF scheme {kind.value} has no decoder: {_UNDECODED_GGUF_REASON}")
    k, n = matmul_dims(ctx)
    value = ctx.value(1)
    if value is None:
        raise ctx.unsupported(
            f"{kind.value} weights must be a Param or Constant (decoded at conversion time); run-time"
            " GGUF bytes have no Core ML decoding"
        )
    raw = as_bytes(int_values(ctx, 1, value, -128, 255))
    try:
        weight = gguf_dequantize(kind, raw, k)  # [N, K]; also validates the byte count
    except GraphError as err:
        raise type(err)(err.detail, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name,
                        operand=err.operand) from None
    if weight.shape[0] != n:
        raise param_error(ctx, 1, f"holds {weight.shape[0]} rows of K={k}; the output needs N={n}")
    x = ctx.var(0)
    if kind in GGUF_AFFINE and ctx.target >= Target.IOS16:
        codes, d = gguf_codes(kind, raw, k, n)
        groups = k // 32
        as_kind = QuantKind.INT4_BLOCK if kind is QuantKind.GGUF_Q4_0 else QuantKind.INT8_BLOCK
        bias = 8 if kind is QuantKind.GGUF_Q4_0 else 0
        lower = _int_block_ios18 if ctx.target >= Target.IOS18 else _int_block_ios16
        return lower(ctx, x, codes, d, None, as_kind, k, n, 32, groups, nibble_bias=bias)
    return linear(ctx, x, weight.astype(ctx.float_dtype))
