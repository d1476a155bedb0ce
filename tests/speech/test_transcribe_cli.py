"""`rlx-mil transcribe` over a scripted model standing in for the folder's packages: output
forms, and one `rlx-mil transcribe: error:` line for bad audio, options and folders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from rlx_mil.cli.main import main
from tests.speech.fake_whisper import (
    NO_TIMESTAMPS,
    TS,
    ScriptedWhisper,
    speaking,
    tiny_tokens,
    write_speech_folder,
)

TOKENS = tiny_tokens()


def ids(text: str) -> list[int]:
    return [int(t) for t in TOKENS.tokenizer.encode(text, add_special_tokens=False).ids]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A speech folder whose packages are a script saying ' hello there' (timestamped: 0.00 to
    1.00 s)."""
    path = write_speech_folder(tmp_path / "openai_whisper-tiny")
    timed = speaking([[TS, *ids(" hello there"), TS + 50]])
    plain = speaking([ids(" hello there")])
    script = lambda window, fed: (plain if NO_TIMESTAMPS in fed else timed)(window, fed)  # noqa: E731
    monkeypatch.setattr("rlx_mil.speech.transcription.open_model",
                        lambda where, stateful=False, engine="auto": ScriptedWhisper(script))
    return path


def speech(tmp_path: Path, name: str = "a.wav", seconds: float = 2.0, rate: int = 22050) -> Path:
    path = tmp_path / name
    t = np.arange(round(seconds * rate)) / rate
    sf.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, subtype="PCM_16")
    return path


def test_text_streams_to_stdout(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["transcribe", str(folder), str(speech(tmp_path)), "--language", "en"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "hello there\n"
    assert "2.00 s of audio in 1 window, language en" in captured.err and "real-time factor" in captured.err


def test_json_holds_language_text_and_segments(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["transcribe", str(folder), str(speech(tmp_path)), "--json", "--timestamps", "-q"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["language"] == "de" and doc["text"] == " hello there" and doc["task"] == "transcribe"
    assert doc["segments"] == [{"start": 0.0, "end": 1.0, "text": " hello there",
                                "tokens": [TS, *ids(" hello there"), TS + 50]}]
    assert captured.err == ""


def test_timestamps_print_timed_lines(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    audio = [str(speech(tmp_path, "a.wav")), str(speech(tmp_path, "b.wav", rate=16000))]
    assert main(["transcribe", str(folder), *audio, "--timestamps", "-q"]) == 0
    assert capsys.readouterr().out == "".join(f"{a}: [00:00.000 --> 00:01.000] hello there\n" for a in audio)


def test_stateful_and_engine_are_passed_to_the_runner(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bool, str]] = []
    monkeypatch.setattr("rlx_mil.speech.transcription.open_model",
                        lambda where, stateful=False, engine="auto": seen.append((stateful, engine))
                        or ScriptedWhisper(speaking([ids(" x")])))
    assert main(["transcribe", str(folder), str(speech(tmp_path)), "--stateful", "-q", "--language", "en"]) == 0
    assert main(["transcribe", str(folder), str(speech(tmp_path)), "--engine", "milexec", "-q", "--language", "en"]) == 0
    assert seen == [(True, "auto"), (False, "milexec")] and capsys.readouterr().out == "x\nx\n"


@pytest.mark.parametrize(
    ("make", "extra", "message"),
    [
        (lambda p: p.write_bytes(b"not a wav at all" * 8), [], "not a readable WAV file"),
        (lambda p: sf.write(p, np.zeros((100, 8), np.float32), 16000), [], "8 channels"),
        (lambda p: sf.write(p, np.array([0.0, np.nan], np.float32), 16000, subtype="FLOAT"), [], "NaN"),
        (lambda p: sf.write(p, np.zeros(100, np.float32), 16000), ["--language", "xx"], "unknown language 'xx'"),
    ],
)
def test_bad_input_is_one_error_line(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any,
                                     extra: list[str], message: str) -> None:
    bad = tmp_path / "bad.wav"
    make(bad)
    assert main(["transcribe", str(folder), str(speech(tmp_path)), str(bad), *extra]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("rlx-mil transcribe: error: ")
    assert message in lines[0]


def test_a_folder_that_is_not_a_speech_package_is_one_error_line(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert main(["transcribe", str(tmp_path / "llm"), str(speech(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlx-mil transcribe: error: ") and "not a Whisper speech package" in err
    assert main(["transcribe", str(tmp_path / "none"), str(speech(tmp_path))]) == 1
    assert "no such speech package folder" in capsys.readouterr().err
