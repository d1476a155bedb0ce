"""On macOS, converted models are also checked through Core ML's own MLModel.predict on
CPU_ONLY and ALL; elsewhere these tests skip with the reason shown."""

from __future__ import annotations

import pytest
from graph_data import leaf_values

from rlx_mil.llm.runner import coreml_available
from rlx_mil.models.transformer import DecoderConfig, example_inputs, llama_decoder, random_params
from rlx_mil.testing import check_conversion

pytestmark = pytest.mark.skipif(
    not coreml_available(),
    reason="MLModel.predict needs macOS with the Core ML runtime; here the NumPy MIL executor checks conversions",
)


def test_decoder_matches_reference_through_core_ml() -> None:
    config = DecoderConfig(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2, seq=16)
    graph = llama_decoder(config)
    report = check_conversion(
        graph, random_params(graph, config), example_inputs(config), targets=["iOS17", "iOS18"], coreml=True
    )
    engines = {c.engine for c in report.checks}
    assert {"coreml[CPU_ONLY]", "coreml[ALL]"} <= engines


def test_fixture_graphs_match_reference_through_core_ml() -> None:
    from conftest import upstream_fixture_paths

    from rlx_mil.ir.graph import Graph

    paths = upstream_fixture_paths()
    if not paths:
        pytest.skip("upstream JSON fixtures absent: ../shared/fixtures/upstream-json not found")
    for path in paths:
        graph = Graph.from_json_file(path)
        inputs, params = leaf_values(graph)
        report = check_conversion(graph, params, inputs, targets=["iOS18"], coreml=True, roundtrip=False)
        assert any(c.engine.startswith("coreml") for c in report.checks)
