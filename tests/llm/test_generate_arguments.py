"""`Session` and `rlx-mil generate` with hostile or careless arguments: a typed error naming the
argument, or the tokens the reference generates (greedy) / a reproducible sample."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_llm_package import MAX_CONTEXT, VOCAB, tiny_checkpoint, tiny_stateful_package

import rlx_mil
from rlx_mil.cli import main
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.generate import Session
from rlx_mil.llm.package import reference_greedy
from rlx_mil.models import from_pretrained


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck"), seed=7)


@pytest.fixture(scope="module")
def package(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_stateful_package(checkpoint, tmp_path_factory.mktemp("pkg"))


@pytest.fixture(scope="module")
def session(package: Path) -> Session:
    return Session(package, engine="milexec", precision_model="float32")


def test_an_in_memory_model_is_a_session(checkpoint: Path, session: Session) -> None:
    graph, params = from_pretrained(checkpoint, "decode", seq_len=1, cache_len=1, max_positions=MAX_CONTEXT,
                                    last_logits=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = rlx_mil.convert(graph, params, kv_cache="auto", max_context=MAX_CONTEXT, precision="fp32")
    in_memory = Session(model, engine="milexec", precision_model="float32")
    session.reset()
    assert in_memory.generate([5, 6, 7], 4) == session.generate([5, 6, 7], 4) == reference_greedy(checkpoint, [5, 6, 7], 4)


@pytest.mark.skipif(sys.platform == "darwin", reason="Core ML runs on macOS")
def test_engine_coreml_where_core_ml_cannot_run_is_a_plain_error(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidOptionError, match="engine 'coreml' needs macOS"):
        Session(package, engine="coreml")
    assert main(["generate", str(package), "--prompt-ids", "1,2", "--engine", "coreml"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlx-mil generate: error: engine 'coreml' needs macOS"), err
    np.savez(tmp_path / "in.npz", input_ids=np.array([[1]], np.int32))
    assert main(["run", str(package), "--inputs", str(tmp_path / "in.npz"), "--engine", "coreml"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlx-mil run: error: engine 'coreml' needs macOS"), err


@pytest.mark.parametrize("flags", [["--temperature", "inf", "--top-k", "5"], ["--temperature", "nan"], ["--seed", "-1"],
                                   ["--temperature", "-1"], ["--top-k", "0", "--temperature", "1"]])
def test_bad_generate_flags_are_usage_errors(tmp_path: Path, flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Refused while the command line is parsed (exit 2), before any package is opened: the
    package named does not even exist."""
    with pytest.raises(SystemExit) as exit_:
        main(["generate", str(tmp_path / "absent.mlpackage"), "--prompt-ids", "1,2", "--engine", "milexec", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rlx-mil generate: error: argument ") and "internal" not in err[-1], err


_TOKEN = st.one_of(st.integers(-2, VOCAB + 1), st.sampled_from([None, "3", 2.0, True, np.int64(4)]))
_IDS = st.one_of(st.lists(_TOKEN, max_size=6), st.sampled_from([None, "1,2", 5, (1, 2), np.array([1, 2, 3])]))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(prompt=_IDS, steps=st.one_of(st.integers(-1, 3), st.sampled_from([None, 2.0, "2"])),
       temperature=st.one_of(st.sampled_from([0, 0.0, 0.7, 1e-300, float("inf"), float("nan"), -1.0, None, "1"])),
       top_k=st.sampled_from([None, 1, 5, 0, -3, 2.5, True]),
       seed=st.sampled_from([None, 0, 3, -1, "s", 2**70, 1.5]),
       stop_ids=st.sampled_from([(), [1], None, "1", [None], np.array([2])]))
def test_generate_arguments_typed_error_or_correct(
    checkpoint: Path, session: Session, prompt: Any, steps: Any, temperature: Any, top_k: Any, seed: Any, stop_ids: Any,
) -> None:
    session.reset()
    call = dict(temperature=temperature, top_k=top_k, seed=seed, stop_ids=stop_ids)
    try:
        got = session.generate(prompt, steps, **call)
    except RlxMilError:
        return
    ids = [int(t) for t in prompt]
    assert all(0 <= t < VOCAB for t in ids) and ids and len(ids) + steps <= MAX_CONTEXT + 1
    assert all(isinstance(t, int) and 0 <= t < VOCAB for t in got) and len(got) <= steps
    stops = {int(t) for t in stop_ids}
    assert not any(t in stops for t in got[:-1])
    if temperature == 0:
        want = reference_greedy(checkpoint, ids, steps)
        assert got == want[:len(got)]
    elif seed is not None:
        session.reset()
        assert session.generate(prompt, steps, **call) == got


def test_n_beyond_the_context_is_capped_and_said(package: Path, checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-n past the cache generates what fits (the greedy reference's tokens) and says so in one
    warning line; a prompt that does not fit, or is empty, is refused before anything runs."""
    argv = ["generate", str(package), "--engine", "milexec", "--prompt-ids", "1,2,3"]
    assert main([*argv, "-n", "1000000000"]) == 0
    out, err = capsys.readouterr()
    room = MAX_CONTEXT - 3 + 1
    assert f"-n 1000000000 capped to {room}: the package's context holds {MAX_CONTEXT} tokens" in err
    assert [int(t) for t in out.splitlines()[-1].split(",")] == reference_greedy(checkpoint, [1, 2, 3], room)
    assert main(["generate", str(package), "--engine", "milexec", "--prompt-ids", ",".join(["1"] * (MAX_CONTEXT + 1))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the prompt has {MAX_CONTEXT + 1} tokens, more than the package's context" in err[0], err
    assert main(["generate", str(package), "--engine", "milexec", "--prompt-ids", ","]) == 1
    assert "the prompt is empty" in capsys.readouterr().err
