"""`rlx-mil eval SPEECH_FOLDER --audio FILES --reference CHECKPOINT` on a tiny random Whisper:
the reference model (the checkpoint through the NumPy reference interpreter) against the tests'
independent NumPy forward, and the reported numbers against the same metrics computed here from
that forward and the package run on its own."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli.main import main
from rlx_mil.compress.quality import cosine, decoder_quality, psnr
from rlx_mil.compress.quality_check import check_from_dict
from rlx_mil.speech.audio import read_audio, window
from rlx_mil.speech.decoding import DecodingOptions, decode_window
from rlx_mil.speech.evaluate import ReferenceWhisper, SpeechEvalFile, SpeechEvalResult, speech_folder_in
from rlx_mil.speech.packages import convert_whisper
from rlx_mil.speech.runner import PackagedWhisper
from rlx_mil.speech.tokens import load_tokens
from tests.speech.fake_whisper import write_text_checkpoint
from tests.speech.test_transcribe_packages import CACHE, CONFIG, NumpyWhisper, speech_wav

pytestmark = pytest.mark.xdist_group("whisper-packages")

MAX_TOKENS = 6


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_whisper_eval")
    checkpoint = write_text_checkpoint(root / "whisper-tiny", CONFIG)
    # 2-bit tables: a package that visibly loses quality (the check must see it); a rule that
    # names encoder weights only (the decoder's package holds none of them)
    out = root / "out"
    convert_whisper(checkpoint, out, precision="fp32", cache_len=CACHE,
                    compress=r"lut2;re:^model\.encoder\.layers\.0\.fc1\.=int8;check=off")
    return {"checkpoint": checkpoint, "out": out, "wav": speech_wav(root / "speech.wav", 2.0)}


@pytest.fixture(scope="module")
def reported(built: dict[str, Path]) -> dict:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["eval", str(built["out"]), "--audio", str(built["wav"]), "--reference", str(built["checkpoint"]),
                     "--max-tokens", str(MAX_TOKENS), "--language", "en", "--json", "-q"])
    assert code == 0
    return json.loads(buffer.getvalue())


@pytest.fixture(scope="module")
def forward(built: dict[str, Path]) -> dict:
    """The independent forward's log-mel and encoder output of the test audio (computed once)."""
    model = NumpyWhisper(built["checkpoint"])
    samples = window(read_audio(built["wav"]), 0)
    mel = model.log_mel(samples)
    return {"model": model, "samples": samples, "mel": mel, "encoded": model.encode(mel)}


def test_reference_model_is_the_independent_numpy_forward(built: dict[str, Path], forward: dict) -> None:
    reference = ReferenceWhisper(built["checkpoint"], cache_len=CACHE)
    mel = reference.log_mel(forward["samples"])
    np.testing.assert_allclose(mel, forward["mel"], atol=2e-4)
    encoded = reference.encode(mel)
    want = forward["encoded"]
    assert cosine(want, encoded) > 0.999999
    np.testing.assert_allclose(encoded, want, atol=1e-3 * float(np.abs(want).max()))
    tokens = [int(t) for t in load_tokens(speech_folder_in(built["out"])).prompt("en", "transcribe", False)] + [300, 301]
    got = reference.decoder(encoded).step(tokens)
    expect = forward["model"].decoder(encoded).step(tokens)
    np.testing.assert_allclose(got, expect, atol=1e-3 * float(np.abs(expect).max()))


def test_eval_reports_the_metrics_of_the_package_against_the_checkpoint(reported: dict, built: dict[str, Path],
                                                                        forward: dict) -> None:
    """Every number the command prints, recomputed: the reference's greedy transcript from the
    independent forward, the package's logits teacher-forced over it on its own encoder output."""
    folder = speech_folder_in(built["out"])
    tokens = load_tokens(folder)
    package, samples, ref_encoded = PackagedWhisper(folder), forward["samples"], forward["encoded"]
    decoded = decode_window(forward["model"], ref_encoded, tokens, DecodingOptions(language="en", max_tokens=MAX_TOKENS))
    fed = decoded.prompt + decoded.tokens
    wanted = decoded.tokens + ([tokens.eot] if decoded.ended else [])
    fed = fed if decoded.ended else fed[:-1]
    first = len(decoded.prompt) - 1
    encoded = package.encode(package.log_mel(samples))
    want = decoder_quality(forward["model"].decoder(ref_encoded).step(fed)[first:], package.decoder(encoded).step(fed)[first:], wanted)
    quality = reported["quality"]
    assert quality["compared_with"] == "the checkpoint (NumPy reference, float32)"
    got = quality["decoder"]
    assert got["positions"] == want.positions == len(wanted) and got["confident_positions"] == want.confident_positions
    assert got["top1"] == pytest.approx(want.top1) and got["top1_confident"] == pytest.approx(want.top1_confident)
    assert got["mean_kl"] == pytest.approx(want.mean_kl, rel=1e-2, abs=1e-6)
    assert got["perplexity_ratio"] == pytest.approx(want.perplexity_ratio, rel=1e-3)
    [enc] = quality["outputs"]
    assert enc["name"] == "encoder_output"
    assert enc["cosine"] == pytest.approx(cosine(ref_encoded, encoded), abs=1e-5)
    assert enc["psnr"] == pytest.approx(psnr(ref_encoded, encoded), abs=0.05)
    # 2-bit tables lose quality and the report says so
    assert got["mean_kl"] > 1e-3 and enc["cosine"] < 0.99
    assert quality["ok"] is not (enc["cosine"] < 0.95 or got["mean_kl"] > 0.1)
    [file] = reported["files"]
    assert file["transcript"] == tokens.text(decoded.tokens) and file["positions"] == len(wanted)


def test_text_output_names_what_it_measured(reported: dict) -> None:
    result = SpeechEvalResult(check_from_dict(reported["quality"]), [SpeechEvalFile(**f) for f in reported["files"]])
    out = result.to_text()
    assert "quality vs the checkpoint (NumPy reference, float32): top-1" in out
    assert "encoder_output cosine" in out and "positions of the reference's greedy transcript" in out


@pytest.mark.parametrize("extra, message", [
    ([], "--reference CHECKPOINT"),
    (["--reference", "{wav}"], "not a folder"),
    (["--reference", "{checkpoint}", "--text", "{wav}"], "--text is for a text decoder"),
])
def test_bad_speech_eval_arguments_are_one_line(built: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                extra: list[str], message: str) -> None:
    args = [a.format(wav=built["wav"], checkpoint=built["checkpoint"]) for a in extra]
    assert main(["eval", str(built["out"]), "--audio", str(built["wav"]), *args, "-q"]) in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlx-mil eval: error:") and message in err[0]


def test_a_speech_folder_without_audio_says_what_to_give(built: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(speech_folder_in(built["out"])), "-q"]) in (1, 2)
    err = capsys.readouterr().err
    assert "--audio" in err and len(err.strip().splitlines()) == 1


def test_folder_rules_apply_to_the_package_holding_their_weights(built: dict[str, Path]) -> None:
    from rlx_mil.compress import report_of
    from rlx_mil.coreml.package_info import package_info

    folder = speech_folder_in(built["out"])
    schemes = {}
    for role in ("AudioEncoder", "TextDecoder"):
        report = report_of(package_info(folder / f"{role}.mlpackage").metadata)
        assert report is not None
        schemes.update({w.name: w.scheme for w in report.weights})
    assert schemes["model.encoder.layers.0.fc1.weight"].startswith("int8")
    assert schemes["model.encoder.layers.1.fc1.weight"].startswith("lut2")
    assert schemes["model.decoder.layers.0.fc1.weight"].startswith("lut2")


def test_a_rule_matching_no_weight_of_the_folder_is_refused_before_converting(built: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    from rlx_mil.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match=r"(?s)the speech folder.*encodr"):
        convert_whisper(built["checkpoint"], tmp_path / "never", precision="fp32", cache_len=CACHE,
                        compress=r"int8;re:^model\.encodr\.=int4")
    assert not (tmp_path / "never").exists() or not any((tmp_path / "never").rglob("*.mlpackage"))
