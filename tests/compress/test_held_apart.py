"""autoN with fitted codes measures them on calibration positions the fit did not use."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from rlx_mil.compress import parse_compress
from rlx_mil.compress.calibration import input_activations
from rlx_mil.compress.fit import fit_to_shape
from rlx_mil.compress.fitting import FitOptions, fit_codes, input_hessian
from rlx_mil.compress.moments import FitFeed, second_moments
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.compress.sensitivity import MIN_PART, held_apart
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.reference import evaluate
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

SEQ = 64
CONFIG = TinyLM(layers=2, seq=SEQ)


def test_a_decoders_token_ids_are_split_in_half_unless_too_few() -> None:
    graph = tiny_lm(CONFIG)
    ids = np.zeros((1, SEQ), np.int32)
    assert held_apart(graph, {"input_ids": ids}) == SEQ // 2
    assert held_apart(graph, {"input_ids": np.zeros((1, 2 * MIN_PART + 1), np.int32)}) == MIN_PART + 1
    assert held_apart(graph, {"input_ids": np.zeros((1, 2 * MIN_PART - 1), np.int32)}) is None  # too few: no split
    assert held_apart(graph, {"pixels": np.zeros((1, SEQ), np.float32)}) is None  # no token ids
    graph.set_name(graph.outputs[0], "hidden")
    assert held_apart(graph, {"input_ids": ids}) is None  # no logits: outputs not judged per position


def test_the_fit_sees_each_rows_positions_before_the_split_only() -> None:
    graph = tiny_lm(CONFIG)
    params = tiny_lm_params(graph, CONFIG)
    inputs = tiny_lm_inputs(CONFIG)
    rows = input_activations(graph, params, inputs)
    split = second_moments(graph, params, [FitFeed(inputs, 20)])
    whole = second_moments(graph, params, [FitFeed(inputs)])
    assert set(split) == set(whole) == set(rows)
    for name, x in rows.items():
        assert split[name].count == 20 and whole[name].count == SEQ
        np.testing.assert_allclose(split[name].hessian(), input_hessian(x[:20]), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(whole[name].hessian(), input_hessian(x), rtol=1e-5, atol=1e-7)


def _kl_rows(want: np.ndarray, got: np.ndarray) -> np.ndarray:
    def log_softmax(z: np.ndarray) -> np.ndarray:
        z = z.astype(np.float64) - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    a, b = log_softmax(want), log_softmax(got)
    return np.sum(np.exp(a) * (a - b), -1)


@pytest.fixture(scope="module")
def planned() -> dict[str, Any]:
    """The tiny decoder's auto4 plan with fitted codes (`fit=on`) on 64 calibration tokens."""
    import rlx_mil.compress.plan as plan

    graph = tiny_lm(CONFIG)
    params = tiny_lm_params(graph, CONFIG)
    inputs = tiny_lm_inputs(CONFIG)
    captured: dict[str, Any] = {}
    real = plan.plan_auto

    def spy(*args: Any, **kwargs: Any) -> Any:
        import inspect

        captured.update(inspect.signature(real).bind(*args, **kwargs).arguments)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(plan, "plan_auto", spy)
        spec = parse_compress("auto4;fit=on")
        assert spec is not None
        compressor = plan.WeightCompressor(dataclasses.replace(spec, calibration=inputs), graph, Target.IOS18,
                                           Precision.FP32, params)
    return {"graph": graph, "params": params, "inputs": inputs, "compressor": compressor, **captured}


def test_fitted_codes_are_measured_only_where_the_fit_did_not_look(planned: dict[str, Any]) -> None:
    graph, params, inputs, compressor = planned["graph"], planned["params"], planned["inputs"], planned["compressor"]
    assert compressor.plan is not None
    assert f"fitted codes measured on calibration positions {SEQ // 2}-{SEQ - 1}, which the fit did not use" in \
        compressor.plan.summary
    rows = input_activations(graph, params, inputs)
    name = "layers.1.mlp.down_proj.weight"
    # The fit's statistics: each weight's input over positions 0..31 only.
    for n, x in rows.items():
        moment = compressor.fit.moment(n, x.shape[1])
        if n not in compressor.fit.skip:
            assert moment is not None and moment.count == SEQ // 2
            np.testing.assert_allclose(moment.hessian(), input_hessian(x[: SEQ // 2]), rtol=1e-5, atol=1e-7)
    # A measurement: the mean KL, over positions 32..62 only, of the model with that weight's
    # codes fitted on positions 0..31 (recomputed here from the fit's own functions).
    scheme, _ = fit_to_shape(parse_scheme("lut4-scaled"), (CONFIG.hidden, CONFIG.intermediate), Target.IOS18)  # type: ignore[arg-type]
    storage = params[name].T
    x = rows[name][: SEQ // 2]
    codes = fit_codes(storage, scheme, np.float32, name, input_hessian(x), FitOptions(), activations=x)
    want = evaluate(graph, inputs, params)["logits"][0]
    got = evaluate(graph, inputs, {**params, name: codes.dequantize().T})["logits"][0]
    kl = _kl_rows(want, got)
    from rlx_mil.compress.plan import encode

    plain = encode(storage, scheme, Precision.FP32, name).dequantize()
    kl_plain = _kl_rows(want, evaluate(graph, inputs, {**params, name: plain.T})["logits"][0])
    fitted_apart, plain_apart = (float(np.mean(k[SEQ // 2:SEQ - 1])) for k in (kl, kl_plain))
    measured = planned["measure"](name, scheme)
    assert measured == pytest.approx(min(fitted_apart, plain_apart), rel=1e-6)
    # The fit learns the positions it saw: there the same codes look better than held apart,
    # which is what measuring on them would have priced.
    assert float(np.mean(kl[: SEQ // 2])) < 0.5 * fitted_apart
    assert float(np.mean(kl[: SEQ // 2])) < float(np.mean(kl_plain[: SEQ // 2]))


def test_weights_measured_better_plain_are_encoded_plainly(planned: dict[str, Any]) -> None:
    """Held apart, 32 tokens of random ids fit a random model's 64-128-wide layers worse than
    plain rounding (the fit learns its tokens): those weights get plain codes, said in the notes."""
    from rlx_mil.compress.plan import encode

    params, compressor = planned["params"], planned["compressor"]
    plain_codes = compressor.plain_codes
    assert "layers.1.mlp.down_proj.weight" in plain_codes
    for name, (plainly, fitted) in plain_codes.items():
        assert plainly < fitted
        assert "plain codes (held apart" in compressor.notes[name]
        assert name in compressor.fit.skip
    name = "layers.1.mlp.down_proj.weight"
    scheme, _ = fit_to_shape(compressor.schemes[name], (CONFIG.hidden, CONFIG.intermediate), Target.IOS18)
    storage = params[name].T
    np.testing.assert_array_equal(compressor.fit.encode(storage, scheme, name).dequantize(),
                                  encode(storage, scheme, Precision.FP32, name).dequantize())


def test_a_fixed_scheme_or_an_unfitted_plan_uses_every_position() -> None:
    import rlx_mil.compress.plan as plan

    graph = tiny_lm(CONFIG)
    params = tiny_lm_params(graph, CONFIG)
    inputs = tiny_lm_inputs(CONFIG)
    for text in ("lut4-scaled;fit=on", "auto4;fit=off"):
        spec = parse_compress(text)
        assert spec is not None
        compressor = plan.WeightCompressor(dataclasses.replace(spec, calibration=inputs), graph, Target.IOS18,
                                           Precision.FP32, params)
        from rlx_mil.compress.sensitivity import fitted_from

        assert fitted_from(compressor) is None
        if compressor.plan is not None:
            assert "fitted codes" not in compressor.plan.summary
    spec = parse_compress("lut4-scaled;fit=on")
    assert spec is not None
    compressor = plan.WeightCompressor(dataclasses.replace(spec, calibration=inputs), graph, Target.IOS18,
                                       Precision.FP32, params)
    moment = compressor.fit.moment("layers.0.mlp.down_proj.weight", CONFIG.intermediate)
    assert moment is not None and moment.count == SEQ  # every position


def test_too_few_calibration_tokens_fit_and_measure_on_all_of_them_and_say_so() -> None:
    import rlx_mil.compress.plan as plan

    config = TinyLM(layers=1, seq=2 * MIN_PART - 2)
    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    spec = parse_compress("auto4;fit=on")
    assert spec is not None
    compressor = plan.WeightCompressor(dataclasses.replace(spec, calibration=tiny_lm_inputs(config)), graph,
                                       Target.IOS18, Precision.FP32, params)
    assert compressor.plan is not None
    assert "fitted codes measured on the positions they were fitted on" in compressor.plan.summary
    moment = compressor.fit.moment("layers.0.mlp.down_proj.weight", config.intermediate)
    assert moment is not None and moment.count == config.seq


def test_the_builtin_calibration_doubles_only_for_plans_that_fit_codes() -> None:
    """The Neural Engine's auto4 (fitted codes) gets 256 built-in tokens, half of them held apart;
    the GPU's auto4 and a fixed scheme's fit keep 128 (their measurements score every position)."""
    from rlx_mil.compress import parse_compress as parse
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression
    from rlx_mil.llm.calibration import CALIBRATION_TOKENS, calibration_tokens

    assert CALIBRATION_TOKENS == 128
    assert calibration_tokens(form_compression(parse("auto4"), DeployForm.ANE)) == 256
    assert calibration_tokens(form_compression(parse("auto4;fit=off"), DeployForm.ANE)) == 128
    assert calibration_tokens(form_compression(parse("auto4"), DeployForm.GPU)) == 128
    assert calibration_tokens(parse("lut4-scaled;fit=on")) == 128
    assert calibration_tokens(None) == 128


def test_weights_whose_fit_holds_apart_keep_fitted_codes() -> None:
    """128 fitted tokens for 32-64-wide layers: held apart the fitted codes keep the model
    closer than plain ones, so no weight is switched to plain codes (against 32 tokens above)."""
    import rlx_mil.compress.plan as plan

    config = TinyLM(layers=1, seq=256, hidden=32, intermediate=64, vocab=64)
    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    spec = parse_compress("auto4;fit=on;budget=0.5")
    assert spec is not None
    compressor = plan.WeightCompressor(dataclasses.replace(spec, calibration=tiny_lm_inputs(config)), graph,
                                       Target.IOS18, Precision.FP32, params)
    assert compressor.plan is not None and "positions 128-255" in compressor.plan.summary
    assert compressor.plain_codes == {}
    name = "layers.0.mlp.down_proj.weight"
    from rlx_mil.compress.plan import encode

    scheme, _ = fit_to_shape(compressor.schemes[name], (config.hidden, config.intermediate), Target.IOS18)
    storage = params[name].T
    assert not np.array_equal(compressor.fit.encode(storage, scheme, name).dequantize(),
                              encode(storage, scheme, Precision.FP32, name).dequantize())


@pytest.mark.parametrize("fitted_limit", [10**15, 0])
def test_a_sampled_plan_with_fitted_codes_measures_its_layers_held_apart(fitted_limit: int) -> None:
    """Layers are measured (with their fitted codes, on the held-apart positions) under
    FITTED_LAYER_MEASURE_LIMIT while the unfitted limit stays off."""
    import rlx_mil.compress.plan as plan

    config = TinyLM(layers=4, seq=SEQ)
    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    elements = sum(int(np.prod(v.shape)) for v in params.values() if np.asarray(v).dtype.kind == "f")
    spec = parse_compress("auto4;fit=on")
    assert spec is not None
    with pytest.MonkeyPatch.context() as m:
        m.setattr(plan, "MEASURE_LIMIT", 10 * elements * (SEQ // 2))  # 10 weights, counting the scored positions
        m.setattr(plan, "LAYER_MEASURE_LIMIT", 0)
        m.setattr(plan, "FITTED_LAYER_MEASURE_LIMIT", fitted_limit)
        compressor = plan.WeightCompressor(dataclasses.replace(spec, calibration=tiny_lm_inputs(config)), graph,
                                           Target.IOS18, Precision.FP32, params)
    assert compressor.plan is not None
    assert "(10 of 30 weights measured, the rest by kind" in compressor.plan.summary
    assert ("scaled per layer by 4 measured layers" in compressor.plan.summary) == (fitted_limit > 0)
