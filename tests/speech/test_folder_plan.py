"""`--compress auto4` of a Whisper folder: one plan over the encoder's and decoder's weights
(`rlx_mil.speech.folder_plan`), measured on the user's audio or the built-in calibration clip, on a tiny
random Whisper. The candidates are cut to int4 (per channel, per block) / int8 and the measured weights to a few, so the
plan takes seconds; what is checked is that one budget is spent over both packages."""

from __future__ import annotations

import json
import re
import warnings
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_mil.cli.main import main
from rlx_mil.compress import WeightCompressor, parse_compress
from rlx_mil.compress.builtin_text import builtin_text
from rlx_mil.compress.emit import compressed_bytes
from rlx_mil.compress.plan import encode
from rlx_mil.errors import CompressionWarning
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.models.whisper import build_cross_kv, build_stateful_decoder
from rlx_mil.models.whisper_checkpoint import ParamsOf, open_whisper
from rlx_mil.speech import calibration, folder_plan, quality_check
from rlx_mil.speech.calibration import (
    CALIBRATION_SECONDS,
    builtin_speech,
    calibration_clip,
    calibration_clip_text,
    speech_calibration,
)
from rlx_mil.speech.folder_plan import plan_folder
from rlx_mil.speech.model import SAMPLE_RATE
from rlx_mil.speech.packages import graphs
from tests.speech.fake_whisper import write_text_checkpoint
from tests.speech.test_transcribe_packages import CACHE, CONFIG, speech_wav

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.xdist_group("whisper-packages")

BUDGET = 0.3


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("tiny_whisper_plan")
    checkpoint = write_text_checkpoint(root / "whisper-tiny", CONFIG, says_text=False)
    wav = speech_wav(root / "speech.wav", 2.0)
    built = graphs(open_whisper(checkpoint), CACHE, True)
    # A decoder target (mean KL 0.001) the budget cannot hold: the decoder takes every byte
    # the encoder (already within its target) can spare, and the plan says what budget would do.
    with pytest.warns(CompressionWarning) as caught:
        config = _plan(f"auto4;budget={BUDGET};max_kl=0.001", checkpoint, built, wav)
    return {"checkpoint": checkpoint, "config": config, "built": built, "wav": wav,
            "warnings": [str(w.message) for w in caught]}


def _plan(text: str, checkpoint: Path, built: dict, wav: Path, folder_kl: float = folder_plan.FOLDER_KL) -> Any:
    """`plan_folder` of the tiny Whisper, cut to a few candidates and measured weights."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(folder_plan, "CANDIDATES", {4: ("int4-channel", "int4", "int8")})
        patch.setattr(folder_plan, "MEASURED", {"encoder": 8, "decoder": 8})
        patch.setattr(folder_plan, "FOLDER_KL", folder_kl)
        patch.setattr(calibration, "CALIBRATION_SECONDS", 0.5)
        return plan_folder(parse_compress(text), open_whisper(checkpoint), built, speech_calibration([wav]),
                           target="iOS18", precision="fp16")


def test_one_budget_is_spent_over_both_packages(planned: dict) -> None:
    config = planned["config"]
    summary = config.plan.summary
    assert summary.startswith("auto4 across 2 packages") and f"one budget {BUDGET:g}x over all" in summary
    assert "measured on 0.5 s of speech.wav" in summary  # the user's audio, cut to the calibration length
    # the mix as planned, measured on that audio: both packages together
    found = re.search(r"the mix on it: encoder cosine (0\.\d+), decoder top-1 (\d+\.\d) %.*?, KL ([\d.]+), ppl", summary)
    assert found is not None, summary
    assert 0.95 < float(found.group(1)) < 1 and 0 < float(found.group(3)) < 1
    before, after, said = {}, {}, {}
    for role in ("AudioEncoder", "TextDecoder"):
        graph, params = planned["built"][role]
        # the package's conversion takes its weights' schemes from the plan
        compressor = WeightCompressor(config, graph, Target.IOS18, Precision.FP16, params=params)
        assert compressor.plan is not None and compressor.plan.summary == summary
        assert set(compressor.auto_names) <= set(config.plan.schemes) and compressor.auto_names
        before[role] = after[role] = 0
        for name in compressor.auto_names:
            scheme = compressor.schemes[name]
            assert scheme == config.plan.schemes[name] and scheme.label.startswith(("int4", "int8")), scheme
            assert "across packages" in compressor.notes[name] or "the narrowest start" in compressor.notes[name]
            arr = np.asarray(params[name])
            before[role] += arr.size * 2
            after[role] += compressed_bytes(encode(arr, scheme, Precision.FP16, name), Target.IOS18)
        found = re.search(rf"{role} (\d\.\d+)x", summary)
        assert found is not None
        said[role] = float(found.group(1))
    # The folder's compressed bytes stay within the budget of its fp16 weight bytes, but not each
    # package's: the plan moved bytes from one package to the other, which a budget per package
    # cannot (each package planned alone stays within 0.3x of its own bytes).
    fractions = {role: after[role] / before[role] for role in before}
    assert sum(after.values()) <= BUDGET * sum(before.values()) * 1.01, fractions
    assert fractions["TextDecoder"] > BUDGET * 1.05 and fractions["AudioEncoder"] < BUDGET, fractions
    assert re.fullmatch(r"auto4 across AudioEncoder, TextDecoder: the quality target cannot be met within the budget:"
                        r" predicted (AudioEncoder cosine 0\.9\d+ \(default target cosine 0\.9900\), )?TextDecoder mean KL \S+ \(target mean KL 0\.001\); a budget of (0\.\d+) is predicted"
                        r" to meet it", planned["warnings"][0]), planned["warnings"]
    for role in before:  # the summary's per-package sizes count the float weights too
        assert said[role] >= fractions[role] * 0.9, (said, fractions)

    assert "TextDecoder mean KL" in summary and "(target mean KL 0.001)" in summary


def test_without_a_target_the_summary_says_the_default_and_claims_no_failure(planned: dict) -> None:
    # `--compress auto4` alone: the plan judges the decoder against its default mean KL, here
    # one the tiny model's mix misses; no target was asked for, so nothing "cannot be met".
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = _plan(f"auto4;budget={BUDGET}", planned["checkpoint"], planned["built"], planned["wav"],
                        folder_kl=1e-6).plan.summary
    found = re.search(r"TextDecoder \d\.\d+x, predicted mean KL (\S+) \(default target mean KL 1e-06\)", summary)
    assert found is not None and float(found.group(1)) > 1e-6, summary
    assert re.search(r"AudioEncoder \d\.\d+x, predicted cosine 0\.9\d+ \(default target cosine 0\.9900\)", summary)
    assert "cannot be met" not in summary and "predicted to meet it" not in summary and "(target " not in summary


def test_the_built_in_signal_is_speech_shaped() -> None:
    samples = builtin_speech(4.0)
    assert samples.dtype == np.float32 and samples.shape == (4 * SAMPLE_RATE,)
    assert np.array_equal(samples, builtin_speech(4.0)) and float(np.abs(samples).max()) == pytest.approx(0.5)
    spectrum = np.abs(np.fft.rfft(samples)) ** 2
    hz = np.fft.rfftfreq(samples.size, 1 / SAMPLE_RATE)
    # voiced: most energy under 1 kHz (pitch harmonics, first formants), some above 3 kHz (hiss)
    assert spectrum[hz < 1000].sum() > 0.5 * spectrum.sum() > spectrum[hz > 3000].sum() > 1e-3 * spectrum.sum()
    frames = samples[: samples.size // 400 * 400].reshape(-1, 400)  # 25 ms frames: syllables and pauses
    loud = np.sqrt((frames.astype(np.float64) ** 2).mean(1))
    assert (loud < 0.05 * loud.max()).mean() > 0.1 and (loud > 0.3 * loud.max()).mean() > 0.2


def _sentences(part: str) -> set[str]:
    text = " ".join(builtin_text(part).split())
    return {s.strip() for s in re.split(r"(?<=\.) ", text)}


def test_the_calibration_clip_is_speech_of_the_calibration_text_shipped_with_the_package() -> None:
    clip = calibration_clip()
    assert clip.source_rate == SAMPLE_RATE and clip.source_channels == 1 and clip.samples.dtype == np.float32
    # one sentence, within what the plan measures: nothing shipped that the plan cuts off
    assert 4.0 < clip.seconds <= CALIBRATION_SECONDS and 0.4 < float(np.abs(clip.samples).max()) <= 0.5
    frames = clip.samples[: len(clip.samples) // 400 * 400].reshape(-1, 400)  # speech: words and the gaps between
    loud = np.sqrt((frames.astype(np.float64) ** 2).mean(1))
    assert (loud < 0.05 * loud.max()).mean() > 0.05 and (loud > 0.2 * loud.max()).mean() > 0.3
    # it says a sentence of the calibration text, none of the held-out text the check's clip says
    text = calibration_clip_text()
    assert text in _sentences("calibration") and len(text.split()) > 15
    assert text not in _sentences("heldout") and text not in quality_check.builtin_clip_text()
    file = ROOT / "rlx_mil" / "speech" / "clips" / calibration.CLIP_FILE
    assert file.stat().st_size < 200_000  # small: 16-bit FLAC
    table = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]", 1)[1]
    data = json.loads(re.search(r"^rlx_mil = (\[.*\])$", table, re.M).group(1))  # type: ignore[union-attr]
    for name in (calibration.CLIP_FILE, calibration.CLIP_TEXT):
        assert any(fnmatch(f"speech/clips/{name}", pattern) for pattern in data), data


def test_the_default_calibration_is_the_calibration_clip_never_the_checks() -> None:
    heard = speech_calibration(None)
    clip = calibration_clip().samples
    assert heard.spoken and heard.label == f"the built-in English calibration clip ({clip.size / SAMPLE_RATE:.1f} s, espeak-ng)"
    assert np.array_equal(heard.samples, clip[: int(CALIBRATION_SECONDS * SAMPLE_RATE)])
    # the quality check judges on another file, and no stretch of its audio is the plan's
    assert calibration.CLIP_FILE != quality_check.CLIP_FILE and calibration.CLIP_TEXT != quality_check.CLIP_TEXT
    checked = quality_check.builtin_clip().samples
    assert heard.samples.size != checked.size or not np.array_equal(heard.samples, checked)
    head = min(heard.samples.size, checked.size)
    assert float(np.abs(heard.samples[:head] - checked[:head]).mean()) > 0.01


def test_the_generated_signal_is_the_fallback_when_the_clip_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibration, "CLIP_FILE", "not-installed.flac")
    heard = speech_calibration(None)
    assert not heard.spoken and np.array_equal(heard.samples, builtin_speech())
    assert heard.label == f"the built-in speech-shaped signal ({CALIBRATION_SECONDS:g} s; not-installed.flac is not installed)"


def test_the_clip_is_teacher_forced_over_the_float_models_transcript(planned: dict) -> None:
    checkpoint = open_whisper(planned["checkpoint"])
    asked: list = []

    def greedy(prompt: list[int], eot: int) -> list[int]:
        asked.append((list(prompt), eot))
        return [11, 12, 13]

    ids, first = folder_plan._transcript(checkpoint, speech_calibration(None), greedy)
    assert len(asked) == 1 and ids == [*asked[0][0], 11, 12, 13] and first == len(asked[0][0])
    # the generated signal does not say the built-in text: the decoder is forced over the text itself
    ids, first = folder_plan._transcript(checkpoint, calibration.SpeechCalibration(builtin_speech(0.5), "signal", False), greedy)
    assert len(asked) == 1 and len(ids) - first == calibration.TRANSCRIPT_TOKENS


def test_calibration_audio_needs_compress_and_is_read_before_converting(planned: dict, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = planned["checkpoint"]
    code = main(["convert-hf", str(checkpoint), "-o", str(tmp_path / "a"), "--compress-calibration", str(planned["wav"])])
    assert code in (1, 2) and "--compress-calibration needs --compress" in capsys.readouterr().err
    text = tmp_path / "notes.txt"
    text.write_text("not audio")
    code = main(["convert-hf", str(checkpoint), "-o", str(tmp_path / "b"), "--compress", "auto4",
                 "--compress-calibration", str(text)])
    err = capsys.readouterr().err
    assert code in (1, 2) and err.startswith("rlx-mil convert-hf: error:") and "notes.txt" in err, err
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())
    # the audio reaches the speech conversion as the plan's calibration
    seen: dict = {}

    def plan(config: object, checkpoint: object, built: object, heard: calibration.SpeechCalibration,
             **_: object) -> object:
        seen["label"] = heard.label
        raise RuntimeError("planned")

    monkeypatch.setattr(folder_plan, "plan_folder", plan)
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path / "c"), "--compress", "auto4",
                 "--compress-calibration", str(planned["wav"])]) != 0
    assert "RuntimeError: planned" in capsys.readouterr().err and seen["label"].endswith("s of speech.wav")
    # without audio: the built-in calibration clip (the check's clip is another)
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path / "d"), "--compress", "auto4"]) != 0
    assert "RuntimeError: planned" in capsys.readouterr().err
    assert seen["label"].startswith("the built-in English calibration clip")


def test_the_folder_budget() -> None:
    # auto4's default for a speech folder is measured (0.33x of the fp16 packages on Whisper base)
    assert folder_plan.folder_budget(parse_compress("auto4")) == 0.325
    assert folder_plan.folder_budget(parse_compress("auto6")) == 0.42  # AUTO_BUDGETS where none is measured
    assert folder_plan.folder_budget(parse_compress("auto4;budget=0.4;max_kl=0.01")) == 0.4
    assert folder_plan.folder_budget(parse_compress("auto4;max_kl=0.01")) == 1.0  # the target search stops the widening


def test_a_stateful_decoder_takes_the_same_schemes(planned: dict) -> None:
    # --stateful converts the decoder again (the cross-attention and decode functions): its
    # weights are the TextDecoder's, and each takes the plan's scheme
    config = planned["config"]
    spec = open_whisper(planned["checkpoint"]).spec
    for graph, names in (build_stateful_decoder(spec), build_cross_kv(spec)):
        compressor = WeightCompressor(config, graph, Target.IOS18, Precision.FP16,
                                      params=ParamsOf(open_whisper(planned["checkpoint"]).params, names))
        assert compressor.auto_names
        assert all(compressor.schemes[n] == config.plan.schemes[n] for n in compressor.auto_names)

