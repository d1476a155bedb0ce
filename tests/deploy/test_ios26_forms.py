"""Stateful LLM packages on iOS26 (specification 10) in every deploy form, compressed and not:
the same logits through `Session` as the same package for iOS18, the forms' logits near the
plain package's, the device's structure, a clean Neural Engine preflight."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import rlx_mil
from rlx_mil.coreml.package_info import package_info
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.models.random_checkpoint import write_random_checkpoint

from .ane_checks import assert_neural_engine_form
from .test_deployed_packages import CONFIG, PROMPT

#: name -> (target, deploy form, compress); each iOS26 package against its iOS18 twin.
SETTINGS = {f"{target}-{name}": (target, form, compress) for target in ("iOS18", "iOS26")
            for name, form, compress in (("plain", "plain", None), ("gpu-int8", "gpu", "int8"), ("ane", "ane", None),
                                         ("plain-lut6", "plain", "lut6"))}


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ios26")
    checkpoint = write_random_checkpoint(root / "llama", CONFIG, seed=11)
    made = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (target, form, compress) in SETTINGS.items():
            made[name] = root / f"{name}.mlpackage"
            convert_llm_checkpoint(checkpoint, made[name], max_context=32, prefill=[4], deploy=form, target=target,
                                   compress=compress)
    return made


def _logits(package: Path) -> list[np.ndarray]:
    session = Session(package, engine="milexec")
    return [session.feed(PROMPT), session.feed([9]), session.feed([23])]


@pytest.mark.parametrize("name", ["plain", "gpu-int8", "ane", "plain-lut6"])
def test_ios26_package_generates_the_ios18_logits(name: str, packages: dict[str, Path]) -> None:
    """The same program on both targets (compressed weights included): the same numbers."""
    info = package_info(packages[f"iOS26-{name}"])
    assert (info.target, info.spec_version) == ("iOS26", 10)
    for want, got in zip(_logits(packages[f"iOS18-{name}"]), _logits(packages[f"iOS26-{name}"]), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["gpu-int8", "ane"])
def test_ios26_forms_generate_the_plain_logits(name: str, packages: dict[str, Path]) -> None:
    tol = 2e-2 if SETTINGS[f"iOS26-{name}"][2] is None else 5e-2  # fp16 sums in another order; int8 weights
    for want, got in zip(_logits(packages["iOS26-plain"]), _logits(packages[f"iOS26-{name}"]), strict=True):
        scale = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= tol * scale


def test_ios26_neural_engine_form_and_preflight(packages: dict[str, Path]) -> None:
    program = rlx_mil.milexec.load_program(packages["iOS26-ane"])
    assert set(program.functions) == {"decode", "prefill_4"}
    assert_neural_engine_form(program)
    assert [f for f in rlx_mil.preflight(packages["iOS26-ane"], device="ane") if f.severity != "note"] == []
    gpu = rlx_mil.milexec.load_program(packages["iOS26-gpu-int8"])
    for function in gpu.functions.values():
        ops = [op.op_type for op in function.operations]
        assert "scaled_dot_product_attention" in ops and "constexpr_blockwise_shift_scale" in ops
