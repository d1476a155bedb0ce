"""`rlx-mil convert-gguf`: a quantized tiny GGUF file with its tokenizer -> a stateful package
that verifies against the reference on the same codes and chats through `rlx-mil generate`."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.gguf.gguf_files import tiny_chat_gguf
from rlx_mil.cli import main


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_chat_gguf(tmp_path_factory.mktemp("gguf_cli") / "chat.gguf", layers=1, seed=4)


def test_stateful_conversion_verifies_and_chats(chat_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "chat.mlpackage"
    assert main(["convert-gguf", str(chat_gguf), "-o", str(out), "--stateful", "--max-context", "64", "--prefill", "8",
                 "--verify", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "verify: compared 8 greedy steps" in printed and printed.rstrip().endswith(": ok")
    assert "compressed" in printed and "gguf-Q8_0" in printed
    assert main(["generate", str(out), "--chat", "--prompt", "The quick fox", "-n", "4", "--engine", "milexec",
                 "--quiet"]) == 0
    # eval against the GGUF file itself (llama.cpp's decode of its codes, which the package keeps exactly)
    capsys.readouterr()
    assert main(["eval", str(out), "--reference", str(chat_gguf), "--engine", "milexec", "--max-tokens", "24",
                 "--json", "--quiet"]) == 0
    import json

    result = json.loads(capsys.readouterr().out)
    assert result["reference"] == str(chat_gguf) and result["top1_agreement"] == 1.0
    assert result["mean_kl"] < 1e-4 and abs(result["perplexity_ratio"] - 1) < 5e-3  # an fp16 package


def test_stateless_conversion_verifies(chat_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.mlpackage"
    assert main(["convert-gguf", str(chat_gguf), "-o", str(out), "--seq-len", "5", "--precision", "fp32", "--verify",
                 "--quiet"]) == 0
    assert "ok" in capsys.readouterr().out


def test_deploy_ane_requantizes_as_requantize_says(chat_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--requantize overrides --deploy ane's auto4 plan (tests/models/gguf/test_gguf_ane_plan.py)."""
    import coremltools as ct

    from rlx_mil.compress import report_of

    out = tmp_path / "ane.mlpackage"
    assert main(["convert-gguf", str(chat_gguf), "-o", str(out), "--seq-len", "5", "--precision", "fp32", "--deploy", "ane",
                 "--requantize", "Q8_0=int8", "--verify", "--quiet", "--allow-quality-loss"]) == 0
    printed = capsys.readouterr().out
    assert "gguf-Q8_0>int8-sym-channel" in printed  # 8-bit codes stay 8-bit, per output channel
    # Re-quantizing is measured against the float model the file's codes decode to.
    assert "quality vs the float model the GGUF codes decode to: top-1" in printed
    assert "tokens of the built-in held-out English text" in printed
    model = ct.models.MLModel(str(out), skip_model_load=True)
    assert model.user_defined_metadata["rlx_mil.deploy"] == "ane"
    report = report_of(model.user_defined_metadata)
    assert report is not None and report.weights
    assert {w.scheme for w in report.weights} == {"gguf-Q8_0>int8-sym-channel"}
    errors = [w.max_error for w in report.weights]
    assert all(e is not None and 0 <= e < 1 for e in errors) and any(errors), errors


def test_refusals(chat_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert-gguf", str(chat_gguf), "-o", str(tmp_path / "a.mlpackage"), "--requantize", "Q9_X=lut4"]) == 1
    assert "rlx-mil convert-gguf: error: requantize: 'Q9_X'" in capsys.readouterr().err
    assert main(["convert-gguf", str(chat_gguf), "-o", str(tmp_path / "a.mlpackage"), "--requantize", "Q8_0=lut5"]) == 1
    assert "rlx-mil convert-gguf: error: requantize Q8_0=lut5" in capsys.readouterr().err
    assert main(["convert-gguf", str(chat_gguf), "-o", str(tmp_path / "b.mlpackage"), "--target", "iOS17"]) == 1
    assert "iOS18" in capsys.readouterr().err
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(chat_gguf.read_bytes()[:1000])
    assert main(["convert-gguf", str(bad), "-o", str(tmp_path / "c.mlpackage")]) == 1
    assert "rlx-mil convert-gguf: error:" in capsys.readouterr().err
