"""Tie-aware greedy verification (`rlx_mil.testing.compare_greedy_step`, `convert-hf --stateful
--verify`): near-ties within the precision's reach pass and are reported, real divergences and
a corrupted weight fail."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli.demo import DEMO_FAMILIES, ENCODER_FAMILIES, demo_config
from rlx_mil.cli.main import main
from rlx_mil.llm.package import verify_stateful
from rlx_mil.mil_walk import iter_ops
from rlx_mil.milexec import load_program
from rlx_mil.milexec.loader import mapped_file
from rlx_mil.models.random_checkpoint import write_random_checkpoint
from rlx_mil.testing import GreedyComparison, compare_greedy_step

#: The demo's decoders (qwen3_5's 2-layer demo checkpoint has only linear attention layers: a
#: package with recurrent states and no KV cache). The quick profile runs one family of each kind
#: (plain attention, QK-norm, softcapped, hybrid convolution); the thorough profile
#: (RLX_MIL_HYPOTHESIS_PROFILE=thorough) every one.
ALL_DECODERS = [f for f in DEMO_FAMILIES if f not in ENCODER_FAMILIES]
QUICK = ("llama", "qwen3", "gemma2", "lfm2")
DECODERS = ALL_DECODERS if os.environ.get("RLX_MIL_HYPOTHESIS_PROFILE") == "thorough" else [
    f for f in ALL_DECODERS if f in QUICK]


def test_step_verdicts() -> None:
    want = np.array([3.3916, 3.3912, -1.0, 0.5])
    tie = np.array([3.3910, 3.3914, -1.0, 0.5])  # the top two swapped by fp16-sized errors
    assert compare_greedy_step(1, want, want, "fp32").verdict == "match"
    step = compare_greedy_step(2, tie, want, "fp16")
    assert (step.verdict, step.reference_token, step.package_token, step.ok) == ("near-tie", 0, 1, True)
    assert compare_greedy_step(3, tie, want, "fp32").verdict == "logits"  # fp32 cannot explain 6e-4
    clear = np.array([3.0, 1.0, -1.0, 0.5])
    assert compare_greedy_step(4, clear[[1, 0, 2, 3]], clear, "fp16").verdict == "diverged"
    same_token_bad_logits = want + np.array([0.0, -1.0, 0.0, 0.0])
    assert compare_greedy_step(5, same_token_bad_logits, want, "fp16").verdict == "logits"
    assert not compare_greedy_step(6, np.array([np.nan, 0, 0, 0]), want, "fp16").ok
    comparison = GreedyComparison("x", [compare_greedy_step(1, want, want, "fp16"), step])
    assert comparison.ok and "2 greedy steps" in comparison.summary() and "1 near-tie (steps 2)" in comparison.summary()
    assert not GreedyComparison("nothing").ok


def _demo_checkpoint(folder: Path, family: str) -> Path:
    args = argparse.Namespace(family=family, layers=2, hidden=256, heads=8, kv_heads=2, seq=64)
    return write_random_checkpoint(folder / family, demo_config(args), seed=0)


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("family", DECODERS)
def test_stateful_verify_passes_on_the_demo_checkpoints(
    family: str, precision: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _demo_checkpoint(tmp_path, family)
    out = tmp_path / "package.mlpackage"
    argv = ["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "16",
            "--precision", precision, "--verify", "-q"]
    assert main(argv) == 0, capsys.readouterr().out
    text = capsys.readouterr().out
    assert "verify: step 8:" in text and "compared 8 greedy steps" in text and text.rstrip().endswith(": ok")


def test_a_corrupted_weight_fails_the_verification(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = _demo_checkpoint(tmp_path, "llama")
    out = tmp_path / "package.mlpackage"
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "16", "-q"]) == 0
    capsys.readouterr()
    assert verify_stateful(checkpoint, out, None, 4, precision="fp16").ok
    # Negate one weight (layer 1's down projection) inside the package's weight file.
    program = load_program(out)
    weight = next(op.outputs[0].val for op in iter_ops(program.functions["decode"])
                  if op.op_type == "const" and "layers_1_mlp_down_proj" in op.outputs[0].name)
    mapped = mapped_file(weight)
    assert mapped is not None
    start = weight.__array_interface__["data"][0] - np.frombuffer(mapped, np.uint8, count=1).__array_interface__["data"][0]
    corrupted = (-weight.astype(np.float32)).astype(np.float16).tobytes()
    del program, weight, mapped
    with open(next(out.rglob("weight.bin")), "r+b") as f:
        f.seek(start)
        f.write(corrupted)
    lines: list[str] = []
    comparison = verify_stateful(checkpoint, out, None, 4, precision="fp16", report=lines.append)
    assert not comparison.ok and "MISMATCH at step 1" in comparison.summary()
    assert lines and lines[-1].endswith(("diverged", "logits"))
