"""Random: RngNormal, RngUniform, Sample (spec part 2, section 8).

Core ML cannot reproduce upstream's Philox stream, so the converted ops are
distribution-equivalent (docs/indexing-quant-random.md): MIL `random_normal` /
`random_uniform` with a fixed
int32 seed derived from the node's key (every run of a model draws the same values, as
upstream re-seeds every execute), and Sample as filtered logits fed to `random_categorical`.
What is deterministic stays exact: `scale == 0` and `low == high` fill a constant, and greedy
Sample (`top_k == 1`, `top_p <= 0` or `temperature <= 0`) is `reduce_argmax`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.ir import ops
from rlx_mil.ir.ops.rng import GLOBAL_SEED
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering

_GOLDEN = 0x9E3779B97F4A7C15


def mil_seed(seed: int) -> int:
    """A non-negative int32 MIL seed standing for the u64 `seed` (folded, never -1 = random)."""
    return int((seed ^ (seed >> 31) ^ (seed >> 62)) & 0x7FFFFFFF)


def stream_seed(key: int) -> int:
    return mil_seed((GLOBAL_SEED + key * _GOLDEN) % 2**64)


def _filled(ctx: LowerContext, value: float) -> Any:
    from coremltools.converters.mil import Builder as mb

    return mb.fill(shape=np.asarray(ctx.out_shape.sizes(), np.int32), value=ctx.scalar(value), name=ctx.name())


@lowering(
    notes=(
        "`random_normal` (mean, stddev) with a fixed seed from the key: same distribution, not"
        " upstream's Philox values; scale 0 is an exact `fill`. The template input is not read."
    ),
)
def lower_rng_normal(op: ops.RngNormal, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    if op.scale == 0.0:
        return _filled(ctx, op.mean)
    return mb.random_normal(
        shape=np.asarray(ctx.out_shape.sizes(), np.int32), mean=ctx.scalar(op.mean), stddev=ctx.scalar(op.scale),
        seed=stream_seed(op.key), name=ctx.name(),
    )


@lowering(
    notes=(
        "`random_uniform` [low, high) with a fixed seed from the key: same distribution, not"
        " upstream's Philox values; low == high is an exact `fill`. The template input is not read."
    ),
)
def lower_rng_uniform(op: ops.RngUniform, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    if op.high == op.low:
        return _filled(ctx, op.low)
    return mb.random_uniform(
        shape=np.asarray(ctx.out_shape.sizes(), np.int32), low=ctx.scalar(op.low), high=ctx.scalar(op.high),
        seed=stream_seed(op.key), name=ctx.name(),
    )


def is_greedy(op: ops.Sample, vocab: int) -> bool:
    return op.top_k == 1 or op.top_p <= 0.0 or op.temperature <= 0.0 or vocab == 1


@lowering(
    notes=(
        "Greedy (top_k 1, top_p <= 0, temperature <= 0): `reduce_argmax` (first maximum)."
        " Otherwise logits minus their max over the temperature, top-k by `topk` threshold,"
        " top-p by a sorted `cumsum` threshold (ties at either cut kept), then"
        " `random_categorical` with a seed from `seed`: same distribution, not upstream's draws."
    ),
)
def lower_sample(op: ops.Sample, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = ctx.input_shape(0).sizes()
    vocab = sizes[-1]
    logits = ctx.var(0)
    if len(sizes) == 1:
        logits = mb.reshape(x=logits, shape=np.asarray([1, vocab], np.int32), name=ctx.name("rows"))
    rows = 1 if len(sizes) == 1 else sizes[0]
    if is_greedy(op, vocab):
        best = mb.reduce_argmax(x=logits, axis=-1, keep_dims=False, name=ctx.name("argmax"))
        return mb.cast(x=best, dtype=ctx.mil_float, name=ctx.name())
    peak = mb.reduce_max(x=logits, axes=[-1], keep_dims=True, name=ctx.name("peak"))
    shifted = mb.sub(x=logits, y=peak, name=ctx.name("shifted"))
    z = mb.mul(x=shifted, y=ctx.scalar(1.0 / max(op.temperature, 1e-6)), name=ctx.name("tempered"))
    minus_inf = ctx.scalar(-np.inf)
    if 0 < op.top_k < vocab:
        top = mb.topk(x=z, k=op.top_k, axis=-1, ascending=False, name=ctx.name("top_k"))[0]
        threshold = mb.slice_by_index(
            x=top, begin=[0, op.top_k - 1], end=[rows, op.top_k], name=ctx.name("top_k_threshold"),
        )
        dropped = mb.less(x=z, y=threshold, name=ctx.name("top_k_dropped"))
        z = mb.select(cond=dropped, a=minus_inf, b=z, name=ctx.name("top_k_logits"))
    if op.top_p < 1.0:
        p = mb.softmax(x=z, axis=-1, name=ctx.name("probabilities"))
        ordered = mb.topk(x=p, k=vocab, axis=-1, ascending=False, name=ctx.name("sorted"))[0]
        before = mb.cumsum(x=ordered, axis=-1, exclusive=True, name=ctx.name("mass_before"))
        kept = mb.less(x=before, y=ctx.scalar(op.top_p), name=ctx.name("nucleus"))
        candidates = mb.select(cond=kept, a=ordered, b=ctx.scalar(np.inf), name=ctx.name("nucleus_probabilities"))
        smallest = mb.reduce_min(x=candidates, axes=[-1], keep_dims=True, name=ctx.name("nucleus_threshold"))
        outside = mb.less(x=p, y=smallest, name=ctx.name("top_p_dropped"))
        z = mb.select(cond=outside, a=minus_inf, b=z, name=ctx.name("top_p_logits"))
    drawn = mb.random_categorical(x=z, mode="logits", size=1, seed=mil_seed(op.seed or 0xDEADBEEF), name=ctx.name("draw"))
    return mb.reshape(x=drawn, shape=np.asarray([rows], np.int32), name=ctx.name())
