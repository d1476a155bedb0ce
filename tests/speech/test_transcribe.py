"""Transcription over a scripted model: windows and seek, segments, streamed text, folders."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.errors import MissingFileError, NotADirectoryPathError, RlxMilError
from rlx_mil.speech.audio import as_audio
from rlx_mil.speech.decoding import DecodingOptions
from rlx_mil.speech.segments import split_window
from rlx_mil.speech.tokens import SpeechPackageError
from rlx_mil.speech.transcription import Transcriber, transcribe_audio
from tests.speech.fake_whisper import (
    EOT,
    NO_TIMESTAMPS,
    SOT,
    TRANSCRIBE,
    TS,
    Script,
    ScriptedWhisper,
    ramp,
    row,
    speaking,
    tiny_tokens,
    write_speech_folder,
)

TOKENS = tiny_tokens()


def ids(text: str) -> list[int]:
    return [int(t) for t in TOKENS.tokenizer.encode(text, add_special_tokens=False).ids]


def test_without_timestamps_windows_advance_30_s_and_each_is_one_segment() -> None:
    model = ScriptedWhisper(speaking([ids(" one"), ids(" two"), ids(" three")]))
    shown: list[str] = []
    result = transcribe_audio(model, TOKENS, as_audio(ramp(65.0)), DecodingOptions(), shown.append)
    assert model.starts == [0, 30 * 16000, 60 * 16000]
    assert result.text == " one two three" and "".join(shown) == result.text and len(shown) == 11
    assert [(s.start, s.end, s.text) for s in result.segments] == [
        (0.0, 30.0, " one"), (30.0, 60.0, " two"), (60.0, 65.0, " three")]
    assert result.language == "de" and result.windows == 3  # detected on the first window, then given
    prompts = [c for c in model.calls if c[0] == SOT]
    assert prompts == [[SOT], [SOT, SOT + 2, TRANSCRIBE, NO_TIMESTAMPS], [SOT, SOT + 2, TRANSCRIBE, NO_TIMESTAMPS]]
    assert model.calls[1] == [SOT + 2, TRANSCRIBE, NO_TIMESTAMPS]


def test_with_timestamps_seek_goes_back_to_the_last_complete_segment() -> None:
    # window 0: two closed segments, then an unfinished one cut by the window's end (no EOT)
    first = [TS, *ids(" a"), TS + 100, TS + 100, *ids(" b"), TS + 600, TS + 600, *ids(" cut")]
    # window 1 (from 12 s): a complete segment ending on a single timestamp
    second = [TS, *ids(" c"), TS + 150]
    model = ScriptedWhisper(_exact([first, second]))
    shown: list[str] = []
    result = transcribe_audio(model, TOKENS, as_audio(ramp(40.0)),
                              DecodingOptions(language="en", timestamps=True, max_tokens=len(first)), shown.append)
    assert model.starts == [0, 12 * 16000]  # window 1 ends on a single timestamp: its 28 s are done
    assert [(s.start, s.end, s.text) for s in result.segments] == [
        (0.0, 2.0, " a"), (2.0, 12.0, " b"), (12.0, 15.0, " c")]
    assert "".join(shown) == " a b c"  # the cut segment is never shown
    assert result.segments[0].tokens == [TS, *ids(" a"), TS + 100]


def _exact(per_window: Sequence[Sequence[int]]) -> Script:
    """Each window says exactly its tokens (whatever the rules would prefer), then EOT."""

    def script(window: int, fed: Sequence[int]) -> np.ndarray:
        start = max(i for i, t in enumerate(fed) if t in (SOT, SOT + 1, TRANSCRIBE)) + 1
        said = len(fed) - start
        wanted = per_window[min(window, len(per_window) - 1)]
        return row((wanted[said], 50.0), base=-50.0) if said < len(wanted) else row((EOT, 50.0), base=-50.0)

    return script


@pytest.mark.parametrize(
    ("tokens", "advance", "slices", "times"),
    [
        # single timestamp ending: all speech consumed, a whole window
        ([TS, 1, TS + 50], 3000, [(0, 3)], [(0.0, 1.0)]),
        # pairs, ending on a pair: the tail after the last pair is dropped, seek to 3.00 s
        ([TS, 1, TS + 50, TS + 50, 2, TS + 150, TS + 150, 3], 300, [(0, 3), (3, 6)], [(0.0, 1.0), (1.0, 3.0)]),
        # pairs, then a single timestamp ending: every segment kept
        ([TS, 1, TS + 50, TS + 50, 2, TS + 150], 3000, [(0, 3), (3, 6)], [(0.0, 1.0), (1.0, 3.0)]),
        # no timestamp closing: one segment over the whole window
        ([TS, 1, 2], 3000, [(0, 3)], [(0.0, 30.0)]),
    ],
)
def test_split_window_follows_whispers_seek(tokens: list[int], advance: int, slices: list[tuple[int, int]],
                                            times: list[tuple[float, float]]) -> None:
    split = split_window(tokens, TOKENS, 0, 3000, timestamps=True)
    assert (split.advance, split.slices) == (advance, slices)
    np.testing.assert_allclose(split.times, times, atol=1e-9)
    moved = split_window(tokens, TOKENS, 1000, 3000, timestamps=True)
    np.testing.assert_allclose(moved.times, [(a + 10, b + 10) for a, b in times], atol=1e-9)


def test_split_window_without_timestamps_is_the_whole_window() -> None:
    split = split_window([1, 2, 3], TOKENS, 6000, 1000, timestamps=False)
    assert (split.advance, split.slices, split.times) == (1000, [(0, 3)], [(60.0, 70.0)])


def test_streamed_text_waits_for_whole_characters() -> None:
    word = ids(" hé")  # é is two byte-level tokens
    assert len(word) == 3
    model = ScriptedWhisper(speaking([word]))
    shown: list[str] = []
    result = transcribe_audio(model, TOKENS, as_audio(ramp(2.0)), DecodingOptions(language="en"), shown.append)
    assert result.text == " hé" and shown == [" h", "é"]


def test_english_only_checkpoints_report_no_language() -> None:
    english = tiny_tokens(multilingual=False)
    model = ScriptedWhisper(speaking([ids(" hi")]))
    result = transcribe_audio(model, english, as_audio(ramp(1.0)))
    assert result.language is None and result.text == " hi" and model.calls[0] == [SOT, NO_TIMESTAMPS]


def test_transcriber_reads_the_folder_and_checks_it(tmp_path: Path) -> None:
    folder = write_speech_folder(tmp_path / "openai_whisper-tiny")
    model = ScriptedWhisper(speaking([ids(" ok")]))
    transcript = Transcriber(folder, model=model).transcribe(ramp(3.0), language="fr", timestamps=False)
    assert transcript.text == " ok" and transcript.language == "fr"
    doc = json.loads(json.dumps(transcript.to_json()))
    assert doc["segments"] == [{"start": 0.0, "end": 3.0, "text": " ok", "tokens": ids(" ok")}]
    with pytest.raises(RlxMilError, match="unknown language"):
        Transcriber(folder, model=model).transcribe(np.zeros(10, np.float32), language="zz")


def test_folders_that_are_not_speech_packages_are_typed_errors(tmp_path: Path) -> None:
    model = ScriptedWhisper(speaking([[]]))
    with pytest.raises(MissingFileError):
        Transcriber(tmp_path / "nope", model=model)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryPathError):
        Transcriber(tmp_path / "file", model=model)
    with pytest.raises(SpeechPackageError, match=r"no tokenizer\.json"):
        Transcriber(tmp_path, model=model)
    llm = write_speech_folder(tmp_path / "llm")
    (llm / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(SpeechPackageError, match="'llama' model's folder"):
        Transcriber(llm, model=model)
    bad = write_speech_folder(tmp_path / "bad")
    (bad / "tokenizer.json").write_text("{not json")
    with pytest.raises(SpeechPackageError, match="tokenizer"):
        Transcriber(bad, model=model)
    small = write_speech_folder(tmp_path / "small")
    model.vocab_size = 100
    with pytest.raises(SpeechPackageError, match="do not belong together"):
        Transcriber(small, model=model)
