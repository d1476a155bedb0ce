"""`--compress auto4` of a Whisper folder: one plan over the encoder's and decoder's weights
(`rlx_mil.speech.folder_plan`), measured on the user's audio or the built-in signal, on a tiny
random Whisper. The candidates are cut to int4 (per channel, per block) / int8 and the measured weights to a few, so the
plan takes seconds; what is checked is that one budget is spent over both packages."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli.main import main
from rlx_mil.compress import WeightCompressor, parse_compress
from rlx_mil.compress.emit import compressed_bytes
from rlx_mil.compress.plan import encode
from rlx_mil.errors import CompressionWarning
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.models.whisper import build_cross_kv, build_stateful_decoder
from rlx_mil.models.whisper_checkpoint import ParamsOf, open_whisper
from rlx_mil.speech import calibration, folder_plan
from rlx_mil.speech.calibration import builtin_speech, speech_calibration
from rlx_mil.speech.folder_plan import plan_folder
from rlx_mil.speech.model import SAMPLE_RATE
from rlx_mil.speech.packages import graphs
from tests.speech.fake_whisper import write_text_checkpoint
from tests.speech.test_transcribe_packages import CACHE, CONFIG, speech_wav

pytestmark = pytest.mark.xdist_group("whisper-packages")

BUDGET = 0.3


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("tiny_whisper_plan")
    checkpoint = write_text_checkpoint(root / "whisper-tiny", CONFIG, says_text=False)
    wav = speech_wav(root / "speech.wav", 2.0)
    built = graphs(open_whisper(checkpoint), CACHE, True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(folder_plan, "CANDIDATES", {4: ("int4-channel", "int4", "int8")})
        patch.setattr(folder_plan, "MEASURED", {"encoder": 8, "decoder": 8})
        patch.setattr(calibration, "CALIBRATION_SECONDS", 0.5)
        # A decoder target (mean KL 0.001) the budget cannot hold: the decoder takes every byte
        # the encoder (already within its target) can spare, and the plan says what budget would do.
        with pytest.warns(CompressionWarning) as caught:
            config = plan_folder(parse_compress(f"auto4;budget={BUDGET};max_kl=0.001"), open_whisper(checkpoint), built,
                                 speech_calibration([wav]), target="iOS18", precision="fp16")
    return {"checkpoint": checkpoint, "config": config, "built": built, "wav": wav,
            "warnings": [str(w.message) for w in caught]}


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
                        r" predicted (AudioEncoder cosine 0\.9\d+ \(target cosine 0\.9900\), )?TextDecoder mean KL \S+ \(target mean KL 0\.001\); a budget of (0\.\d+) is predicted"
                        r" to meet it", planned["warnings"][0]), planned["warnings"]
    for role in before:  # the summary's per-package sizes count the float weights too
        assert said[role] >= fractions[role] * 0.9, (said, fractions)


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

