"""Fitted codes' calibration statistics gathered one sequence at a time, in bounded memory."""

from __future__ import annotations

import dataclasses
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil.compress import parse_compress
from rlx_mil.compress.calibration import input_activations
from rlx_mil.compress.fitting import input_hessian, refit_scales, refit_table
from rlx_mil.compress.moments import FitFeed, SecondMoment, fit_tokens, second_moments
from rlx_mil.lowering.target import Precision, Target
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

SEQ = 32
CONFIG = TinyLM(layers=2, seq=SEQ, hidden=32, intermediate=48, vocab=64)


@settings(max_examples=25, deadline=None)
@given(width=st.integers(1, 12), chunks=st.lists(st.integers(0, 9), min_size=1, max_size=5), seed=st.integers(0, 99))
def test_a_moment_gathered_in_chunks_is_the_one_shot_hessian(width: int, chunks: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal((n, width)).astype(np.float32) * rng.uniform(0.1, 30) for n in chunks]
    if parts[0].shape[0]:
        parts[0][0] = 0  # an all-zero position counts and adds nothing, as in input_hessian
    moment = SecondMoment(width)
    for part in parts:
        moment.add(part)
    rows = np.concatenate(parts)
    assert moment.count == rows.shape[0]
    np.testing.assert_allclose(moment.hessian(), input_hessian(rows), rtol=1e-5, atol=1e-6)
    # Rows while no more than the width, then only their Gram matrix: never more than width^2.
    assert moment.held == (rows.shape[0] * width if rows.shape[0] <= width else width * width)
    factor, count = moment.factor()
    assert count == rows.shape[0] and factor.shape[0] <= width
    np.testing.assert_allclose(factor.T @ factor / max(count, 1), input_hessian(rows), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("positions", [20, 200])  # fewer rows than inputs (rows kept), more (Gram matrix)
def test_a_refit_from_the_moment_equals_the_refit_from_the_rows(positions: int) -> None:
    rng = np.random.default_rng(positions)
    width, out, k = 40, 24, 16
    x = rng.standard_normal((positions, width)) * np.exp(rng.standard_normal(width))
    w = rng.standard_normal((out, width))
    scale = np.abs(w).max(axis=1)
    table = np.sort(rng.uniform(-1, 1, k))
    codes = np.abs((w / scale[:, None])[:, :, None] - table).argmin(-1)
    moment = SecondMoment(width)
    for part in np.array_split(x, 3):
        moment.add(part)
    got_table, got_codes = refit_table(w, codes, table, scale, moment)
    want_table, want_codes = refit_table(w, codes, table, scale, x)
    np.testing.assert_allclose(got_table, want_table, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(got_codes, want_codes)
    np.testing.assert_allclose(refit_scales(w, codes, table, scale, moment), refit_scales(w, codes, table, scale, x),
                               rtol=1e-4)


def _sequences(count: int) -> list[dict[str, np.ndarray]]:
    return [tiny_lm_inputs(CONFIG, seed=10 + i) for i in range(count)]


def test_the_gather_over_several_sequences_equals_the_hessian_of_all_their_rows() -> None:
    graph = tiny_lm(CONFIG)
    params = tiny_lm_params(graph, CONFIG)
    first, *more = _sequences(3)
    feeds = [FitFeed(first, SEQ // 2), *(FitFeed(m) for m in more)]
    got = second_moments(graph, params, feeds)
    assert fit_tokens(feeds) == SEQ // 2 + 2 * SEQ
    rows = [input_activations(graph, params, s) for s in (first, *more)]
    assert set(got) == set(rows[0])
    for name in got:
        x = np.concatenate([rows[0][name][:SEQ // 2], *(r[name] for r in rows[1:])])
        np.testing.assert_allclose(got[name].hessian(), input_hessian(x), rtol=1e-5, atol=1e-7)
    # One statistic per distinct input: q/k/v share theirs, gate/up theirs.
    p = "layers.1."
    assert got[p + "self_attn.q_proj.weight"] is got[p + "self_attn.k_proj.weight"] is got[p + "self_attn.v_proj.weight"]
    assert got[p + "mlp.gate_proj.weight"] is got[p + "mlp.up_proj.weight"]
    assert got[p + "self_attn.o_proj.weight"] is not got[p + "self_attn.q_proj.weight"]
    only = second_moments(graph, params, feeds, names={p + "mlp.down_proj.weight"})
    assert set(only) == {p + "mlp.down_proj.weight"}


def _peak(work: Any) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_gather_holds_one_layers_values_not_the_whole_run() -> None:
    """What the gather runs holds one layer's working set: its peak does not grow with the
    depth, where a run keeping every value (`evaluate_all`, what the fit once gathered from)
    grows with it; the statistics themselves hold at most width^2 numbers per distinct input."""
    from rlx_mil.reference import evaluate_all, evaluate_visiting

    peaks: dict[str, list[int]] = {"visiting": [], "all": []}
    for layers in (2, 8):
        config = dataclasses.replace(CONFIG, layers=layers, seq=128)
        graph = tiny_lm(config)
        params = tiny_lm_params(graph, config)
        inputs = tiny_lm_inputs(config)
        nodes = [node.id for node in graph if node.op.type_name == "MatMul"]
        seen: list[int] = []
        run = (graph, inputs, params)
        peaks["visiting"].append(_peak(lambda run=run, nodes=nodes, seen=seen: evaluate_visiting(
            *run, nodes, lambda i, v: seen.append(i))))
        assert sorted(seen) == sorted(nodes)  # each visited once
        peaks["all"].append(_peak(lambda run=run: evaluate_all(*run)))
    # 6 more layers: about 1.9 MB more for a run holding every value, 0.2 MB (bookkeeping) here.
    assert peaks["visiting"][1] - peaks["visiting"][0] < 0.25 * (peaks["all"][1] - peaks["all"][0])
    graph = tiny_lm(CONFIG)
    params = tiny_lm_params(graph, CONFIG)
    got = second_moments(graph, params, [FitFeed(s) for s in _sequences(4)])
    for moment in {id(m): m for m in got.values()}.values():
        assert moment.count == 4 * SEQ
        assert moment.held <= moment.width * moment.width


@pytest.mark.filterwarnings("ignore::rlx_mil.errors.CompressionWarning")  # a tiny model: the budget is not met
def test_the_fits_own_sequences_reach_the_fit_and_the_plan_says_what_it_used() -> None:
    import rlx_mil.compress.plan as plan

    graph = tiny_lm(CONFIG)
    params = tiny_lm_params(graph, CONFIG)
    first, *more = _sequences(3)
    spec = parse_compress("auto4;fit=on")
    assert spec is not None
    compressor = plan.WeightCompressor(dataclasses.replace(spec, calibration=first, fit_calibration=tuple(more)), graph,
                                       Target.IOS18, Precision.FP32, params)
    assert compressor.plan is not None
    summary = compressor.plan.summary
    assert f"fitted codes measured on calibration positions {SEQ // 2}-{SEQ - 1}, which the fit did not use" in summary
    assert f"fitted on {SEQ // 2 + 2 * SEQ} tokens (positions 0-{SEQ // 2 - 1} and 2 more sequences of {SEQ})" in summary
    name = "layers.0.mlp.down_proj.weight"
    moment = compressor.fit.moment(name, CONFIG.intermediate)
    assert moment is not None and moment.count == SEQ // 2 + 2 * SEQ
    rows = [input_activations(graph, params, s)[name] for s in (first, *more)]
    np.testing.assert_allclose(moment.hessian(), input_hessian(np.concatenate([rows[0][:SEQ // 2], *rows[1:]])),
                               rtol=1e-5, atol=1e-7)
    fixed = parse_compress("lut4-scaled;fit=on")
    assert fixed is not None
    compressor = plan.WeightCompressor(dataclasses.replace(fixed, calibration=first, fit_calibration=(more[0],)), graph,
                                       Target.IOS18, Precision.FP32, params)
    moment = compressor.fit.moment(name, CONFIG.intermediate)
    assert moment is not None and moment.count == 2 * SEQ  # no split: every position of both


def test_a_fit_sequence_lacking_an_input_is_refused_by_name() -> None:
    import rlx_mil.compress.plan as plan
    from rlx_mil.errors import CompressionError

    graph = tiny_lm(CONFIG)
    params = tiny_lm_params(graph, CONFIG)
    spec = parse_compress("lut4-scaled;fit=on")
    assert spec is not None
    config = dataclasses.replace(spec, calibration=tiny_lm_inputs(CONFIG), fit_calibration=({"ids": np.zeros((1, SEQ))},))
    compressor = plan.WeightCompressor(config, graph, Target.IOS18, Precision.FP32, params)
    with pytest.raises(CompressionError, match=r"fit calibration sequence 0 lacks the graph's inputs \['input_ids'\]"):
        compressor.fit.hessian("layers.0.mlp.down_proj.weight", CONFIG.intermediate)  # the fit gathers at its first weight


def test_the_builtin_calibration_gives_the_fit_more_of_its_text_and_the_measurements_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Neural Engine's auto4 (fitted codes) measures on the built-in text's first 256 tokens
    (positions 128-255 scored) and fits on positions 0-127 plus the next 512 tokens in two
    sequences of 256; the GPU's auto4 (no fit) gets the first 128 tokens and nothing more."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    import rlx_mil.llm.calibration as calibration
    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression
    from rlx_mil.llm.calibration import with_builtin_calibration
    from rlx_mil.llm.text import TextTokenizer
    from tests.llm.text_fixtures import chat_checkpoint

    monkeypatch.setattr(calibration, "FIT_TOKENS", 640)
    with TemporaryDirectory() as tmp:
        folder = chat_checkpoint(Path(tmp) / "chat")
        ids = TextTokenizer(folder).encode(builtin_text("calibration"))
        spec = parse_compress("auto4")
        assert spec is not None
        ane = with_builtin_calibration(spec, form_compression(spec, DeployForm.ANE), folder)
        gpu = with_builtin_calibration(spec, form_compression(spec, DeployForm.GPU), folder)
    np.testing.assert_array_equal(ane.calibration["input_ids"], [ids[:256]])
    assert [m["input_ids"].tolist() for m in ane.fit_calibration] == [[ids[256:512]], [ids[512:768]]]
    assert fit_tokens([FitFeed(ane.calibration, 128), *(FitFeed(m) for m in ane.fit_calibration)]) == 640
    np.testing.assert_array_equal(gpu.calibration["input_ids"], [ids[:128]])
    assert gpu.fit_calibration == ()


def test_the_calibration_text_shares_no_phrase_with_the_held_out_text() -> None:
    """The quality check and `rlx-mil eval` measure on the held-out text: no run of 4 words of
    it is in the calibration text the codes are fitted and the plan measured on."""
    import re

    from rlx_mil.compress.builtin_text import builtin_text

    def grams(part: str, n: int = 4) -> set[tuple[str, ...]]:
        words = re.findall(r"[a-z0-9']+", builtin_text(part).lower())  # type: ignore[arg-type]
        return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}

    calibration, heldout = grams("calibration"), grams("heldout")
    assert len(calibration) > 650 and len(heldout) > 300
    assert calibration & heldout == set()


def test_a_split_run_gives_the_fit_each_sequences_positions_before_the_split_only() -> None:
    x = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)  # 2 sequences of 6 positions, width 3
    feed = FitFeed({"input_ids": np.zeros((2, 6), np.int32)}, 4)
    got = feed.rows(x)
    assert got is not None
    np.testing.assert_array_equal(got, np.concatenate([x[0, :4], x[1, :4]]))
    assert feed.rows(x.reshape(-1, 3)[:5]) is None  # not one row per position: not fitted at all
    whole = FitFeed({"input_ids": np.zeros((2, 6), np.int32)}).rows(x)
    assert whole is not None and whole.shape == (12, 3)
