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


def _transposed_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    """A transpose feeding an element-wise op: `reduce_transposes` runs on its program."""
    g = Graph("transposed")
    x = g.input("x", [2, 4])
    g.set_outputs([g.tanh(g.transpose(g.matmul(x, g.param("w", [4, 4])), [1, 0]), name="y")])
    return g, {"w": np.eye(4, dtype=np.float32)}


def _counting_function_text(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from coremltools.converters.mil.mil.block import Function

    printed: list[Any] = []
    real = Function.__str__

    def counting(self: Any) -> str:
        printed.append(self)
        return real(self)

    monkeypatch.setattr(Function, "__str__", counting)
    return printed


def test_passes_print_their_function_only_while_debug_logging_is_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from rlx_mil.coreml.pipeline import needs_reduce_transposes, rlx_passes

    graph, params = _transposed_graph()
    assert needs_reduce_transposes(rlx_mil.lower(graph, params))
    printed = _counting_function_text(monkeypatch)
    rlx_mil.convert(graph, params)
    assert printed == []
    with caplog.at_level(logging.DEBUG, logger="coremltools"):
        rlx_mil.convert(graph, params)
    passes = rlx_passes(rlx_mil.lower(graph, params))
    runs = {"optimize transpose": passes.count("common::reduce_transposes"),
            "fuse_layernorm_or_instancenorm": passes.count("common::fuse_layernorm_or_instancenorm")}
    assert all(runs.values())
    assert len(printed) == 2 * sum(runs.values())  # before and after each run's transform
    for pass_name, count in runs.items():
        logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"Block after {pass_name}")]
        assert len(logged) == count and all("tanh" in text for text in logged)


def test_other_function_printouts_are_the_whole_function() -> None:
    graph, params = _transposed_graph()
    function = rlx_mil.lower(graph, params).functions["main"]
    text = str(function)
    with program_text_only_when_logged():
        assert str(function) == text
    assert "transpose" in text and "tanh" in text
