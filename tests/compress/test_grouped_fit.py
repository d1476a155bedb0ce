"""Grouped palettes fitted to the calibration (`fit=on`): one weighted k-means table per group,
each group's table refitted to its own GPTQ codes, checked per group against NumPy written
here; and what each Neural Engine 4-bit candidate costs on iOS18 and on iOS26."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_mil.compress import parse_scheme
from rlx_mil.compress.emit import compressed_bytes
from rlx_mil.compress.fitting import FitOptions, fit_codes, input_hessian, refit_tables
from rlx_mil.compress.linear import quantize_linear
from rlx_mil.compress.palette import GROUP_BINS, PaletteCodes, grouped_luts, palettize
from rlx_mil.compress.schemes import PaletteScheme
from rlx_mil.lowering.target import Target
from tests.compress.fit_layers import calibrated_layer, damped_hessian


def _layer(seed: int, out: int = 16, width: int = 24, tokens: int = 48) -> tuple[np.ndarray, np.ndarray]:
    return calibrated_layer(seed, out, width, tokens, outlier_row=True)


_damped = damped_hessian


def _weighted_sse(values: np.ndarray, weights: np.ndarray, table: np.ndarray) -> float:
    nearest = np.argmin(np.abs(values[:, None] - table[None, :]), axis=1)
    return float(np.sum(weights * (values - table[nearest]) ** 2))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_grouped_tables_are_each_groups_weighted_lloyd_fixed_point(seed: int) -> None:
    """Values one per histogram bin (so the binned fit is exact): each group's table is a fixed
    point of weighted Lloyd on that group's own values, computed here with argmin, and never
    worse than the seed table it was also started from."""
    rng = np.random.default_rng(seed)
    groups, n, k = 5, 96, 8
    span = 2.0
    bins = np.stack([np.sort(rng.choice(GROUP_BINS, n, replace=False)) for _ in range(groups)])
    bins[:, 0], bins[:, -1] = 0, GROUP_BINS - 1  # the group's range is exactly the histogram's
    x = ((bins + 0.5) * span / GROUP_BINS - 1.0).astype(np.float32)
    weights = rng.random((groups, n)) ** 3  # far from uniform
    seed_tables = np.sort(rng.uniform(-1, 1, (groups, k)), axis=1)
    got = grouped_luts(x, k, weights, (seed_tables,))
    for g in range(groups):
        v, wt, table = x[g].astype(np.float64), weights[g], got[g]
        nearest = np.argmin(np.abs(v[:, None] - table[None, :]), axis=1)
        for a in range(k):
            hit = nearest == a
            if hit.any():
                assert table[a] == pytest.approx(np.sum(wt[hit] * v[hit]) / np.sum(wt[hit]), rel=1e-9, abs=1e-12)
        assert _weighted_sse(v, wt, table) <= _weighted_sse(v, wt, seed_tables[g]) * (1 + 1e-12)
    # The weights move the tables: unweighted they differ.
    assert not np.allclose(grouped_luts(x, k), got)


@pytest.mark.parametrize("spec", ["lut4-group1", "lut4-group4", "lut4-group4-scaled", "lut3-group2"])
def test_fit_on_refits_each_groups_table_to_its_own_codes(spec: str) -> None:
    """`fit=on` with grouped tables: each group's decoded values are the least-squares ones for
    that group's codes (solved here per group by whitening with H's Cholesky factor)."""
    w, x = _layer(4)
    scheme = parse_scheme(spec)
    assert isinstance(scheme, PaletteScheme)
    h = input_hessian(x)
    codes = fit_codes(w.astype(np.float32), scheme, np.float32, "w", h, FitOptions(), activations=x)
    assert isinstance(codes, PaletteCodes)
    per = scheme.group_size
    assert codes.lut.shape == (w.shape[0] // per, 1 << scheme.bits)
    assert np.all(np.diff(codes.lut, axis=1) >= 0)
    lt = np.linalg.cholesky(_damped(x)).T
    s = np.ones(w.shape[0]) if codes.channel_scale is None else codes.channel_scale.astype(np.float64)
    idx = codes.indices.astype(np.int64)
    decoded = codes.dequantize().astype(np.float64)
    k = 1 << scheme.bits
    for g in range(w.shape[0] // per):
        rows = range(g * per, (g + 1) * per)
        design = np.concatenate([lt @ (np.eye(k)[idx[r]] * s[r]) for r in rows])
        target = np.concatenate([lt @ w[r] for r in rows])
        used = np.unique(idx[g * per:(g + 1) * per])
        best = np.linalg.lstsq(design[:, used], target, rcond=None)[0]
        want = best[np.searchsorted(used, idx[g * per:(g + 1) * per])] * s[g * per:(g + 1) * per, None]
        np.testing.assert_allclose(decoded[g * per:(g + 1) * per], want, rtol=1e-5, atol=1e-7)
    # the refit lowers the calibration objective against the same fit without it
    kept = fit_codes(w.astype(np.float32), scheme, np.float32, "w", h, FitOptions(refit=False), activations=x)
    damped = _damped(x)

    def objective(q: np.ndarray) -> float:
        d = w - q.astype(np.float64)
        return float(np.einsum("ri,ij,rj->", d, damped, d))
    assert objective(codes.dequantize()) < objective(kept.dequantize())


def test_refit_tables_solves_each_group_alone() -> None:
    """Two groups refitted together give what each gives refitted alone."""
    w, x = _layer(7, out=8)
    rng = np.random.default_rng(3)
    k = 4
    codes = rng.integers(0, k, w.shape).astype(np.uint8)
    luts = np.sort(rng.standard_normal((2, k)), axis=1)
    scale = np.abs(w).max(axis=1)
    both, both_codes = refit_tables(w, codes, luts, scale, x)
    for g in range(2):
        part = slice(4 * g, 4 * g + 4)
        alone, alone_codes = refit_tables(w[part], codes[part], luts[g:g + 1], scale[part], x)
        np.testing.assert_allclose(both[g], alone[0], rtol=1e-9, atol=1e-12)
        assert np.array_equal(both_codes[part], alone_codes)


def test_a_table_per_row_is_never_worse_than_one_scaled_table_on_the_weighted_objective() -> None:
    """The per-row weighted fit also starts from the scaled table's fit, so before rounding its
    activation-weighted error is at most the scaled palette's."""
    w, x = _layer(9, out=32, width=40)
    h = input_hessian(x)
    importance = np.diag(h)[None, :]
    off = FitOptions(gptq=False, refit=False)
    per_row = fit_codes(w.astype(np.float32), parse_scheme("lut3-group1"), np.float32, "w", h, off)  # type: ignore[arg-type]
    scaled = fit_codes(w.astype(np.float32), parse_scheme("lut3-scaled"), np.float32, "w", h, off)  # type: ignore[arg-type]

    def weighted(q: np.ndarray) -> float:
        return float(np.sum(importance * (q.astype(np.float64) - w) ** 2))
    assert weighted(per_row.dequantize()) <= weighted(scaled.dequantize()) * (1 + 1e-3)


OUT, IN = 64, 96


@pytest.mark.parametrize("spec, ios18, ios26", [
    # packed 4-bit codes, then per row: a scaled table's 16 fp16 entries and its fp16 scale on
    # iOS18 (coremltools stores the scaled table per channel), one table + scales from iOS26
    ("lut4-scaled", OUT * IN // 2 + OUT * (16 * 2 + 2), OUT * IN // 2 + 16 * 2 + OUT * 2),
    ("lut4-group1", OUT * IN // 2 + OUT * 16 * 2, OUT * IN // 2 + OUT * 16 * 2),
    ("lut4-group4", OUT * IN // 2 + OUT // 4 * 16 * 2, OUT * IN // 2 + OUT // 4 * 16 * 2),
    ("lut4-group4-scaled", OUT * IN // 2 + OUT * (16 * 2 + 2), OUT * IN // 2 + OUT // 4 * 16 * 2 + OUT * 2),
    ("lut3-group1", OUT * IN * 3 // 8 + OUT * 8 * 2, OUT * IN * 3 // 8 + OUT * 8 * 2),
    ("lut6", OUT * IN * 6 // 8 + OUT // 16 * 64 * 2, OUT * IN * 6 // 8 + OUT // 16 * 64 * 2),
    ("int4-channel", OUT * IN // 2 + OUT * 2, OUT * IN // 2 + OUT * 2),
    ("int8", OUT * IN + OUT * 2, OUT * IN + OUT * 2),
])
def test_each_candidates_bytes_on_ios18_and_ios26(spec: str, ios18: int, ios26: int) -> None:
    w = np.random.default_rng(0).standard_normal((OUT, IN)).astype(np.float16)
    scheme = parse_scheme(spec)
    assert scheme is not None
    codes = (quantize_linear(w, scheme, np.float16) if not spec.startswith("lut")  # type: ignore[arg-type]
             else palettize(w, scheme, np.float16))  # type: ignore[arg-type]
    assert (compressed_bytes(codes, Target.IOS18), compressed_bytes(codes, Target.IOS26)) == (ios18, ios26)


def _q4_1_rows(seed: int, rows: int = 32, width: int = 256) -> np.ndarray:
    """Rows on llama.cpp Q4_1-like grids (16 levels per 32 elements, each block its own range),
    as SmolLM2's weights are: few, clumped values per row."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width)) * rng.uniform(0.5, 2.0, (rows, 1))
    b = x.reshape(rows, -1, 32)
    lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
    d = (hi - lo) / 15
    return (np.rint((b - lo) / d) * d + lo).reshape(rows, width).astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1])
def test_plain_tables_per_row_start_from_the_scaled_table_and_never_fit_worse(
    seed: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Plain (unfitted) `lut4-group1`: each row's table also starts from the shared table of
    the max-normalised rows scaled back, so its squared error is at most `lut4-scaled`'s, row
    by row; from quantile / evenly spaced seeds alone Lloyd on these rows ends worse."""
    import rlx_mil.compress.palette as palette

    w = _q4_1_rows(seed)
    per_row = palettize(w, parse_scheme("lut4-group1"), np.float32)  # type: ignore[arg-type]
    scaled = palettize(w, parse_scheme("lut4-scaled"), np.float32)  # type: ignore[arg-type]
    mine = np.sum((per_row.dequantize() - w) ** 2, axis=1)
    theirs = np.sum((scaled.dequantize() - w) ** 2, axis=1)
    assert np.all(mine <= theirs * (1 + 1e-6))
    monkeypatch.setattr(palette, "SHARED_SEED_ELEMENTS", 0)
    unseeded = palettize(w, parse_scheme("lut4-group1"), np.float32)  # type: ignore[arg-type]
    assert unseeded.sq_error > scaled.sq_error > per_row.sq_error


def test_tables_of_sixteen_rows_keep_their_own_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared scaled table seeds only tables of at most `SHARED_SEED_ROWS` rows: a grouped
    `lut4` (16 rows a table) is fitted as before it, whatever the group's element count."""
    import rlx_mil.compress.palette as palette

    w = _q4_1_rows(0)
    grouped = palettize(w, parse_scheme("lut4-group16"), np.float32)  # type: ignore[arg-type]
    calls: list[int] = []
    real = palette._shared_seed

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(palette, "_shared_seed", counting)
    monkeypatch.setattr(palette, "SHARED_SEED_ELEMENTS", 1 << 30)
    again = palettize(w, parse_scheme("lut4-group16"), np.float32)  # type: ignore[arg-type]
    assert not calls and again.sq_error == grouped.sq_error
    palettize(w, parse_scheme("lut4-group4"), np.float32)  # type: ignore[arg-type]
    assert calls == [1]
