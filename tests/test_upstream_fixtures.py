"""Every graph serialised by upstream RLX converts for every target and computes the
reference's numbers after conversion (through the NumPy MIL executor)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import upstream_fixture_paths
from graph_data import leaf_values

from rlx_mil.errors import UnsupportedOpError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.testing import Tolerance, check_conversion, supported_targets

FIXTURES = upstream_fixture_paths()
pytestmark = pytest.mark.skipif(
    not FIXTURES, reason="upstream JSON fixtures absent: ../shared/fixtures/upstream-json not found"
)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_converts_and_matches_reference(path: Path) -> None:
    graph = Graph.from_json_file(path)
    inputs, params = leaf_values(graph)
    targets = supported_targets(graph)
    assert targets, f"{path.name}: some op has no lowering rule"
    report = check_conversion(
        graph, params, inputs, targets=targets, roundtrip=(path.stem == "llama_layer"),
        tolerances={Precision.FP16: Tolerance(5e-2, 5e-2)},
    )
    assert report.checks and not report.failures


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_on_unsupported_targets_raises_typed_error(path: Path) -> None:
    import rlx_mil

    graph = Graph.from_json_file(path)
    _inputs, params = leaf_values(graph)
    supported = supported_targets(graph)
    for target in Target:
        if target in supported:
            continue
        with pytest.raises(UnsupportedOpError, match=target.label):
            rlx_mil.lower(graph, params, target=target)
