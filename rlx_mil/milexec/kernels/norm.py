"""MIL normalisation kernels: layer_norm, batch_norm, instance_norm, l2_norm, local_response_norm."""

from __future__ import annotations

import numpy as np

from rlx_mil.milexec.kernels.reduce import axes_param
from rlx_mil.milexec.registry import OpContext, kernel


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
    axes = axes_param(ctx, x.ndim)
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
