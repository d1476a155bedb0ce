"""Hybrid decoders: an attention layer, a Gated DeltaNet layer and MoE MLPs built with the graph
builder, and Qwen3.5-style hybrid models as upstream JSON (both versions), each converted and
verified through the executor in fp32 and fp16."""

from __future__ import annotations

import numpy as np
import pytest
from e2e.factory import fp16_tolerance, verify

from models.hybrid import HybridBuilder, HybridConfig, hybrid_params
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Target
from rlx_mil.reference import evaluate

#: A few layers of fp16 rounding: logits of O(1) agree to ~1e-2.
TOLERANCES = fp16_tolerance(4e-2, 4e-2)


def _inputs(config: HybridConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, config.vocab, (config.batch, config.seq)).astype(np.int32)}


def _build(config: HybridConfig, kinds: list[str] | None, seed: int) -> tuple[Graph, dict[str, np.ndarray]]:
    builder = HybridBuilder(config)
    graph = builder.model(kinds)
    return graph, hybrid_params(builder, seed)


def _check(graph: Graph, params: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    logits = evaluate(graph, inputs, params)["logits"]
    assert logits.shape == (1, 5, 32) and np.isfinite(logits).all() and float(np.std(logits)) > 0.1
    verify(graph, inputs, params, tolerances=TOLERANCES, targets=[Target.IOS18])


def test_attention_and_moe_block() -> None:
    """A gated full-attention layer with a top-2-of-4 MoE MLP and a shared expert."""
    graph, params = _build(HybridConfig(), ["full"], 3)
    _check(graph, params, _inputs(HybridConfig(), 4))


def test_hybrid_decoder_block() -> None:
    """Attention layer + Gated DeltaNet layer, each followed by the MoE MLP."""
    graph, params = _build(HybridConfig(), ["full", "linear"], 5)
    assert {n.op.type_name for n in graph} >= {"Attention", "GatedDeltaNet", "GroupedMatMul", "TopK"}
    _check(graph, params, _inputs(HybridConfig(), 6))


@pytest.mark.parametrize("version", ["0.2.2", "newest"])
def test_qwen35_style_hybrid_json(version: str) -> None:
    """Three Gated DeltaNet layers and a full-attention layer (full_attention_interval 4), written
    as upstream JSON, read back, converted and verified."""
    config = HybridConfig(newest_ops=version == "newest")
    built, params = _build(config, None, 7)
    kinds = [n.op.type_name for n in built if n.op.type_name in ("Attention", "GatedDeltaNet")]
    assert kinds == ["GatedDeltaNet"] * 3 + ["Attention"]
    text = built.to_json(version=version)
    loaded = Graph.from_json(text)
    assert loaded.json_version == version and loaded.to_json() == text
    inputs = _inputs(config, 8)
    np.testing.assert_array_equal(evaluate(loaded, inputs, params)["logits"], evaluate(built, inputs, params)["logits"])
    _check(loaded, params, inputs)
