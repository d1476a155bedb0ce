"""autoN's measurements over a vocabulary sample (`rlx_mil.compress.vocab_sample`): a large
vocabulary's head computed on the reference's top candidates plus a uniform sample of the rest
gives the mean KL the whole head gives, and lets the planner measure a model whose head was
too large to measure."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import numpy as np
import pytest

import rlx_mil.compress.vocab_sample as vocab_sample
from rlx_mil.compress import parse_compress
from rlx_mil.compress.auto import plan_auto
from rlx_mil.compress.plan import encode
from rlx_mil.compress.quality import kl_per_position
from rlx_mil.compress.quality_check import next_token_targets
from rlx_mil.compress.schemes import parse_scheme
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.reference import evaluate
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

CONFIG = TinyLM(vocab=3008, hidden=32, heads=2, kv_heads=1, intermediate=64, layers=2, seq=24, tied=True)
GRAPH = tiny_lm(CONFIG)


def _params() -> dict[str, np.ndarray]:
    params = tiny_lm_params(GRAPH, CONFIG)
    params["embed_tokens.weight"] *= 0.6  # logits with a few likely tokens over a long tail, as a trained model's
    return params


PARAMS = _params()
INPUTS = tiny_lm_inputs(CONFIG)
KEEP = next_token_targets(INPUTS, (1, CONFIG.seq, CONFIG.vocab))


@pytest.fixture
def small_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sample's sizes scaled to the tiny vocabulary: 8 top candidates a position, 300 others."""
    monkeypatch.setattr(vocab_sample, "VOCAB_LIMIT", 1000)
    monkeypatch.setattr(vocab_sample, "TOP_CANDIDATES", 8)
    monkeypatch.setattr(vocab_sample, "TAIL_SAMPLE", 300)


def _lut(name: str, bits: int) -> np.ndarray:
    scheme = parse_scheme(f"lut{bits}")
    assert scheme is not None
    value = PARAMS[name]
    storage = value.T if name != "embed_tokens.weight" else value  # [out, in] as stored
    back = encode(np.ascontiguousarray(storage), scheme, Precision.FP32, name).dequantize()
    return np.asarray(back.T if name != "embed_tokens.weight" else back, np.float32).reshape(value.shape)


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert vocab_sample.VOCAB_LIMIT is None and vocab_sample.large_head(GRAPH) is None
    monkeypatch.setattr(vocab_sample, "TOP_CANDIDATES", 8)
    monkeypatch.setattr(vocab_sample, "TAIL_SAMPLE", 300)
    assert vocab_sample.large_head(GRAPH) is None and vocab_sample.large_head(GRAPH, 1000) is not None


@pytest.mark.usefixtures("small_sample")
def test_the_sampled_head_finds_the_tied_head_and_stops_the_graph_at_its_input() -> None:
    head = vocab_sample.large_head(GRAPH)
    assert head is not None
    assert (head.weight, head.transposed, head.vocabulary, head.hidden_size) == ("embed_tokens.weight", True, 3008, 32)
    final = next(n.id for n in GRAPH if n.name == "final_norm")
    assert head.graph.outputs == (final,) and len(head.graph) == final + 1
    assert head.skipped_elements(24) == (3008 - 8 * 24 - 300) * 32
    untied = dataclasses.replace(CONFIG, tied=False)
    found = vocab_sample.large_head(tiny_lm(untied))
    assert found is not None and (found.weight, found.transposed) == ("head.weight", False)
    assert vocab_sample.large_head(tiny_lm(dataclasses.replace(CONFIG, vocab=900))) is None  # within the limit


@pytest.mark.usefixtures("small_sample")
@pytest.mark.parametrize(("name", "bits"), [("layers.0.self_attn.q_proj.weight", 2), ("layers.1.mlp.down_proj.weight", 3),
                                            ("embed_tokens.weight", 3), ("norm.weight", 0)])
def test_the_sampled_kl_is_the_whole_heads(name: str, bits: int) -> None:
    """One weight replaced (a layer's, or the tied head itself): the sample's mean KL against
    the one of the full 3,008-token logits (`kl_per_position`, what the plan measured before)."""
    assert KEEP is not None
    head = vocab_sample.large_head(GRAPH)
    assert head is not None
    hidden = evaluate(head.graph, INPUTS, PARAMS)
    head.prepare(next(iter(hidden.values())), PARAMS["embed_tokens.weight"], KEEP[0])
    assert len(head.rows) < 0.4 * CONFIG.vocab
    changed = dict(PARAMS)
    changed[name] = _lut(name, bits) if bits else PARAMS[name] * np.float32(1.2)
    want_logits = evaluate(GRAPH, INPUTS, PARAMS)["logits"][KEEP[0]]
    got_logits = evaluate(GRAPH, INPUTS, changed)["logits"][KEEP[0]]
    exact = float(np.mean(kl_per_position(want_logits, got_logits)))
    sampled = head.mean_kl(next(iter(evaluate(head.graph, INPUTS, changed).values())),
                           changed[name] if name == head.weight else None)
    assert exact > 1e-3
    assert sampled == pytest.approx(exact, rel=0.05), (sampled, exact)
    assert head.mean_kl(next(iter(hidden.values()))) == pytest.approx(0.0, abs=1e-9)  # the reference itself


def _planned(monkeypatch: pytest.MonkeyPatch, limit: int) -> tuple[Any, dict[str, Any]]:
    import rlx_mil.compress.plan as plan

    monkeypatch.setattr(plan, "MEASURE_LIMIT", limit)
    captured: dict[str, Any] = {}
    real = plan_auto  # the planner itself (an earlier call's spy is replaced)

    def spy(*args: Any, **kwargs: Any) -> Any:
        captured.update(inspect.signature(real).bind(*args, **kwargs).arguments)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan, "plan_auto", spy)
    config = dataclasses.replace(parse_compress("auto4"), calibration=INPUTS)  # type: ignore[arg-type]
    compressor = plan.WeightCompressor(config, GRAPH, Target.IOS18, Precision.FP32, PARAMS)
    assert compressor.plan is not None
    return compressor.plan, captured


@pytest.mark.usefixtures("small_sample")
def test_a_model_whose_head_was_too_large_to_measure_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A measuring limit of 7 runs of the model without its head's unsampled rows: its 7 planned
    weights are measured, where counting the whole head fewer than 8 runs fit and none was."""
    elements = sum(int(v.size) for v in PARAMS.values() if v.dtype.kind == "f")
    head = vocab_sample.large_head(GRAPH)
    assert head is not None
    limit = 7 * (elements - head.skipped_elements(CONFIG.seq)) * CONFIG.seq
    assert limit // (elements * CONFIG.seq) < 8
    planned, captured = _planned(monkeypatch, limit)
    assert planned.summary.endswith("measured output sensitivities); predicted mean KL " + planned.summary.split()[-1])
    assert captured["loss_unit"] == "mean KL" and captured.get("sample") is None and len(planned.schemes) == 7
    scheme = parse_scheme("lut3")
    assert scheme is not None
    measured = {n: captured["measure"](n, scheme) for n in ("layers.1.mlp.down_proj.weight", "embed_tokens.weight")}
    monkeypatch.setattr(vocab_sample, "VOCAB_LIMIT", 10**6)  # the whole head: as before
    before, nothing = _planned(monkeypatch, limit)
    assert nothing.get("measure") is None and "measured" not in before.summary
    _, whole = _planned(monkeypatch, 10**15)  # the whole head, measured: what the sample estimates
    for name, value in measured.items():
        assert value > 1e-3 and value == pytest.approx(whole["measure"](name, scheme), rel=0.05), name
