"""The conversion-time output check (generated inputs) and autoN's measured sensitivities."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.compress import parse_compress, report_of
from rlx_mil.compress.auto import NARROWER, Option, measured_weights, weight_kind
from rlx_mil.compress.calibration import CHECK_TOKENS, example_inputs
from rlx_mil.compress.fit import fit_to_shape
from rlx_mil.compress.plan import encode
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.errors import CompressionWarning, InvalidOptionError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.shape import Dynamic
from rlx_mil.lowering.target import Precision, Target
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_params

CONFIG = TinyLM(layers=2)
GRAPH = tiny_lm(CONFIG)
PARAMS = tiny_lm_params(GRAPH, CONFIG)


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


def test_example_inputs_index_inside_their_tables_and_fill_dynamic_dims() -> None:
    feeds = example_inputs(GRAPH)
    ids = feeds["input_ids"]
    assert ids.shape == (1, CONFIG.seq) and ids.dtype == np.int32
    assert 0 <= ids.min() and ids.max() < CONFIG.vocab and np.unique(ids).size > 1
    np.testing.assert_array_equal(example_inputs(GRAPH)["input_ids"], ids)  # deterministic

    g = Graph("dyn")
    x = g.input("x", [1, Dynamic(0), 8])
    mask = g.input("attention_mask", [1, Dynamic(0)], dtype="i32")
    g.set_outputs([g.add(x, x), mask])
    feeds = example_inputs(g)
    assert feeds["x"].shape == (1, CHECK_TOKENS, 8) and feeds["x"].dtype == np.float32
    np.testing.assert_array_equal(feeds["attention_mask"], np.ones((1, CHECK_TOKENS)))


def test_a_conversion_without_calibration_checks_its_outputs_and_warns() -> None:
    with pytest.warns(CompressionWarning, match=r"(?s)^quality vs the uncompressed weights: top-1 .*on inputs generated for the"
                      r" check.*BELOW THRESHOLD.*\n  the weights contributing most: \S+ \(lut2"):
        model = rlx_mil.convert(GRAPH, PARAMS, precision="fp32", compress="lut2")
    report = report_of(model)
    assert report is not None and report.check_error is not None
    assert report.quality is not None and not report.quality["ok"] and len(report.quality["worst"]) == 3
    assert report.quality["decoder"]["perplexity_ratio"] is None  # generated ids are not text
    # The package itself (NumPy MIL executor) against the float reference on the same inputs.
    feeds = example_inputs(GRAPH)
    want = np.asarray(reference.evaluate(GRAPH, feeds, PARAMS)["logits"], np.float64)
    measured = _rel_l2(milexec.run(model, feeds)["logits"], want)
    assert report.check_error["logits"]["relative_l2"] == pytest.approx(measured, rel=1e-3)
    assert measured > 0.1
    assert "generated check inputs" in report.to_text()

    with warnings.catch_warnings():
        warnings.simplefilter("error", CompressionWarning)
        model = rlx_mil.convert(GRAPH, PARAMS, precision="fp32", compress="int8")
        quiet = rlx_mil.convert(GRAPH, PARAMS, precision="fp32", compress="lut2;check=off")
    good = report_of(model)
    assert good is not None and good.check_error is not None and good.check_error["logits"]["relative_l2"] < 0.05
    assert good.quality is not None and good.quality["ok"] and good.quality["decoder"]["top1"] > 0.9
    skipped = report_of(quiet)
    assert skipped is not None and skipped.check_error is None and "check=off" in skipped.config


@pytest.mark.parametrize("spec", ["int4;check=maybe", "lut4;check=on;check=off"])
def test_bad_check_options_are_option_errors(spec: str) -> None:
    with pytest.raises(InvalidOptionError):
        parse_compress(spec)


def test_measured_weights_scale_each_output_error_by_the_start_error() -> None:
    lut4, int8 = parse_scheme("lut4"), parse_scheme("int8")
    assert lut4 is not None and int8 is not None
    options = {"a": [Option(lut4, 0.1, 10), Option(int8, 0.01, 20)], "exact": [Option(lut4, 0.0, 10)]}
    seen = []

    def measure(name: str, scheme: object) -> float:
        seen.append((name, scheme))
        return 0.04

    got = measured_weights(options, {"a": 1.0, "exact": 3.0}, measure)
    assert got == {"a": pytest.approx(4.0), "exact": 3.0}  # 0.04 / 0.1**2; an exact start keeps its weight
    assert seen == [("a", lut4)]


def test_a_sample_measures_some_weights_and_the_rest_take_their_kinds_mean() -> None:
    lut4 = parse_scheme("lut4")
    assert lut4 is not None
    names = [f"layers.{i}.{k}.weight" for i in range(3) for k in ("q", "v")] + ["other.weight", "exact.weight"]
    options = {n: [Option(lut4, 0.0 if n == "exact.weight" else 0.1, 10)] for n in names}
    output = {"layers.0.q.weight": 0.01, "layers.2.q.weight": 0.03, "layers.1.v.weight": 0.08}
    seen = []

    def measure(name: str, scheme: object) -> float:
        seen.append(name)
        return output[name]

    got = measured_weights(options, dict.fromkeys(names, 7.0), measure, [*output, "exact.weight"])
    assert sorted(seen) == sorted(output)  # only the sample is measured (an exact start never)
    assert got["layers.0.q.weight"] == pytest.approx(1.0) and got["layers.2.q.weight"] == pytest.approx(3.0)
    assert got["layers.1.q.weight"] == pytest.approx(2.0)  # the mean of the measured q weights
    assert got["layers.0.v.weight"] == got["layers.2.v.weight"] == pytest.approx(8.0)
    assert got["other.weight"] == pytest.approx(4.0)  # no measured weight of its kind: all measured
    assert got["exact.weight"] == 7.0
    assert weight_kind("model.layers.12.mlp.up_proj.weight") == "model.layers.#.mlp.up_proj.weight"


def test_measure_sample_takes_the_head_and_every_kind_at_spread_depths() -> None:
    from rlx_mil.compress.plan import MIN_SAMPLE, measure_sample

    names = ["embed.weight"] + [f"model.layers.{i}.{k}.weight" for i in range(30) for k in "qkvogud"]
    sample = measure_sample(names, {"embed.weight": "embedding"}, 12)
    assert sample is not None and len(sample) == 12 and sample[0] == "embed.weight"
    kinds = [weight_kind(n) for n in sample[1:]]
    assert len(set(kinds)) == 7  # every kind before any kind twice
    layers = {int(n.split(".")[2]) for n in sample[1:]}
    assert len(layers) == 11 and min(layers) < 10 and max(layers) >= 20
    assert measure_sample(names, {}, MIN_SAMPLE - 1) is None
    assert sorted(measure_sample(names, {}, 10**6) or []) == sorted(names)


def test_a_model_too_large_to_measure_whole_is_measured_on_a_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_mil.compress.plan as plan

    config = TinyLM(layers=4)
    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    elements = sum(int(np.prod(v.shape)) for v in params.values() if np.asarray(v).dtype.kind == "f")
    monkeypatch.setattr(plan, "MEASURE_LIMIT", 10 * elements * config.seq)  # 10 of 30 weights fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompressionWarning)  # random weights: 4 bits move the logits
        report = report_of(rlx_mil.convert(graph, params, precision="fp16", compress="auto4"))
        monkeypatch.setattr(plan, "MEASURE_LIMIT", 7 * elements * config.seq)  # below MIN_SAMPLE: role factors
        small = report_of(rlx_mil.convert(graph, params, precision="fp16", compress="auto4"))
    assert report is not None
    assert "measured output sensitivities (10 of 30 weights measured, the rest by kind)" in report.plan
    assert small is not None and "measured" not in small.plan


def _two_branches() -> tuple[Graph, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """y = x A^T + x B^T: A heavy-tailed (larger relative 4-bit error), B ten times larger (its
    error dominates the output)."""
    g = Graph("branches")
    x = g.input("x", [1, 8, 64])
    a = g.matmul(x, g.transpose(g.param("a.weight", [64, 64]), [1, 0]))
    b = g.matmul(x, g.transpose(g.param("b.weight", [64, 64]), [1, 0]))
    g.set_outputs([g.add(a, b)])
    rng = np.random.default_rng(3)
    params = {"a.weight": (rng.standard_t(2, (64, 64)) / 40).astype(np.float32),
              "b.weight": (rng.standard_normal((64, 64)) / 2).astype(np.float32)}
    return g, params, example_inputs(g)


def test_measured_sensitivities_widen_the_weight_the_output_feels() -> None:
    g, params, feeds = _two_branches()
    chosen = {}
    for spec in ("auto4;budget=0.36", "auto4;budget=0.36;check=off"):
        model = rlx_mil.convert(g, params, precision="fp16", compress=spec)
        report = report_of(model)
        assert report is not None
        chosen[spec] = {w.name: w.bytes_after for w in report.weights}
        if "check=off" in spec:
            continue
        assert "measured output sensitivities" in report.plan
        # Each contribution is the weight's own measured output error at its start scheme
        # (NumPy: only that weight compressed), scaled by (chosen error / start error)^2.
        start = parse_scheme(NARROWER[4][0])  # measured: the cheapest start is narrower than 4 bits
        assert start is not None
        x = feeds["x"][0].astype(np.float64)
        y = x @ (params["a.weight"] + params["b.weight"]).T.astype(np.float64)
        for entry in report.weights:
            w = params[entry.name]
            fitted, _ = fit_to_shape(start, w.shape, Target.IOS18)
            codes = encode(w, fitted, Precision.FP16, entry.name)
            err = x @ (codes.dequantize() - w).T.astype(np.float64)
            m = float(np.sum(err**2) / np.sum(y**2))
            want = m * (entry.relative_error / codes.relative_error) ** 2
            assert report.contributions[entry.name] == pytest.approx(want, rel=1e-3)
    measured, heuristic = chosen["auto4;budget=0.36"], chosen["auto4;budget=0.36;check=off"]
    assert measured["b.weight"] > measured["a.weight"]
    assert heuristic["b.weight"] <= heuristic["a.weight"]


def test_the_check_runs_by_default_only_while_the_weights_are_small(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_mil.compress.plan as plan

    float32_bytes = 4 * sum(n.shape.numel() for n in GRAPH if n.op.__class__.__name__ == "Param")
    monkeypatch.setattr(plan, "CHECK_AUTO_LIMIT", float32_bytes - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompressionWarning)  # lut2 would warn if it were checked
        skipped = report_of(rlx_mil.convert(GRAPH, PARAMS, precision="fp32", compress="lut2"))
    assert skipped is not None and skipped.check_error is None
    with pytest.warns(CompressionWarning):
        forced = report_of(rlx_mil.convert(GRAPH, PARAMS, precision="fp32", compress="lut2;check=on"))
    assert forced is not None and forced.check_error is not None and forced.check_error["logits"]["relative_l2"] > 0.1
    monkeypatch.setattr(plan, "CHECK_AUTO_LIMIT", float32_bytes)
    with pytest.warns(CompressionWarning):
        checked = report_of(rlx_mil.convert(GRAPH, PARAMS, precision="fp32", compress="lut2"))
    assert checked is not None and checked.check_error == forced.check_error
    assert "check=on" in parse_compress("lut2;check=on").describe().split(";")


def _encoder() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("enc")
    x = g.input("x", [1, 16, 128])
    h = g.matmul(x, g.param("w1", [128, 128]))
    g.set_outputs([g.matmul(h, g.param("w2", [128, 64]))])
    rng = np.random.default_rng(5)
    return g, {"w1": rng.standard_normal((128, 128)).astype(np.float32) / 11,
               "w2": rng.standard_normal((128, 64)).astype(np.float32) / 11}


def test_an_encoder_output_is_judged_by_cosine_and_psnr() -> None:
    graph, params = _encoder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompressionWarning)
        good = report_of(rlx_mil.convert(graph, params, precision="fp32", compress="int8;min_size=0"))
    assert good is not None and good.quality is not None and good.quality["decoder"] is None
    (out,) = good.quality["outputs"]
    assert out["cosine"] > 0.999 and out["psnr"] > 35
    with pytest.warns(CompressionWarning, match=r"cosine 0\.\d+ < 0\.95"):
        bad = report_of(rlx_mil.convert(graph, params, precision="fp32", compress="lut1-tensor;min_size=0"))
    assert bad is not None and bad.quality is not None and not bad.quality["ok"]
