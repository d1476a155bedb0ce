"""fp16 hazards: inputs that overflow a naive fp16 lowering must still give finite outputs
close to the reference.

* Norms over hidden 1024 with activations of 300-3000: `x*x` exceeds fp16's 65504, and so do
  the row sums of squares and of values.
* Softmax of logits far beyond exp's range (needs the max subtraction), and rows of huge equal
  logits.
* Attention whose unscaled `q.k` exceeds 65504 although the scaled scores fit.
* Custom-masked attention with a fully masked row: the spec's uniform average, not NaN, which
  a -1e9 fill (-inf in fp16) or an additive mask would break.

Every reference output here is finite, so `check_conversion`'s comparison fails on any inf or
NaN the converted model produces (`_verify_finite` asserts that precondition).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, e2e_settings, integers, normal, rng_for, seeds, signed, uniform
from rlx_mil import reference
from rlx_mil.ir.ops import MaskKind
from rlx_mil.lowering.target import Target
from rlx_mil.testing import CheckReport

HIDDEN = 1024
magnitudes = st.sampled_from([300.0, 1000.0, 3000.0])


def _verify_finite(f: Feeds, outputs: list[int], **options: Any) -> CheckReport:
    f.graph.set_outputs(outputs)
    want = reference.evaluate(f.graph, f.inputs, f.params)
    for name, value in want.items():
        assert np.all(np.isfinite(value)), f"reference output {name} is not finite: the case is mis-built"
    return f.verify(outputs, **options)


def large_rows(rng: np.random.Generator, rows: tuple[int, ...], magnitude: float, pattern: str) -> np.ndarray:
    """Rows of width HIDDEN: "dense" (every value ~magnitude), "offset" (a mean of
    ~magnitude with a spread of magnitude/10) or "outliers" (O(1) values with a few channels
    at +-magnitude, as in LLM residual streams)."""
    dims = (*rows, HIDDEN)
    if pattern == "dense":
        return signed(rng, dims, magnitude / 3, magnitude)
    if pattern == "offset":
        return (magnitude + normal(rng, dims, magnitude / 10)).astype(np.float32)
    values = normal(rng, dims)
    channels = rng.choice(HIDDEN, size=8, replace=False)
    values[..., channels] = signed(rng, (*rows, 8), magnitude / 2, magnitude)
    return values


@e2e_settings(3)
@given(magnitude=magnitudes, pattern=st.sampled_from(["dense", "offset", "outliers"]), seed=seeds)
def test_norms_of_large_activations(magnitude: float, pattern: str, seed: int) -> None:
    """LayerNorm, RmsNorm, GroupNorm and both fused residual norms on rows whose squares
    (and sums) overflow fp16."""
    rng = rng_for(seed)
    f = Feeds("large_norms")
    x = f.input("x", large_rows(rng, (2, 3), magnitude, pattern))
    residual = f.input("residual", large_rows(rng, (2, 3), magnitude, "outliers"))
    gamma = f.param("gamma", uniform(rng, (HIDDEN,), 0.5, 1.5))
    beta = f.param("beta", normal(rng, (HIDDEN,), 0.1))
    g = f.graph
    outputs = [
        g.layer_norm(x, gamma, beta, eps=1e-5, name="layer_norm"),
        g.rms_norm(x, gamma, beta, eps=1e-6, name="rms_norm"),
        g.fused_residual_ln(x, residual, gamma, beta, eps=1e-5, name="residual_ln"),
        g.fused_residual_rms_norm(x, residual, gamma, beta, eps=1e-6, name="residual_rms_norm"),
    ]
    # GroupNorm over [N, C, L] = [2, 8, 384]: each group of 2 channels spans 768 values.
    grouped = g.reshape(x, [2, 8, 384], name="as_channels")
    channel_gamma = f.param("channel_gamma", uniform(rng, (8,), 0.5, 1.5))
    channel_beta = f.param("channel_beta", normal(rng, (8,), 0.1))
    outputs.append(g.group_norm(grouped, channel_gamma, channel_beta, 4, eps=1e-5, name="group_norm"))
    outputs.append(g.mean(x, [-1], keep_dim=True, name="row_mean"))
    _verify_finite(f, outputs)


def test_norms_of_constant_and_zero_rows() -> None:
    """A row of 3000s has zero variance (LayerNorm gives beta); an all-zero row gives beta
    for RmsNorm (0 / sqrt(eps)); a row at fp16's largest value must not overflow either."""
    rng = rng_for(3)
    rows = np.stack([
        np.full(HIDDEN, 3000.0),
        np.zeros(HIDDEN),
        np.full(HIDDEN, 65504.0) * np.where(np.arange(HIDDEN) % 2 == 0, 1.0, -1.0),
        signed(rng, (HIDDEN,), 100.0, 3000.0),
    ]).astype(np.float32)
    f = Feeds("degenerate_norm_rows")
    x = f.input("x", rows)
    gamma = f.param("gamma", uniform(rng, (HIDDEN,), 0.5, 1.5))
    beta = f.param("beta", normal(rng, (HIDDEN,), 0.1))
    _verify_finite(f, [
        f.graph.layer_norm(x, gamma, beta, eps=1e-5, name="layer_norm"),
        f.graph.rms_norm(x, gamma, beta, eps=1e-5, name="rms_norm"),
    ])


@e2e_settings(3)
@given(width=st.sampled_from([8, 64, HIDDEN]), seed=seeds)
def test_softmax_of_large_logits(width: int, seed: int) -> None:
    """Logits of +-500..1000 in steps of 0.5 (exact in fp16) with several near each row's
    max, plus rows of huge equal logits (uniform result) and of +-60000 (one-hot)."""
    rng = rng_for(seed)
    base = signed(rng, (4, 1), 500.0, 1000.0)
    near_max = np.round(base * 2) / 2 - integers(rng, (4, width), 0, 12) * 0.5
    equal_huge = np.full((1, width), -60000.0, np.float32)
    spread_huge = integers(rng, (1, width), -1, 1) * 60000.0
    logits = np.concatenate([near_max, equal_huge, spread_huge]).astype(np.float32)
    f = Feeds("large_softmax")
    x = f.input("x", logits)
    _verify_finite(f, [f.graph.softmax(x, -1, name="softmax"), f.graph.softmax(x, 0, name="softmax_columns")])


@pytest.mark.parametrize("attention", ["auto", "decomposed"])
@pytest.mark.parametrize("mask_kind", ["none", "causal"])
def test_attention_with_large_scores(attention: str, mask_kind: str) -> None:
    """Self-attention with k = q of integer entries of magnitude 32..60 and head_dim 64:
    `q.q` is ~1.3e5 (> 65504) before the 1/8 scale, ~1.6e4 after. Each row's own key
    dominates, so the result is finite and well conditioned in fp16."""
    rng = rng_for(5)
    q = np.round(signed(rng, (1, 4, 2 * 64), 32, 60))
    assert (q[0, :, :64] ** 2).sum(-1).min() > 65504
    f = Feeds(f"large_scores_{mask_kind}")
    qi = f.input("q", q)
    v = f.input("v", normal(rng, (1, 4, 2 * 64)))
    out = f.graph.attention_kind(qi, qi, v, 2, 64, mask_kind, name="attention")
    _verify_finite(f, [out], attention=attention)


@pytest.mark.parametrize("attention", ["auto", "decomposed"])
def test_custom_mask_with_fully_masked_row(attention: str) -> None:
    """Batch 1's mask drops every key: the spec's FILL replacement gives the uniform average
    of v (not NaN). Batch 0 keeps some keys. Large logits in batch 0 as well."""
    rng = rng_for(6)
    mask = np.array([[1, 0, 1, 0, 1], [0, 0, 0, 0, 0]], np.float32)
    f = Feeds(f"fully_masked_{attention}")
    q = f.input("q", normal(rng, (2, 3, 8), 8.0))
    k = f.input("k", normal(rng, (2, 5, 8), 8.0))
    v = f.input("v", normal(rng, (2, 5, 8)))
    m = f.input("mask", mask)
    out = f.graph.attention(q, k, v, m, 2, 4, name="attention")
    report = _verify_finite(f, [out], attention=attention)
    assert any(c.target is Target.IOS18 for c in report.checks)


def test_fully_masked_row_is_the_mean_of_v() -> None:
    """Pins what the previous test compares against: the reference's uniform average."""
    rng = rng_for(6)
    q, k, v = normal(rng, (1, 2, 4)), normal(rng, (1, 3, 4)), normal(rng, (1, 3, 4))
    out = reference.attention.attention(q, k, v, np.zeros((1, 3), np.float32), num_heads=1, head_dim=4, mask_kind=MaskKind.CUSTOM)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=1, keepdims=True), out.shape), rtol=1e-5, atol=1e-6)
