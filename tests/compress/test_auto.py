"""compress="autoN": per-weight mixes from error statistics, budgets, calibration, warnings."""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import numpy as np
import pytest

from rlx_mil.compress import parse_compress
from rlx_mil.compress.auto import Option, choose, options_for
from rlx_mil.compress.calibration import activation_importance
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.errors import CompressionWarning, InvalidOptionError
from rlx_mil.lowering.target import Target
from tests.compress.helpers import convert_and_verify
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

CONFIG = TinyLM(layers=2)
GRAPH = tiny_lm(CONFIG)
PARAMS = tiny_lm_params(GRAPH, CONFIG)
INPUTS = tiny_lm_inputs(CONFIG)
OUTLIER = "layers.1.mlp.up_proj.weight"


def _opt(text: str, error: float, size: int) -> Option:
    scheme = parse_scheme(text)
    assert scheme is not None
    return Option(scheme, error, size)


def test_greedy_widens_the_largest_error_reduction_per_byte_within_the_budget() -> None:
    options = {
        "a": [_opt("lut4", 0.10, 100), _opt("int8", 0.01, 200)],
        "b": [_opt("lut4", 0.30, 100), _opt("int8", 0.02, 200)],
        "c": [_opt("lut4", 0.05, 100), _opt("int8", 0.01, 200)],
    }
    weights = {"a": 1.0, "b": 1.0, "c": 1.0}
    pick, why, reached = choose(options, weights, 0, 1000, 4, budget=0.41, max_error=None)
    assert pick == {"a": 0, "b": 1, "c": 0} and "widened" in why["b"]
    assert reached == pytest.approx(0.4)
    pick, _, _ = choose(options, weights, 0, 1000, 4, budget=0.51, max_error=None)
    assert pick == {"a": 1, "b": 1, "c": 0}
    # max_error alone: the cheapest option within it, no budget filling.
    pick, _, _ = choose(options, weights, 0, 1000, 4, budget=None, max_error=0.08)
    assert pick == {"a": 1, "b": 1, "c": 0}
    # ... narrowed again where the budget cannot hold it.
    pick, why, _ = choose(options, weights, 0, 1000, 4, budget=0.4, max_error=0.08)
    assert pick == {"a": 0, "b": 1, "c": 0} and why["a"] == "narrowed to fit the budget"


def test_options_drop_dominated_candidates_and_estimate_bytes() -> None:
    w = np.random.default_rng(0).standard_normal((512, 64)).astype(np.float32)
    found = options_for(w, 4, Target.IOS18, np.float16)
    assert [o.bytes for o in found] == sorted(o.bytes for o in found)
    assert all(b.error < a.error for a, b in itertools.pairwise(found))
    lut4 = found[0]
    assert lut4.scheme.label == "lut4-group16"
    assert lut4.bytes == pytest.approx(512 * 64 // 2 + 32 * 16 * 2, rel=0.01)
    # iOS17 holds no 4-bit linear codes and no grouped tables.
    labels = [o.scheme.label for o in options_for(w, 4, Target.IOS17, np.float16)]
    assert labels and all(not label.startswith(("int4", "uint4")) and "group" not in label for label in labels)


def test_auto4_mix_meets_its_budget_and_widens_the_outlier_heavy_weight() -> None:
    params = dict(PARAMS)
    heavy = params[OUTLIER].copy()
    heavy[:, :4] *= 40.0  # a few outlier channels: 4-bit codes lose the rest
    params[OUTLIER] = heavy
    _, report = convert_and_verify(GRAPH, params, INPUTS, "auto4;budget=0.3", roundtrip=False)
    assert report.plan.startswith("auto4:") and "budget 0.3x" in report.plan
    notes = {w.name: w.note for w in report.weights}
    assert all(n.startswith("auto4: est. error") for n in notes.values())
    kept = sum(int(np.prod(params[n].shape)) * 2 for n in report.kept if n in params and params[n].dtype.kind == "f")
    assert (report.bytes_after + kept) / (report.bytes_before + kept) <= 0.3 + 1e-3
    schemes = {w.name: w.scheme for w in report.weights}
    assert schemes[OUTLIER] != "lut4-group16", notes[OUTLIER]
    assert report.contributions and set(report.contributions) == set(schemes)
    # A larger budget never leaves the mix with a larger total estimated error.
    _, wide = convert_and_verify(GRAPH, params, INPUTS, "auto4;budget=0.45", roundtrip=False)
    assert sum(wide.contributions.values()) <= sum(report.contributions.values())


def test_activation_importance_is_the_mean_square_of_the_multiplied_features() -> None:
    from rlx_mil.reference import evaluate_all

    got = activation_importance(GRAPH, PARAMS, INPUTS)
    values = evaluate_all(GRAPH, INPUTS, PARAMS)
    node = next(n for n in GRAPH if n.op.type_name == "MatMul" and GRAPH.node(n.inputs[1]).op.type_name == "Param"
                and getattr(GRAPH.node(n.inputs[1]).op, "name", "") == "layers.0.mlp.down_proj.weight")
    x = values[node.inputs[0]].reshape(-1, values[node.inputs[0]].shape[-1]).astype(np.float64)
    np.testing.assert_allclose(got["layers.0.mlp.down_proj.weight"], np.mean(x * x, axis=0), rtol=1e-6)
    assert "embed_tokens.weight" not in got  # a gathered table has no activation


def test_calibration_measures_the_output_error_and_warns_naming_the_top_weights() -> None:
    config = dataclasses.replace(parse_compress("auto4"), calibration=INPUTS)  # type: ignore[arg-type]
    _, report = convert_and_verify(GRAPH, PARAMS, INPUTS, config, roundtrip=False)
    assert report.calibration_error and "activation-weighted" in report.plan
    assert 0 < report.calibration_error["logits"]["relative_l2"] < 0.5
    with pytest.warns(CompressionWarning, match=r"(?s)quality vs the uncompressed weights: .*on the calibration inputs.*contributing most: \S+ \(lut2"):
        convert_and_verify(GRAPH, PARAMS, INPUTS, dataclasses.replace(parse_compress("lut2"), calibration=INPUTS),  # type: ignore[arg-type]
                           roundtrip=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompressionWarning)
        convert_and_verify(GRAPH, PARAMS, INPUTS, dataclasses.replace(parse_compress("int8"), calibration=INPUTS),  # type: ignore[arg-type]
                           roundtrip=False)


@pytest.mark.parametrize("spec", ["int4;budget=0.3", "auto5", "auto4;budget=1.5", "auto4;max_error=-1", "auto4;max_error=1.5", "auto4;max_error=inf", "auto4;budget=x"])
def test_bad_auto_specs_are_option_errors(spec: str) -> None:
    with pytest.raises(InvalidOptionError):
        parse_compress(spec)


def test_a_budget_below_the_narrowest_mix_says_so_and_what_would_do() -> None:
    """Never a silent miss: the plan and a warning give the budget that the mix needs."""
    import rlx_mil
    from rlx_mil.compress import report_of

    with pytest.warns(CompressionWarning, match=r"budget 0\.05x cannot be met: .* at least 0\.\d+") as caught:
        model = rlx_mil.convert(GRAPH, PARAMS, compress="auto4;budget=0.05;check=off")
    report = report_of(model)
    assert report is not None and "the budget 0.05x cannot be met" in report.plan
    needed = float(next(str(w.message) for w in caught if "cannot be met" in str(w.message)).rsplit("at least ", 1)[1])
    kept = sum(int(np.prod(PARAMS[n].shape)) * 2 for n in report.kept if n in PARAMS and PARAMS[n].dtype.kind == "f")
    reached = (report.bytes_after + kept) / (report.bytes_before + kept)
    assert 0.05 < reached <= needed + 1e-3
    with warnings.catch_warnings():  # the budget it names is met without a word
        warnings.simplefilter("error", CompressionWarning)
        again = report_of(rlx_mil.convert(GRAPH, PARAMS, compress=f"auto4;budget={needed};check=off"))
    assert again is not None and "cannot be met" not in again.plan

