"""Linear algebra, reductions, softmax, norms and attention."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai import adapter
from rlx_mil.coreai.registry import RuleContext, rule


def _swap_last(ctx: RuleContext, x: Any) -> Any:
    rank = len(adapter.shape_of(x))
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return ctx.ops.transpose(x, np.asarray(perm, np.uint32))


def _matmul(ctx: RuleContext, x: Any, y: Any) -> Any:
    x_shape, y_shape = adapter.shape_of(x), adapter.shape_of(y)
    squeeze = []
    if len(x_shape) == 1:
        x = ctx.reshape(x, [1, x_shape[0]])
        squeeze.append(-2)
    if len(y_shape) == 1:
        y = ctx.reshape(y, [y_shape[0], 1])
        squeeze.append(-1)
    return ctx.ops.broadcasting_batch_matmul(x, y), squeeze


@rule("matmul")
def matmul(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    if ctx.param("transpose_x", False):
        x = _swap_last(ctx, x)
    # A stored weight read as x @ W^T is transposed at translation time (`weight_layout`).
    y = ctx.translator.transposed_weight(ctx.var("y")) if ctx.param("transpose_y", False) else None
    if y is None:
        y = ctx.v("y")
        if ctx.param("transpose_y", False):
            y = _swap_last(ctx, y)
    product, _ = _matmul(ctx, x, y)
    return ctx.reshape(product, ctx.out_shape())


@rule("linear")
def linear(ctx: RuleContext) -> Any:
    """x @ W^T + b as x @ (W^T), W^T made at translation time from the stored weight
    (`weight_layout`: the Linux runtime's fast form; a tied embedding's gather reads the same
    transposed copy). A weight computed at run time: (W @ x^T)^T, transposing activations only."""
    x = ctx.v("x")
    x_shape = adapter.shape_of(x)
    rows = int(np.prod(x_shape[:-1], dtype=np.int64)) if len(x_shape) > 1 else 1
    flat = ctx.reshape(x, [rows, x_shape[-1]])
    transposed = ctx.translator.transposed_weight(ctx.var("weight"))
    if transposed is not None:
        product = ctx.reshape(ctx.ops.broadcasting_batch_matmul(flat, transposed), ctx.out_shape())
    else:
        weight = ctx.v("weight")
        product = ctx.ops.broadcasting_batch_matmul(weight, ctx.ops.transpose(flat, np.asarray([1, 0], np.uint32)))
        product = ctx.reshape(ctx.ops.transpose(product, np.asarray([1, 0], np.uint32)), ctx.out_shape())
    if ctx.has("bias") and not (ctx.is_const("bias") and not np.any(ctx.const("bias"))):
        product = ctx.ops.broadcasting_add(product, ctx.v("bias"))
    return product


@rule("einsum")
def einsum(ctx: RuleContext) -> Any:
    equation = str(ctx.param("equation")).replace(" ", "")
    a, b = ctx.vs("values")
    patterns = {"abcd,adce->abce": (False, False), "abcd,abde->abce": (False, False)}
    if equation not in patterns:
        raise ctx.fail(f"einsum {equation!r} is not supported")
    if equation == "abcd,adce->abce":
        a = ctx.ops.transpose(a, np.asarray([0, 2, 1, 3], np.uint32))
        b = ctx.ops.transpose(b, np.asarray([0, 2, 1, 3], np.uint32))
        out = ctx.ops.broadcasting_batch_matmul(a, b)
        return ctx.ops.transpose(out, np.asarray([0, 2, 1, 3], np.uint32))
    return ctx.ops.broadcasting_batch_matmul(a, b)


@rule("softmax")
def softmax(ctx: RuleContext) -> Any:
    axis = int(ctx.param("axis", -1)) % ctx.rank("x")
    return ctx.ops.softmax(ctx.v("x"), np.int32(axis))


def _axes(ctx: RuleContext) -> list[int]:
    rank = ctx.rank("x")
    return sorted({a % rank for a in ctx.ints("axes", list(range(rank)))}) if ctx.has("axes") else list(range(rank))


def _reduce(ctx: RuleContext, x: Any, kind: str) -> Any:
    axes = _axes(ctx)
    if not axes:
        return x
    reduced = getattr(ctx.ops, kind)(x, np.asarray(axes, np.int32))
    return ctx.reshape(reduced, ctx.out_shape())


_REDUCE = {"reduce_sum": "reduce_sum", "reduce_mean": "reduce_mean", "reduce_max": "reduce_max",
           "reduce_min": "reduce_min", "reduce_prod": "reduce_product"}


def _plain_reduce(ctx: RuleContext) -> Any:
    return _reduce(ctx, ctx.v("x"), _REDUCE[ctx.op_type])


for _op_type in _REDUCE:
    rule(_op_type)(_plain_reduce)


@rule("reduce_sum_square")
def reduce_sum_square(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    return _reduce(ctx, ctx.ops.broadcasting_mul(x, x), "reduce_sum")


@rule("reduce_l2_norm")
def reduce_l2_norm(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    return ctx.ops.sqrt(_reduce(ctx, ctx.ops.broadcasting_mul(x, x), "reduce_sum"))


@rule("reduce_l1_norm")
def reduce_l1_norm(ctx: RuleContext) -> Any:
    return _reduce(ctx, ctx.ops.abs_(ctx.v("x")), "reduce_sum")


@rule("reduce_log_sum")
def reduce_log_sum(ctx: RuleContext) -> Any:
    return ctx.ops.log(_reduce(ctx, ctx.v("x"), "reduce_sum"))


@rule("reduce_log_sum_exp")
def reduce_log_sum_exp(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    axes = np.asarray(_axes(ctx), np.int32)
    peak = ctx.reshape(ctx.ops.reduce_max(x, axes), [1 if a in set(axes.tolist()) else d
                                                     for a, d in enumerate(ctx.in_shape("x"))])
    summed = ctx.ops.reduce_sum(ctx.ops.exp(ctx.ops.broadcasting_sub(x, peak)), axes)
    return ctx.reshape(ctx.ops.broadcasting_add(ctx.ops.log(summed), ctx.ops.reduce_max(x, axes)), ctx.out_shape())


@rule("reduce_argmax", "reduce_argmin")
def reduce_arg(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    axis = int(ctx.param("axis", -1)) % ctx.rank("x")
    if ctx.op_type == "reduce_argmin":
        x = ctx.ops.broadcasting_mul(x, ctx.scalar(-1, x))
    index = ctx.ops.argmax(x, np.int32(axis))
    return ctx.reshape(ctx.cast(index, np.int32), ctx.out_shape())


def _keepdims(ctx: RuleContext, reduced: Any, axes: list[int], shape: tuple[int, ...]) -> Any:
    return ctx.reshape(reduced, [1 if a in axes else d for a, d in enumerate(shape)])


def normalize(ctx: RuleContext, x: Any, axes: list[int], epsilon: float) -> Any:
    shape = adapter.shape_of(x)
    axes_array = np.asarray(axes, np.int32)
    mean = _keepdims(ctx, ctx.ops.reduce_mean(x, axes_array), axes, shape)
    centered = ctx.ops.broadcasting_sub(x, mean)
    variance = _keepdims(ctx, ctx.ops.reduce_mean(ctx.ops.broadcasting_mul(centered, centered), axes_array), axes, shape)
    return ctx.ops.broadcasting_mul(centered, ctx.ops.rsqrt(ctx.ops.broadcasting_add(variance, ctx.scalar(epsilon, x))))


@rule("layer_norm")
def layer_norm(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    rank = ctx.rank("x")
    axes = sorted({a % rank for a in ctx.ints("axes")})
    y = normalize(ctx, x, axes, float(ctx.param("epsilon", 1e-5)))
    if ctx.has("gamma"):
        y = ctx.ops.broadcasting_mul(y, ctx.v("gamma"))
    if ctx.has("beta"):
        y = ctx.ops.broadcasting_add(y, ctx.v("beta"))
    return y


def _per_channel(ctx: RuleContext, name: str) -> Any:
    rank = ctx.rank("x")
    value = ctx.v(name)
    channels = adapter.shape_of(value)[0]
    return ctx.reshape(value, [1, channels] + [1] * (rank - 2))


@rule("instance_norm")
def instance_norm(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    y = normalize(ctx, x, list(range(2, ctx.rank("x"))), float(ctx.param("epsilon", 1e-5)))
    if ctx.has("gamma"):
        y = ctx.ops.broadcasting_mul(y, _per_channel(ctx, "gamma"))
    if ctx.has("beta"):
        y = ctx.ops.broadcasting_add(y, _per_channel(ctx, "beta"))
    return y


@rule("batch_norm")
def batch_norm(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    eps = float(ctx.param("epsilon", 1e-5))
    variance = ctx.ops.broadcasting_add(_per_channel(ctx, "variance"), ctx.scalar(eps, x))
    y = ctx.ops.broadcasting_mul(ctx.ops.broadcasting_sub(x, _per_channel(ctx, "mean")), ctx.ops.rsqrt(variance))
    if ctx.has("gamma"):
        y = ctx.ops.broadcasting_mul(y, _per_channel(ctx, "gamma"))
    if ctx.has("beta"):
        y = ctx.ops.broadcasting_add(y, _per_channel(ctx, "beta"))
    return y


@rule("l2_norm")
def l2_norm(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    shape = ctx.in_shape("x")
    axes = list(range(len(shape) - 3, len(shape))) if len(shape) >= 3 else list(range(len(shape)))
    total = _keepdims(ctx, ctx.ops.reduce_sum(ctx.ops.broadcasting_mul(x, x), np.asarray(axes, np.int32)), axes, shape)
    eps = float(ctx.param("epsilon", 1e-6))
    return ctx.ops.broadcasting_divide(x, ctx.ops.sqrt(ctx.ops.broadcasting_maximum(total, ctx.scalar(eps, x))))


@rule("scaled_dot_product_attention")
def scaled_dot_product_attention(ctx: RuleContext) -> Any:
    q, k, v = ctx.v("query"), ctx.v("key"), ctx.v("value")
    depth = adapter.shape_of(q)[-1]
    scores = ctx.ops.broadcasting_batch_matmul(q, _swap_last(ctx, k))
    scores = ctx.ops.broadcasting_mul(scores, ctx.scalar(1.0 / np.sqrt(depth), scores))
    if ctx.has("attn_mask"):
        mask = ctx.v("attn_mask")
        if adapter.dtype_name(mask) == "i1":
            scores = ctx.ops.broadcasting_where(mask, scores, ctx.scalar(-3.0e38, scores))
        else:
            scores = ctx.ops.broadcasting_add(scores, mask)
    weights = ctx.ops.softmax(scores, np.int32(len(adapter.shape_of(scores)) - 1))
    return ctx.ops.broadcasting_batch_matmul(weights, v)
