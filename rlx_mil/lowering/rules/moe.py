"""Mixture-of-experts matmuls: GroupedMatMul, DequantGroupedMatMul, DequantMoEWeights (spec
part 2, sections 2.4-2.6).

Two formulations, picked per node from its sizes: with no more rows than experts (decode) each
row gathers its expert's `[K, N]` weight and one batched `matmul` multiplies them (memory
M*K*N, at most the weights' own size); with more rows (prefill) every row is multiplied by
every expert in one broadcast `matmul` (`[E, M, N]`) and `select` + `reduce_sum` keep each
row's own expert, so no gathered copy of the weights grows with M. GGUF Q8_0 / Q4_0 experts
stay compressed on iOS18 (one `constexpr_blockwise_shift_scale`); other GGUF schemes and older
targets decode them at conversion time into a float const.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.errors import GraphError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import QuantKind
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.dequant_matmul import GGUF_AFFINE, gguf_codes
from rlx_mil.lowering.rules.elementwise import convert, to_float
from rlx_mil.lowering.rules.quant_support import integer_codes
from rlx_mil.lowering.rules.shape import gather_indices
from rlx_mil.lowering.target import Target
from rlx_mil.reference.moe import clamped_experts, mlx_codes, moe_weights
from rlx_mil.reference.quant import GGUF_FORMATS, as_bytes


def _rows_cols(ctx: LowerContext) -> tuple[int, int]:
    sizes = ctx.input_shape(0).sizes()
    if len(sizes) != 2:
        raise ctx.fail(ShapeError, f"input must be [M, K], got {list(sizes)}", "input")
    ids = ctx.input_shape(2).sizes()
    if ids != (sizes[0],):
        raise ctx.fail(ShapeError, f"expert_idx must be [{sizes[0]}], got {list(ids)}", "expert_idx")
    return sizes[0], sizes[1]


def grouped_matmul_var(ctx: LowerContext, x: Any, weight: Any, experts: int, m: int, k: int, n: int,
                       ids: Any | None = None) -> Any:
    """`x[i] @ weight[expert_idx[i]]` for the node's input 0 rows (`x` in the program float,
    `weight` an `[E, K, N]` var); expert ids are the int32 `ids`, else the node's input 2."""
    from coremltools.converters.mil import Builder as mb

    if ids is None:
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
        raise ctx.fail(ShapeError, f"weight must be [E, K={k}, N], got {list(w_sizes)}", "weight")
    experts, _, n = w_sizes
    x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "x_float")
    weight = to_float(ctx, ctx.var(1), ctx.input_shape(1).dtype, "weight_float")
    y = grouped_matmul_var(ctx, x, weight, experts, m, k, n)
    return convert(ctx, y, DType.F32, ctx.out_shape.dtype, suffix="out")


def _expert_bytes(ctx: LowerContext, scheme: ops.QuantScheme, index: int, k: int, n: int) -> tuple[np.ndarray, int]:
    """The GGUF bytes of input `index` (a Param or Constant) and the number of `[N, K]` experts
    they hold, checked before anything is decoded."""
    value = ctx.value(index)
    if value is None:
        raise ctx.unsupported(
            f"{scheme} expert weights must be a Param or Constant (decoded at conversion time); run-time"
            " GGUF bytes have no Core ML decoding"
        )
    raw = as_bytes(value)
    if scheme.kind not in GGUF_FORMATS:
        raise ctx.unsupported(f"no decoder for the GGUF scheme {scheme.kind.value}")
    elems, block_bytes, _ = GGUF_FORMATS[scheme.kind]
    slab = (k * n) // elems * block_bytes
    if k % elems or slab == 0 or raw.size % slab or raw.size == 0:
        raise ctx.fail(ShapeError, f"{raw.size} bytes are not whole {scheme.kind.value} experts of [N={n}, K={k}]"
                          f" ({slab} bytes each; K must be a multiple of {elems})", "packed_w")
    return raw, raw.size // slab


def _expert_weights(ctx: LowerContext, scheme: ops.QuantScheme, index: int, k: int, n: int) -> tuple[Any, int]:
    """The `[E, K, N]` expert weights of GGUF bytes as a MIL var, and E. Q8_0 / Q4_0 on iOS18
    stay compressed: their codes and block scales become one `constexpr_blockwise_shift_scale`
    (blocks of 32 along K); other schemes are decoded at conversion into a float const."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    raw, experts = _expert_bytes(ctx, scheme, index, k, n)
    kind = scheme.kind
    if kind not in GGUF_AFFINE or ctx.target < Target.IOS18:
        try:
            weight = moe_weights(scheme, raw, k, n)
        except GraphError as err:
            raise type(err)(err.detail, node=ctx.node.id, op=ctx.op.type_name, name=ctx.node.name,
                            operand=err.operand) from None
        return ctx.const(weight, "experts"), experts
    slabs = [gguf_codes(kind, slab, k, n) for slab in np.split(raw, experts)]
    codes = np.stack([c for c, _ in slabs])  # [E, K, N]
    scales = np.stack([d for _, d in slabs]).astype(ctx.float_dtype)  # [E, K/32, N]
    kwargs: dict[str, Any] = {}
    if kind is QuantKind.GGUF_Q4_0:
        data = codes.astype(types.np_uint4_dtype)
        kwargs["offset"] = np.full(scales.shape, 8, dtype=types.np_uint4_dtype)  # Q4_0 centres codes on 8
    else:
        data = codes.astype(np.int8)
    weight = mb.constexpr_blockwise_shift_scale(data=data, scale=scales, name=ctx.name("experts"), **kwargs)
    return weight, experts


@lowering(
    notes=(
        "GGUF bytes (Param/Constant), each [N,K] slab as [K,N] (the CPU's layout; upstream's Core ML"
        " lowering skips the transpose): Q8_0/Q4_0 on iOS18 one `constexpr_blockwise_shift_scale` (codes +"
        " block scales stay compressed), otherwise decoded at conversion into one float const."
    ),
)
def lower_dequant_moe_weights(op: ops.DequantMoEWeights, ctx: LowerContext) -> Any:
    experts, k, n = ctx.out_shape.sizes()
    weight, held = _expert_weights(ctx, op.scheme, 0, k, n)
    if held != experts:
        raise ctx.fail(ShapeError, f"the bytes hold {held} experts, the node declares {experts}", "packed_w")
    return weight


@lowering(
    notes=(
        "GGUF expert bytes (Param/Constant) as [E,K,N] experts exactly as DequantMoEWeights (compressed"
        " Q8_0/Q4_0 on iOS18), then as GroupedMatMul."
    ),
)
def lower_dequant_grouped_matmul(op: ops.DequantGroupedMatMul, ctx: LowerContext) -> Any:
    m, k = _rows_cols(ctx)
    n = ctx.out_shape.sizes()[1]
    weight, experts = _expert_weights(ctx, op.scheme, 1, k, n)
    x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "x_float")
    y = grouped_matmul_var(ctx, x, weight, experts, m, k, n)
    return convert(ctx, y, DType.F32, ctx.out_shape.dtype, suffix="out")


def _clamped_ids(ctx: LowerContext, experts: int) -> Any:
    """Input 4 (expert ids) clamped into [0, E - 1] as upstream's kernels read them, int32."""
    from coremltools.converters.mil import Builder as mb

    known = ctx.value(4)
    if known is not None:
        return ctx.const(clamped_experts(known, experts).astype(np.int32), "expert_ids")
    ids = to_float(ctx, ctx.var(4), ctx.input_shape(4).dtype, "ids_float")
    ids = mb.clip(x=ids, alpha=ctx.scalar(0.0), beta=ctx.scalar(float(experts - 1)), name=ctx.name("ids_clamped"))
    return mb.cast(x=mb.floor(x=ids, name=ctx.name("ids_floor")), dtype="int32", name=ctx.name("ids_int"))


def _mlx_weight(ctx: LowerContext, codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int) -> Any:
    """`[E, K, N]` weights from `[E, N, K]` codes and `[E, N, G]` scales / biases."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    experts, n, k = codes.shape
    groups = scales.shape[2]
    block = k // groups
    codes_kn = np.ascontiguousarray(codes.transpose(0, 2, 1))  # [E, K, N]
    s = np.ascontiguousarray(scales.transpose(0, 2, 1)).astype(np.float32)  # [E, G, N]
    b = np.ascontiguousarray(biases.transpose(0, 2, 1)).astype(np.float32)
    if ctx.target < Target.IOS16:
        w = codes_kn.reshape(experts, groups, block, n) * s[:, :, None] + b[:, :, None]
        return ctx.const(w.reshape(experts, k, n), "experts")
    if ctx.target >= Target.IOS18 and bits in (4, 8) and np.all(np.isfinite(s)) and np.all(s != 0):
        # code * s + b = (code - (-b / s)) * s: the words and per-group tables stay compressed.
        data = codes_kn.astype(types.np_uint4_dtype if bits == 4 else np.uint8)
        return mb.constexpr_blockwise_shift_scale(data=data, scale=s.astype(ctx.float_dtype),
                                                  offset=(-b / s).astype(ctx.float_dtype), name=ctx.name("experts"))
    values = integer_codes(ctx, codes_kn.reshape(experts, groups, block, n), bits, "codes")
    w = mb.mul(x=values, y=s[:, :, None].astype(ctx.float_dtype), name=ctx.name("times_scale"))
    w = mb.add(x=w, y=b[:, :, None].astype(ctx.float_dtype), name=ctx.name("plus_bias"))
    return mb.reshape(x=w, shape=np.asarray([experts, k, n], np.int32), name=ctx.name("experts"))


@lowering(
    notes=(
        "MLX-affine words, scales and biases known at conversion (run-time ones are refused): 4/8-bit"
        " on iOS18 one `constexpr_blockwise_shift_scale` ([E,K,N] codes, per-group scale, float offset"
        " -bias/scale); other widths (and 4/8-bit with a zero scale) the codes as an identity-table"
        " `constexpr_lut_to_dense` (2/3/6/8-bit indices; 5 bits as a 4-bit and a 1-bit table summed,"
        " 3 bits before iOS18 as 2 + 1) times the group scale plus bias at run time; iOS15 decoded. Expert ids clamped into [0, E-1] (`clip`, `floor`), then"
        " as GroupedMatMul."
    ),
)
def lower_dequant_grouped_matmul_mlx(op: ops.DequantGroupedMatMulMlx, ctx: LowerContext) -> Any:
    scheme = op.scheme
    assert scheme.bits is not None
    words, scales, biases = ctx.known_value(1), ctx.known_value(2), ctx.known_value(3)
    if words is None or scales is None or biases is None:
        raise ctx.unsupported("the MLX words, scales and biases must be Params or Constants (known at conversion)")
    m, k = ctx.input_shape(0).sizes()
    experts, n, _ = ctx.input_shape(2).sizes()
    codes = mlx_codes(np.asarray(words), experts * n, k, scheme.bits).reshape(experts, n, k)
    weight = _mlx_weight(ctx, codes, np.asarray(scales, np.float32), np.asarray(biases, np.float32), scheme.bits)
    x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "x_float")
    y = grouped_matmul_var(ctx, x, weight, experts, m, k, n, ids=_clamped_ids(ctx, experts))
    return convert(ctx, y, DType.F32, ctx.out_shape.dtype, suffix="out")
