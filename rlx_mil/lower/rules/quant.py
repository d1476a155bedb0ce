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

from rlx_mil.errors import AttributeValueError, ParamError
from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.ops import QuantKind
from rlx_mil.lower.context import LowerContext
from rlx_mil.lower.registry import PARAM_LAYOUT_HOOKS, lowering
from rlx_mil.lower.target import Target
from rlx_mil.reference.quant import E2M1, E4M3FN, E5M2, gguf_dequantize, unpack_nibbles

# --------------------------------------------------------------------------------------------
# Decoders (spec 5.6): the code tables are the reference evaluator's, so both read codes alike.
# --------------------------------------------------------------------------------------------

#: FP8 code -> value, as the weight decoders of DequantMatMul read them.
E4M3_VALUES: np.ndarray = E4M3FN
E5M2_VALUES: np.ndarray = E5M2
#: NVFP4 block scales: OCP E4M3 with the NaN bytes (0x7F, 0xFF) read as 0.
E4M3_SCALE_VALUES: np.ndarray = np.where(np.isnan(E4M3FN), np.float32(0), E4M3FN).astype(np.float32)
#: FP4 E2M1 code -> value.
FP4_E2M1_VALUES: np.ndarray = E2M1
NVFP4_GROUP = 16


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """Codes 0..15 packed two per byte over the flat index, even index in the low nibble (the
    IR's Int4 layout, which is also `constexpr_lut_to_dense`'s LSB-first 4-bit packing)."""
    flat = np.asarray(codes).reshape(-1).astype(np.uint8) & 0x0F
    if flat.size % 2:
        flat = np.concatenate([flat, np.zeros(1, np.uint8)])
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def decode_rows(table: np.ndarray, block: int, k: int) -> np.ndarray:
    """[G, N] per-block values repeated to [K, N]."""
    return np.repeat(table, block, axis=0)[:k]


def decode_int_block(
    kind: QuantKind, codes: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, block: int
) -> np.ndarray:
    """W [K, N] of Int8Block / Int8BlockAsym / Int4Block from logical codes [K, N] and the
    per-block scale (and zero point) tables [ceil(K/bs), N]."""
    k = codes.shape[0]
    w = codes.astype(np.float32)
    if kind is QuantKind.INT8_BLOCK_ASYM:
        assert zero_point is not None
        w = w - decode_rows(zero_point.astype(np.float32), block, k)
    return (w * decode_rows(scale.astype(np.float32), block, k)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Params given in a packed layout (hooked into the driver's param check).
# --------------------------------------------------------------------------------------------


def _packed_code_consumers(graph: Graph, node: Node) -> list[Node]:
    """DequantMatMul nodes reading `node` as 4-bit codes (input 1 of Int4Block / Nvfp4Block)."""
    users = []
    for user in graph:
        if node.id not in user.inputs:
            continue
        op = user.op
        if not isinstance(op, ops.DequantMatMul) or op.scheme.kind not in (QuantKind.INT4_BLOCK, QuantKind.NVFP4_BLOCK):
            return []
        if any(pos != 1 for pos, inp in enumerate(user.inputs) if inp == node.id):
            return []
        users.append(user)
    return users


def accepts_packed_nibbles(graph: Graph, node: Node, array: np.ndarray) -> bool:
    """True when `array` is the packed form (ceil(K*N/2) bytes) of a Param that only feeds
    4-bit-code DequantMatMul weights; such a Param is declared with its logical [K, N] shape,
    or with the packed shape itself, its I8 values then being bytes (0..255 as uint8)."""
    users = _packed_code_consumers(graph, node)
    if not users or array.dtype.kind not in "iu":
        return False
    try:
        logical = node.shape.sizes()
    except ValueError:
        return False
    count = int(np.prod(logical, dtype=np.int64))
    packed = array.size == (count + 1) // 2 or array.shape == logical
    return packed and bool(np.all((array >= -128) & (array <= 255)))


if accepts_packed_nibbles not in PARAM_LAYOUT_HOOKS:
    PARAM_LAYOUT_HOOKS.append(accepts_packed_nibbles)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _mb() -> Any:
    from coremltools.converters.mil import Builder as mb

    return mb


def _param_error(ctx: LowerContext, index: int, message: str) -> ParamError:
    node = ctx.input_node(index)
    what = f"param {node.op.name!r}" if isinstance(node.op, ops.Param) else f"input {index} (%{node.id})"
    return ParamError(f"node %{ctx.node.id} {ctx.base_name!r} ({ctx.op.type_name})", [f"{what}: {message}"])


def _attr_error(ctx: LowerContext, message: str) -> AttributeValueError:
    return AttributeValueError(message, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name)


def _int_values(ctx: LowerContext, index: int, value: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Integer codes of a const input, checked to lie in [lo, hi]."""
    arr = np.asarray(value)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.trunc(arr)):
            raise _param_error(ctx, index, "non-integer quantized codes")
    elif arr.dtype.kind not in "iub":
        raise _param_error(ctx, index, f"dtype {arr.dtype} cannot hold quantized codes")
    out = arr.astype(np.int64)
    if out.size and (out.min() < lo or out.max() > hi):
        raise _param_error(ctx, index, f"codes outside [{lo}, {hi}] (min {out.min()}, max {out.max()})")
    return out


def _int8_codes(ctx: LowerContext, index: int, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.uint8:
        arr = arr.view(np.int8)
    codes = _int_values(ctx, index, arr, -128, 127)
    if codes.size != int(np.prod(shape, dtype=np.int64)):
        raise _param_error(ctx, index, f"{codes.size} values where shape {list(shape)} is needed")
    return codes.reshape(shape).astype(np.int8)


def _byte_codes(ctx: LowerContext, index: int, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """FP8 codes as unsigned bytes (an I8-declared payload is read as raw bytes)."""
    codes = _int_values(ctx, index, value, -128, 255) & 0xFF
    if codes.size != int(np.prod(shape, dtype=np.int64)):
        raise _param_error(ctx, index, f"{codes.size} codes where shape {list(shape)} is needed")
    return codes.reshape(shape).astype(np.uint8)


def _nibble_codes(ctx: LowerContext, index: int, value: np.ndarray, k: int, n: int) -> np.ndarray:
    """Logical [K, N] codes 0..15 from either accepted layout (see the module docstring)."""
    arr = np.asarray(value)
    if arr.shape == (k, n):
        return _int_values(ctx, index, arr, 0, 15).astype(np.uint8)
    if arr.size == (k * n + 1) // 2:
        packed = _int_values(ctx, index, arr, -128, 255)
        return unpack_nibbles(packed, k * n).reshape(k, n)
    raise _param_error(
        ctx, index,
        f"shape {list(arr.shape)}: 4-bit codes come as [{k}, {n}] codes or {(k * n + 1) // 2} packed bytes",
    )


def _float_values(ctx: LowerContext, index: int, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float32)
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        raise _param_error(ctx, index, f"shape {list(arr.shape)} where {list(shape)} is needed")
    return arr.reshape(shape)


def _matmul_dims(ctx: LowerContext) -> tuple[int, int]:
    x_sizes = ctx.input_shape(0).sizes()
    out_sizes = ctx.out_shape.sizes()
    if not x_sizes or not out_sizes:
        raise _attr_error(ctx, "x and the output need rank >= 1")
    k, n = x_sizes[-1], out_sizes[-1]
    lead = int(np.prod(x_sizes[:-1], dtype=np.int64))
    if lead * n != int(np.prod(out_sizes, dtype=np.int64)):
        raise _attr_error(ctx, f"declared output {list(out_sizes)} does not hold x's {lead} rows of {n}")
    return k, n


def _mil_dtype_name(var: Any) -> str:
    from coremltools.converters.mil.mil import types

    return str(types.builtin_to_string(var.dtype))


def _to_float(ctx: LowerContext, var: Any, suffix: str) -> Any:
    if _mil_dtype_name(var) == ctx.mil_float:
        return var
    return _mb().cast(x=var, dtype=ctx.mil_float, name=ctx.name(suffix))


def _finish(ctx: LowerContext, y: Any) -> Any:
    want = ctx.out_shape.sizes()
    if tuple(y.shape) == want:
        return y
    return _mb().reshape(x=y, shape=list(want), name=ctx.name("out"))


def _pad_k(ctx: LowerContext, x: Any, k: int, padded_k: int) -> Any:
    """Zero columns appended to x's K axis, matching weights padded to whole blocks."""
    if padded_k == k:
        return x
    return _mb().pad(
        x=x, pad=np.array([0, padded_k - k], dtype=np.int32), mode="constant",
        constant_val=ctx.scalar(0.0), name=ctx.name("x_pad"),
    )


def _linear(ctx: LowerContext, x: Any, weight: Any) -> Any:
    """`linear` with a const [N, K] weight; x of rank > 3 is flattened to 2-D around it."""
    mb = _mb()
    sizes = tuple(x.shape)
    if len(sizes) > 3:
        x = mb.reshape(x=x, shape=[-1, sizes[-1]], name=ctx.name("x_2d"))
    return _finish(ctx, mb.linear(x=x, weight=weight, name=ctx.name("linear")))


def _matmul(ctx: LowerContext, x: Any, w_kn: Any) -> Any:
    return _finish(ctx, _mb().matmul(x=x, y=w_kn, name=ctx.name("matmul")))


def _group_expand(ctx: LowerContext, table: Any, groups: int, block: int, k: int, n: int, suffix: str) -> Any:
    """[G, N] per-block values -> [K, N], each row repeated `block` times (runtime ops)."""
    mb = _mb()
    out = mb.reshape(x=table, shape=[groups, 1, n], name=ctx.name(f"{suffix}_g"))
    if block > 1:
        out = mb.tile(x=out, reps=[1, block, 1], name=ctx.name(f"{suffix}_tile"))
    out = mb.reshape(x=out, shape=[groups * block, n], name=ctx.name(f"{suffix}_rows"))
    if groups * block != k:
        out = mb.slice_by_size(x=out, begin=[0, 0], size=[k, n], name=ctx.name(f"{suffix}_k"))
    return out


def _apply_groups(ctx: LowerContext, w_gbn: Any, scale: np.ndarray, zero_point: np.ndarray | None) -> Any:
    """(W - zp) * scale on decoded codes [G, bs, N] with const per-block [G, N] tables, then
    reshaped to [G*bs, N]. The tables are small consts; the codes stay compressed upstream."""
    mb = _mb()
    groups, block, n = (int(d) for d in w_gbn.shape)
    w = w_gbn
    if zero_point is not None:
        w = mb.sub(x=w, y=zero_point.reshape(groups, 1, n).astype(ctx.float_dtype), name=ctx.name("minus_zp"))
    w = mb.mul(x=w, y=scale.reshape(groups, 1, n).astype(ctx.float_dtype), name=ctx.name("times_scale"))
    return mb.reshape(x=w, shape=[groups * block, n], name=ctx.name("w"))


def _pad_rows(codes: np.ndarray, padded_k: int) -> np.ndarray:
    k = codes.shape[0]
    if padded_k == k:
        return codes
    return np.concatenate([codes, np.zeros((padded_k - k, *codes.shape[1:]), codes.dtype)], axis=0)


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
            raise _attr_error(ctx, f"per-tensor needs one scale and one zero point, got {scales.size} and {zps.size}")
        return scales.reshape(()), zps.reshape(()), None
    axis = op.axis
    if not 0 <= axis < len(sizes):
        raise _attr_error(ctx, f"axis {axis} out of range for rank {len(sizes)}")
    if scales.size != sizes[axis] or zps.size != sizes[axis]:
        raise _attr_error(
            ctx, f"per-channel on axis {axis} needs {sizes[axis]} scales and zero points,"
            f" got {scales.size} and {zps.size}"
        )
    bshape = [1] * len(sizes)
    bshape[axis] = sizes[axis]
    return scales.reshape(bshape), zps.reshape(bshape), axis


@lowering(
    ops.Quantize, family="quant",
    notes="mul by f32 1/scale, ties-away rounding as sign*floor(|v|+0.5), add zero point, clip"
    " [-128, 127], NaN -> 0 (select), cast to int32 (IR I8 values are held as int32); per-channel"
    " scales broadcast along `axis`. fp16 programs round in fp16 (codes may differ by 1)",
)
def lower_quantize(op: ops.Quantize, ctx: LowerContext) -> Any:
    mb = _mb()
    sizes = ctx.input_shape(0).sizes()
    scales, zps, _ = _channel_params(ctx, op, sizes)
    inv = (np.float32(1.0) / scales).astype(np.float32)
    x = _to_float(ctx, ctx.var(0), "x_float")
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
    codes = _int_values(ctx, 0, value, np.iinfo(np.int64).min, np.iinfo(np.int64).max).reshape(sizes)
    if codes.size and codes.min() >= -128 and codes.max() <= 127:
        return codes, "int8"
    if codes.size and codes.min() >= 0 and codes.max() <= 255:
        return codes, "uint8"
    return codes, None


@lowering(
    ops.Dequantize, family="quant",
    notes="const input: `constexpr_affine_dequantize` on iOS16+ (int8 or uint8 codes, per-tensor or"
    " per-channel; zero points the code type cannot hold get a unit-scale constexpr plus runtime"
    " sub/mul), decoded fp const on iOS15 or for codes wider than 8 bits; runtime input: cast, sub"
    " zero point, mul scale",
)
def lower_dequantize(op: ops.Dequantize, ctx: LowerContext) -> Any:
    mb = _mb()
    sizes = ctx.input_shape(0).sizes()
    scales, zps, axis = _channel_params(ctx, op, sizes)
    value = ctx.value(0)
    if value is None:
        q = _to_float(ctx, ctx.var(0), "codes")
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


def _block_tables(
    ctx: LowerContext, op: ops.DequantMatMul, k: int, n: int
) -> tuple[int, int, np.ndarray | None, np.ndarray | None]:
    """Block size, group count and the const scale / zero-point tables ([G, N]; None when the
    input is not known at conversion time or, for the zero point, unused by the scheme)."""
    block = int(op.scheme.block_size or 0)
    groups = -(-k // block)
    if groups == 1:
        block = k  # one block spans K: no padding to a block size beyond K
    scale_value = ctx.value(2)
    scale = None if scale_value is None else _float_values(ctx, 2, scale_value, (groups, n))
    zp = None
    if op.scheme.kind is QuantKind.INT8_BLOCK_ASYM:
        zp_value = ctx.value(3)
        zp = None if zp_value is None else _float_values(ctx, 3, zp_value, (groups, n))
    return block, groups, scale, zp


@lowering(
    ops.DequantMatMul, family="quant",
    notes="const Int8Block/Int8BlockAsym/Int4Block weights: iOS18 `constexpr_blockwise_shift_scale`"
    " (int8/uint4 [N, K] data, per-block scale, float offset for Asym) -> `linear`, K padded to whole"
    " blocks with x zero-padded; iOS16/17 `constexpr_affine_dequantize` per output channel -> `linear`"
    " when one block spans K, else int8 codes via unit-scale `constexpr_affine_dequantize` / 4-bit codes"
    " via `constexpr_lut_to_dense`, then runtime (w - zp) * scale on [G, bs, N] -> `matmul`; iOS15"
    " decoded fp `linear` weight (uncompressed). Fp8E4m3/Fp8E5m2/Nvfp4Block: `constexpr_lut_to_dense`"
    " (256- or 16-entry LUT) on iOS16+, scales applied at runtime; decoded fp weight on iOS15. GGUF"
    " Q8_0/Q4_0: iOS18 `constexpr_blockwise_shift_scale`, else decoded; other GGUF types decoded to an"
    " fp `linear` weight. Runtime weights: cast/gather/nibble unpack + scale expansion -> `matmul`;"
    " runtime GGUF bytes are rejected",
)
def lower_dequant_matmul(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    kind = op.scheme.kind
    if kind.is_gguf:
        return _lower_gguf(op, ctx)
    if kind in (QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK):
        return _lower_int_block(op, ctx)
    if kind in (QuantKind.FP8_E4M3, QuantKind.FP8_E5M2):
        return _lower_fp8(op, ctx)
    if kind is QuantKind.NVFP4_BLOCK:
        return _lower_nvfp4(op, ctx)
    raise ctx.unsupported(f"quant scheme {op.scheme} has no lowering")


# ---------------------------------------------------------------- integer block schemes


def _lower_int_block(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    kind = op.scheme.kind
    k, n = _matmul_dims(ctx)
    block, groups, scale, zp = _block_tables(ctx, op, k, n)
    w_value = ctx.value(1)
    asym = kind is QuantKind.INT8_BLOCK_ASYM
    if w_value is None or scale is None or (asym and zp is None):
        return _int_block_runtime(op, ctx, k, n, block, groups, scale, zp, w_value)

    if kind is QuantKind.INT4_BLOCK:
        codes: np.ndarray = _nibble_codes(ctx, 1, w_value, k, n)
    else:
        codes = _int8_codes(ctx, 1, w_value, (k, n))
    x = ctx.var(0)
    if ctx.target >= Target.IOS18:
        return _int_block_ios18(ctx, x, codes, scale, zp, kind, k, n, block, groups)
    if ctx.target >= Target.IOS16:
        return _int_block_ios16(ctx, x, codes, scale, zp, kind, k, n, block, groups)
    weight = decode_int_block(kind, codes, scale, zp, block)
    return _linear(ctx, x, weight.T.astype(ctx.float_dtype))


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

    mb = _mb()
    padded_k = groups * block
    data = np.ascontiguousarray(_pad_rows(codes, padded_k).T)  # [N, Kp]: the `linear` orientation
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
    return _linear(ctx, _pad_k(ctx, x, k, padded_k), weight)


def _int_block_ios16(
    ctx: LowerContext, x: Any, codes: np.ndarray, scale: np.ndarray, zp: np.ndarray | None,
    kind: QuantKind, k: int, n: int, block: int, groups: int, nibble_bias: int = 0,
) -> Any:
    """One block spanning K: per-channel `constexpr_affine_dequantize` -> `linear`. Otherwise
    the codes stay compressed in a constexpr and the block tables apply at run time."""
    mb = _mb()
    whole_zp = _int8_zero_points(zp)
    if kind is not QuantKind.INT4_BLOCK and groups == 1 and (zp is None or whole_zp is not None):
        zero_point = np.zeros(n, np.int8) if whole_zp is None else whole_zp.reshape(n)
        weight = mb.constexpr_affine_dequantize(
            quantized_data=np.ascontiguousarray(codes.T).astype(np.int8), zero_point=zero_point,
            scale=scale.reshape(n).astype(ctx.float_dtype), axis=np.int32(0), name=ctx.name("weight"),
        )
        return _linear(ctx, x, weight)
    padded_k = groups * block
    padded = _pad_rows(codes, padded_k)
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
    weight = _apply_groups(ctx, w_codes, scale, zp)
    return _matmul(ctx, _pad_k(ctx, x, k, padded_k), weight)


def _runtime_nibbles(ctx: LowerContext, index: int, k: int, n: int) -> Any:
    """Int32 codes [K, N] of a 4-bit weight known only at run time."""
    mb = _mb()
    sizes = ctx.input_shape(index).sizes()
    var = ctx.var(index)
    count = int(np.prod(sizes, dtype=np.int64))
    if tuple(sizes) == (k, n):
        return var
    if count != (k * n + 1) // 2:
        raise _attr_error(
            ctx, f"4-bit weight input {list(sizes)}: expected [{k}, {n}] codes or {(k * n + 1) // 2} packed bytes"
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
        raise _attr_error(ctx, f"input {index} has shape {list(sizes)}, [{groups}, {n}] is needed")
    return _to_float(ctx, ctx.var(index), f"in{index}_float")


def _int_block_runtime(
    op: ops.DequantMatMul, ctx: LowerContext, k: int, n: int, block: int, groups: int,
    scale: np.ndarray | None, zp: np.ndarray | None, w_value: np.ndarray | None,
) -> Any:
    mb = _mb()
    kind = op.scheme.kind
    if w_value is not None:
        codes = _nibble_codes(ctx, 1, w_value, k, n) if kind is QuantKind.INT4_BLOCK else _int8_codes(ctx, 1, w_value, (k, n))
        w = ctx.const(codes.astype(np.float32), "codes")
    elif kind is QuantKind.INT4_BLOCK:
        w = _to_float(ctx, _runtime_nibbles(ctx, 1, k, n), "codes_float")
    else:
        sizes = ctx.input_shape(1).sizes()
        if tuple(sizes) != (k, n):
            raise _attr_error(ctx, f"weight input has shape {list(sizes)}, [{k}, {n}] is needed")
        w = _to_float(ctx, ctx.var(1), "codes_float")
    if kind is QuantKind.INT8_BLOCK_ASYM:
        zp_rows = (ctx.const(decode_rows(zp, block, k), "zp") if zp is not None
                   else _group_expand(ctx, _runtime_table(ctx, 3, None, groups, n), groups, block, k, n, "zp"))
        w = mb.sub(x=w, y=zp_rows, name=ctx.name("minus_zp"))
    scale_rows = (ctx.const(decode_rows(scale, block, k), "scale") if scale is not None
                  else _group_expand(ctx, _runtime_table(ctx, 2, None, groups, n), groups, block, k, n, "scale"))
    w = mb.mul(x=w, y=scale_rows, name=ctx.name("w"))
    return _matmul(ctx, ctx.var(0), w)


# ---------------------------------------------------------------- FP8


def _reshaped(ctx: LowerContext, var: Any, shape: list[int], suffix: str) -> Any:
    if list(var.shape) == shape:
        return var
    return _mb().reshape(x=var, shape=shape, name=ctx.name(suffix))


def _fp8_scale(ctx: LowerContext, n: int) -> np.ndarray | Any | None:
    """The per-column scale: None when absent (an empty input reads as all ones), a NumPy
    [N] (or one-value) array when known at conversion time, else a runtime var."""
    value = ctx.value(2)
    if value is not None:
        flat = np.asarray(value, dtype=np.float32).reshape(-1)
        if flat.size not in (0, 1, n):
            raise _param_error(ctx, 2, f"{flat.size} scales; one per output column ({n}) or a single one is needed")
        return flat if flat.size else None
    count = int(np.prod(ctx.input_shape(2).sizes(), dtype=np.int64))
    if count == 0:
        return None
    if count not in (1, n):
        raise _attr_error(ctx, f"FP8 scale input has {count} values; one per output column ({n}) or one is needed")
    return _reshaped(ctx, _to_float(ctx, ctx.var(2), "scale_float"), [count], "scale_vec")


def _lower_fp8(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    mb = _mb()
    k, n = _matmul_dims(ctx)
    table = E4M3_VALUES if op.scheme.kind is QuantKind.FP8_E4M3 else E5M2_VALUES
    scale = _fp8_scale(ctx, n)
    w_value = ctx.value(1)
    x = ctx.var(0)
    if w_value is None:
        sizes = ctx.input_shape(1).sizes()
        if int(np.prod(sizes, dtype=np.int64)) != k * n:
            raise _attr_error(ctx, f"FP8 weight input {list(sizes)}: [{k}, {n}] codes are needed")
        w = _gather_lut(ctx, _reshaped(ctx, ctx.var(1), [k, n], "codes_kn"), table, 256, "w_fp8")
    else:
        codes = _byte_codes(ctx, 1, w_value, (k, n))
        if ctx.target < Target.IOS16:
            decoded = table[codes]
            if scale is None or isinstance(scale, np.ndarray):
                weight = decoded if scale is None else decoded * scale
                return _linear(ctx, x, weight.T.astype(ctx.float_dtype))
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
    return _matmul(ctx, x, w)


def _gather_lut(ctx: LowerContext, codes: Any, table: np.ndarray, size: int, suffix: str) -> Any:
    """table[codes] at run time; codes are int32 bytes (negative I8 bytes wrap to 128..255)."""
    mb = _mb()
    if size == 256:
        codes = mb.mod(x=mb.add(x=codes, y=np.int32(256), name=ctx.name(f"{suffix}_shift")), y=np.int32(256),
                       name=ctx.name(f"{suffix}_u8"))
    return mb.gather(x=table.astype(ctx.float_dtype), indices=codes, axis=0, name=ctx.name(suffix))


# ---------------------------------------------------------------- NVFP4


def _lower_nvfp4(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    from coremltools.converters.mil.mil import types

    mb = _mb()
    k, n = _matmul_dims(ctx)
    groups = -(-k // NVFP4_GROUP)
    x = ctx.var(0)
    w_value, bs_value, gs_value = ctx.value(1), ctx.value(2), ctx.value(3)
    block_scale = None if bs_value is None else E4M3_SCALE_VALUES[_byte_codes(ctx, 2, bs_value, (groups, n))]
    global_scale = None
    if gs_value is not None:
        flat = np.asarray(gs_value, dtype=np.float32).reshape(-1)
        if flat.size != 1:
            raise _param_error(ctx, 3, f"global scale has {flat.size} values, 1 is needed")
        global_scale = flat[0]

    if w_value is not None and block_scale is not None and global_scale is not None:
        codes = _nibble_codes(ctx, 1, w_value, k, n)
        if ctx.target < Target.IOS16:
            rows = np.arange(k) // NVFP4_GROUP
            weight = FP4_E2M1_VALUES[codes] * block_scale[rows] * global_scale
            return _linear(ctx, x, weight.T.astype(ctx.float_dtype))
        padded_k = groups * NVFP4_GROUP
        padded = _pad_rows(codes, padded_k)
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
        return _matmul(ctx, _pad_k(ctx, x, k, padded_k), w)

    # Run-time decode: gather the LUTs, expand the block scales along K.
    if w_value is not None:
        w = ctx.const(FP4_E2M1_VALUES[_nibble_codes(ctx, 1, w_value, k, n)], "w_fp4")
    else:
        w = _gather_lut(ctx, _runtime_nibbles(ctx, 1, k, n), FP4_E2M1_VALUES, 16, "w_fp4")
    if block_scale is not None:
        scale_rows = ctx.const(decode_rows(block_scale, NVFP4_GROUP, k), "block_scale")
    else:
        sizes = ctx.input_shape(2).sizes()
        if int(np.prod(sizes, dtype=np.int64)) != groups * n:
            raise _attr_error(ctx, f"block scale input {list(sizes)}: [{groups}, {n}] is needed")
        table = _gather_lut(ctx, _reshaped(ctx, ctx.var(2), [groups, n], "block_codes"), E4M3_SCALE_VALUES, 256,
                            "block_scale")
        scale_rows = _group_expand(ctx, table, groups, NVFP4_GROUP, k, n, "block_scale")
    w = mb.mul(x=w, y=scale_rows, name=ctx.name("times_block"))
    if global_scale is not None:
        w = mb.mul(x=w, y=ctx.scalar(float(global_scale)), name=ctx.name("w"))
    else:
        sizes = ctx.input_shape(3).sizes()
        if int(np.prod(sizes, dtype=np.int64)) != 1:
            raise _attr_error(ctx, f"global scale input {list(sizes)}: one value is needed")
        g = _reshaped(ctx, _to_float(ctx, ctx.var(3), "global_float"), [1], "global")
        w = mb.mul(x=w, y=g, name=ctx.name("w"))
    return _matmul(ctx, x, w)


# ---------------------------------------------------------------- GGUF

#: GGUF formats that are exactly a block-scaled integer code: (elements, bytes per block).
_GGUF_AFFINE = {QuantKind.GGUF_Q8_0: (32, 34), QuantKind.GGUF_Q4_0: (32, 18)}


def _gguf_codes(kind: QuantKind, raw: np.ndarray, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes [K, N] (int8, or 4-bit 0..15 for Q4_0) and the fp16 block scales d [K/32, N] of a
    Q8_0 / Q4_0 weight stored as [N, K] blocks."""
    elems, nbytes = _GGUF_AFFINE[kind]
    blocks = raw.reshape(n, k // elems, nbytes)
    d = np.ascontiguousarray(blocks[:, :, 0:2]).view("<f2").reshape(n, k // elems).astype(np.float32)
    if kind is QuantKind.GGUF_Q8_0:
        codes = np.ascontiguousarray(blocks[:, :, 2:34]).view(np.int8).reshape(n, k)
    else:
        qs = blocks[:, :, 2:18]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, k)  # low nibbles are elements 0..15
    return np.ascontiguousarray(codes.T), np.ascontiguousarray(d.T)


def _lower_gguf(op: ops.DequantMatMul, ctx: LowerContext) -> Any:
    from rlx_mil.errors import GraphError
    from rlx_mil.reference.quant import as_bytes

    kind = op.scheme.kind
    k, n = _matmul_dims(ctx)
    value = ctx.value(1)
    if value is None:
        raise ctx.unsupported(
            f"{kind.value} weights must be a Param or Constant (decoded at conversion time); run-time"
            " GGUF bytes have no Core ML decoding"
        )
    raw = as_bytes(_int_values(ctx, 1, value, -128, 255))
    try:
        weight = gguf_dequantize(kind, raw, k)  # [N, K]; also validates the byte count
    except GraphError as err:
        raise type(err)(err.detail, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name,
                        operand=err.operand) from None
    if weight.shape[0] != n:
        raise _param_error(ctx, 1, f"holds {weight.shape[0]} rows of K={k}; the output needs N={n}")
    x = ctx.var(0)
    if kind in _GGUF_AFFINE and ctx.target >= Target.IOS16:
        codes, d = _gguf_codes(kind, raw, k, n)
        groups = k // 32
        as_kind = QuantKind.INT4_BLOCK if kind is QuantKind.GGUF_Q4_0 else QuantKind.INT8_BLOCK
        bias = 8 if kind is QuantKind.GGUF_Q4_0 else 0
        lower = _int_block_ios18 if ctx.target >= Target.IOS18 else _int_block_ios16
        return lower(ctx, x, codes, d, None, as_kind, k, n, 32, groups, nibble_bias=bias)
    return _linear(ctx, x, weight.astype(ctx.float_dtype))
