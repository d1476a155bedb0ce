"""A conversion prints its program for coremltools' pass-pipeline debug log only when that log
is on (`rlx_mil.coreml.pipeline.program_text_only_when_logged`); other printouts are unchanged."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from coremltools.converters.mil.mil.program import Program

import rlx_mil
from rlx_mil.coreml.pipeline import program_text_only_when_logged
from rlx_mil.ir.graph import Graph


def _graph() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("printed")
    x = g.input("x", [2, 4])
    g.set_outputs([g.relu(g.matmul(x, g.param("w", [4, 4])), name="y")])
    return g, {"w": np.eye(4, dtype=np.float32)}


def _counting_text(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    printed: list[Any] = []
    real = Program.__str__

    def counting(self: Any) -> str:
        printed.append(self)
        return real(self)

    monkeypatch.setattr(Program, "__str__", counting)
    return printed


def test_the_pipelines_do_not_print_the_program_while_debug_logging_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    printed = _counting_text(monkeypatch)
    graph, params = _graph()
    rlx_mil.convert(graph, params)
    assert printed == []


def test_with_debug_logging_each_pipeline_logs_the_program(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    printed = _counting_text(monkeypatch)
    graph, params = _graph()
    with caplog.at_level(logging.DEBUG, logger="coremltools"):
        rlx_mil.convert(graph, params)
    assert len(printed) == 6  # before and after each of the three pipelines
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Program after")]
    assert len(logged) == 3 and all("-> (%y)" in text for text in logged)


def test_other_printouts_are_the_whole_program() -> None:
    graph, params = _graph()
    program = rlx_mil.lower(graph, params)
    text = str(program)
    with program_text_only_when_logged():
        assert str(program) == text
    assert "main[CoreML8](%x: (2, 4, fp32)" in text and "-> (%y)" in text
