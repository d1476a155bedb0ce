"""The quality check of compressed conversions on the command line: the summary line against
the original model, --report, the warning, and --verify's verdict (--allow-quality-loss)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlx_mil.cli import main
from tests.llm.text_fixtures import chat_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_checkpoint(tmp_path_factory.mktemp("quality") / "ckpt")


def _convert(checkpoint: Path, out: Path, spec: str, *extra: str) -> int:
    return main(["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "64",
                 "--precision", "fp32", "--compress", spec, *extra])


def test_int8_reports_its_quality_on_the_builtin_text_without_warning(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    code = _convert(checkpoint, tmp_path / "m.mlpackage", "int8", "--report", str(report), "--verify")
    out, err = capsys.readouterr()
    assert code == 0, out
    assert "warning: quality" not in err
    line = next(x for x in out.splitlines() if x.startswith("quality vs the float checkpoint"))
    assert "tokens of the built-in held-out English text" in line and "ppl x" in line
    assert "verify: quality (the compressed weights vs the original model" in out
    assert "the weights the package stores (decoded from its own codes) (fidelity)" in out
    body = json.loads(report.read_text())
    quality = body["quality"]
    assert quality["ok"] and quality["decoder"]["positions"] > 100
    assert quality["decoder"]["mean_kl"] < 1e-3 and 0.97 < quality["decoder"]["perplexity_ratio"] < 1.03
    weights = body["compression"]["weights"]
    assert weights and all(w["scheme"].startswith("int8") and w["relative_error"] < 0.01 for w in weights)


def test_a_broken_package_warns_and_fails_verify_unless_allowed(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _convert(checkpoint, tmp_path / "m.mlpackage", "lut2-tensor", "--verify")
    out, err = capsys.readouterr()
    assert code == 1, out
    warned = [x for x in err.split("rlx-mil convert-hf: warning: ") if x.startswith("quality vs")]
    assert len(warned) == 1, err
    assert "BELOW THRESHOLD" in warned[0] and "the weights contributing most: " in warned[0]
    assert "verify: FAILED: quality below the thresholds" in out
    code = _convert(checkpoint, tmp_path / "m2.mlpackage", "lut2-tensor", "--verify", "--allow-quality-loss")
    assert code == 0
    assert "accepted (--allow-quality-loss)" in capsys.readouterr().out


def test_a_chunked_set_is_checked_once_for_the_whole_model(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    code = _convert(checkpoint, tmp_path / "set", "lut2-tensor", "--chunk-bytes", "40KB", "--verify", "--report", str(report))
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert re.search(r"\(1 chunk, weights|\(\d+ chunks, weights", out), out
    assert out.count("quality vs the float checkpoint") == 2  # the line, and verify's
    body = json.loads(report.read_text())
    assert not body["quality"]["ok"] and len(body["compression"]["weights"]) > 2


def test_the_users_token_ids_are_what_the_check_runs_on(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    ids = tmp_path / "ids.npz"
    np.savez(ids, input_ids=np.arange(3, 43, dtype=np.int32)[None, :])
    assert _convert(checkpoint, tmp_path / "m.mlpackage", "int8", "--compress-calibration", str(ids)) == 0
    out = capsys.readouterr().out
    assert "on 40 token ids of --compress-calibration" in out
    np.savez(ids, input_ids=np.zeros((1, 4), np.float32))
    assert _convert(checkpoint, tmp_path / "m2.mlpackage", "int8", "--compress-calibration", str(ids)) == 1
    assert "must hold 2 or more integer token ids" in capsys.readouterr().err


def test_the_compression_help_says_what_the_code_does(capsys: pytest.CaptureFixture[str]) -> None:
    """`convert-hf --help` as a newcomer reads it: the presets and autoN, the default budgets and
    thresholds the code uses (the help states them without importing the code that owns them)."""
    from rlx_mil.compress.quality import DEFAULT_THRESHOLDS
    from rlx_mil.compress.schemes import AUTO_BUDGETS, PRESETS
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import AUTO4
    from rlx_mil.speech.folder_plan import FOLDER_BUDGETS

    try:
        code = main(["convert-hf", "--help"])
    except SystemExit as done:
        code = done.code
    assert code == 0
    options: dict[str, str] = {}  # option -> its help, on one line
    for line in capsys.readouterr().out.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            name = line.split()[0].split(",")[0].lstrip("-")
            options[name] = line
        elif line.strip():
            options[name] += " " + line.strip()
    options = {n: " ".join(h.split()) for n, h in options.items()}
    compress = options["compress"]
    assert all(re.search(rf"[ (]{name}[,;:) ]", compress) for name in [*PRESETS, *(f"auto{b}" for b in AUTO_BUDGETS)]), compress
    budget = options["compress-budget"]
    assert f"auto4 {AUTO_BUDGETS[4]:.2f}," in budget and f"Whisper folder {FOLDER_BUDGETS[4]:g};" in budget, budget
    assert all(f"auto{bits} {AUTO_BUDGETS[bits]:.2f}" in budget for bits in AUTO_BUDGETS), budget
    for form in (DeployForm.GPU, DeployForm.ANE):
        assert f"--deploy {form.value} {AUTO4[form][2]:.2f}" in budget, budget
    loss = options["allow-quality-loss"]
    t = DEFAULT_THRESHOLDS
    assert f"KL {t.max_mean_kl:g}, top-1 {t.min_top1:g}, cosine {t.min_cosine:g}" in loss, loss
    assert f"(default {t.max_mean_kl:g}," in options["max-kl"] and f"(default {t.min_top1:g}," in options["min-top1"]
    assert "quality thresholds unless --allow-quality-loss" in options["verify"], options["verify"]
