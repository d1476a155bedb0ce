"""End-to-end: ResizeNearest2x, Interpolate3d, AxialRope2d and LogMel (part-2 spec 5)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, e2e_settings, normal, rng_for, seeds, uniform, weight_kinds
from rlx_mil import reference
from rlx_mil.ir.graph import Graph


@e2e_settings(2)
@given(dims=st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)), seed=seeds)
def test_resize_nearest_2x(dims: tuple[int, int, int, int], seed: int) -> None:
    f = Feeds("resize")
    x = f.input("x", normal(rng_for(seed), dims))
    f.verify([f.graph.resize_nearest_2x(x, name="up")])


@e2e_settings(3)
@given(
    spatial=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
    size=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 6)),
    seed=seeds,
)
def test_interpolate3d(spatial: tuple[int, int, int], size: tuple[int, int, int], seed: int) -> None:
    """Up, down and kept sizes per axis."""
    f = Feeds("interpolate3d")
    x = f.input("x", normal(rng_for(seed), (1, 2, *spatial)))
    f.verify([f.graph.interpolate3d(x, list(size), name="resized")])


def test_interpolate3d_uses_integer_source_indices() -> None:
    """src = min(dst * in // out, in - 1): 3 -> 7 picks 0,0,0,1,1,2,2 (no float rounding)."""
    g = Graph("nearest")
    x = g.input("x", [1, 1, 1, 1, 3])
    g.set_outputs([g.interpolate3d(x, [1, 1, 7], name="y")])
    y = reference.evaluate(g, {"x": np.array([10, 20, 30], np.float32).reshape(1, 1, 1, 1, 3)})["y"]
    np.testing.assert_array_equal(y.reshape(-1), [10, 10, 10, 20, 20, 30, 30])


@e2e_settings(3)
@given(
    end_x=st.integers(1, 4),
    end_y=st.integers(1, 3),
    head_dim=st.sampled_from([4, 8, 16]),
    num_heads=st.integers(1, 2),
    repeat=st.integers(0, 2),
    theta=st.sampled_from([10000.0, 100.0]),
    seed=seeds,
)
def test_axial_rope2d(end_x: int, end_y: int, head_dim: int, num_heads: int, repeat: int, theta: float, seed: int) -> None:
    tokens = end_x * end_y * max(repeat, 1)
    f = Feeds("axial_rope")
    x = f.input("x", normal(rng_for(seed), (2, tokens, num_heads * head_dim)))
    f.verify([f.graph.axial_rope2d(x, end_x, end_y, head_dim, num_heads, theta, repeat, name="roped")])


def test_axial_rope2d_repeats_each_position() -> None:
    """Part-2 spec 9 Q30: with repeat_factor 2 tokens 2t and 2t+1 share grid position t
    (repeat-interleave, not SAM2's tiling), and token 0 (x = y = 0) is unrotated."""
    g = Graph("repeat")
    x = g.input("x", [1, 8, 4])
    g.set_outputs([g.axial_rope2d(x, 2, 2, 4, repeat_factor=2, name="y")])
    ones = np.ones((1, 8, 4), np.float32)
    y = reference.evaluate(g, {"x": ones})["y"][0]
    np.testing.assert_array_equal(y[0], ones[0, 0])
    np.testing.assert_array_equal(y[0::2], y[1::2])
    assert not np.allclose(y[2], y[0])  # token 2 is position 1: x = 1


@e2e_settings(3)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple),
    n_fft=st.sampled_from([2, 4, 8, 16]),
    n_mels=st.integers(1, 5),
    magnitude=st.sampled_from([1e-2, 1.0, 300.0]),
    filters_kind=weight_kinds,
    seed=seeds,
)
def test_log_mel(lead: tuple[int, ...], n_fft: int, n_mels: int, magnitude: float, filters_kind: str, seed: int) -> None:
    """Positive filters, spectra of magnitude up to 300 (whose power overflows fp16 unless
    scaled), bins within 3 decades of each other (what fp16 resolves)."""
    rng = rng_for(seed)
    f = Feeds("log_mel")
    spectrum = np.sign(normal(rng, (*lead, 2 * n_fft))) * uniform(rng, (*lead, 2 * n_fft), 0.05, 1.0) * magnitude
    x = f.input("spectrum", spectrum.astype(np.float32))
    filters = f.leaf(filters_kind, "filters", uniform(rng, (n_mels, n_fft // 2 + 1), 0.01, 1.0))
    f.verify([f.graph.log_mel(x, filters, name="features")])


def test_log_mel_clamps_per_frame_and_floors_zero_frames() -> None:
    """Part-2 spec 9 Q31: each frame is clamped at its own max - 8 (Whisper: the global max); an
    all-zero frame is the 1e-10 floor, (-10 + 4) / 4 = -1.5."""
    g = Graph("clamp")
    spectrum = g.input("spectrum", [3, 4])  # n_fft = 2: 2 one-sided bins
    g.set_outputs([g.log_mel(spectrum, g.param("filters", [2, 2]), name="y")])
    frames = np.array([[1e5, 1e-3, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
    y = reference.evaluate(g, {"spectrum": frames}, {"filters": np.eye(2, dtype=np.float32)})["y"]
    np.testing.assert_allclose(y[0], [(10 + 4) / 4, (2 + 4) / 4], rtol=1e-6)  # 1e-6 power clamped to 1e10 / 1e8
    np.testing.assert_allclose(y[1], [1.0, 1.0])
    np.testing.assert_allclose(y[2], [-1.5, -1.5], rtol=1e-6)
