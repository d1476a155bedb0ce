"""Palettization: the k-means fit, degenerate weights, LUT forms per target."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.compress.emit import pack_bits
from rlx_mil.compress.palette import fit_lut, lloyd_1d, palettize, quantile_seeds, value_histogram
from rlx_mil.compress.schemes import PER_GROUPED_CHANNEL, PaletteScheme
from rlx_mil.errors import CompressionError


def reference_lloyd(x: np.ndarray, seeds: np.ndarray, iterations: int = 100) -> np.ndarray:
    """Textbook Lloyd: assign every value to its nearest centroid (argmin), move each centroid
    to the mean of its values (an empty cluster keeps its centroid)."""
    c = seeds.astype(np.float64).copy()
    for _ in range(iterations):
        assign = np.argmin(np.abs(x[:, None] - c[None, :]), axis=1)
        new = np.array([x[assign == j].mean() if np.any(assign == j) else c[j] for j in range(c.size)])
        if np.array_equal(new, c):
            break
        c = new
    return c


def sse(x: np.ndarray, centroids: np.ndarray) -> float:
    return float(np.sum(np.min((x[:, None] - centroids[None, :]) ** 2, axis=1)))


@given(
    n=st.integers(20, 600),
    bits=st.sampled_from([1, 2, 3, 4, 6]),
    dist=st.sampled_from(["normal", "laplace", "uniform", "clustered", "few"]),
    seed=st.integers(0, 2**16),
)
def test_kmeans_no_worse_than_reference_lloyd_from_the_same_seeds(n: int, bits: int, dist: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = {
        "normal": lambda: rng.standard_normal(n),
        "laplace": lambda: rng.laplace(size=n),
        "uniform": lambda: rng.uniform(-1, 1, n),
        "clustered": lambda: rng.choice([-2.0, 0.0, 0.5, 3.0], n) + 0.01 * rng.standard_normal(n),
        "few": lambda: rng.choice([-1.0, 0.25, 2.0], n),
    }[dist]().astype(np.float32).astype(np.float64)
    k = 1 << bits
    ours = fit_lut(x, k)
    assert ours.shape == (k,) and np.all(np.diff(ours) >= 0)
    values, counts = value_histogram(x)
    if values.size <= k:
        assert sse(x, ours) == 0.0
        return
    reference = reference_lloyd(x, quantile_seeds(values, counts, k), iterations=300)
    assert sse(x, ours) <= sse(x, reference) * (1 + 1e-9) + 1e-12


def test_weighted_lloyd_equals_lloyd_on_raw_values() -> None:
    x = np.random.default_rng(2).standard_normal(3000).round(2)  # many repeated values
    values, counts = value_histogram(x)
    seeds = quantile_seeds(values, counts, 16)
    np.testing.assert_allclose(lloyd_1d(values, counts, seeds), np.sort(reference_lloyd(x, seeds, 300)), rtol=1e-12)


def test_half_width_histograms_match_unique() -> None:
    x = np.random.default_rng(3).standard_normal((50, 40)).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 0.0]
    for dtype in (np.float16, ml_dtypes.bfloat16):
        half = x.astype(dtype)
        got_v, got_c = value_histogram(half)
        want_v, want_c = np.unique(half.astype(np.float64), return_counts=True)
        np.testing.assert_array_equal(got_v, want_v)
        np.testing.assert_array_equal(got_c, want_c)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("grouped", [False, True])
def test_palettize_indexes_the_nearest_entry(bits: int, grouped: bool) -> None:
    w = np.random.default_rng(bits).standard_normal((32, 24)).astype(np.float32)
    scheme = PaletteScheme(bits=bits, granularity=PER_GROUPED_CHANNEL if grouped else "per_tensor", group_size=8)
    codes = palettize(w, scheme, np.float16)
    assert codes.lut.shape == ((4 if grouped else 1), 1 << bits) and codes.lut.dtype == np.float16
    assert codes.indices.shape == w.shape and int(codes.indices.max()) < (1 << bits)
    back = codes.dequantize()
    rows_per_group = 8 if grouped else 32
    for g in range(codes.lut.shape[0]):
        block = w[g * rows_per_group:(g + 1) * rows_per_group]
        lut = codes.lut[g].astype(np.float32)
        best = np.min(np.abs(block[..., None] - lut), axis=-1)
        np.testing.assert_allclose(np.abs(back[g * rows_per_group:(g + 1) * rows_per_group] - block), best, atol=1e-7)
    expected = np.sqrt(np.sum((back - w) ** 2) / np.sum(w**2))
    assert codes.relative_error == pytest.approx(expected, rel=1e-4)
    # More bits, smaller error.
    if bits < 8:
        assert palettize(w, PaletteScheme(bits=8), np.float16).relative_error < codes.relative_error


def test_degenerate_weights() -> None:
    for values in (np.zeros((8, 16)), np.full((8, 16), -0.3), np.tile([0.0, 1.0], (8, 8))):
        codes = palettize(values.astype(np.float32), PaletteScheme(bits=4, granularity="per_tensor"), np.float32)
        np.testing.assert_array_equal(codes.dequantize(), values.astype(np.float32))
        codes = palettize(values.astype(np.float32), PaletteScheme(bits=4, group_size=2), np.float32)
        np.testing.assert_array_equal(codes.dequantize(), values.astype(np.float32))
        assert codes.relative_error == 0.0
    w = np.ones((4, 8), np.float32)
    w[1, 1] = np.inf
    with pytest.raises(CompressionError, match=r"'emb' holds a non-finite value \(inf\) at row 1"):
        palettize(w, PaletteScheme(bits=4, group_size=2), np.float32, name="emb")
    with pytest.raises(CompressionError, match=r"group size 3 does not divide its 4 output channels"):
        palettize(np.ones((4, 8), np.float32), PaletteScheme(bits=2, granularity=PER_GROUPED_CHANNEL, group_size=3), np.float32)


@pytest.mark.parametrize("bits", [1, 2, 4, 6, 8])
def test_ios16_packing_is_what_the_executor_unpacks(bits: int) -> None:
    from rlx_mil.milexec.kernels.quant import _unpack_bits

    idx = np.random.default_rng(bits).integers(0, 1 << bits, size=37).astype(np.uint8)
    packed = pack_bits(idx, bits)
    assert packed.size == (37 * bits + 7) // 8
    np.testing.assert_array_equal(_unpack_bits(packed, bits, 37), idx)


@given(
    groups=st.integers(1, 6),
    rows=st.sampled_from([1, 2, 4]),
    width=st.integers(8, 96),
    bits=st.sampled_from([1, 2, 3, 4, 6]),
    dist=st.sampled_from(["normal", "laplace", "clustered", "few"]),
    seed=st.integers(0, 2**16),
)
def test_grouped_fit_is_close_to_exact_lloyd_per_group(groups: int, rows: int, width: int, bits: int, dist: str, seed: int) -> None:
    """The vectorised histogram fit of every group at once loses at most a few percent of
    squared error against the exact per-group fit (and is exact for few distinct values)."""
    rng = np.random.default_rng(seed)
    n = groups * rows
    w = {
        "normal": lambda: rng.standard_normal((n, width)) * rng.uniform(0.1, 3, (n, 1)),
        "laplace": lambda: rng.laplace(size=(n, width)),
        "clustered": lambda: rng.choice([-2.0, 0.0, 0.5, 3.0], (n, width)) + 0.01 * rng.standard_normal((n, width)),
        "few": lambda: rng.choice([-1.0, 0.25, 2.0], (n, width)),
    }[dist]().astype(np.float32)
    codes = palettize(w, PaletteScheme(bits=bits, group_size=rows), np.float32)
    back = codes.dequantize()
    k = 1 << bits
    for g in range(groups):
        block = w[g * rows:(g + 1) * rows].astype(np.float64).reshape(-1)
        exact = sse(block, fit_lut(block, k))
        ours = float(np.sum((back[g * rows:(g + 1) * rows].astype(np.float64).reshape(-1) - block) ** 2))
        if np.unique(block).size <= k:
            assert ours == 0.0
        else:
            assert ours <= exact * 1.05 + 1e-9 * float(np.sum(block**2)), (g, ours, exact)


def test_grouped_indices_are_nearest_with_many_groups() -> None:
    w = np.random.default_rng(5).standard_normal((64, 40)).astype(np.float16)
    for bits in (4, 8):
        codes = palettize(w, PaletteScheme(bits=bits, group_size=4), np.float16)
        lut = codes.lut.astype(np.float32)
        x = w.astype(np.float32).reshape(16, -1)
        best = np.min(np.abs(x[..., None] - lut[:, None, :]), axis=-1)
        got = np.abs(codes.dequantize().reshape(16, -1) - x)
        np.testing.assert_allclose(got, best, atol=1e-7)
