"""Codes fitted to calibration activations (`rlx_mil.compress.fitting`): they must lower the
layer's output error on those activations against plain rounding, decode as the scheme's
ordinary codes, and refuse a Hessian that does not fit the weight."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil.compress import parse_scheme
from rlx_mil.compress.fitting import FitOptions, compensated_codes, fit_codes, weighted_table
from rlx_mil.compress.linear import LinearCodes
from rlx_mil.compress.palette import PaletteCodes
from rlx_mil.compress.plan import encode
from rlx_mil.errors import CompressionError
from rlx_mil.lowering.target import Precision


def _layer(seed: int, out: int = 48, width: int = 32, tokens: int = 96) -> tuple[np.ndarray, np.ndarray]:
    """A weight and correlated activations with a few outlier features (as trained models have)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out, width)).astype(np.float32) * 0.05
    mix = rng.standard_normal((width, width)) / np.sqrt(width) + np.eye(width)
    x = rng.standard_normal((tokens, width)) @ mix
    x[:, rng.choice(width, 3, replace=False)] *= 8.0
    return w, x


def _output_error(x: np.ndarray, w: np.ndarray, back: np.ndarray) -> float:
    return float(np.linalg.norm(x @ (w.astype(np.float64) - back.astype(np.float64)).T))


@pytest.mark.parametrize("spec", ["lut4-scaled", "lut3-scaled", "lut4-group8", "lut4-tensor", "int4-channel", "lut6-scaled"])
@pytest.mark.parametrize("seed", [0, 1])
def test_fitted_codes_lower_the_output_error_on_the_calibration_activations(spec: str, seed: int) -> None:
    w, x = _layer(seed)
    hessian = x.T @ x / x.shape[0]
    scheme = parse_scheme(spec)
    assert scheme is not None
    plain = encode(w, scheme, Precision.FP16, "w")
    fitted = fit_codes(w, scheme, np.float16, "w", hessian)
    assert type(fitted) is type(plain)
    before, after = _output_error(x, w, plain.dequantize()), _output_error(x, w, fitted.dequantize())
    # GPTQ-style rounding removes a large share of the output error on these activations.
    assert after < 0.9 * before, (spec, before, after)
    # The weight error itself grows: the codes trade it for output error.
    assert fitted.relative_error >= 0.95 * plain.relative_error


def test_each_part_of_the_fit_helps_on_its_own() -> None:
    w, x = _layer(3)
    hessian = x.T @ x / x.shape[0]
    scheme = parse_scheme("lut4-scaled")
    assert scheme is not None
    plain = _output_error(x, w, encode(w, scheme, Precision.FP16, "w").dequantize())
    weighted = _output_error(x, w, fit_codes(w, scheme, np.float16, "w", hessian, FitOptions(gptq=False)).dequantize())
    gptq = _output_error(x, w, fit_codes(w, scheme, np.float16, "w", hessian, FitOptions(weighted=False)).dequantize())
    both = _output_error(x, w, fit_codes(w, scheme, np.float16, "w", hessian).dequantize())
    assert weighted < plain and gptq < 0.9 * plain and both < 0.9 * plain


def test_fitted_codes_are_the_schemes_own_codes() -> None:
    """A fitted palette decodes as table[index] x scale (what constexpr_lut_to_dense and the
    scale op compute); fitted int codes stay within the scheme's range."""
    w, x = _layer(5)
    hessian = x.T @ x / x.shape[0]
    pal = fit_codes(w, parse_scheme("lut4-scaled"), np.float16, "w", hessian)  # type: ignore[arg-type]
    assert isinstance(pal, PaletteCodes) and pal.channel_scale is not None
    assert pal.indices.dtype == np.uint8 and int(pal.indices.max()) < 16 and pal.lut.dtype == np.float16
    want = pal.lut[0].astype(np.float32)[pal.indices.astype(np.int64)] * pal.channel_scale.astype(np.float32)[:, None]
    np.testing.assert_array_equal(pal.dequantize(), want)
    np.testing.assert_allclose(pal.relative_error,
                               np.linalg.norm(pal.dequantize() - w) / np.linalg.norm(w), rtol=1e-5)
    lin = fit_codes(w, parse_scheme("int4-channel"), np.float16, "w", hessian)  # type: ignore[arg-type]
    assert isinstance(lin, LinearCodes)
    lo, hi = lin.scheme.quant_range
    assert lo <= int(lin.data.min()) and int(lin.data.max()) <= hi


def test_identity_hessian_rounds_to_the_nearest_entry() -> None:
    """With H = I there is nothing to compensate: the codes are plain nearest rounding."""
    w, _ = _layer(7)
    scheme = parse_scheme("lut4-scaled")
    assert scheme is not None
    plain = encode(w, scheme, Precision.FP16, "w")
    fitted = fit_codes(w, scheme, np.float16, "w", np.eye(w.shape[1]), FitOptions(weighted=False))
    np.testing.assert_array_equal(fitted.indices, plain.indices)  # type: ignore[union-attr]


def test_dead_inputs_pass_no_error_on() -> None:
    """A column no calibration token reached is rounded plainly (H_jj = 0, no division by it)."""
    w, x = _layer(9)
    x[:, 4] = 0.0
    hessian = x.T @ x / x.shape[0]
    fitted = fit_codes(w, parse_scheme("int4-channel"), np.float16, "w", hessian)  # type: ignore[arg-type]
    plain = encode(w, parse_scheme("int4-channel"), Precision.FP16, "w")  # type: ignore[arg-type]
    assert np.isfinite(fitted.dequantize()).all()
    np.testing.assert_array_equal(fitted.data[:, 4], plain.data[:, 4])  # type: ignore[union-attr]


def test_a_hessian_that_does_not_fit_is_refused_by_name() -> None:
    w, _ = _layer(11)
    scheme = parse_scheme("lut4-scaled")
    assert scheme is not None
    with pytest.raises(CompressionError, match=r"'q_proj'.*Hessian is \[8, 8\]"):
        fit_codes(w, scheme, np.float16, "q_proj", np.eye(8))
    bad = np.eye(w.shape[1])
    bad[0, 0] = np.nan
    with pytest.raises(CompressionError, match="non-finite"):
        fit_codes(w, scheme, np.float16, "q_proj", bad)
    with pytest.raises(CompressionError, match="2-D or more"):
        fit_codes(w.reshape(-1), scheme, np.float16, "q_proj", np.eye(w.shape[1]))


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 300), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_weighted_table_is_no_worse_than_its_unweighted_seeds(n: int, bits: int, seed: int) -> None:
    """The weighted k-means lowers its own objective below the table fitted without weights."""
    from rlx_mil.compress.palette import fit_lut

    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n)
    weights = rng.exponential(size=n)
    k = 1 << bits

    def cost(table: np.ndarray) -> float:
        mids = (table[:-1] + table[1:]) / 2
        return float(np.sum(weights * (values - table[np.searchsorted(mids, values)]) ** 2))

    table = weighted_table(values, weights, k)
    assert table.shape == (k,) and np.all(np.diff(table) >= 0)
    assert cost(table) <= cost(np.sort(fit_lut(values, k))) * (1 + 1e-9) + 1e-12


def test_compensated_codes_with_a_diagonal_hessian_match_plain_rounding() -> None:
    from rlx_mil.compress.fitting import _PaletteGrid

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((6, 10))
    lut = np.linspace(-2, 2, 8)[None, :]
    grid = _PaletteGrid(lut, 6, None)
    codes = compensated_codes(rows.copy(), np.diag(rng.uniform(0.5, 2.0, 10)), grid)
    want = np.searchsorted((lut[0, :-1] + lut[0, 1:]) / 2, rows, side="left")
    np.testing.assert_array_equal(codes, want)


def test_a_conversion_with_fit_holds_codes_that_keep_the_model_closer() -> None:
    """`fit=gptq` end to end: the package the executor runs (its own stored codes) is closer to
    the float model on the calibration inputs than the same scheme rounded plainly, and the
    conversion's own check (which decodes the conversion's codes) measures the same."""
    import dataclasses

    import rlx_mil
    from rlx_mil import milexec, reference
    from rlx_mil.compress import parse_compress, report_of
    from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

    config = TinyLM(layers=2, seq=48)
    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    inputs = tiny_lm_inputs(config)
    want = reference.evaluate(graph, inputs, params)["logits"].astype(np.float64)
    errors, checks = {}, {}
    for fit in ("off", "gptq"):
        spec = parse_compress(f"lut4-scaled;fit={fit}")
        assert spec is not None and spec.fit == fit
        model = rlx_mil.convert(graph, params, target="iOS18", precision="fp32",
                                compress=dataclasses.replace(spec, calibration=inputs))
        got = np.asarray(milexec.run(model, inputs)["logits"], np.float64)
        errors[fit] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        report = report_of(model)
        assert report is not None and report.calibration_error is not None
        checks[fit] = report.calibration_error["logits"]["relative_l2"]
        assert checks[fit] == pytest.approx(errors[fit], rel=0.05)
    assert errors["gptq"] < 0.8 * errors["off"], errors


def test_fit_is_a_checked_option() -> None:
    from rlx_mil.compress import parse_compress
    from rlx_mil.errors import InvalidOptionError

    assert parse_compress("auto4;fit=gptq").fit == "gptq"  # type: ignore[union-attr]
    assert "fit=on" in parse_compress({"default": "lut4-scaled", "fit": "on"}).describe()  # type: ignore[union-attr]
    with pytest.raises(InvalidOptionError, match=r"fit takes off/weighted/gptq/on\[,sequential/float\], got 'maybe'"):
        parse_compress("lut4;fit=maybe")


def test_the_neural_engine_auto4_fits_its_codes_unless_told_otherwise() -> None:
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression

    assert form_compression("auto4", DeployForm.ANE).fit == "on"
    assert form_compression("auto4;fit=off", DeployForm.ANE).fit == "off"
    assert form_compression("auto4", DeployForm.GPU).fit is None
    assert form_compression("4bit", DeployForm.ANE).fit is None


@pytest.mark.parametrize("spec", ["int8", "int4-channel", "lut4-scaled"])
def test_fitted_codes_go_through_the_code_store(spec: str, tmp_path: Any) -> None:
    """The conversion's code writer hands back a read-only view of its file: a fit writes its
    codes through it (it once wrote into the plain codes' view in place)."""
    from rlx_mil.compress.code_store import CodeStore

    w, x = _layer(13)
    scheme = parse_scheme(spec)
    assert scheme is not None
    store = CodeStore(str(tmp_path), min_bytes=1)
    fitted = fit_codes(w, scheme, np.float16, "w", x.T @ x / x.shape[0], code_writer=store.writer)
    memory = fit_codes(w, scheme, np.float16, "w", x.T @ x / x.shape[0])
    np.testing.assert_array_equal(fitted.dequantize(), memory.dequantize())


def test_embedding_tables_are_rounded_plainly() -> None:
    """A (tied) embedding is read by token lookups its head's activations say nothing about."""
    import dataclasses

    from rlx_mil.compress import WeightCompressor, parse_compress
    from rlx_mil.lowering.target import Target
    from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

    config = TinyLM(layers=1)
    graph = tiny_lm(config)
    spec = dataclasses.replace(parse_compress("lut4-scaled;fit=gptq"), calibration=tiny_lm_inputs(config))  # type: ignore[arg-type]
    comp = WeightCompressor(spec, graph, Target.IOS18, Precision.FP16, tiny_lm_params(graph, config))
    assert comp.fit.hessian("embed_tokens.weight", config.hidden) is None
    h = comp.fit.hessian("layers.0.self_attn.q_proj.weight", config.hidden)
    assert h is not None and h.shape == (config.hidden, config.hidden)
    np.testing.assert_allclose(np.trace(h), 1.0, rtol=1e-6)  # every position counts once


def test_weighted_table_does_not_depend_on_the_weights_scale() -> None:
    """Weights below 1 (a normalised Hessian's diagonal) fit the same table as the same weights
    times 1000 (a cluster's weight was once clamped to at least 1, pulling small-weight entries
    toward 0: a grouped table lost its outer entries)."""
    rng = np.random.default_rng(4)
    values = rng.standard_normal(16 * 64)
    weights = rng.uniform(0.1, 1.0, values.size) / 576
    small, large = weighted_table(values, weights, 64), weighted_table(values, weights * 1000, 64)
    np.testing.assert_allclose(small, large, rtol=1e-9, atol=1e-12)
    assert small[-1] > 0.5 * values.max()
