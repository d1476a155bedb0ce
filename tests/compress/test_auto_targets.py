"""autoN searching toward a quality target (max_kl / min_top1) within a budget, and saying
which budget would meet a target the given one cannot."""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.compress.auto import Option, bytes_for_target, choose, plan_auto, predicted
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.compress.sensitivity import kl_for_top1
from rlx_mil.errors import CompressionWarning
from rlx_mil.lowering.target import Target
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_params

CONFIG = TinyLM(layers=1, seq=16)
GRAPH = tiny_lm(CONFIG)
PARAMS = tiny_lm_params(GRAPH, CONFIG)
CALIBRATION = {"input_ids": np.random.default_rng(7).integers(0, CONFIG.vocab, (1, CONFIG.seq)).astype(np.int32)}


def _opt(text: str, error: float, size: int) -> Option:
    scheme = parse_scheme(text)
    assert scheme is not None
    return Option(scheme, error, size)


OPTIONS = {
    "a": [_opt("lut4", 0.10, 100), _opt("int8", 0.01, 200)],
    "b": [_opt("lut4", 0.30, 100), _opt("int8", 0.02, 200)],
    "c": [_opt("lut4", 0.05, 100), _opt("int8", 0.01, 200)],
}
WEIGHTS = {"a": 1.0, "b": 1.0, "c": 1.0}


def test_a_target_stops_the_widening_at_the_cheapest_mix_predicted_to_meet_it() -> None:
    # Without a target the budget is filled; with one, the widening stops once it is met.
    filled, _, full = choose(OPTIONS, WEIGHTS, 0, 1000, 4, budget=0.6, max_error=None)
    assert filled == {"a": 1, "b": 1, "c": 1} and full == pytest.approx(0.6)
    pick, why, reached = choose(OPTIONS, WEIGHTS, 0, 1000, 4, budget=0.6, max_error=None, target=0.02)
    assert pick == {"a": 0, "b": 1, "c": 0} and reached == pytest.approx(0.4)
    assert predicted(OPTIONS, WEIGHTS, pick) == pytest.approx(0.01 + 0.0004 + 0.0025)
    assert "quality target" in why["b"]
    # A target the budget cannot hold: the budget's best, and the bytes that would meet it.
    pick, _, reached = choose(OPTIONS, WEIGHTS, 0, 1000, 4, budget=0.41, max_error=None, target=0.005)
    assert pick == {"a": 0, "b": 1, "c": 0} and reached == pytest.approx(0.4)
    assert bytes_for_target(OPTIONS, WEIGHTS, pick, 400, 0.005) == 500
    assert bytes_for_target(OPTIONS, WEIGHTS, pick, 400, 1e-6) is None  # even all int8 misses it


def test_plan_auto_names_the_budget_that_would_meet_the_target() -> None:
    rng = np.random.default_rng(0)
    arrays = {f"layers.{i}.w": rng.standard_normal((64, 64)).astype(np.float32) for i in range(3)}
    storages = {name: (lambda name=name: arrays[name]) for name in arrays}
    total = 3 * 64 * 64 * 2

    def measure(name: str, scheme: object) -> float:  # the start (narrowest) scheme's loss, per weight
        return {"layers.0.w": 0.05, "layers.1.w": 0.01, "layers.2.w": 0.002}[name]

    args = (4, storages, {}, Target.IOS18, np.float16, 0, total)
    with pytest.warns(CompressionWarning, match=r"cannot be met within the budget 0\.3x: predicted .*a budget of ([0-9.]+) is"):
        tight = plan_auto(*args, 0.3, None, measure=measure, loss_target=1e-4, loss_unit="mean KL")
    asked = re.search(r"a budget of ([0-9.]+)", tight.summary)
    assert asked is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompressionWarning)
        met = plan_auto(*args, float(asked.group(1)), None, measure=measure, loss_target=1e-4, loss_unit="mean KL")
    found = re.search(r"predicted mean KL ([0-9.e-]+) \(target", met.summary)
    assert found is not None and float(found.group(1)) <= 1e-4
    assert sum(met.contributions.values()) == pytest.approx(float(found.group(1)), rel=1e-2)
    # No target asked for: the same tight budget, and the plan says what it predicts, claiming
    # no failure of a target nobody set (the decoder-only plan has no default target).
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompressionWarning)
        free = plan_auto(*args, 0.3, None, measure=measure, loss_unit="mean KL")
    assert re.search(r"; predicted mean KL [0-9.e-]+$", free.summary), free.summary
    assert "target" not in free.summary and "cannot be met" not in free.summary
    # Without measured sensitivities there is no loss to predict: the target does not steer.
    plain = plan_auto(*args, 0.3, None, loss_target=1e-4, loss_unit="mean KL")
    assert "predicted" not in plain.summary


def test_kl_for_top1_follows_the_measured_relation() -> None:
    assert kl_for_top1(0.9) == pytest.approx(0.04)
    assert kl_for_top1(0.95) < kl_for_top1(0.9) < kl_for_top1(0.8)


def _planned(**targets: float) -> tuple[str, int, float]:
    """(plan summary, compressed bytes, mean KL on the calibration inputs against the float
    weights) of the tiny decoder's auto4 mix, each weight encoded as the conversion does."""
    from rlx_mil import reference
    from rlx_mil.compress import WeightCompressor, parse_compress
    from rlx_mil.compress.emit import compressed_bytes
    from rlx_mil.compress.plan import encode
    from rlx_mil.compress.quality import mean_kl
    from rlx_mil.lowering.target import Precision

    config = parse_compress({"default": "auto4", "calibration": CALIBRATION, "budget": 0.6, **targets})
    assert config is not None
    # Linear candidates only: fitted in milliseconds (the search is what is tested).
    config = dataclasses.replace(config, default=parse_scheme("int4"), candidates=("int4", "uint4-float", "int8"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompressionWarning)
        comp = WeightCompressor(config, GRAPH, Target.IOS18, Precision.FP32, PARAMS)
    assert comp.plan is not None
    decoded, size = dict(PARAMS), 0
    for name, scheme in comp.schemes.items():
        codes = encode(np.asarray(PARAMS[name]), scheme, Precision.FP32, name)  # type: ignore[arg-type]
        size += compressed_bytes(codes, Target.IOS18)
        decoded[name] = codes.dequantize()
    want = reference.evaluate(GRAPH, CALIBRATION, PARAMS)["logits"]
    got = reference.evaluate(GRAPH, CALIBRATION, decoded)["logits"]
    return comp.plan.summary, size, mean_kl(want, got)


def test_the_planner_searches_toward_max_kl_and_min_top1() -> None:
    loose = _planned(max_kl=0.5)
    tight = _planned(max_kl=0.002)
    by_top1 = _planned(min_top1=0.99)
    for (summary, _, _), target in ((loose, 0.5), (tight, 0.002), (by_top1, kl_for_top1(0.99))):
        assert f"(target {target:.3g})" in summary
    # A tighter target buys more bytes and the measured KL (calibration inputs, against the
    # float weights) goes down with it, to about the target.
    assert tight[1] > loose[1]
    assert tight[2] < loose[2]
    assert tight[2] <= 0.002 * 2
    assert by_top1[2] <= kl_for_top1(0.99) * 2


def test_a_decode_step_is_planned_on_the_builtin_calibration_text(tmp_path: Path) -> None:
    """A stateful conversion's graph takes one token: autoN measures on the built-in calibration
    text through the checkpoint's plain graph (the same Params), in mean KL, and the plan meets
    the target it was given."""
    from rlx_mil.compress import WeightCompressor, parse_compress
    from rlx_mil.llm.calibration import builtin_calibration
    from rlx_mil.lowering.target import Precision
    from rlx_mil.models.pretrained import from_pretrained
    from tests.llm.text_fixtures import chat_checkpoint

    folder = chat_checkpoint(tmp_path / "chat")
    found = builtin_calibration(folder, tokens=24)
    assert found is not None
    inputs, plain, own = found
    assert inputs["input_ids"].shape == (1, 24) and int(inputs["input_ids"].max()) < 400
    decode, params = from_pretrained(folder, "decode", cache_len=32)
    config = parse_compress({"default": "auto4", "budget": 0.6, "max_kl": 0.01})
    assert config is not None
    config = dataclasses.replace(config, default=parse_scheme("int4"), candidates=("int4", "uint4-float", "int8"),
                                 calibration=inputs, calibration_graph=plain, calibration_params=own)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompressionWarning)
        comp = WeightCompressor(config, decode, Target.IOS18, Precision.FP32, params)
    assert comp.plan is not None
    found_kl = re.search(r"predicted mean KL ([0-9.e-]+) \(target 0\.01\)", comp.plan.summary)
    assert found_kl is not None and float(found_kl.group(1)) <= 0.01, comp.plan.summary
    assert "activation-weighted" in comp.plan.summary
    assert builtin_calibration(tmp_path) is None  # no tokenizer there

    def no_token_graph(*args: object, **kwargs: object) -> tuple[object, object]:
        from rlx_mil.errors import UnsupportedConfigError

        raise UnsupportedConfigError("a vision checkpoint: no token graph")

    assert builtin_calibration(folder, loader=no_token_graph) is None  # as before: generated inputs


def test_a_forms_narrower_candidates_join_only_with_measured_sensitivities() -> None:
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression

    config = form_compression("auto4", DeployForm.ANE)
    assert config.narrower == ("lut3-scaled", "lut3-group1") and "lut4-scaled" in config.candidates
    rng = np.random.default_rng(1)
    arrays = {f"layers.{i}.w": rng.standard_normal((64, 128)).astype(np.float32) for i in range(3)}
    storages = {name: (lambda name=name: arrays[name]) for name in arrays}
    total = 3 * 64 * 128 * 2
    felt = {"layers.0.w": 1e-7, "layers.1.w": 0.05, "layers.2.w": 0.05}
    args = (4, storages, {}, Target.IOS18, np.float16, 0, total, 0.36, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompressionWarning)
        measured = plan_auto(*args, candidates=config.candidates, narrower=config.narrower,
                             measure=lambda name, scheme: felt[name], loss_unit="mean KL")
        guessed = plan_auto(*args, candidates=config.candidates, narrower=config.narrower)
    # The weight the outputs hardly feel pays for the others' width.
    assert measured.schemes["layers.0.w"].label.startswith("lut3")
    assert all(not s.label.startswith("lut3") for s in guessed.schemes.values())
    assert predicted_of(measured) < sum(felt.values())
    # Each weight's note says what it became, its predicted share of the loss and why.
    note = measured.notes["layers.1.w"]
    assert re.search(r"^auto4: est\. error [0-9.]+; lut3\S* [0-9.]+; predicted mean KL [0-9.e-]+ \(", note), note
    assert "predicted" not in guessed.notes["layers.1.w"]


def predicted_of(plan: object) -> float:
    found = re.search(r"predicted mean KL ([0-9.e-]+)", getattr(plan, "summary", ""))
    assert found is not None
    return float(found.group(1))
