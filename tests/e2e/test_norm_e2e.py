"""End-to-end: LayerNorm, RmsNorm, GroupNorm, FusedResidualLN, FusedResidualRmsNorm.

Large-activation fp16 cases live in test_fp16_hazards_e2e.py.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import Feeds, e2e_settings, leaf_kinds, normal, rng_for, seeds, uniform

eps_values = st.sampled_from([1e-5, 1e-12, 1e-3, 0.1])
#: Row offsets: a mean well above the spread exercises cancellation in the variance (spec 13
#: Q16), within what fp16 inputs can resolve (|offset| / spread <= 8: the fp16 rounding of
#: the input alone moves a normalized value by up to ulp(8)/2 = 0.004).
offsets = st.sampled_from([0.0, 4.0, -8.0])


def well_conditioned_rows(rng: np.random.Generator, dims: tuple[int, ...], offset: float) -> np.ndarray:
    """Rows with mean `offset` and standard deviation exactly 1 (width > 1). Random rows of
    width 2 or 3 can have an arbitrarily small spread, which makes any fp16 normalization
    (already the fp16 rounding of the input) arbitrarily wrong: an ill-posed case, not a
    lowering defect."""
    rows = normal(rng, dims).astype(np.float64)
    if dims[-1] > 1:
        rows -= rows.mean(axis=-1, keepdims=True)
        spread = rows.std(axis=-1, keepdims=True)
        rows = np.where(spread > 0, rows / np.where(spread > 0, spread, 1.0), 1.0)
        rows -= rows.mean(axis=-1, keepdims=True)
    return (rows + offset).astype(np.float32)


@st.composite
def rows(draw: st.DrawFn) -> tuple[int, ...]:
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3))
    return (*lead, draw(st.sampled_from([1, 2, 5, 8, 16])))


@e2e_settings(5)
@given(dims=rows(), eps=eps_values, offset=offsets, negative_axis=st.booleans(),
       gamma_kind=leaf_kinds, beta_kind=leaf_kinds, seed=seeds)
def test_layer_norm_and_rms_norm(
    dims: tuple[int, ...], eps: float, offset: float, negative_axis: bool, gamma_kind: str, beta_kind: str, seed: int
) -> None:
    """Both norms over the last axis (given as -1 or rank-1) of the same rows."""
    rng = rng_for(seed)
    hidden = dims[-1]
    f = Feeds("norms")
    x = f.input("x", well_conditioned_rows(rng, dims, offset))
    gamma = f.leaf(gamma_kind, "gamma", uniform(rng, (hidden,), 0.5, 1.5))
    beta = f.leaf(beta_kind, "beta", normal(rng, (hidden,), 0.5))
    axis = -1 if negative_axis else len(dims) - 1
    f.verify([
        f.graph.layer_norm(x, gamma, beta, axis=axis, eps=eps, name="layer_norm"),
        f.graph.rms_norm(x, gamma, beta, axis=axis, eps=eps, name="rms_norm"),
    ])


@e2e_settings(4)
@given(
    batch=st.integers(1, 2),
    groups=st.integers(1, 3),
    per_group=st.integers(1, 3),
    spatial=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4),
    eps=eps_values,
    offset=offsets,
    affine_kind=leaf_kinds,
    seed=seeds,
)
def test_group_norm(
    batch: int, groups: int, per_group: int, spatial: tuple[int, ...], eps: float, offset: float,
    affine_kind: str, seed: int,
) -> None:
    """Contiguous channel groups of `[N, C, *spatial]`, batch > 1 included (spec 13 Q17)."""
    rng = rng_for(seed)
    channels = groups * per_group
    f = Feeds("group_norm")
    # Each (n, group) block spans per_group * prod(spatial) values: condition it as one row.
    block = (batch, groups, per_group * int(np.prod(spatial, dtype=np.int64)))
    x = f.input("x", well_conditioned_rows(rng, block, offset).reshape(batch, channels, *spatial))
    gamma = f.leaf(affine_kind, "gamma", uniform(rng, (channels,), 0.5, 1.5))
    beta = f.leaf(affine_kind, "beta", normal(rng, (channels,), 0.5))
    f.verify([f.graph.group_norm(x, gamma, beta, groups, eps=eps, name="group_norm")])


@e2e_settings(4)
@given(dims=rows(), has_bias=st.booleans(), eps=eps_values, residual_kind=leaf_kinds,
       affine_kind=leaf_kinds, seed=seeds)
def test_fused_residual_norms(
    dims: tuple[int, ...], has_bias: bool, eps: float, residual_kind: str, affine_kind: str, seed: int
) -> None:
    """LayerNorm / RmsNorm of `x + residual (+ bias)`, 4 or 5 inputs."""
    rng = rng_for(seed)
    hidden = dims[-1]
    f = Feeds("fused_residual_norms")
    # x + residual (+ bias) is what gets normalized: make that sum well conditioned.
    residual_values = normal(rng, dims, 2.0)
    bias_values = normal(rng, (hidden,))
    total = well_conditioned_rows(rng, dims, 0.0)
    x = f.input("x", total - residual_values - (bias_values if has_bias else 0.0))
    residual = f.leaf(residual_kind, "residual", residual_values)
    bias = f.leaf(affine_kind, "bias", bias_values) if has_bias else None
    gamma = f.leaf(affine_kind, "gamma", uniform(rng, (hidden,), 0.5, 1.5))
    beta = f.leaf(affine_kind, "beta", normal(rng, (hidden,), 0.5))
    f.verify([
        f.graph.fused_residual_ln(x, residual, gamma, beta, bias, eps=eps, name="residual_ln"),
        f.graph.fused_residual_rms_norm(x, residual, gamma, beta, bias, eps=eps, name="residual_rms_norm"),
    ])
