"""Whisper's special tokens, read from a package folder's `tokenizer.json` (the `tokenizers`
library) and its `generation_config.json`.

Whisper's vocabulary is the text tokens, then `<|endoftext|>`, `<|startoftranscript|>`, one
token per language (`<|en|>` ...), `<|translate|>`, `<|transcribe|>`, `<|startoflm|>`,
`<|startofprev|>`, `<|nospeech|>` (`<|nocaptions|>` in older tokenizers), `<|notimestamps|>`,
and 1501 timestamps `<|0.00|>` .. `<|30.00|>` in steps of 0.02 s. English-only checkpoints
(`.en`) have no language tokens and no task tokens in their prompt. Every id is looked up by
its token's text, never assumed, so fine-tunes with other vocabularies read right.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlx_mil.errors import RlxMilError
from rlx_mil.fileio import read_regular_file

#: Seconds per timestamp token (30 s over 1500 encoder positions).
TIME_PRECISION = 0.02
#: Timestamp tokens: 0.00 .. 30.00 s.
N_TIMESTAMPS = 1501
#: openai-whisper's default `max_initial_timestamp` (1.0 s) in timestamp steps.
DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX = 50
TASKS = ("transcribe", "translate")
_LANGUAGE_TOKEN = re.compile(r"<\|([a-z]{2,3}(?:_[a-z]+)?)\|>")
_TOKENIZER_LIMIT = 64 << 20
_CONFIG_LIMIT = 4 << 20


class SpeechPackageError(RlxMilError):
    """A folder given for transcription is not a speech package, or its tokenizer or
    generation config lacks what Whisper decoding needs; the message names the file."""


@dataclass(frozen=True)
class WhisperTokens:
    """Special token ids, the suppression lists, and the tokenizer that turns ids into text."""

    eot: int
    sot: int
    no_timestamps: int
    #: The first timestamp token (`<|0.00|>`), `no_timestamps + 1`.
    timestamp_begin: int
    transcribe: int | None
    translate: int | None
    sot_prev: int | None
    sot_lm: int | None
    no_speech: int | None
    #: Language code -> token id, in vocabulary order; empty for English-only checkpoints.
    languages: dict[str, int]
    #: Suppressed at every step (generation_config `suppress_tokens`).
    suppress: tuple[int, ...]
    #: Suppressed at the first sampled position (`begin_suppress_tokens`: space and EOT).
    begin_suppress: tuple[int, ...]
    max_initial_timestamp_index: int | None = DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX
    tokenizer: Any = field(default=None, repr=False, compare=False)

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)

    def is_timestamp(self, token: int) -> bool:
        return token >= self.timestamp_begin

    def prompt(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """The start-of-transcript sequence: SOT, language and task (multilingual only), and
        `<|notimestamps|>` unless timestamps are asked for."""
        ids = [self.sot]
        if self.multilingual:
            if language is None:
                raise RlxMilError("a multilingual checkpoint's prompt needs a language (detected or given)")
            ids.append(self.language_token(language))
            task_id = self.translate if task == "translate" else self.transcribe
            if task_id is None:
                raise SpeechPackageError(f"the tokenizer has no <|{task}|> token")
            ids.append(task_id)
        if not timestamps:
            ids.append(self.no_timestamps)
        return ids

    def language_token(self, language: str) -> int:
        if language not in self.languages:
            known = ", ".join(self.languages) or "none: the checkpoint is English-only"
            raise RlxMilError(f"unknown language {language!r} (the checkpoint's languages: {known})")
        return self.languages[language]

    def text(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special and timestamp tokens left out."""
        kept = [t for t in ids if t < self.eot]
        return str(self.tokenizer.decode(kept, skip_special_tokens=False)) if kept else ""

    def time_of(self, token: int) -> float:
        return (token - self.timestamp_begin) * TIME_PRECISION


def load_tokens(folder: str | os.PathLike[str]) -> WhisperTokens:
    """The special tokens of package folder `folder`: its `tokenizer.json` and (when present)
    `generation_config.json` (the suppression lists; without it openai-whisper's defaults are
    derived from the tokenizer)."""
    from tokenizers import Tokenizer

    root = Path(folder)
    path = root / "tokenizer.json"
    if not path.is_file():
        raise SpeechPackageError(f"{root}: no tokenizer.json; a speech package folder holds Whisper's tokenizer")
    data = read_regular_file(path, _TOKENIZER_LIMIT, SpeechPackageError, "tokenizer file")
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as err:  # the tokenizers library raises its own Exception type
        raise SpeechPackageError(f"{path}: not a tokenizer the tokenizers library reads ({err})") from None
    generation = read_json(root / "generation_config.json")
    return tokens_from(tokenizer, generation, where=str(path))


def tokens_from(tokenizer: Any, generation: dict[str, Any] | None, *, where: str = "tokenizer") -> WhisperTokens:
    """WhisperTokens of a `tokenizers.Tokenizer` and a generation config dict (or None)."""

    def find(*names: str) -> int | None:
        for name in names:
            token = tokenizer.token_to_id(name)
            if token is not None:
                return int(token)
        return None

    def need(name: str) -> int:
        token = find(name)
        if token is None:
            raise SpeechPackageError(f"{where}: no {name} token; not a Whisper tokenizer")
        return token

    eot, sot, no_timestamps = need("<|endoftext|>"), need("<|startoftranscript|>"), need("<|notimestamps|>")
    transcribe, translate = find("<|transcribe|>"), find("<|translate|>")
    generation = generation or {}
    # English-only vocabularies hold the language tokens too; openai-whisper tells them apart by
    # size (a multilingual vocabulary has one more text token: 51865 entries with timestamps).
    multilingual = generation.get("is_multilingual", no_timestamps + 1 + N_TIMESTAMPS >= 51865)
    languages: dict[str, int] = {}
    for token in range(sot + 1, translate if translate is not None and multilingual else sot + 1):
        match = _LANGUAGE_TOKEN.fullmatch(tokenizer.id_to_token(token) or "")
        if match:
            languages[match.group(1)] = token
    suppress = generation.get("suppress_tokens")
    begin = generation.get("begin_suppress_tokens")
    specials = [t for t in (transcribe, translate, sot, find("<|startofprev|>"), find("<|startoflm|>"),
                            find("<|nospeech|>", "<|nocaptions|>")) if t is not None]
    if not isinstance(suppress, list):  # openai-whisper's "-1": symbols that are not speech, and the specials
        suppress = sorted(set(non_speech_tokens(tokenizer)) | set(specials))
    if not isinstance(begin, list):
        begin = [*tokenizer.encode(" ", add_special_tokens=False).ids, eot]
    initial = generation.get("max_initial_timestamp_index", DEFAULT_MAX_INITIAL_TIMESTAMP_INDEX)
    return WhisperTokens(
        eot=eot, sot=sot, no_timestamps=no_timestamps, timestamp_begin=no_timestamps + 1,
        transcribe=transcribe, translate=translate, sot_prev=find("<|startofprev|>"), sot_lm=find("<|startoflm|>"),
        no_speech=find("<|nospeech|>", "<|nocaptions|>"), languages=languages,
        suppress=_ids(suppress, where, "suppress_tokens"), begin_suppress=_ids(begin, where, "begin_suppress_tokens"),
        max_initial_timestamp_index=int(initial) if isinstance(initial, int) else None, tokenizer=tokenizer,
    )


def _ids(values: Sequence[Any], where: str, key: str) -> tuple[int, ...]:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise SpeechPackageError(f"{where}: generation config {key} holds something other than token ids")
    return tuple(int(v) for v in values)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, None when there is no such file; typed errors otherwise."""
    if not path.exists():
        return None
    data = read_regular_file(path, _CONFIG_LIMIT, SpeechPackageError, "JSON file")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise SpeechPackageError(f"{path}: not JSON ({err})") from None
    if not isinstance(value, dict):
        raise SpeechPackageError(f"{path}: holds a {type(value).__name__}, not an object")
    return value


def non_speech_tokens(tokenizer: Any) -> list[int]:
    """openai-whisper's `non_speech_tokens`: tokens of symbols a speaker does not say (brackets,
    music notes, speaker-turn dashes), suppressed so the model does not caption sounds."""
    symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
    symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
    miscellaneous = set("♩♪♫♬♭♮♯")

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    result = {encode(" -")[0], encode(" '")[0]}
    for symbol in symbols + sorted(miscellaneous):
        for ids in (encode(symbol), encode(" " + symbol)):
            if len(ids) == 1 or (ids and symbol in miscellaneous):
                result.add(ids[0])
    return sorted(result)
