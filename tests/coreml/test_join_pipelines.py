"""Joining converted functions into one package runs no pass over them again: a program whose
passes are all skipped leaves each pipeline as it came, unvalidated and unprinted
(`rlx_mil.coreml.pipeline.passless_programs_left_alone`), and the joined program is not
validated or checked again (each function was, after its last pass)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline, PassPipelineManager
from coremltools.converters.mil.mil.program import Program

import rlx_mil
from rlx_mil.coreml.pipeline import passless_programs_left_alone
from rlx_mil.ir.graph import Graph


def _program_with_a_dead_op() -> Program:
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 4))])
    def prog(x: Any) -> Any:
        mb.exp(x=x, name="dead")
        return mb.relu(x=x, name="y")

    return prog


def _counting_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of functions of each program validated."""
    validated: list[int] = []
    real = Program.validate

    def counting(self: Program, *args: Any, **kwargs: Any) -> None:
        validated.append(len(self.functions))
        real(self, *args, **kwargs)

    monkeypatch.setattr(Program, "validate", counting)
    return validated


def test_a_passless_program_leaves_the_pipeline_unvalidated_and_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    validated = _counting_validations(monkeypatch)
    skipped = _program_with_a_dead_op()
    skipped.skip_all_passes = True
    with passless_programs_left_alone():
        PassPipelineManager.apply_pipeline(skipped, PassPipeline.DEFAULT)
    assert validated == []
    assert [op.op_type for op in skipped.functions["main"].operations] == ["exp", "relu"]


def test_other_programs_still_take_their_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    validated = _counting_validations(monkeypatch)
    program = _program_with_a_dead_op()
    with passless_programs_left_alone():
        PassPipelineManager.apply_pipeline(program, PassPipeline.DEFAULT)
    assert validated  # coremltools' own validations
    kinds = [op.op_type for op in program.functions["main"].operations]
    assert "relu" in kinds and "exp" not in kinds  # the dead exp eliminated


def _graph(width: int) -> Graph:
    g = Graph(f"f{width}")
    x = g.input("x", [width, 4])
    g.set_outputs([g.tanh(g.matmul(x, g.param("w", [4, 4])), name="y")])
    return g


def test_the_joined_program_is_not_validated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    validated = _counting_validations(monkeypatch)
    checked: list[int] = []
    real_check = Program._check_early_error_out_for_invalid_program

    def counting_check(self: Program) -> None:
        checked.append(len(self.functions))
        real_check(self)

    monkeypatch.setattr(Program, "_check_early_error_out_for_invalid_program", counting_check)
    w = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    model = rlx_mil.convert_functions({"one": _graph(1), "two": _graph(2)}, {"w": w})
    # each function's own program, never the joined one
    assert validated and set(validated) == {1}
    assert checked == [1, 1]
    spec = model.get_spec()
    assert {f.name for f in spec.description.functions} == {"one", "two"}
    from rlx_mil import milexec

    program = milexec.load_program(model.package_path)
    for name, rows in (("one", 1), ("two", 2)):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 8
        got = milexec.run(program, {"x": x}, function_name=name)["y"]
        np.testing.assert_allclose(got, np.tanh(x @ w), atol=2e-3, rtol=0)
