"""Shared pieces of the quantization lowerings: the weight decoders (spec 5.6, reading codes
as the reference evaluator does), the packed-nibble Param layout hook, and checks and MIL helpers
for quantized weights and their tables."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import AttributeValueError, ParamError
from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.ops import QuantKind
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import PARAM_LAYOUT_HOOKS
from rlx_mil.lowering.target import Target
from rlx_mil.reference.quant import E2M1, E4M3FN, E5M2, unpack_nibbles

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


def packed_code_consumers(graph: Graph, node: Node) -> list[Node]:
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
    users = packed_code_consumers(graph, node)
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


def mil_builder() -> Any:
    from coremltools.converters.mil import Builder as mb

    return mb


def param_error(ctx: LowerContext, index: int, message: str) -> ParamError:
    node = ctx.input_node(index)
    what = f"param {node.op.name!r}" if isinstance(node.op, ops.Param) else f"input {index} (%{node.id})"
    return ParamError(f"node %{ctx.node.id} {ctx.base_name!r} ({ctx.op.type_name})", [f"{what}: {message}"])




def int_values(ctx: LowerContext, index: int, value: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Integer codes of a const input, checked to lie in [lo, hi]."""
    arr = np.asarray(value)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.array_equal(arr, np.trunc(arr)):
            raise param_error(ctx, index, "non-integer quantized codes")
    elif arr.dtype.kind not in "iub":
        raise param_error(ctx, index, f"dtype {arr.dtype} cannot hold quantized codes")
    out = arr.astype(np.int64)
    if out.size and (out.min() < lo or out.max() > hi):
        raise param_error(ctx, index, f"codes outside [{lo}, {hi}] (min {out.min()}, max {out.max()})")
    return out


def int8_codes(ctx: LowerContext, index: int, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.uint8:
        arr = arr.view(np.int8)
    codes = int_values(ctx, index, arr, -128, 127)
    if codes.size != int(np.prod(shape, dtype=np.int64)):
        raise param_error(ctx, index, f"{codes.size} values where shape {list(shape)} is needed")
    return codes.reshape(shape).astype(np.int8)


def byte_codes(ctx: LowerContext, index: int, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """FP8 codes as unsigned bytes (an I8-declared payload is read as raw bytes)."""
    codes = int_values(ctx, index, value, -128, 255) & 0xFF
    if codes.size != int(np.prod(shape, dtype=np.int64)):
        raise param_error(ctx, index, f"{codes.size} codes where shape {list(shape)} is needed")
    return codes.reshape(shape).astype(np.uint8)


def nibble_codes(ctx: LowerContext, index: int, value: np.ndarray, k: int, n: int) -> np.ndarray:
    """Logical [K, N] codes 0..15 from either accepted layout (see the module docstring)."""
    arr = np.asarray(value)
    if arr.shape == (k, n):
        return int_values(ctx, index, arr, 0, 15).astype(np.uint8)
    if arr.size == (k * n + 1) // 2:
        packed = int_values(ctx, index, arr, -128, 255)
        return unpack_nibbles(packed, k * n).reshape(k, n)
    raise param_error(
        ctx, index,
        f"shape {list(arr.shape)}: 4-bit codes come as [{k}, {n}] codes or {(k * n + 1) // 2} packed bytes",
    )


def float_values(ctx: LowerContext, index: int, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float32)
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        raise param_error(ctx, index, f"shape {list(arr.shape)} where {list(shape)} is needed")
    return arr.reshape(shape)


def matmul_dims(ctx: LowerContext) -> tuple[int, int]:
    x_sizes = ctx.input_shape(0).sizes()
    out_sizes = ctx.out_shape.sizes()
    if not x_sizes or not out_sizes:
        raise ctx.fail(AttributeValueError, "x and the output need rank >= 1")
    k, n = x_sizes[-1], out_sizes[-1]
    lead = int(np.prod(x_sizes[:-1], dtype=np.int64))
    if lead * n != int(np.prod(out_sizes, dtype=np.int64)):
        raise ctx.fail(AttributeValueError, f"declared output {list(out_sizes)} does not hold x's {lead} rows of {n}")
    return k, n


def mil_dtype_name(var: Any) -> str:
    from coremltools.converters.mil.mil import types

    return str(types.builtin_to_string(var.dtype))


def to_float(ctx: LowerContext, var: Any, suffix: str) -> Any:
    if mil_dtype_name(var) == ctx.mil_float:
        return var
    return mil_builder().cast(x=var, dtype=ctx.mil_float, name=ctx.name(suffix))


def finish(ctx: LowerContext, y: Any) -> Any:
    want = ctx.out_shape.sizes()
    if tuple(y.shape) == want:
        return y
    return mil_builder().reshape(x=y, shape=list(want), name=ctx.name("out"))


def pad_k(ctx: LowerContext, x: Any, k: int, padded_k: int) -> Any:
    """Zero columns appended to x's K axis, matching weights padded to whole blocks."""
    if padded_k == k:
        return x
    return mil_builder().pad(
        x=x, pad=np.array([0, padded_k - k], dtype=np.int32), mode="constant",
        constant_val=ctx.scalar(0.0), name=ctx.name("x_pad"),
    )


def linear(ctx: LowerContext, x: Any, weight: Any) -> Any:
    """`linear` with a const [N, K] weight; x of rank > 3 is flattened to 2-D around it."""
    mb = mil_builder()
    sizes = tuple(x.shape)
    if len(sizes) > 3:
        x = mb.reshape(x=x, shape=[-1, sizes[-1]], name=ctx.name("x_2d"))
    return finish(ctx, mb.linear(x=x, weight=weight, name=ctx.name("linear")))


def matmul(ctx: LowerContext, x: Any, w_kn: Any) -> Any:
    return finish(ctx, mil_builder().matmul(x=x, y=w_kn, name=ctx.name("matmul")))


def group_expand(ctx: LowerContext, table: Any, groups: int, block: int, k: int, n: int, suffix: str) -> Any:
    """[G, N] per-block values -> [K, N], each row repeated `block` times (runtime ops)."""
    mb = mil_builder()
    out = mb.reshape(x=table, shape=[groups, 1, n], name=ctx.name(f"{suffix}_g"))
    if block > 1:
        out = mb.tile(x=out, reps=[1, block, 1], name=ctx.name(f"{suffix}_tile"))
    out = mb.reshape(x=out, shape=[groups * block, n], name=ctx.name(f"{suffix}_rows"))
    if groups * block != k:
        out = mb.slice_by_size(x=out, begin=[0, 0], size=[k, n], name=ctx.name(f"{suffix}_k"))
    return out


def apply_groups(ctx: LowerContext, w_gbn: Any, scale: np.ndarray, zero_point: np.ndarray | None) -> Any:
    """(W - zp) * scale on decoded codes [G, bs, N] with const per-block [G, N] tables, then
    reshaped to [G*bs, N]. The tables are small consts; the codes stay compressed upstream."""
    mb = mil_builder()
    groups, block, n = (int(d) for d in w_gbn.shape)
    w = w_gbn
    if zero_point is not None:
        w = mb.sub(x=w, y=zero_point.reshape(groups, 1, n).astype(ctx.float_dtype), name=ctx.name("minus_zp"))
    w = mb.mul(x=w, y=scale.reshape(groups, 1, n).astype(ctx.float_dtype), name=ctx.name("times_scale"))
    return mb.reshape(x=w, shape=[groups * block, n], name=ctx.name("w"))


def pad_rows(codes: np.ndarray, padded_k: int) -> np.ndarray:
    k = codes.shape[0]
    if padded_k == k:
        return codes
    return np.concatenate([codes, np.zeros((padded_k - k, *codes.shape[1:]), codes.dtype)], axis=0)




def integer_codes(ctx: LowerContext, codes: np.ndarray, bits: int, suffix: str) -> Any:
    """Integer `codes` in [0, 2^bits) as constexpr table lookups giving them back as floats of the
    program's type, exactly (iOS16+). At a table width the target has (1, 2, 3, 4, 6, 8 from
    iOS18; no 3 before) one `constexpr_lut_to_dense` of the identity table; otherwise (5 and 7
    bits; 3 before iOS18) the code is low + high * 2^low with both parts at table widths (4 + 1,
    6 + 1, 2 + 1), two exact tables summed, so the package holds `bits` bits per code rather
    than the next width up."""
    widths = (1, 2, 3, 4, 6, 8) if ctx.target >= Target.IOS18 else (1, 2, 4, 6, 8)
    if bits in widths:
        return _code_table(ctx, codes, bits, 1, suffix)
    low = max(w for w in widths if w < bits and bits - w in widths)
    return mil_builder().add(x=_code_table(ctx, codes & ((1 << low) - 1), low, 1, f"{suffix}_low"),
                             y=_code_table(ctx, codes >> low, bits - low, 1 << low, f"{suffix}_high"),
                             name=ctx.name(suffix))


def _code_table(ctx: LowerContext, codes: np.ndarray, bits: int, step: int, suffix: str) -> Any:
    """`codes * step` held as `bits`-bit indices into the table `[0, step, 2 step, ..]` (an exact
    `constexpr_lut_to_dense`; iOS18's sub-byte index types, or iOS16's packed bit stream)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    table = (np.arange(2**bits, dtype=np.float32) * step).astype(ctx.float_dtype)
    if ctx.target >= Target.IOS18:
        dtype = np.uint8 if bits == 8 else getattr(types, f"np_uint{bits}_dtype")
        return mb.constexpr_lut_to_dense(indices=codes.astype(dtype), lut=table.reshape(*(1,) * codes.ndim, -1, 1),
                                         name=ctx.name(suffix))
    stream = ((codes.reshape(-1, 1) >> np.arange(bits)) & 1).astype(np.uint8)
    return mb.constexpr_lut_to_dense(lut=table, indices=np.packbits(stream.reshape(-1), bitorder="little"),
                                     shape=np.asarray(codes.shape, np.uint32), name=ctx.name(suffix))
