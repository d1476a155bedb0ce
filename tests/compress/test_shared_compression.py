"""A multifunction conversion compresses (and plans, and checks) each weight once."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil.compress.plan as plan
from rlx_mil.compress import report_of
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


@pytest.mark.parametrize("spec", ["int4", "auto4"])
def test_every_function_holds_the_codes_encoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    folder = write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"], seed=2)
    encoded: list[str] = []
    planned: list[int] = []
    real_plan = plan.plan_auto

    def counting(real: Any) -> Any:
        def counting_encode(storage: np.ndarray, scheme: object, precision: object, name: str, *rest: object) -> object:
            encoded.append(name)
            return real(storage, scheme, precision, name, *rest)
        return counting_encode

    def counting_plan(*args: object, **kwargs: object) -> object:
        planned.append(1)
        return real_plan(*args, **kwargs)  # type: ignore[arg-type]

    # the planner's candidates go through `encode`, the conversion's codes through `plain_encode`
    monkeypatch.setattr(plan, "encode", counting(plan.encode))
    monkeypatch.setattr(plan, "plain_encode", counting(plan.plain_encode))
    monkeypatch.setattr(plan, "plan_auto", counting_plan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_llm_checkpoint(folder, None, max_context=16, prefill=[4, 8], precision="fp32",
                                       compress=f"{spec};min_size=0;check=off")
    report = report_of(model.user_defined_metadata)
    assert report is not None and report.weights
    names = {w.name for w in report.weights}
    # autoN also encodes candidates while planning; the conversion itself encodes each weight once.
    conversion = encoded if spec == "int4" else encoded[-len(names):]
    assert sorted(conversion) == sorted(names), "a weight was encoded once per function"
    assert len(planned) == (1 if spec == "auto4" else 0)


def test_the_model_carries_its_codes_and_they_decode_as_encoding_again(tmp_path: Path) -> None:
    from rlx_mil.compress import dequantized_params
    from rlx_mil.models.pretrained import from_pretrained

    folder = write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"], seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_llm_checkpoint(folder, None, max_context=16, prefill=[4], precision="fp32",
                                       compress="lut4;min_size=0;check=off")
    report = report_of(model.user_defined_metadata)
    assert report is not None
    codes = model.rlx_mil_codes
    assert set(codes) == {w.name for w in report.weights}
    _, params = from_pretrained(folder, "prefill", seq_len=4)
    held, again = dequantized_params(params, report, codes), dequantized_params(params, report)
    for w in report.weights:
        np.testing.assert_array_equal(held[w.name], again[w.name])
        assert held[w.name].shape == np.shape(params[w.name])
