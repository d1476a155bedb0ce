"""End-to-end: BatchNormInference, LayerNorm2d, AdaLayerNorm, GatedResidual (part-2 spec 5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import Feeds, e2e_settings, leaf_kinds, normal, rng_for, seeds, uniform
from e2e.test_norm_e2e import well_conditioned_rows
from rlx_mil import reference
from rlx_mil.ir.graph import Graph

eps_values = st.sampled_from([1e-5, 1e-3, 0.1])


@e2e_settings(3)
@given(
    lead=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3),
    channels=st.integers(1, 6),
    eps=eps_values,
    stats_kind=leaf_kinds,
    seed=seeds,
)
def test_batch_norm_inference(lead: tuple[int, ...], channels: int, eps: float, stats_kind: str, seed: int) -> None:
    """Channel = last axis; statistics const (scale folded at conversion) or at run time. Means
    near the data keep fp16 free of ill-conditioning."""
    rng = rng_for(seed)
    f = Feeds("batch_norm")
    dims = (*lead, channels)
    mean = normal(rng, (channels,), 2.0)
    x = f.input("x", mean + normal(rng, dims))
    leaves = [
        f.leaf(stats_kind, name, value)
        for name, value in (
            ("gamma", uniform(rng, (channels,), 0.5, 1.5)),
            ("beta", normal(rng, (channels,), 0.5)),
            ("mean", mean),
            ("var", uniform(rng, (channels,), 0.25, 4.0)),
        )
    ]
    f.verify([f.graph.batch_norm_inference(x, *leaves, eps=eps, name="bn")])


def test_batch_norm_normalises_the_last_axis_not_axis_1() -> None:
    """Part-2 spec 9 Q29: the statistics pair with the last axis of `[N, C, W]` even when C == W's
    size would allow axis 1."""
    g = Graph("bn_axis")
    x = g.input("x", [1, 2, 3])
    stats = [g.param(n, [3]) for n in ("gamma", "beta", "mean", "var")]
    g.set_outputs([g.batch_norm_inference(x, *stats, eps=0.0, name="y")])
    xs = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    params = {"gamma": np.ones(3, np.float32), "beta": np.zeros(3, np.float32),
              "mean": np.array([0, 1, 2], np.float32), "var": np.array([1, 4, 16], np.float32)}
    y = reference.evaluate(g, {"x": xs}, params)["y"]
    np.testing.assert_allclose(y, [[[0, 0, 0], [3, 1.5, 0.75]]])


@e2e_settings(3)
@given(
    dims=st.tuples(st.integers(1, 2), st.integers(1, 6), st.integers(1, 3), st.integers(1, 3)),
    eps=eps_values,
    offset=st.sampled_from([0.0, 4.0]),
    affine_kind=leaf_kinds,
    seed=seeds,
)
def test_layer_norm_2d(dims: tuple[int, int, int, int], eps: float, offset: float, affine_kind: str, seed: int) -> None:
    """Normalises across C at each (h, w); rows built with unit spread along axis 1."""
    rng = rng_for(seed)
    f = Feeds("layer_norm_2d")
    channels_last = well_conditioned_rows(rng, (dims[0], dims[2], dims[3], dims[1]), offset)
    x = f.input("x", np.ascontiguousarray(channels_last.transpose(0, 3, 1, 2)))
    gamma = f.leaf(affine_kind, "gamma", uniform(rng, (dims[1],), 0.5, 1.5))
    beta = f.leaf(affine_kind, "beta", normal(rng, (dims[1],), 0.5))
    f.verify([f.graph.layer_norm_2d(x, gamma, beta, eps=eps, name="ln2d")])


@pytest.mark.parametrize("norm", ["LayerNorm", "RmsNorm"])
@e2e_settings(2)
@given(
    batch=st.integers(1, 2),
    seq=st.integers(1, 3),
    width=st.sampled_from([2, 5, 8]),
    per_token=st.booleans(),
    modulation_kind=leaf_kinds,
    eps=eps_values,
    seed=seeds,
)
def test_ada_layer_norm_and_gated_residual(
    norm: str, batch: int, seq: int, width: int, per_token: bool, modulation_kind: str, eps: float, seed: int
) -> None:
    """`norm(x) * (1 + scale) + shift` then `x + gate * y`; modulation `[B, 1, D]` (broadcast
    over tokens) or `[B, S, D]`."""
    rng = rng_for(seed)
    f = Feeds("ada_ln")
    x = f.input("x", well_conditioned_rows(rng, (batch, seq, width), 0.0))
    mod_dims = (batch, seq if per_token else 1, width)
    scale = f.leaf(modulation_kind, "scale", normal(rng, mod_dims, 0.5))
    shift = f.leaf(modulation_kind, "shift", normal(rng, mod_dims, 0.5))
    gate = f.leaf(modulation_kind, "gate", normal(rng, mod_dims, 0.5))
    y = f.graph.ada_layer_norm(x, scale, shift, norm, eps=eps, name="ada")
    f.verify([y, f.graph.gated_residual(x, y, gate, name="gated")])
