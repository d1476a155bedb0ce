"""The quality check of a compressed Whisper folder (`rlx_mil.speech.quality_check`): every
compressed conversion judges the folder it wrote against the float checkpoint on speech (the
built-in clip, or `--compress-calibration`), warns below the thresholds, and `--verify` fails
on it unless `--allow-quality-loss`; fidelity and quality are reported apart. On a tiny random
Whisper: `lut1` (two values per tensor) is the deliberately broken folder, `int8` the kept one."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli.main import main
from rlx_mil.compress.builtin_text import builtin_text
from rlx_mil.speech.evaluate import evaluate_speech
from rlx_mil.speech.model import SAMPLE_RATE
from rlx_mil.speech.quality_check import CLIP_FILE, CLIP_TEXT, builtin_clip, builtin_clip_text
from rlx_mil.speech.tokens import SpeechPackageError
from tests.speech.fake_whisper import write_text_checkpoint
from tests.speech.test_transcribe_packages import CACHE, CONFIG, HAS_STATEFUL, speech_wav

pytestmark = pytest.mark.xdist_group("whisper-packages")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny_whisper_quality")
    checkpoint = write_text_checkpoint(root / "whisper-tiny", CONFIG)
    return checkpoint


def _convert(checkpoint: Path, out: Path, *flags: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["convert-hf", str(checkpoint), "-o", str(out), "--cache-len", str(CACHE), "--target", "iOS18",
                     "--precision", "fp32", "--verify", *flags])
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def broken(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("broken")
    report = tmp_path_factory.mktemp("broken_report") / "report.json"  # not inside -o: refused there
    code, stdout, stderr = _convert(checkpoint, out, "--compress", "lut1", "--report", str(report))
    return {"code": code, "out": stdout, "err": stderr, "report": json.loads(report.read_text()),
            "folder": out / "openai_whisper-tiny"}


def test_a_broken_folder_warns_and_fails_verify(broken: dict) -> None:
    assert broken["code"] == 1
    # fidelity passes (the packages compute what their codes say), quality does not
    assert re.search(r"AudioEncoder: fidelity \(the package vs the weights it stores\):\s+check encoder_output_embeds",
                     broken["out"]), broken["out"]
    assert "FAIL" not in broken["out"].split("verify: quality")[0]
    assert ("verify: quality (the packages as saved vs the float checkpoint, on speech): quality vs the checkpoint"
            in broken["out"])
    assert "verify: FAILED: quality below the thresholds" in broken["out"]
    warning = [line for line in broken["err"].splitlines() if "warning:" in line]
    assert len(warning) == 1 and "BELOW THRESHOLD" in warning[0] and "the built-in English speech clip" in warning[0]
    assert "the weights contributing most: model." in broken["err"]


def test_the_report_holds_the_check_on_the_built_in_clip(broken: dict, checkpoint: Path) -> None:
    report = broken["report"]
    assert sorted(report["compression"]) == ["AudioEncoder", "TextDecoder"]
    assert all(w["scheme"].startswith("lut1") for w in report["compression"]["TextDecoder"]["weights"])
    quality = report["quality"]
    assert quality["ok"] is False and quality["inputs"].startswith("the built-in English speech clip")
    decoder, [encoder] = quality["decoder"], quality["outputs"]
    assert decoder["mean_kl"] > 0.1 and encoder["cosine"] < 0.95 and decoder["positions"] >= 16
    assert any("mean KL" in f for f in quality["failures"]) and any("cosine" in f for f in quality["failures"])
    [file] = report["files"]
    assert file["audio"] == f"the built-in clip {CLIP_FILE}" and file["positions"] == decoder["positions"]
    # the conversion's check is `rlx-mil eval` of the folder on the clip: the same numbers
    clip = ROOT / "rlx_mil" / "speech" / "clips" / CLIP_FILE
    again = evaluate_speech(broken["folder"], [clip], checkpoint, language="en", max_tokens=96).check.to_dict()
    assert again["decoder"]["mean_kl"] == pytest.approx(decoder["mean_kl"], rel=1e-6)
    assert again["outputs"][0]["cosine"] == pytest.approx(encoder["cosine"], rel=1e-9)


def test_allow_quality_loss_passes_the_same_folder(checkpoint: Path, tmp_path: Path) -> None:
    stateful = ["--stateful"] if HAS_STATEFUL else []
    code, stdout, stderr = _convert(checkpoint, tmp_path, "--compress", "lut1", "--allow-quality-loss", *stateful)
    assert code == 0, stdout + stderr
    assert "verify: quality below the thresholds, accepted (--allow-quality-loss)" in stdout
    assert "BELOW THRESHOLD" in stderr  # the warning is still given
    if stateful:
        # fidelity of the stateful package decodes the codes of both its functions (the
        # cross-attention's weights too: the multifunction report holds them)
        assert re.search(r"TextDecoderStateful: .*\(fidelity: .*max \|logit error\| [0-9.e-]+ of the largest logit,"
                         r" argmax agrees: ok", stdout), stdout
        # its quality is judged too, and as broken
        [line] = [s for s in stdout.splitlines() if s.startswith("verify: quality") and "stateful text decoder" in s]
        assert "BELOW THRESHOLD" in line and "mean KL" in line
        assert stdout.count("accepted (--allow-quality-loss)") == 2


@pytest.fixture(scope="module")
def kept(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("int8")
    wav = speech_wav(out / "speech.wav", 1.5)
    stateful = ["--stateful"] if HAS_STATEFUL else []
    code, stdout, stderr = _convert(checkpoint, out, "--compress", "int8", "--compress-calibration", str(wav), *stateful)
    return {"code": code, "out": stdout, "err": stderr}


def test_int8_passes_without_a_warning(kept: dict) -> None:
    assert kept["code"] == 0, kept["out"] + kept["err"]
    assert "warning" not in kept["err"], kept["err"]
    lines = [s for s in kept["out"].splitlines() if s.startswith("verify: quality")]
    assert len(lines) == (2 if HAS_STATEFUL else 1)
    # judged on the user's audio, not the built-in clip
    assert all("of --compress-calibration (speech.wav)" in line and "BELOW" not in line for line in lines)
    kl = float(re.search(r"KL ([0-9.e-]+)", lines[0]).group(1))  # type: ignore[union-attr]
    cos = float(re.search(r"cosine ([0-9.]+)", lines[0]).group(1))  # type: ignore[union-attr]
    assert kl < 0.01 and cos > 0.999
    if HAS_STATEFUL:  # the stateful decoder over the same transcript, on the same weights' codes
        assert lines[1].endswith("the stateful text decoder)")
        assert float(re.search(r"KL ([0-9.e-]+)", lines[1]).group(1)) < 0.01  # type: ignore[union-attr]


@pytest.mark.skipif(not HAS_STATEFUL, reason="rlx_mil.speech.stateful is not there")
def test_the_stateful_compressed_decoder_is_verified_on_its_stored_weights(kept: dict) -> None:
    assert re.search(r"TextDecoderStateful: 4 tokens against the reference decoder \(fidelity: on the weights the"
                     r" package stores\): max \|logit error\| [0-9.e-]+ of the largest logit, argmax agrees: ok",
                     kept["out"]), kept["out"]


def test_the_built_in_clip_is_english_speech_shipped_with_the_package() -> None:
    clip = builtin_clip()
    assert clip.source_rate == SAMPLE_RATE and clip.source_channels == 1
    assert 8.0 < clip.seconds < 20.0 and 0.4 < float(np.abs(clip.samples).max()) <= 0.5
    # speech: silences between words, not a tone
    frames = clip.samples[: len(clip.samples) // 400 * 400].reshape(-1, 400)
    loud = np.sqrt((frames.astype(np.float64) ** 2).mean(1))
    assert (loud < 0.05 * loud.max()).mean() > 0.05 and (loud > 0.2 * loud.max()).mean() > 0.3
    # it says the opening of the held-out text
    text = builtin_clip_text()
    assert " ".join(builtin_text("heldout").split()).startswith(text) and len(text.split()) > 20
    # shipped: pyproject's package-data names it (tomllib is not there on Python 3.10)
    table = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]", 1)[1]
    data = json.loads(re.search(r"^rlx_mil = (\[.*\])$", table, re.M).group(1))  # type: ignore[union-attr]
    for name in (CLIP_FILE, CLIP_TEXT):
        assert any(fnmatch(f"speech/clips/{name}", pattern) for pattern in data), data


def test_a_folder_without_a_tokenizer_is_judged_on_generated_ids(broken: dict, checkpoint: Path,
                                                                 tmp_path: Path) -> None:
    from rlx_mil.speech.evaluate import GENERATED_TOKENS, judge_folder

    folder = tmp_path / "no-tokenizer"
    shutil.copytree(broken["folder"], folder, ignore=shutil.ignore_patterns("tokenizer.json"))
    check = judge_folder(folder, [builtin_clip()], checkpoint, inputs="the clip").check
    assert check.inputs.startswith("the clip; ") and "generated token ids (no tokenizer)" in check.inputs
    assert check.decoder is not None and check.decoder.positions == min(GENERATED_TOKENS, CACHE - 1) + 1
    assert check.decoder.perplexity_ratio is None and not check.ok  # no perplexity on ids that are not text
    # `rlx-mil eval` still needs the tokenizer (it judges transcripts)
    with pytest.raises(SpeechPackageError, match=r"no tokenizer\.json"):
        evaluate_speech(folder, [ROOT / "rlx_mil" / "speech" / "clips" / CLIP_FILE], checkpoint)
