"""`rlx-mil convert-hf --stateful`: a tiny Qwen3-style checkpoint becomes one stateful prefill +
decode package in one command; the MIL executor generates the reference's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx_mil.cli import main
from rlx_mil.errors import InvalidOptionError
from rlx_mil.generate import Session
from rlx_mil.llm_package import prefill_buckets, reference_greedy
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("hf") / "qwen3", TINY_CONFIGS["qwen3"], seed=3)


def test_one_command_package_generates_the_reference_tokens(
    qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "qwen3.mlpackage"
    argv = ["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--max-context", "32", "--prefill", "8,4",
            "--precision", "fp32", "--verify", "-q"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "functions prefill_4, prefill_8, decode" in text and ": ok" in text
    prompt = [3, 14, 15, 92, 65, 35, 8, 9, 7, 9, 3, 2, 38]  # 8 + 4 + 1
    session = Session(out, precision_model="float32")
    assert session.generate(prompt, 16) == reference_greedy(qwen3, prompt, 16)
    assert [name for name, _ in session.calls[:3]] == ["prefill_8", "prefill_4", "decode"]
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "functions: 3 (default decode)" in shown
    assert "states:  key_cache fp16[2, 1, 2, 32, 16], value_cache fp16[2, 1, 2, 32, 16]" in shown
    contract = session.contract
    assert contract["max_context"] == 32 and contract["mask_kinds"] == ["Causal"]


def test_fp16_package_stays_close_to_the_reference(qwen3: Path, tmp_path: Path) -> None:
    out = tmp_path / "qwen3_fp16.mlpackage"
    assert main(["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--max-context", "32", "-q"]) == 0
    session = Session(out)
    got = session.generate([3, 14, 15, 92, 65], 8)
    want = reference_greedy(qwen3, [3, 14, 15, 92, 65], 8)
    # fp16 states and program against the fp32 reference: for this checkpoint no near-tie flips.
    assert got == want


def test_stateful_flags_are_checked(qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.mlpackage"
    assert main(["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--seq-len", "4"]) == 1
    assert "drop --seq-len" in capsys.readouterr().err
    assert main(["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--max-context", "16", "--prefill", "16"]) == 1
    assert "prefill bucket" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(InvalidOptionError):
        prefill_buckets("4,x", 16)
    assert prefill_buckets("8, 4,8", 16) == [4, 8]
