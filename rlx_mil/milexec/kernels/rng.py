"""Random MIL ops: random_normal, random_uniform, random_categorical.

Core ML's generators are not public, so these kernels draw from NumPy's PCG64 seeded with the
op's seed: the same distributions, deterministic per seed (as a Core ML model with a fixed
seed is), not Core ML's values. A seed of -1 (fresh randomness on every run) draws from an
unseeded generator.
"""

from __future__ import annotations

import numpy as np

from rlx_mil.milexec.registry import OpContext, kernel


def _generator(ctx: OpContext) -> np.random.Generator:
    seed = int(ctx.param("seed", -1))
    return np.random.default_rng(None if seed < 0 else seed)


@kernel("random_normal")
def random_normal(ctx: OpContext) -> np.ndarray:
    shape = ctx.int_list("shape")
    mean = float(ctx.param("mean", 0.0))
    stddev = float(ctx.param("stddev", 1.0))
    return (mean + stddev * _generator(ctx).standard_normal(shape)).astype(np.float32)


@kernel("random_uniform")
def random_uniform(ctx: OpContext) -> np.ndarray:
    shape = ctx.int_list("shape")
    low = float(ctx.param("low", 0.0))
    high = float(ctx.param("high", 1.0))
    return _generator(ctx).uniform(low, high, size=shape).astype(np.float32)


@kernel("random_categorical")
def random_categorical(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x").astype(np.float64)
    mode = str(ctx.param("mode", "logits"))
    size = int(ctx.param("size", 1))
    if mode == "logits":
        with np.errstate(invalid="ignore", over="ignore"):
            weights = np.exp(x - x.max(axis=-1, keepdims=True))
    elif mode == "probs":
        weights = x
    else:
        raise ctx.error(f"unknown random_categorical mode {mode!r}")
    total = weights.sum(axis=-1, keepdims=True)
    if not np.all(np.isfinite(total)) or np.any(total <= 0):
        raise ctx.error("random_categorical needs a finite, positive total weight in every row")
    cdf = np.cumsum(weights / total, axis=-1).reshape(-1, x.shape[-1])
    draws = _generator(ctx).random((cdf.shape[0], size))
    picks = np.stack([np.searchsorted(row, u, side="right") for row, u in zip(cdf, draws, strict=True)])
    return np.minimum(picks, x.shape[-1] - 1).reshape((*x.shape[:-1], size)).astype(np.float32)
