"""Attention and AttentionBackward (spec section 9).

Forward, per target and `convert(..., attention=)`:

* fused: iOS18's `scaled_dot_product_attention`, one op per node. A custom score scale is
  folded into q (the op always divides by sqrt(D)); GQA folds the G query heads sharing a kv
  head into the query rows (`[B, H_kv, G*Sq, D]`), so K/V are never repeated; masks are bool
  (Causal, SlidingWindow, Custom) or float (Bias). Rows whose every key is masked get zero
  queries and an all-True mask row, which yields the spec's uniform average instead of NaN.
* decomposed: matmul -> (softcap) -> bias add / select(keep, s, FILL) -> softmax -> matmul,
  the only form below iOS18 and the only one that can soft-cap.

The backward op is always decomposed (Core ML has no fused attention gradient).
"""

from __future__ import annotations

import math
from typing import Any

from rlx_mil.errors import DTypeError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.attention_layout import AttentionGeometry
from rlx_mil.ir.ops import AttentionBwdWrt, f32
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.attention_masks import (
    Masking,
    attention_dims,
    build_masking,
    fold_groups,
    mask_fill,
    merge_heads,
    split_heads,
    unfold_groups,
)
from rlx_mil.lowering.target import Target

MASK_INPUT = {ops.Attention: 3, ops.AttentionBackward: 4}


def use_fused(op: ops.Attention, ctx: LowerContext) -> bool:
    """Whether this node lowers to `scaled_dot_product_attention` (see the module docstring)."""
    mode = ctx.options.attention
    if mode == "decomposed":
        return False
    blockers = []
    if ctx.target < Target.IOS18:
        blockers.append(
            f"scaled_dot_product_attention exists from iOS18 on (target is {ctx.target.label}); "
            "convert with target='iOS18'"
        )
    if op.softcap is not None:
        blockers.append(
            f"attn_logit_softcap={op.softcap} must be applied between the scores and the mask, "
            "which the fused op cannot do"
        )
    if not blockers:
        return True
    if mode == "fused":
        raise ctx.unsupported(
            "attention='fused' is impossible for this node: " + "; ".join(blockers)
            + ". Use attention='auto' or 'decomposed'."
        )
    return False


def score_scale_factor(op: ops.Attention) -> float | None:
    """What q must be multiplied by so that the fused op's fixed 1/sqrt(D) gives the node's
    scale; None when the node uses the default scale."""
    default = f32(op.head_dim**-0.5)
    if op.score_scale is None or op.score_scale == default:
        return None
    factor = float(op.score_scale) * math.sqrt(op.head_dim)
    return None if factor == 1.0 else factor


def _heads(ctx: LowerContext, dims: AttentionGeometry) -> tuple[Any, Any, Any]:
    q = split_heads(ctx.var(0), dims, dims.num_heads, dims.q_size, ctx, "q")
    k = split_heads(ctx.var(1), dims, dims.num_kv_heads, dims.kv_size, ctx, "k")
    v = split_heads(ctx.var(2), dims, dims.num_kv_heads, dims.kv_size, ctx, "v", dims.v_head_dim)
    return q, k, v


def _scaled(x: Any, factor: float | None, ctx: LowerContext, what: str) -> Any:
    from coremltools.converters.mil import Builder as mb

    if factor is None:
        return x
    return mb.mul(x=x, y=ctx.scalar(factor), name=ctx.name(what))


def _masked_scores(scores: Any, masking: Masking, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    if masking.bias is not None:
        scores = mb.add(x=scores, y=masking.bias, name=ctx.name("scores_biased"))
    if masking.keep is not None:
        scores = mb.select(
            cond=masking.keep, a=scores, b=ctx.scalar(mask_fill(ctx.precision, ctx.options.neural_engine)), name=ctx.name("scores_masked")
        )
    return scores


def attention_probabilities(
    q_folded: Any, k: Any, scale: float, softcap: float | None, masking: Masking, ctx: LowerContext
) -> Any:
    """softmax(mask(cap(q k^T * scale))) over keys, `[B, H_kv, G*Sq, Sk]`. The scale goes on q
    (Sq x D values rather than Sq x Sk, and smaller fp16 partial sums)."""
    from coremltools.converters.mil import Builder as mb

    qs = _scaled(q_folded, scale, ctx, "q_scaled")
    scores = mb.matmul(x=qs, y=k, transpose_y=True, name=ctx.name("scores"))
    if softcap is not None:
        capped = mb.real_div(x=scores, y=ctx.scalar(softcap), name=ctx.name("scores_over_cap"))
        capped = mb.tanh(x=capped, name=ctx.name("scores_tanh"))
        scores = mb.mul(x=capped, y=ctx.scalar(softcap), name=ctx.name("scores_capped"))
    scores = _masked_scores(scores, masking, ctx)
    return mb.softmax(x=scores, axis=-1, name=ctx.name("probs"))


def _fused(op: ops.Attention, dims: AttentionGeometry, q_folded: Any, k: Any, v: Any, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    masking = build_masking(op.mask_kind, dims, ctx, MASK_INPUT[ops.Attention], q_folded, k, full_keys=True)
    query = _scaled(q_folded, score_scale_factor(op), ctx, "q_scaled")
    mask = masking.bias if masking.bias is not None else masking.keep
    if masking.live_rows is not None:
        # A row with every key masked must average all keys (spec 9.4); the fused op would give
        # NaN. Unmask such rows and zero their query: equal scores, uniform weights.
        def keep_live(mask: Any = mask) -> Any:
            dead = mb.logical_not(x=masking.live_rows, name=ctx.name("mask_dead_rows"))
            return mb.logical_or(x=mask, y=dead, name=ctx.name("mask_keep_live"))

        mask = ctx.shared_var(("mask_keep_live", id(mask), id(masking.live_rows)), keep_live)
        query = mb.select(cond=masking.live_rows, a=query, b=ctx.scalar(0.0), name=ctx.name("q_live"))
    kwargs: dict[str, Any] = {} if mask is None else {"attn_mask": mask}
    return mb.scaled_dot_product_attention(query=query, key=k, value=v, name=ctx.name("sdpa"), **kwargs)


def _decomposed(op: ops.Attention, dims: AttentionGeometry, q_folded: Any, k: Any, v: Any, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    masking = build_masking(op.mask_kind, dims, ctx, MASK_INPUT[ops.Attention], q_folded, k, full_keys=False)
    probs = attention_probabilities(q_folded, k, float(op.scale), op.softcap, masking, ctx)
    return mb.matmul(x=probs, y=v, name=ctx.name("context"))


@lowering(
    notes=(
        "iOS18 (auto/fused): one `scaled_dot_product_attention` (custom scale folded into q; GQA as"
        " grouped q `[B,H_kv,G*Sq,D]`, no K/V repeat; bool/fp16 masks built at run time, never"
        " Sq x Sk consts); softcap or below iOS18: matmul, tanh, select/add, softmax, matmul;"
        " all layouts (transpose/reshape), fp16-safe finite mask fill; v_head_dim (MLA) gives value and"
        " output heads their own width; attention='fused' with softcap or before iOS18 is rejected"
    ),
)
def lower_attention(op: ops.Attention, ctx: LowerContext) -> Any:
    dims = attention_dims(ctx, op.num_heads, op.head_dim, op.v_head_dim)
    fused = use_fused(op, ctx)
    q, k, v = _heads(ctx, dims)
    q_folded = fold_groups(q, dims, ctx, "q")
    context = (_fused if fused else _decomposed)(op, dims, q_folded, k, v, ctx)
    out = unfold_groups(context, dims, ctx, "out", dims.v_head_dim)
    return merge_heads(out, dims, dims.num_heads, dims.q_size, ctx.out_shape.sizes(), ctx, "out")


@lowering(
    notes=(
        "decomposed on every target: forward probabilities recomputed (same masks), then matmul/"
        "reduce_sum/mul for dQ, dK or dV; GQA gradients summed over the query heads of a kv head"
        " by the grouped-row matmul; output in the layout of the input differentiated"
    ),
)
def lower_attention_backward(op: ops.AttentionBackward, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    dims = attention_dims(ctx, op.num_heads, op.head_dim)
    dy_shape = ctx.input_shape(3)
    if not dy_shape.dtype.is_float:
        raise DTypeError(
            f"dy must be a float tensor, got {dy_shape.dtype.value}",
            node=ctx.node.id, op=op.type_name, name=ctx.node.name, operand="dy",
        )
    if dy_shape.sizes() != ctx.input_shape(0).sizes():
        raise ShapeError(
            f"dy must have q's shape {ctx.input_shape(0)}, got {dy_shape}",
            node=ctx.node.id, op=op.type_name, name=ctx.node.name, operand="dy",
        )
    q, k, v = _heads(ctx, dims)
    q_folded = fold_groups(q, dims, ctx, "q")
    dy = split_heads(ctx.var(3), dims, dims.num_heads, dims.q_size, ctx, "dy")
    dy_folded = fold_groups(dy, dims, ctx, "dy")
    scale = float(f32(op.head_dim**-0.5))
    masking = build_masking(
        op.mask_kind, dims, ctx, MASK_INPUT[ops.AttentionBackward], q_folded, k, full_keys=False
    )
    probs = attention_probabilities(q_folded, k, scale, None, masking, ctx)

    # Folded rows g*Sq + i of kv head j are all the query rows that use kv head j, so the
    # matmuls over rows below already sum dK/dV over the query heads sharing it.
    if op.wrt is AttentionBwdWrt.VALUE:
        grad = mb.matmul(x=probs, y=dy_folded, transpose_x=True, name=ctx.name("dv"))
        return merge_heads(grad, dims, dims.num_kv_heads, dims.kv_size, ctx.out_shape.sizes(), ctx, "dv")
    d_probs = mb.matmul(x=dy_folded, y=v, transpose_y=True, name=ctx.name("dprobs"))
    weighted = mb.mul(x=probs, y=d_probs, name=ctx.name("probs_dprobs"))
    row_sum = mb.reduce_sum(x=weighted, axes=[-1], keep_dims=True, name=ctx.name("probs_dprobs_sum"))
    centered = mb.sub(x=d_probs, y=row_sum, name=ctx.name("dprobs_centered"))
    d_scores = mb.mul(x=probs, y=centered, name=ctx.name("dscores_unscaled"))
    d_scores = mb.mul(x=d_scores, y=ctx.scalar(scale), name=ctx.name("dscores"))
    if masking.replaces:
        # Replaced scores are constants: no gradient reaches q or k through them (this only
        # matters in fully masked rows, whose probabilities are uniform, not zero).
        d_scores = mb.select(cond=masking.keep, a=d_scores, b=ctx.scalar(0.0), name=ctx.name("dscores_kept"))
    if op.wrt is AttentionBwdWrt.QUERY:
        grad = mb.matmul(x=d_scores, y=k, name=ctx.name("dq"))
        grad = unfold_groups(grad, dims, ctx, "dq")
        return merge_heads(grad, dims, dims.num_heads, dims.q_size, ctx.out_shape.sizes(), ctx, "dq")
    grad = mb.matmul(x=d_scores, y=q_folded, transpose_x=True, name=ctx.name("dk"))
    return merge_heads(grad, dims, dims.num_kv_heads, dims.kv_size, ctx.out_shape.sizes(), ctx, "dk")


__all__ = ["lower_attention", "lower_attention_backward", "score_scale_factor", "use_fused"]
