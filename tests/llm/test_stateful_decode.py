"""Stateful KV cache on hand-written upstream-form decode graphs: a prompt plus 16 decode steps
through the MIL executor, every step against the stateless graph run by the reference."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_mil.ir.graph import Graph

from .decode_graphs import TinyLM, decode_graph, tiny_params
from .stepping import StatelessReference, convert_stateful, full_sequence_logits, run_stateful

MAX_CONTEXT = 32
PROMPT = [5, 17, 3, 41, 8]
DECODE_STEPS = 16
#: fp16 states and fp16 programs against the fp32 reference: logits agree to this absolute
#: error (logits here are O(1)-O(10)); documented in docs/llm.md.
FP16_LOGITS_ATOL = 0.02
FP32_LOGITS_ATOL = 2e-5


def _graph(graph: Graph, from_json: bool) -> Graph:
    """`from_json`: the graph as upstream RLX would hand it over, through the JSON interchange."""
    return Graph.from_json(graph.to_json()) if from_json else graph


def generate_and_compare(
    c: TinyLM, precision: str, layout: str = "stacked", precision_model: str = "declared",
    hidden: frozenset[int] = frozenset(), from_json: bool = False, attention: str = "auto", target: str = "iOS18",
) -> list[float]:
    params = tiny_params(c)
    models = {
        n: convert_stateful(_graph(decode_graph(c, n, 3), from_json), params, max_context=MAX_CONTEXT, precision=precision, cache_layout=layout,
                            attention=attention, target=target)
        for n in (len(PROMPT), 1)
    }
    states: dict[str, np.ndarray] = {}
    stateless = StatelessReference(c, params, hidden)
    tokens = list(PROMPT)
    errors = []
    chunk, position = list(PROMPT), 0
    for _ in range(DECODE_STEPS + 1):
        got = run_stateful(models, c, chunk, position, states, MAX_CONTEXT, precision_model, hidden)
        want = stateless(chunk)
        if c.mask not in ("custom", "none"):
            # Causal masks: the stateless step equals the plain graph over the whole sequence.
            np.testing.assert_allclose(want, full_sequence_logits(c, params, tokens), atol=1e-4, rtol=0)
        errors.append(float(np.max(np.abs(got - want))))
        position += len(chunk)
        chunk = [int(np.argmax(want[0, -1]))]
        tokens += chunk
    return errors


@pytest.mark.parametrize(
    "config",
    [
        TinyLM(heads=4, kv_heads=2),  # GQA
        TinyLM(heads=4, kv_heads=4),  # MHA
        TinyLM(heads=4, kv_heads=1, mask="sliding:3"),  # MQA, sliding window shorter than the run
        TinyLM(heads=4, kv_heads=2, mask="custom"),  # key-padding mask input
        TinyLM(heads=4, kv_heads=2, layout="bshd"),  # caches joined along axis 1
        TinyLM(heads=4, kv_heads=2, mask="none"),  # no mask: every written slot, no unwritten one
    ],
    ids=["gqa", "mha", "mqa-sliding", "gqa-custom", "gqa-bshd", "gqa-unmasked"],
)
def test_fp32_program_matches_stateless_graph_every_step(config: TinyLM) -> None:
    # precision_model="float32": the executor keeps the fp16 state in fp32, so the comparison
    # checks the transformation itself, tightly.
    errors = generate_and_compare(config, "fp32", precision_model="float32")
    assert len(errors) == DECODE_STEPS + 1
    assert max(errors) < FP32_LOGITS_ATOL, errors


@pytest.mark.parametrize("layout", ["stacked", "per_layer"])
@pytest.mark.parametrize("mask", ["causal", "sliding:2"])
def test_fp16_matches_within_documented_tolerance(layout: str, mask: str) -> None:
    errors = generate_and_compare(TinyLM(mask=mask), "fp16", layout=layout)
    assert max(errors) < FP16_LOGITS_ATOL, errors


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_ios26_program_matches_stateless_graph_every_step(precision: str) -> None:
    """iOS26 (specification 10) keeps the KV cache in Core ML state as iOS18 does."""
    errors = generate_and_compare(TinyLM(mask="sliding:3"), precision, target="iOS26",
                                  precision_model="float32" if precision == "fp32" else "declared")
    assert max(errors) < (FP32_LOGITS_ATOL if precision == "fp32" else FP16_LOGITS_ATOL), errors


def test_fp32_program_with_fp16_states_as_on_device() -> None:
    # Declared precision: the state holds fp16, as Core ML's does; the rest runs in fp32.
    errors = generate_and_compare(TinyLM(), "fp32")
    assert max(errors) < FP16_LOGITS_ATOL / 4, errors


def test_key_padding_mask_hides_slots_like_the_stateless_graph() -> None:
    # Positions 1 and 3 of the prompt are padding; later keys stay visible.
    errors = generate_and_compare(TinyLM(mask="custom"), "fp32", precision_model="float32", hidden=frozenset({1, 3}))
    assert max(errors) < FP32_LOGITS_ATOL, errors


def test_rows_whose_mask_hides_every_written_key_average_them() -> None:
    # The whole prompt is masked: the prompt's rows see no key at all (uniform average over
    # the written keys, as the stateless graph's P+n keys); decode tokens see themselves.
    errors = generate_and_compare(TinyLM(mask="custom"), "fp32", precision_model="float32", hidden=frozenset(range(5)))
    assert max(errors) < FP32_LOGITS_ATOL, errors


def test_decode_graph_through_upstream_json_converts() -> None:
    errors = generate_and_compare(TinyLM(), "fp32", precision_model="float32", from_json=True)
    assert max(errors) < FP32_LOGITS_ATOL, errors


@pytest.mark.parametrize("mask", ["causal", "sliding:2", "custom"])
def test_decomposed_attention_reads_the_cache_too(mask: str) -> None:
    # The form softcapped attention takes: matmul / select / softmax / matmul over the cache.
    errors = generate_and_compare(TinyLM(mask=mask), "fp32", precision_model="float32", attention="decomposed")
    assert max(errors) < FP32_LOGITS_ATOL, errors
