"""The executor's input contract: every feed checked against what the program declares, value
ranges included (token ids within the vocabulary, cache_position within the cache), so what
the reference refuses is refused, and what it accepts gives the reference's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_llm_package import BUCKET, MAX_CONTEXT, VOCAB, tiny_checkpoint, tiny_stateful_package

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import EvaluationError, MilExecError, RlxMilError
from rlx_mil.input_contract import INPUT_RANGES_METADATA_KEY
from rlx_mil.models import from_pretrained

SEQ = BUCKET


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck"), seed=5)


@pytest.fixture(scope="module")
def prefill(checkpoint: Path) -> tuple[Any, Any, Any]:
    graph, params = from_pretrained(checkpoint, seq_len=SEQ)
    return graph, params, rlx_mil.convert(graph, params, precision="fp32")


@pytest.fixture(scope="module")
def stateful(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_stateful_package(checkpoint, tmp_path_factory.mktemp("pkg"))


def test_packages_declare_the_ranges(prefill: tuple[Any, Any, Any], stateful: Path) -> None:
    meta = prefill[2].user_defined_metadata
    assert json.loads(meta[INPUT_RANGES_METADATA_KEY]) == {"main": {"input_ids": [0, VOCAB - 1]}}
    import coremltools as ct

    saved = ct.models.MLModel(str(stateful), skip_model_load=True).user_defined_metadata
    assert json.loads(saved[INPUT_RANGES_METADATA_KEY]) == {
        "decode": {"input_ids": [0, VOCAB - 1], "position_ids": [0, MAX_CONTEXT - 1], "cache_position": [0, MAX_CONTEXT - 1]},
        f"prefill_{SEQ}": {"input_ids": [0, VOCAB - 1], "position_ids": [0, MAX_CONTEXT - 1],
                           "cache_position": [0, MAX_CONTEXT - SEQ]},
    }


def test_a_negative_token_id_is_refused_like_the_reference(prefill: tuple[Any, Any, Any]) -> None:
    graph, params, model = prefill
    ids = np.array([[1, 2, -1, 3]], np.int32)
    with pytest.raises(EvaluationError, match="Gather index out of range"):
        reference.evaluate(graph, {"input_ids": ids}, params)
    with pytest.raises(MilExecError, match=r"input 'input_ids': 1 value outside the declared range \[0, 95\], e.g. -1 at \[0, 2\]"):
        milexec.run(model, {"input_ids": ids})


@pytest.mark.parametrize("position", [-1, MAX_CONTEXT, 2**31 - 1])
def test_a_cache_position_outside_the_cache_is_refused(stateful: Path, position: int) -> None:
    feeds = {"input_ids": np.array([[3]]), "position_ids": np.array([[0]]), "cache_position": np.array([position])}
    with pytest.raises(MilExecError, match="input 'cache_position': 1 value outside the declared range"):
        milexec.run(stateful, feeds, function_name="decode")


_IDS = st.one_of(
    st.lists(st.integers(-3, VOCAB + 3), min_size=SEQ, max_size=SEQ).map(lambda v: np.array([v], np.int32)),
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=SEQ + 1).map(lambda v: np.array([v], np.int32)),
    st.sampled_from([np.zeros((1, SEQ), np.float32) + 0.5, np.full((1, SEQ), np.nan), np.zeros((2, SEQ), np.int64),
                     np.array([[2**40] * SEQ]), np.zeros((1, SEQ), bool), "text"]),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ids=_IDS)
def test_prefill_feeds_typed_error_or_the_reference(prefill: tuple[Any, Any, Any], ids: Any) -> None:
    graph, params, model = prefill
    try:
        want = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    except RlxMilError:
        want = None
    try:
        got = milexec.run(model, {"input_ids": ids})["logits"]
    except MilExecError:
        assert want is None, f"the executor refused feeds the reference accepts: {ids!r}"
        return
    assert want is not None, f"the executor accepted feeds the reference refuses: {ids!r}"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(function=st.sampled_from(["decode", f"prefill_{SEQ}"]), position=st.integers(-4, MAX_CONTEXT + 4),
       token=st.integers(-2, VOCAB + 1))
def test_stateful_feeds_typed_error_or_finite_logits(stateful: Path, function: str, position: int, token: int) -> None:
    n = 1 if function == "decode" else SEQ
    feeds = {"input_ids": np.full((1, n), token, np.int32),
             "position_ids": np.clip(np.arange(position, position + n), -1, None)[None].astype(np.int32),
             "cache_position": np.array([position], np.int32)}
    fits = 0 <= position <= MAX_CONTEXT - n and 0 <= token < VOCAB
    try:
        logits = milexec.run(stateful, feeds, function_name=function, precision_model="float32")["logits"]
    except MilExecError as err:
        assert not fits, f"refused feeds within the contract: {err}"
        assert "declared range" in str(err)
        return
    assert fits, f"accepted cache_position {position} / token {token} for {function}"
    assert np.isfinite(logits).all()
