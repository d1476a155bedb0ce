"""ScaledDequantize, ScaledMatMul and ScaledGroupedMatMul.

Codes known at conversion stay compressed from iOS16 on: one `constexpr_lut_to_dense` over the
format's 2^bits-entry code table (4/6/8-bit indices), and block scales (E8M0 / E4M3 bytes) are a
second 256-entry `constexpr_lut_to_dense` over their byte values, expanded along K at run time
and multiplied in - so the package holds the codes and the scale bytes. A per-tensor scale of
known codes is folded into the code table (the weight is then one constexpr feeding `linear`).
iOS15 gets decoded consts; run-time codes `gather` the tables.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops.scaled import ScaledFormat, ScaleKind, ScaleLayout
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.quant_support import finish, linear
from rlx_mil.lowering.rules.training import decomposed
from rlx_mil.lowering.target import Target
from rlx_mil.reference.scaled import E4M3_TABLE, E8M0_TABLE, code_table


def _packed(indices: np.ndarray, bits: int) -> np.ndarray:
    """LSB-first bit packing (iOS16 `constexpr_lut_to_dense` indices)."""
    bitstream = ((indices.reshape(-1, 1).astype(np.uint16) >> np.arange(bits, dtype=np.uint16)) & 1).astype(np.uint8)
    return np.packbits(bitstream.reshape(-1), bitorder="little")


def _held(ctx: LowerContext, table: np.ndarray) -> np.ndarray:
    """A value table in the program's float type: under fp16, E8M0 scales beyond fp16's range
    become inf or 0 (what an fp16 program can hold; docs/upstream-ops-3.md)."""
    with np.errstate(over="ignore", under="ignore"):
        return table.astype(ctx.float_dtype)


def _lut_const(ctx: LowerContext, codes: np.ndarray, table: np.ndarray, bits: int, suffix: str) -> Any:
    """`table[codes]` as a constexpr (iOS16+) or a decoded const (iOS15)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    held = _held(ctx, table)
    if ctx.target < Target.IOS16:
        return ctx.const(held[codes], suffix)
    if ctx.target >= Target.IOS18:
        dtype = np.uint8 if bits == 8 else getattr(types, f"np_uint{bits}_dtype")
        lut = held.reshape([1] * codes.ndim + [2**bits, 1])
        return mb.constexpr_lut_to_dense(indices=codes.astype(dtype), lut=lut, name=ctx.name(suffix))
    return mb.constexpr_lut_to_dense(lut=held, indices=_packed(codes, bits),
                                     shape=np.asarray(codes.shape, np.uint32), name=ctx.name(suffix))


def _runtime_lut(ctx: LowerContext, var: Any, table: np.ndarray, bits: int, suffix: str) -> Any:
    """`table[var & (2^bits - 1)]` for run-time codes."""
    from coremltools.converters.mil import Builder as mb

    idx = mb.cast(x=var, dtype="int32", name=ctx.name(f"{suffix}_int"))
    if bits < 8:
        idx = mb.mod(x=idx, y=np.int32(2**bits), name=ctx.name(f"{suffix}_low"))
    return mb.gather(x=ctx.const(_held(ctx, table), f"{suffix}_table"), indices=idx, axis=0, name=ctx.name(suffix))


def _expand_blocks(ctx: LowerContext, scale: Any, sizes: tuple[int, ...], block: int, suffix: str) -> Any:
    """`[.., G]` block scales -> `[.., k]` (each repeated `block` times, cut to k)."""
    from coremltools.converters.mil import Builder as mb

    *lead, k = sizes
    groups = -(-k // block)
    out = mb.expand_dims(x=scale, axes=[-1], name=ctx.name(f"{suffix}_col"))
    if block > 1:
        out = mb.tile(x=out, reps=[1] * (len(lead) + 1) + [block], name=ctx.name(f"{suffix}_tile"))
    out = mb.reshape(x=out, shape=np.asarray([*lead, groups * block], np.int32), name=ctx.name(f"{suffix}_rows"))
    if groups * block != k:
        out = mb.slice_by_size(x=out, begin=[0] * len(sizes), size=list(sizes), name=ctx.name(f"{suffix}_k"))
    return out


def decoded(ctx: LowerContext, fmt: ScaledFormat, layout: ScaleLayout, i_codes: int, i_scale: int,
            role: str) -> tuple[Any, bool]:
    """Input `i_codes` decoded and scaled, `[.., k]` in the program's float type, and whether it
    is a constexpr (known codes, per-tensor known scale) that `linear` can take as a weight."""
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(i_codes).sizes()
    mask = 2**fmt.bits - 1
    table = code_table(fmt)
    known = ctx.known_value(i_codes)
    known_scale = ctx.known_value(i_scale)
    if layout.kind is ScaleKind.PER_TENSOR:
        if known is not None and known_scale is not None:
            scaled_table = table * np.float32(np.asarray(known_scale, np.float32).reshape(-1)[0])
            codes = np.asarray(known).astype(np.int64) & mask
            return _lut_const(ctx, codes, scaled_table, fmt.bits, f"{role}_values"), True
        values = (_lut_const(ctx, np.asarray(known).astype(np.int64) & mask, table, fmt.bits, f"{role}_codes")
                  if known is not None else _runtime_lut(ctx, ctx.var(i_codes), table, fmt.bits, f"{role}_codes"))
        scale = ctx.var(i_scale)
        if known_scale is None and ctx.mil_dtype(ctx.input_shape(i_scale).dtype) != ctx.mil_float:
            scale = mb.cast(x=scale, dtype=ctx.mil_float, name=ctx.name(f"{role}_scale_f"))
        return mb.mul(x=values, y=scale, name=ctx.name(f"{role}_values")), False
    values = (_lut_const(ctx, np.asarray(known).astype(np.int64) & mask, table, fmt.bits, f"{role}_codes")
              if known is not None else _runtime_lut(ctx, ctx.var(i_codes), table, fmt.bits, f"{role}_codes"))
    scale_table = E8M0_TABLE if layout.kind is ScaleKind.BLOCK_MX_E8M0 else E4M3_TABLE
    per_block = (_lut_const(ctx, np.asarray(known_scale).astype(np.int64) & 0xFF, scale_table, 8, f"{role}_scales")
                 if known_scale is not None else _runtime_lut(ctx, ctx.var(i_scale), scale_table, 8, f"{role}_scales"))
    full = _expand_blocks(ctx, per_block, sizes, layout.block, f"{role}_scale")
    return mb.mul(x=values, y=full, name=ctx.name(f"{role}_values")), False


_NOTES_DECODE = (
    " Known codes: iOS16+ `constexpr_lut_to_dense` over the format's code table (F8 8-bit, F6 6-bit,"
    " F4 4-bit indices), block scales a 256-entry `constexpr_lut_to_dense` over E8M0 / E4M3 bytes"
    " expanded along K (`expand_dims`, `tile`, `reshape`) and `mul`; a known per-tensor scale folds"
    " into the code table; iOS15 decoded consts. Run-time codes: `cast`, `mod` to the low bits,"
    " `gather` of the tables."
)


@lowering(notes="decode(code) * scale as F32." + _NOTES_DECODE)
def lower_scaled_dequantize(op: ops.ScaledDequantize, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    values, _ = decoded(ctx, op.format, op.scale_layout, 0, 1, "codes")
    return mb.identity(x=values, name=ctx.name())


@lowering(
    notes=(
        "lhs and rhs decoded as ScaledDequantize, then `matmul` with transpose_y (`linear` when the"
        " rhs is a known per-tensor-scaled constexpr) and `add` of the bias." + _NOTES_DECODE
    ),
)
def lower_scaled_matmul(op: ops.ScaledMatMul, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    lhs, _ = decoded(ctx, op.lhs_format, op.scale_layout, 0, 2, "lhs")
    rhs, rhs_const = decoded(ctx, op.rhs_format, op.scale_layout, 1, 3, "rhs")
    if rhs_const:
        y = linear(ctx, lhs, rhs)
    else:
        y = finish(ctx, mb.matmul(x=lhs, y=rhs, transpose_y=True, name=ctx.name("matmul")))
    if op.has_bias:
        bias = ctx.known_value(4)
        y = mb.add(x=y, y=ctx.const(bias, "bias") if bias is not None else ctx.var(4), name=ctx.name("bias"))
    return y


@lowering(
    notes=(
        "decomposed in IR: ScaledDequantize of input and weight (the weight's codes and scale bytes"
        " stay compressed as for ScaledDequantize), `Transpose` to [E, K, N], `GroupedMatMul`, and"
        " with a bias `Gather` of each row's expert bias + `Add`."
    ),
)
def lower_scaled_grouped_matmul(op: ops.ScaledGroupedMatMul, ctx: LowerContext) -> Any:
    layout = op.scale_layout

    def build(g: Graph, ins: list[int]) -> int:
        x = g.scaled_dequantize(ins[0], ins[2], op.lhs_format, layout)
        w = g.transpose(g.scaled_dequantize(ins[1], ins[3], op.rhs_format, layout), [0, 2, 1])
        y = g.grouped_matmul(x, w, ins[4])
        return g.add(y, g.gather(ins[5], ins[4], 0)) if op.has_bias else y

    return decomposed(ctx, build)
