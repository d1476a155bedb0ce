"""MIL attention kernel: scaled_dot_product_attention (iOS18)."""

from __future__ import annotations

import numpy as np

from rlx_mil.milexec.kernels._math import softmax
from rlx_mil.milexec.registry import OpContext, as_compute, kernel


def _attended_keys(mask: np.ndarray, keys: int) -> int:
    """How many leading keys `mask` lets any query see: keys past the last one any row attends
    to add exactly nothing (their weights are exp(-inf) = 0), so they need not be computed.
    A KV cache read at its whole capacity is mostly such slots."""
    if mask.ndim == 0 or mask.shape[-1] != keys:
        return keys
    seen = mask.reshape(-1, keys).any(axis=0) if mask.dtype == np.bool_ else (mask.reshape(-1, keys) > -np.inf).any(axis=0)
    hits = np.flatnonzero(seen)
    return int(hits[-1]) + 1 if hits.size else keys


@kernel("scaled_dot_product_attention")
def scaled_dot_product_attention(ctx: OpContext) -> np.ndarray:
    q, k, v = ctx.val("query"), ctx.raw("key"), ctx.raw("value")
    mask = ctx.val("attn_mask") if ctx.has("attn_mask") else None
    if mask is not None:
        keep = _attended_keys(mask, k.shape[-2])
        if keep < k.shape[-2]:
            k, v, mask = k[..., :keep, :], v[..., :keep, :], mask[..., :keep]
    k, v = as_compute(k), as_compute(v)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.float32(np.sqrt(q.shape[-1]))
    if mask is not None:
        if mask.dtype == np.bool_:
            # True = attend; a fully masked row becomes NaN, as in Core ML.
            scores = np.where(mask, scores, np.float32(-np.inf))
        else:
            scores = scores + mask.astype(np.float32)
    return np.matmul(softmax(scores, axis=-1), v)
