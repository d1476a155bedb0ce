"""`transcribe`: audio in, text and timed segments out, over a Whisper package folder.

Audio is read and resampled (`speech.audio`), cut into 30 s windows by Whisper's seek logic
(`speech.segments`), and each window goes through the log-mel front end, the encoder and greedy
decoding (`speech.decoding`). Text streams to a callback as it is decoded: token by token
without timestamps; with timestamps, segment by segment as each closes, since the unfinished
tail of a window is decoded again in the next one and must not be shown twice.

What openai-whisper's `transcribe` adds beyond this is left out on purpose: conditioning a
window on the previous window's text, temperature fallback, and the no-speech and
compression-ratio thresholds. Decoding is greedy, as transformers' `generate` is by default,
so the two give the same tokens on the same checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import MissingFileError, NotADirectoryPathError
from rlx_mil.speech.audio import Audio, as_audio, content_frames, window, window_frames
from rlx_mil.speech.decoding import DecodingOptions, decode_window
from rlx_mil.speech.model import WhisperModel
from rlx_mil.speech.segments import Segment, split_window
from rlx_mil.speech.tokens import SpeechPackageError, WhisperTokens, load_tokens, read_json

TextSink = Callable[[str], None]
SegmentSink = Callable[[Segment], None]


@dataclass(frozen=True)
class Transcript:
    """The text of one audio input, its language (None for English-only checkpoints) and its
    segments."""

    text: str
    language: str | None
    segments: list[Segment]
    seconds: float
    source: str = ""
    task: str = "transcribe"
    windows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "language": self.language, "task": self.task, "duration": round(self.seconds, 3),
            "text": self.text, "segments": [s.to_json() for s in self.segments], **self.extra,
        }


class _TextStream:
    """A window's sampled tokens -> new text, whole characters only (a byte-level token can end
    inside a UTF-8 character: the replacement character it decodes to waits for the rest)."""

    def __init__(self, tokens: WhisperTokens, sink: TextSink | None) -> None:
        self.tokens, self.sink = tokens, sink
        self.shown = ""

    def show(self, ids: list[int], final: bool = False) -> None:
        if self.sink is None:
            return
        text = self.tokens.text(ids)
        if not final and text.endswith("\ufffd"):
            return
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.sink(text[len(self.shown):])
            self.shown = text


def transcribe_audio(
    model: WhisperModel,
    tokens: WhisperTokens,
    audio: Audio,
    options: DecodingOptions | None = None,
    on_text: TextSink | None = None,
    on_segment: SegmentSink | None = None,
) -> Transcript:
    """Transcribe (or translate) `audio` with `model`; `on_text` sees the text as it is decoded,
    `on_segment` each segment once its window is done."""
    options = options or DecodingOptions()
    options.check(tokens)
    total = content_frames(audio)
    seek, windows = 0, 0
    segments: list[Segment] = []
    while seek < total:
        advance, found, language = _transcribe_window(model, tokens, audio, seek, options, on_text)
        options = replace(options, language=language)  # detected on the first window, kept after
        segments.extend(found)
        if on_segment is not None:
            for segment in found:
                on_segment(segment)
        seek += advance
        windows += 1
    return Transcript(
        text="".join(s.text for s in segments), language=options.language if tokens.multilingual else None,
        segments=segments, seconds=audio.seconds, source=audio.name, task=options.task, windows=windows,
    )


def _transcribe_window(
    model: WhisperModel, tokens: WhisperTokens, audio: Audio, seek: int, options: DecodingOptions,
    on_text: TextSink | None,
) -> tuple[int, list[Segment], str | None]:
    """One window at mel frame `seek`: (frames to advance, its segments, its language)."""
    frames = window_frames(audio, seek)
    encoded = model.encode(model.log_mel(window(audio, seek)))
    sampled: list[int] = []
    stream = _TextStream(tokens, on_text)

    def on_token(token: int) -> None:
        sampled.append(token)
        if not options.timestamps:
            stream.show(sampled)
        elif tokens.is_timestamp(token) and len(sampled) >= 2 and not tokens.is_timestamp(sampled[-2]):
            stream.show(sampled)  # a segment closed: it stays whatever comes next

    decoded = decode_window(model, encoded, tokens, options, on_token)
    split = split_window(decoded.tokens, tokens, seek, frames, options.timestamps)
    stream.show(decoded.tokens[: split.kept], final=True)
    found = []
    for (start, stop), (t0, t1) in zip(split.slices, split.times, strict=True):
        piece = decoded.tokens[start:stop]
        text = tokens.text(piece)
        if text.strip():
            found.append(Segment(t0, t1, text, piece))
    return split.advance, found, decoded.language


def check_speech_folder(folder: str | os.PathLike[str]) -> Path:
    """`folder` as a Path if it can be a speech package folder (a folder, with a Whisper
    config when it has one); a typed error naming it otherwise."""
    root = Path(folder)
    if not root.exists():
        raise MissingFileError(f"{root}: no such speech package folder")
    if not root.is_dir():
        raise NotADirectoryPathError(f"{root}: a file, not a speech package folder")
    if root.suffix == ".mlpackage":
        raise SpeechPackageError(
            f"{root}: a single .mlpackage, not a speech package folder (the folder convert-hf writes for a Whisper"
            " checkpoint: MelSpectrogram, AudioEncoder and TextDecoder packages beside the tokenizer)"
        )
    config = read_json(root / "config.json")
    if config is not None and config.get("model_type", "whisper") != "whisper":
        raise SpeechPackageError(f"{root}: a {config.get('model_type')!r} model's folder, not a Whisper speech package")
    return root


def open_model(folder: Path, *, stateful: bool = False, engine: str = "auto") -> WhisperModel:
    """The Whisper packages of `folder` as a WhisperModel (`rlx_mil.speech.runner`) run by
    `engine`: "coreml" (macOS), "milexec" (the NumPy MIL executor) or "auto" (Core ML where it
    runs); `stateful` runs the stateful text decoder."""
    from rlx_mil.speech.runner import PackagedWhisper

    return PackagedWhisper(folder, stateful=stateful, engine=engine)


class Transcriber:
    """A speech package folder opened once (tokenizer, generation config, packages) for any
    number of audio inputs. `model` replaces the folder's packages (any `WhisperModel`)."""

    def __init__(
        self, folder: str | os.PathLike[str], *, stateful: bool = False, model: WhisperModel | None = None,
        engine: str = "auto",
    ) -> None:
        self.folder = check_speech_folder(folder)
        self.tokens = load_tokens(self.folder)
        self.model = model if model is not None else open_model(self.folder, stateful=stateful, engine=engine)
        if self.model.vocab_size <= self.tokens.timestamp_begin:
            raise SpeechPackageError(
                f"{self.folder}: the text decoder's vocabulary ({self.model.vocab_size}) ends before the tokenizer's"
                f" timestamps (from {self.tokens.timestamp_begin}): tokenizer and packages do not belong together"
            )

    def transcribe(
        self, audio: str | os.PathLike[str] | np.ndarray | Audio, *, language: str | None = None,
        task: str = "transcribe", timestamps: bool = False, on_text: TextSink | None = None,
        on_segment: SegmentSink | None = None, max_tokens: int | None = None,
    ) -> Transcript:
        options = DecodingOptions(language=language, task=task, timestamps=timestamps, max_tokens=max_tokens)
        options.check(self.tokens)  # before reading the audio: a bad option costs nothing
        audio = audio if isinstance(audio, Audio) else as_audio(audio)
        return transcribe_audio(self.model, self.tokens, audio, options, on_text, on_segment)


def transcribe(
    folder: str | os.PathLike[str], audio: str | os.PathLike[str] | np.ndarray, *, language: str | None = None,
    task: str = "transcribe", timestamps: bool = False, on_text: TextSink | None = None, stateful: bool = False,
) -> Transcript:
    """Transcribe `audio` (a WAV path, or 16 kHz mono float samples) with the Whisper packages
    in `folder`. `language` None detects it; `task` "translate" translates into English;
    `timestamps` decodes timed segments; `on_text` receives the text as it is decoded;
    `stateful` runs the folder's stateful text decoder."""
    return Transcriber(folder, stateful=stateful).transcribe(
        audio, language=language, task=task, timestamps=timestamps, on_text=on_text
    )
