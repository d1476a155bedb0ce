"""MIL attention kernel: scaled_dot_product_attention (iOS18)."""

from __future__ import annotations

import numpy as np

from rlx_mil.milexec.kernels._math import softmax
from rlx_mil.milexec.registry import OpContext, kernel


@kernel("scaled_dot_product_attention")
def scaled_dot_product_attention(ctx: OpContext) -> np.ndarray:
    q, k, v = ctx.val("query"), ctx.val("key"), ctx.val("value")
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.float32(np.sqrt(q.shape[-1]))
    if ctx.has("attn_mask"):
        mask = ctx.val("attn_mask")
        if mask.dtype == np.bool_:
            # True = attend; a fully masked row becomes NaN, as in Core ML.
            scores = np.where(mask, scores, np.float32(-np.inf))
        else:
            scores = scores + mask.astype(np.float32)
    return np.matmul(softmax(scores, axis=-1), v)
