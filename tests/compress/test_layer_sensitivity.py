"""autoN's per-layer measurements: a layer's weights measured together scale their kinds' means."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlx_mil.compress import parse_compress
from rlx_mil.compress.auto import MAX_LAYER_FACTOR, Option, layer_scaled, measured_weights
from rlx_mil.compress.calibration import example_inputs
from rlx_mil.compress.plan import encode
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.reference import evaluate
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_params

LUT4 = parse_scheme("lut4")
INT8 = parse_scheme("int8")
assert LUT4 is not None and INT8 is not None


def _options(names: list[str], start: float = 0.1) -> dict[str, list[Option]]:
    assert LUT4 is not None and INT8 is not None
    return {n: [Option(LUT4, start, 10), Option(INT8, start / 10, 20)] for n in names}


def test_each_layer_scales_its_unmeasured_weights_by_its_measured_over_predicted_loss() -> None:
    names = [f"model.layers.{i}.{k}.weight" for i in range(3) for k in ("q", "v")]
    options = _options(names)
    weights = dict.fromkeys(names, 1.0)  # each layer predicted 2 * 1.0 * 0.1^2 = 0.02
    measured_loss = {0: 0.01, 1: 0.01, 2: 0.04}  # the ratios 0.5, 0.5, 2.0; their mean (by prediction) 1.0
    seen: list[dict[str, Any]] = []

    def measure_layer(schemes: Any) -> float:
        seen.append(dict(schemes))
        return measured_loss[int(next(iter(schemes)).split(".")[2])]

    got = layer_scaled(options, weights, {"model.layers.0.q.weight"}, measure_layer)
    assert [sorted(s) for s in seen] == [[f"model.layers.{i}.q.weight", f"model.layers.{i}.v.weight"] for i in range(3)]
    assert all(s == LUT4 for schemes in seen for s in schemes.values())  # every weight at its start
    assert got["model.layers.0.q.weight"] == 1.0  # measured alone: its own measurement stays
    assert got["model.layers.0.v.weight"] == pytest.approx(0.5)
    assert got["model.layers.1.q.weight"] == got["model.layers.1.v.weight"] == pytest.approx(0.5)
    assert got["model.layers.2.q.weight"] == got["model.layers.2.v.weight"] == pytest.approx(2.0)


def test_the_layers_share_the_loss_but_its_total_stays_the_single_weight_measurements() -> None:
    names = [f"blk.{i}.w.weight" for i in range(2)]
    options = _options(names)
    # Measured together the layers lose 10x what their weights predict: only the split counts.
    got = layer_scaled(options, dict.fromkeys(names, 2.0), set(), lambda s: 0.2 if "blk.0." in next(iter(s)) else 0.6)
    assert got["blk.0.w.weight"] == pytest.approx(2.0 * 0.5) and got["blk.1.w.weight"] == pytest.approx(2.0 * 1.5)
    # A layer the calibration barely measures is clipped, not trusted to a factor of thousands.
    got = layer_scaled(options, dict.fromkeys(names, 2.0), set(), lambda s: 1e-9 if "blk.0." in next(iter(s)) else 1.0)
    assert got["blk.0.w.weight"] == pytest.approx(2.0 / MAX_LAYER_FACTOR)
    assert got["blk.1.w.weight"] == pytest.approx(2.0 * min(2.0, MAX_LAYER_FACTOR))


def test_without_layers_or_without_a_sample_nothing_is_measured_per_layer() -> None:
    calls = []

    def measure_layer(schemes: Any) -> float:
        calls.append(schemes)
        return 1.0

    flat = _options(["a.weight", "b.weight"])
    assert layer_scaled(flat, {"a.weight": 1.0, "b.weight": 2.0}, set(), measure_layer) == {"a.weight": 1.0, "b.weight": 2.0}
    one = _options(["layers.0.a.weight", "layers.0.b.weight", "exact.weight"])
    one["exact.weight"] = [Option(LUT4, 0.0, 10)]
    assert layer_scaled(one, dict.fromkeys(one, 1.0), set(), measure_layer) == dict.fromkeys(one, 1.0)
    names = [f"layers.{i}.q.weight" for i in range(3)]
    measured_weights(_options(names), dict.fromkeys(names, 1.0), lambda n, s: 0.01, None, measure_layer)
    assert calls == []  # every weight measured alone: nothing to scale


def _plan(config: TinyLM, monkeypatch: pytest.MonkeyPatch, layer_limit: int) -> Any:
    """The tiny decoder's auto4 plan (no conversion: the compressor plans when made)."""
    import rlx_mil.compress.plan as plan

    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    elements = sum(int(np.prod(v.shape)) for v in params.values() if np.asarray(v).dtype.kind == "f")
    monkeypatch.setattr(plan, "MEASURE_LIMIT", 10 * elements * config.seq)  # 10 of 30 weights fit
    monkeypatch.setattr(plan, "LAYER_MEASURE_LIMIT", layer_limit)
    captured: dict[str, Any] = {}
    real = plan.plan_auto

    def spy(*args: Any, **kwargs: Any) -> Any:
        captured.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan, "plan_auto", spy)
    config_ = parse_compress("auto4")
    assert config_ is not None
    compressor = plan.WeightCompressor(config_, graph, Target.IOS18, Precision.FP16, params)
    assert compressor.plan is not None
    return graph, params, compressor.plan, captured


def test_a_sampled_model_measures_each_layer_with_its_weights_replaced_together(monkeypatch: pytest.MonkeyPatch) -> None:
    config = TinyLM(layers=4)
    graph, params, planned, captured = _plan(config, monkeypatch, 10**15)
    assert "(10 of 30 weights measured, the rest by kind, scaled per layer by 4 measured layers)" in planned.summary
    measure_layer = captured["measure_layer"]
    assert measure_layer is not None
    # The measurement is the outputs' squared relative error (generated inputs: no calibration
    # text) with exactly those weights encoded plainly: recomputed here from the reference.
    names = ["layers.1.self_attn.q_proj.weight", "layers.1.mlp.down_proj.weight"]
    feeds = example_inputs(graph)
    want = evaluate(graph, feeds, params)["logits"].astype(np.float64)
    changed = dict(params)
    for n in names:
        stored = params[n].T  # [in, out] params: stored as the [out, in] linear weight
        changed[n] = encode(stored, LUT4, Precision.FP16, n).dequantize().T
    got = evaluate(graph, feeds, changed)["logits"].astype(np.float64)
    expected = float(np.sum((got - want) ** 2) / np.sum(want**2))
    assert measure_layer(dict.fromkeys(names, LUT4)) == pytest.approx(expected, rel=1e-6)
    alone = measure_layer({names[0]: LUT4})
    assert alone < expected and alone > 0

    _, _, small, captured = _plan(config, monkeypatch, 0)
    assert captured["measure_layer"] is None
    assert "(10 of 30 weights measured, the rest by kind)" in small.summary
