"""Stateful LLM packages in the Neural Engine and GPU forms: the plain package's logits through
`Session`, the device's structure in every function, and a clean Neural Engine preflight."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import pytest

import rlx_mil
from rlx_mil.coreml import metadata
from rlx_mil.coreml.deploy import DeployForm
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

from .ane_checks import assert_neural_engine_form

#: Llama with a head size of 32, so that every state dim the Neural Engine sees is a multiple
#: of 32 (the capacity is rounded up by the form itself).
CONFIG = copy.deepcopy(TINY_CONFIGS["llama"])
CONFIG.update(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128)
CONFIG.pop("head_dim", None)
PROMPT = [3, 17, 42, 5]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deployed")
    checkpoint = write_random_checkpoint(root / "llama", CONFIG, seed=11)
    made = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for form in ("plain", "gpu", "ane"):
            made[form] = root / f"{form}.mlpackage"
            convert_llm_checkpoint(checkpoint, made[form], max_context=32, prefill=[4], deploy=form)
    return made


def _logits(package: Path) -> list[np.ndarray]:
    session = Session(package, engine="milexec")
    return [session.feed(PROMPT), session.feed([9]), session.feed([23])]


@pytest.mark.parametrize("form", ["gpu", "ane"])
def test_deployed_package_generates_the_plain_logits(form: str, packages: dict[str, Path]) -> None:
    for want, got in zip(_logits(packages["plain"]), _logits(packages[form]), strict=True):
        scale = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= 2e-2 * scale  # fp16 programs, summed in another order
        assert int(np.argmax(got)) == int(np.argmax(want)) or np.sort(want)[-2] > np.max(want) - 2e-2 * scale


def test_neural_engine_package_structure_and_preflight(packages: dict[str, Path]) -> None:
    program = rlx_mil.milexec.load_program(packages["ane"])
    assert set(program.functions) == {"decode", "prefill_4"}
    assert_neural_engine_form(program)
    findings = [f for f in rlx_mil.preflight(packages["ane"], device="ane") if f.severity != "note"]
    assert findings == []
    plain_rules = {f.rule for f in rlx_mil.preflight(packages["plain"], device="ane")}
    assert "rank-over-4" in plain_rules  # the stacked rank-5 cache the form folds
    meta = rlx_mil.coreml.package_info.package_info(packages["ane"]).metadata
    assert metadata.read_deploy(meta) is DeployForm.ANE


def test_gpu_package_fuses_attention_in_every_function(packages: dict[str, Path]) -> None:
    program = rlx_mil.milexec.load_program(packages["gpu"])
    for name, function in program.functions.items():
        ops = [op.op_type for op in function.operations]
        assert ops.count("scaled_dot_product_attention") == CONFIG["num_hidden_layers"], name
        assert "softmax" not in ops and "conv" not in ops and "linear" in ops
