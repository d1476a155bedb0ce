"""A one-table palette's entries refitted to its GPTQ codes (`fit=on`): the least-squares table."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_mil.compress import parse_scheme
from rlx_mil.compress.fitting import FitOptions, fit_codes, input_hessian, refit_scales, refit_table
from tests.compress.fit_layers import calibrated_layer, damped_hessian


def _layer(seed: int, out: int = 12, width: int = 16, tokens: int = 40) -> tuple[np.ndarray, np.ndarray]:
    return calibrated_layer(seed, out, width, tokens)


_damped = damped_hessian


def _objective(w: np.ndarray, q: np.ndarray, h: np.ndarray) -> float:
    d = w - q
    return float(np.einsum("ri,ij,rj->", d, h, d))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scaled", [False, True])
def test_the_refitted_table_is_the_least_squares_table_for_the_codes(seed: int, scaled: bool) -> None:
    w, x = _layer(seed)
    rng = np.random.default_rng(seed + 10)
    k = 8
    codes = rng.integers(0, k - 1, w.shape).astype(np.uint8)  # entry k-1 unused
    scale = np.abs(w).max(axis=1) if scaled else None
    s = np.ones(w.shape[0]) if scale is None else scale
    table = np.sort(rng.standard_normal(k))
    got_table, got_codes = refit_table(w, codes, table, scale, x)
    # Independently: whiten by H = L L^T and solve min ||L^T (w_r - s_r A_r T)|| over every row.
    h = _damped(x)
    lt = np.linalg.cholesky(h).T
    design = np.concatenate([lt @ (np.eye(k)[codes[r].astype(int)] * s[r]) for r in range(w.shape[0])])
    target = np.concatenate([lt @ w[r] for r in range(w.shape[0])])
    used = np.unique(codes)
    want = np.linalg.lstsq(design[:, used], target, rcond=None)[0]
    decoded = got_table[got_codes.astype(int)] * s[:, None]
    np.testing.assert_allclose(decoded, want[np.searchsorted(used, codes)] * s[:, None], rtol=1e-6, atol=1e-9)
    assert np.all(np.diff(got_table) >= 0)  # still a sorted table; the codes renumbered with it
    assert table[k - 1] in got_table  # the unused entry keeps its value
    assert got_codes.dtype == codes.dtype
    before = _objective(w, table[codes.astype(int)] * s[:, None], h)
    assert _objective(w, decoded, h) < before


@pytest.mark.parametrize("spec", ["lut4-scaled", "lut3-scaled", "lut4-tensor"])
def test_fit_on_refits_a_single_table_and_lowers_the_calibration_objective(spec: str) -> None:
    w, x = _layer(5, out=24, width=32, tokens=64)
    scheme = parse_scheme(spec)
    assert scheme is not None
    h = input_hessian(x)
    kept = fit_codes(w.astype(np.float32), scheme, np.float32, "w", h, FitOptions(refit=False), activations=x)
    refit = fit_codes(w.astype(np.float32), scheme, np.float32, "w", h, FitOptions(), activations=x)
    assert not np.array_equal(kept.lut, refit.lut)  # type: ignore[union-attr]
    assert np.all(np.diff(refit.lut[0]) >= 0)  # type: ignore[union-attr]
    damped = _damped(x)
    assert _objective(w, refit.dequantize().astype(np.float64), damped) < _objective(w, kept.dequantize().astype(np.float64), damped)
    # Without the activations (or with a table of more than 16 entries) nothing is refitted.
    assert np.array_equal(fit_codes(w.astype(np.float32), scheme, np.float32, "w", h).lut, kept.lut)  # type: ignore[union-attr]
    wide = parse_scheme("lut6-scaled")
    assert wide is not None
    assert np.array_equal(fit_codes(w.astype(np.float32), wide, np.float32, "w", h, activations=x).lut,  # type: ignore[union-attr]
                          fit_codes(w.astype(np.float32), wide, np.float32, "w", h, FitOptions(refit=False)).lut)  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_refitted_scales_are_each_rows_least_squares_scale(seed: int) -> None:
    w, x = _layer(seed)
    rng = np.random.default_rng(seed + 20)
    k = 8
    codes = rng.integers(0, k, w.shape).astype(np.uint8)
    table = np.sort(rng.uniform(-1, 1, k))
    scale = np.abs(w).max(axis=1)
    got = refit_scales(w, codes, table, scale, x)
    h = _damped(x)
    lt = np.linalg.cholesky(h).T
    for r in range(w.shape[0]):  # independently: a one-column least squares in the whitened space
        t = lt @ table[codes[r].astype(int)]
        want = float(np.linalg.lstsq(t[:, None], lt @ w[r], rcond=None)[0][0])
        assert got[r] == pytest.approx(want, rel=1e-9)
    before = _objective(w, table[codes.astype(int)] * scale[:, None], h)
    after = _objective(w, table[codes.astype(int)] * got[:, None], h)
    assert after < 0.9 * before  # random codes: the max-magnitude scale is far from the best one


def test_a_row_that_decodes_to_zeros_keeps_its_scale() -> None:
    w, x = _layer(3, out=4, width=16)
    table = np.array([-1.0, 0.0, 0.5, 1.0])
    codes = np.full(w.shape, 2, np.uint8)
    codes[1] = 1  # every entry 0.0
    got = refit_scales(w, codes, table, np.full(4, 0.25), x)
    assert got[1] == 0.25
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("spec", ["lut4-scaled", "lut6-scaled"])
def test_rescale_refits_the_scales_and_lowers_the_calibration_objective(spec: str) -> None:
    w, x = _layer(6, out=24, width=32, tokens=64)
    scheme = parse_scheme(spec)
    assert scheme is not None
    h = input_hessian(x)
    kept = fit_codes(w.astype(np.float32), scheme, np.float32, "w", h, FitOptions(), activations=x)
    rescaled = fit_codes(w.astype(np.float32), scheme, np.float32, "w", h, FitOptions(rescale=True), activations=x)
    assert np.array_equal(kept.indices, rescaled.indices)  # type: ignore[union-attr]
    assert not np.array_equal(kept.channel_scale, rescaled.channel_scale)  # type: ignore[union-attr, arg-type]
    damped = _damped(x)
    before = _objective(w, kept.dequantize().astype(np.float64), damped)
    after = _objective(w, rescaled.dequantize().astype(np.float64), damped)
    assert after < before, (before, after)
