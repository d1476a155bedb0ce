"""Reductions, softmax and the normalisation ops; all accumulate in float32."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.milexec.kernels._math import softmax
from rlx_mil.milexec.registry import OpContext, kernel

Reducer = Callable[[np.ndarray, tuple[int, ...] | None, bool], np.ndarray]


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    peak = np.max(x, axis=axes, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    total = np.sum(np.exp(x - peak), axis=axes, keepdims=True)
    out = np.log(total) + peak
    return out if keep else np.squeeze(out, axis=axes)


_REDUCERS: dict[str, Reducer] = {
    "reduce_sum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "reduce_mean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "reduce_prod": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "reduce_max": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "reduce_min": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "reduce_l1_norm": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "reduce_l2_norm": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)),
    "reduce_sum_square": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
    "reduce_log_sum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "reduce_log_sum_exp": _log_sum_exp,
}


def _axes(ctx: OpContext, rank: int) -> tuple[int, ...] | None:
    if not ctx.has("axes"):
        return None
    axes = ctx.param("axes")
    if axes is None:
        return None
    if isinstance(axes, int):
        axes = [axes]
    return tuple(sorted({a + rank if a < 0 else a for a in axes}))


def _register_reducer(op_type: str, fn: Reducer) -> None:
    def run(ctx: OpContext) -> np.ndarray:
        x = ctx.val("x")
        if x.dtype.kind == "f":
            x = x.astype(np.float32, copy=False)
        return np.asarray(fn(x, _axes(ctx, x.ndim), bool(ctx.param("keep_dims", False))))

    run.__name__ = op_type
    kernel(op_type)(run)


for _name, _fn in _REDUCERS.items():
    _register_reducer(_name, _fn)


@kernel("reduce_argmax", "reduce_argmin")
def reduce_arg(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    axis = int(ctx.param("axis", -1))
    fn = np.argmax if ctx.op_type == "reduce_argmax" else np.argmin
    return np.asarray(fn(x, axis=axis, keepdims=bool(ctx.param("keep_dims", False))))


@kernel("softmax")
def softmax_kernel(ctx: OpContext) -> np.ndarray:
    return softmax(ctx.val("x"), axis=int(ctx.param("axis", -1)))


def _normalize(x: np.ndarray, axes: tuple[int, ...], epsilon: np.ndarray) -> np.ndarray:
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    return centered / np.sqrt(var + epsilon)


def _epsilon(ctx: OpContext, default: float) -> np.ndarray:
    return ctx.val("epsilon").astype(np.float32) if ctx.has("epsilon") else np.float32(default)


@kernel("layer_norm")
def layer_norm(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    axes = _axes(ctx, x.ndim)
    if axes is None:
        axes = tuple(range(x.ndim))
    out = _normalize(x, axes, _epsilon(ctx, 1e-5))
    param_shape = tuple(n if i in axes else 1 for i, n in enumerate(x.shape))
    if ctx.has("gamma"):
        out = out * ctx.val("gamma").reshape(param_shape)
    if ctx.has("beta"):
        out = out + ctx.val("beta").reshape(param_shape)
    return out


def _per_channel(param: np.ndarray, rank: int) -> np.ndarray:
    return param.reshape((1, -1) + (1,) * (rank - 2))


@kernel("batch_norm")
def batch_norm(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    mean = _per_channel(ctx.val("mean"), x.ndim)
    var = _per_channel(ctx.val("variance"), x.ndim)
    out = (x - mean) / np.sqrt(var + _epsilon(ctx, 1e-5))
    if ctx.has("gamma"):
        out = out * _per_channel(ctx.val("gamma"), x.ndim)
    if ctx.has("beta"):
        out = out + _per_channel(ctx.val("beta"), x.ndim)
    return out


@kernel("instance_norm")
def instance_norm(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    out = _normalize(x, tuple(range(2, x.ndim)), _epsilon(ctx, 1e-5))
    if ctx.has("gamma"):
        out = out * _per_channel(ctx.val("gamma"), x.ndim)
    if ctx.has("beta"):
        out = out + _per_channel(ctx.val("beta"), x.ndim)
    return out


@kernel("l2_norm")
def l2_norm(ctx: OpContext) -> np.ndarray:
    # Normalises over the last three dims; leading dims are batch.
    x = ctx.val("x")
    axes = tuple(range(max(x.ndim - 3, 0), x.ndim))
    total = np.sum(x * x, axis=axes, keepdims=True)
    return x / np.sqrt(total + _epsilon(ctx, 1e-6))


@kernel("local_response_norm")
def local_response_norm(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    size = int(ctx.param("size"))
    alpha = ctx.val("alpha") if ctx.has("alpha") else np.float32(1e-4)
    beta = ctx.val("beta") if ctx.has("beta") else np.float32(0.75)
    k = ctx.val("k") if ctx.has("k") else np.float32(1.0)
    channels = x.shape[1]
    squared = x * x
    before, after = (size - 1) // 2, size // 2
    padded = np.pad(squared, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    cumulative = np.cumsum(padded, axis=1, dtype=np.float32)
    cumulative = np.concatenate([np.zeros_like(cumulative[:, :1]), cumulative], axis=1)
    window = cumulative[:, size : size + channels] - cumulative[:, :channels]
    return x / np.power(k + alpha / size * window, beta)
