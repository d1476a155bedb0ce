"""Apple's Core AI runtime as an engine for packages: a stateful LLM package (prefill bucket +
decode) gives milexec's logits and KV states, step by step (`rlx_mil.coreai.crosscheck`), and
greedy tokens through `generate.Session(engine="coreai")`; `rlx-mil run --engine coreai` runs a
package. Without the extra, asking for the engine says how to install it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlx_mil.errors import CoreAIUnavailableError

coreai = pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

from tiny_llm_package import BUCKET, VOCAB, tiny_checkpoint, tiny_stateful_package  # noqa: E402

from rlx_mil import milexec  # noqa: E402
from rlx_mil.cli import main  # noqa: E402
from rlx_mil.coreai.crosscheck import crosscheck  # noqa: E402
from rlx_mil.llm.generate import Session  # noqa: E402


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("coreai_llm")
    return tiny_stateful_package(tiny_checkpoint(folder, seed=3), folder)


def _calls(steps: int) -> list[tuple[str, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(5)
    calls = [(f"prefill_{BUCKET}", {"input_ids": rng.integers(0, VOCAB, (1, BUCKET)).astype(np.int32),
                                    "position_ids": np.arange(BUCKET, dtype=np.int32)[None],
                                    "cache_position": np.array([0], np.int32)})]
    for i in range(steps):
        pos = BUCKET + i
        calls.append(("decode", {"input_ids": rng.integers(0, VOCAB, (1, 1)).astype(np.int32),
                                 "position_ids": np.array([[pos]], np.int32), "cache_position": np.array([pos], np.int32)}))
    return calls


def test_prefill_and_decode_match_milexec_output_by_output_and_state_by_state(package: Path) -> None:
    report = crosscheck(package, _calls(3))
    assert len(report.outputs) == 4 and {d.name for d in report.states} == {"key_cache", "value_cache"}
    assert not report.failures(rtol=1e-5, atol=1e-5), report.failures()
    worst = report.worst()
    assert worst is not None and worst.max_rel < 1e-5
    # The states really moved: the check compares written caches, not two zero buffers.
    assert all(d.max_abs > 0 or d.max_rel == 0 for d in report.states)


def test_session_on_core_ai_generates_milexec_tokens(package: Path) -> None:
    prompt = [1, 7, 3, 9, 2]
    want = Session(package, engine="milexec").generate(prompt, 6)
    session = Session(package, engine="coreai")
    assert session.generate(prompt, 6) == want
    session.reset()
    assert session.generate(prompt, 6) == want  # a reset starts from a zeroed cache again


def test_cli_run_engine_coreai(tmp_path: Path, package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    feeds = _calls(0)[0][1]
    np.savez(tmp_path / "in.npz", **feeds)  # type: ignore[arg-type]
    out = tmp_path / "out.npz"
    assert main(["run", str(package), "--function", f"prefill_{BUCKET}", "--inputs", str(tmp_path / "in.npz"),
                 "--engine", "coreai", "-o", str(out)]) == 0
    assert "coreai" in capsys.readouterr().out
    want = milexec.run(package, feeds, function_name=f"prefill_{BUCKET}")
    with np.load(out) as got:
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)


def test_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil.coreai import adapter

    monkeypatch.setattr(adapter.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CoreAIUnavailableError, match=r'pip install -e "\.\[coreai\]"'):
        adapter.require()
