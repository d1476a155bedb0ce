"""Hybrid decoders built with the graph builder (models/hybrid.py): attention and MoE MLP layers,
converted and verified through the executor in fp32 and fp16."""

from __future__ import annotations

import numpy as np
from e2e.factory import fp16_tolerance, verify

from models.hybrid import HybridBuilder, HybridConfig, hybrid_params
from rlx_mil.ir.graph import Graph
from rlx_mil.lower.target import Target
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
