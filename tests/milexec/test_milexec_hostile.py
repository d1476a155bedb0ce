"""Hostile arguments to the executor API (and the macOS runner's name maps): typed errors,
refused before anything large is allocated."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import EvaluationError, MilExecError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.naming import IO_NAMES_METADATA_KEY
from rlx_mil.llm.runner import io_name_maps


def _graph() -> Graph:
    g = Graph("hostile_exec")
    x = g.input("x", [2, 4])
    g.set_outputs([g.relu(x, name="y")])
    return g


@pytest.fixture(scope="module")
def model() -> Iterator[Any]:
    converted = rlx_mil.convert(_graph(), precision="fp32")
    yield converted
    shutil.rmtree(converted.package_path, ignore_errors=True)


@pytest.mark.parametrize(
    "metadata, message",
    [
        ("[" * 100_000 + "]" * 100_000, "nests 100000 levels deep"),
        ('{"inputs": {"x": {"y": {"z": 1}}}}', "nests 4 levels deep"),
        ('{"inputs": {"x": 1}}', "must map interface names to IR names"),
        ("{", "not valid JSON"),
        ("", "not valid JSON"),
    ],
)
def test_hostile_io_names_metadata(model: Any, metadata: str, message: str) -> None:
    saved = model.user_defined_metadata[IO_NAMES_METADATA_KEY]
    model.user_defined_metadata[IO_NAMES_METADATA_KEY] = metadata
    try:
        with pytest.raises(MilExecError, match=message):
            milexec.run(model, {"x": np.zeros((2, 4), np.float32)})
        with pytest.raises(MilExecError, match=message):
            io_name_maps(model)
    finally:
        model.user_defined_metadata[IO_NAMES_METADATA_KEY] = saved


@pytest.mark.parametrize(
    "states, message",
    [([1, 2], "states must map state names to arrays, got list"), ("cache", "got str"),
     ({"cache": "abc"}, "unexpected state 'cache' \\(model states: none\\)")],
)
def test_hostile_states(model: Any, states: Any, message: str) -> None:
    with pytest.raises(MilExecError, match=message):
        milexec.run(model, {"x": np.zeros((2, 4), np.float32)}, states=states)


def test_a_huge_feed_is_refused_by_its_shape_before_any_cast(model: Any) -> None:
    # 4e9 float64 elements (32 GB if materialised) that occupy 8 bytes: a cast would allocate.
    huge = np.broadcast_to(np.float64(1.0), (10**9, 4))
    start = time.perf_counter()
    with pytest.raises(MilExecError, match=r"input 'x': shape \(1000000000, 4\), expected \(2, 4\)"):
        milexec.run(model, {"x": huge})
    with pytest.raises(EvaluationError, match=r"input 'x': shape \[1000000000, 4\] does not match"):
        reference.evaluate(_graph(), {"x": huge})
    assert time.perf_counter() - start < 10
