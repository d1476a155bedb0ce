"""`rlx-mil eval` scores a bucket of tokens per prefill call when the package's prefill returns
every position's logits (`all_logits`), with the same numbers as one decode call per token."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from tiny_llm_package import BUCKET, MAX_CONTEXT, VOCAB, tiny_checkpoint, tiny_stateful_package

from rlx_mil.compress.quality import log_softmax
from rlx_mil.llm.evaluate import evaluate_text, session_logits
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("eval_chunked")
    checkpoint = tiny_checkpoint(folder, seed=7)
    all_rows = folder / "all.mlpackage"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert_llm_checkpoint(checkpoint, all_rows, max_context=MAX_CONTEXT, prefill=[BUCKET], precision="fp32",
                               all_logits=True)
    last_only = tiny_stateful_package(checkpoint, folder / "last")
    return all_rows, last_only


def _ids(n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(3).integers(0, VOCAB, n)]


def test_chunked_scores_equal_token_by_token(packages: tuple[Path, Path]) -> None:
    session = Session(packages[0], engine="milexec")
    assert {f.name: f.rows for f in session.functions} == {f"prefill_{BUCKET}": BUCKET, "decode": 1}
    ids = _ids(2 * MAX_CONTEXT + 5)  # two full windows and a short one
    window = ids[:MAX_CONTEXT]
    chunked = np.stack(list(session_logits(session)(window)))
    calls = list(session.calls)
    single = np.stack(list(session_logits(session, chunked=False)(window)))
    assert chunked.shape == single.shape == (MAX_CONTEXT - 1, VOCAB)
    # 15 predictions: three prefill calls of 4, then three decode calls.
    assert calls == [(f"prefill_{BUCKET}", BUCKET)] * 3 + [("decode", 1)] * 3
    assert session.calls == [("decode", 1)] * (MAX_CONTEXT - 1)
    targets = window[1:]
    lp_chunked = log_softmax(chunked)[np.arange(len(targets)), targets]
    lp_single = log_softmax(single)[np.arange(len(targets)), targets]
    np.testing.assert_allclose(lp_chunked, lp_single, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chunked, single, rtol=1e-4, atol=1e-4)
    fast = evaluate_text(session_logits(session), ids, MAX_CONTEXT)
    slow = evaluate_text(session_logits(session, chunked=False), ids, MAX_CONTEXT)
    assert fast.scored == slow.scored == len(ids) - 3
    assert fast.perplexity == pytest.approx(slow.perplexity, rel=1e-6)
    # The last-position-only package gives the same model's scores through decode calls.
    last = Session(packages[1], engine="milexec")
    assert {f.name: f.rows for f in last.functions} == {f"prefill_{BUCKET}": 1, "decode": 1}
    ref = evaluate_text(session_logits(last), ids, MAX_CONTEXT)
    assert last.calls == [("decode", 1)] * 4  # the last window: 5 tokens, 4 predictions
    assert ref.perplexity == pytest.approx(slow.perplexity, rel=1e-5)


def test_generation_unchanged_by_all_logits(packages: tuple[Path, Path]) -> None:
    prompt = _ids(7)
    texts = [Session(p, engine="milexec").generate(prompt, max_new_tokens=5) for p in packages]
    assert texts[0] == texts[1]


def test_feed_rows_rejects_overflow(packages: tuple[Path, Path]) -> None:
    from rlx_mil.llm.sampling import GenerationError

    session = Session(packages[0], engine="milexec")
    with pytest.raises(GenerationError, match="cache holds"):
        session.feed_rows(_ids(MAX_CONTEXT + 1))
    with pytest.raises(GenerationError, match="at least one"):
        session.feed_rows([])


def test_cli_all_logits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_mil.cli import main

    checkpoint = tiny_checkpoint(tmp_path, seed=7)
    out = tmp_path / "cli.mlpackage"
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "--max-context", str(MAX_CONTEXT),
                 "--prefill", str(BUCKET), "--all-logits", "--precision", "fp32", "--quiet"]) == 0
    session = Session(out, engine="milexec")
    assert {f.name: f.rows for f in session.functions} == {f"prefill_{BUCKET}": BUCKET, "decode": 1}
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path / "g.mlpackage"), "--graph-only",
                 "--all-logits"]) == 1
    assert "--all-logits shapes the stateful package" in capsys.readouterr().err
