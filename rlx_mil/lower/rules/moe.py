"""Mixture-of-experts matmuls: GroupedMatMul, DequantGroupedMatMul, DequantMoEWeights (spec
part 2, sections 2.4-2.6).

Two formulations, picked per node from its sizes: with no more rows than experts (decode) each
row gathers its expert's `[K, N]` weight and one batched `matmul` multiplies them (memory
M*K*N, at most the weights' own size); with more rows (prefill) every row is multiplied by
every expert in one broadcast `matmul` (`[E, M, N]`) and `select` + `reduce_sum` keep each
row's own expert, so no gathered copy of the weights grows with M. GGUF expert bytes are
decoded at conversion time into a float const.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import GraphError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.lower.context import LowerContext
from rlx_mil.lower.registry import lowering
from rlx_mil.lower.rules.elementwise import convert, shape_error, to_float
from rlx_mil.lower.rules.shape import gather_indices
from rlx_mil.reference.moe import moe_weights
from rlx_mil.reference.quant import as_bytes


def _rows_cols(ctx: LowerContext) -> tuple[int, int]:
    sizes = ctx.input_shape(0).sizes()
    if len(sizes) != 2:
        raise shape_error(ctx, f"input must be [M, K], got {list(sizes)}", "input")
    ids = ctx.input_shape(2).sizes()
    if ids != (sizes[0],):
        raise shape_error(ctx, f"expert_idx must be [{sizes[0]}], got {list(ids)}", "expert_idx")
    return sizes[0], sizes[1]


def grouped_matmul_var(ctx: LowerContext, x: Any, weight: Any, experts: int, m: int, k: int, n: int) -> Any:
    """`x[i] @ weight[expert_idx[i]]` for the node's input 0 rows (`x` in the program float,
    `weight` an `[E, K, N]` var); expert ids are the node's input 2."""
    from coremltools.converters.mil import Builder as mb

    ids = gather_indices(ctx, experts, operand=2, role="expert_idx")
    if m <= experts:
        picked = mb.gather(x=weight, indices=ids, axis=0, name=ctx.name("experts"))  # [M, K, N]
        rows = mb.reshape(x=x, shape=np.asarray([m, 1, k], np.int32), name=ctx.name("rows"))
        y = mb.matmul(x=rows, y=picked, name=ctx.name("matmul"))  # [M, 1, N]
        return mb.reshape(x=y, shape=np.asarray([m, n], np.int32), name=ctx.name("out_rows"))
    every = mb.matmul(x=x, y=weight, name=ctx.name("every_expert"))  # [E, M, N]
    expert_of_row = mb.reshape(x=ids, shape=np.asarray([1, m, 1], np.int32), name=ctx.name("ids_col"))
    chosen = mb.equal(x=expert_of_row, y=ctx.const(np.arange(experts, dtype=np.int32).reshape(experts, 1, 1), "expert_ids"),
                      name=ctx.name("chosen"))  # [E, M, 1]
    # select, not a 0/1 multiply: an inf in an expert the row does not use must not become NaN.
    kept = mb.select(cond=chosen, a=every, b=ctx.scalar(0.0), name=ctx.name("own_expert"))
    return mb.reduce_sum(x=kept, axes=[0], keep_dims=False, name=ctx.name("rows_sum"))


@lowering(
    ops.GroupedMatMul, family="moe",
    notes=(
        "M <= E rows: `gather` of each row's expert weight + batched `matmul` ([M,1,K] @ [M,K,N]);"
        " more rows: one broadcast `matmul` against every expert ([E,M,N]) + `select` of each row's"
        " expert + `reduce_sum`. Expert ids: floor + cast to int32 (constant ids checked in range)."
    ),
)
def lower_grouped_matmul(op: ops.GroupedMatMul, ctx: LowerContext) -> Any:
    m, k = _rows_cols(ctx)
    w_sizes = ctx.input_shape(1).sizes()
    if len(w_sizes) != 3 or w_sizes[1] != k:
        raise shape_error(ctx, f"weight must be [E, K={k}, N], got {list(w_sizes)}", "weight")
    experts, _, n = w_sizes
    x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "x_float")
    weight = to_float(ctx, ctx.var(1), ctx.input_shape(1).dtype, "weight_float")
    y = grouped_matmul_var(ctx, x, weight, experts, m, k, n)
    return convert(ctx, y, DType.F32, ctx.out_shape.dtype, suffix="out")


def _decoded_experts(ctx: LowerContext, scheme: ops.QuantScheme, index: int, k: int, n: int) -> np.ndarray:
    """The `[E, K, N]` experts held in GGUF bytes of input `index` (a Param or Constant)."""
    value = ctx.value(index)
    if value is None:
        raise ctx.unsupported(
            f"{scheme} expert weights must be a Param or Constant (decoded at conversion time); run-time"
            " GGUF bytes have no Core ML decoding"
        )
    try:
        return moe_weights(scheme, as_bytes(value), k, n)
    except GraphError as err:
        raise type(err)(err.detail, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name,
                        operand=err.operand) from None


@lowering(
    ops.DequantMoEWeights, family="moe",
    notes=(
        "GGUF bytes (Param/Constant) decoded at conversion, each [N,K] slab transposed to [K,N]"
        " (the CPU's layout; upstream's Core ML lowering skips the transpose), baked as one float const."
    ),
)
def lower_dequant_moe_weights(op: ops.DequantMoEWeights, ctx: LowerContext) -> Any:
    experts, k, n = ctx.out_shape.sizes()
    weight = _decoded_experts(ctx, op.scheme, 0, k, n)
    if weight.shape[0] != experts:
        raise shape_error(ctx, f"the bytes hold {weight.shape[0]} experts, the node declares {experts}", "packed_w")
    return ctx.const(weight, "experts")


@lowering(
    ops.DequantGroupedMatMul, family="moe",
    notes="GGUF expert bytes (Param/Constant) decoded at conversion to an [E,K,N] float const, then as GroupedMatMul.",
)
def lower_dequant_grouped_matmul(op: ops.DequantGroupedMatMul, ctx: LowerContext) -> Any:
    m, k = _rows_cols(ctx)
    n = ctx.out_shape.sizes()[1]
    weight = _decoded_experts(ctx, op.scheme, 1, k, n)
    x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "x_float")
    y = grouped_matmul_var(ctx, x, ctx.const(weight, "experts"), weight.shape[0], m, k, n)
    return convert(ctx, y, DType.F32, ctx.out_shape.dtype, suffix="out")
