"""Greedy decoding of one 30 s window with Whisper's rules.

The prompt is the start-of-transcript sequence (SOT, language, task, `<|notimestamps|>` unless
timestamps are asked for). With no language given, a multilingual checkpoint detects it from
the logits after SOT restricted to the language tokens. Each step then takes the argmax of the
logits after these filters, in openai-whisper's order:

* begin-suppress (`begin_suppress_tokens`: space and EOT) at the first sampled position, so a
  window does not open with a blank or end at once;
* `suppress_tokens` at every step (symbols nobody says, and the special tokens);
* with timestamps, openai-whisper's `ApplyTimestampRules`: `<|notimestamps|>` never; timestamps
  come in pairs (after a closing timestamp only a timestamp or EOT, after two timestamps only
  text); timestamps never decrease and a segment has non-zero length; the first token is a
  timestamp no later than `max_initial_timestamp_index`; and where the timestamps together are
  more likely than the single likeliest text token, a timestamp is taken.

Decoding stops at EOT, after `n_text_ctx // 2` sampled tokens, or when the decoder session is
full (a model's `cache_len`, when it has one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rlx_mil.errors import RlxMilError
from rlx_mil.speech.model import DecoderSession, WhisperModel
from rlx_mil.speech.tokens import TASKS, WhisperTokens
from rlx_mil.units import counted

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class DecodingOptions:
    """What a window is decoded as: `language` None detects it (multilingual checkpoints);
    `max_tokens` None is `n_text_ctx // 2`."""

    language: str | None = None
    task: str = "transcribe"
    timestamps: bool = False
    max_tokens: int | None = None

    def check(self, tokens: WhisperTokens) -> None:
        """Options a checkpoint cannot honour end here, before any audio is decoded."""
        if self.task not in TASKS:
            raise RlxMilError(f"task {self.task!r}: expected one of {', '.join(TASKS)}")
        if not tokens.multilingual:
            if self.language not in (None, "en"):
                raise RlxMilError(f"language {self.language!r}: the checkpoint is English-only")
            if self.task == "translate":
                raise RlxMilError("task 'translate': the checkpoint is English-only (it transcribes English)")
        elif self.language is not None:
            tokens.language_token(self.language)
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RlxMilError(f"max_tokens {self.max_tokens}: must be at least 1")


@dataclass(frozen=True)
class DecodedWindow:
    """One window's prompt, its sampled tokens (EOT left out) and its language."""

    prompt: list[int]
    tokens: list[int]
    language: str | None
    #: True when decoding stopped at EOT, False at the length limit.
    ended: bool


def detect_language(logits: np.ndarray, tokens: WhisperTokens) -> str:
    """The language whose token has the largest logit after SOT (`logits` `[V]`)."""
    codes = list(tokens.languages)
    ids = np.array([tokens.languages[c] for c in codes])
    return codes[int(np.argmax(logits[ids]))]


def suppress(logits: np.ndarray, ids: Sequence[int]) -> None:
    """Rule out `ids` (those inside the logits' width) in place."""
    width = logits.shape[-1]
    inside = [t for t in ids if t < width]
    if inside:
        logits[inside] = NEG_INF


def apply_timestamp_rules(logits: np.ndarray, sampled: Sequence[int], tokens: WhisperTokens) -> None:
    """openai-whisper's `ApplyTimestampRules` on one row of logits, in place; `sampled` are the
    tokens sampled so far in this window (the prompt excluded)."""
    begin = tokens.timestamp_begin
    logits[tokens.no_timestamps] = NEG_INF
    last_was_timestamp = len(sampled) >= 1 and sampled[-1] >= begin
    penultimate_was_timestamp = len(sampled) < 2 or sampled[-2] >= begin
    if last_was_timestamp:
        if penultimate_was_timestamp:  # a pair is complete: text (or EOT) comes next
            logits[begin:] = NEG_INF
        else:  # a closing timestamp: another timestamp or EOT, no text
            logits[: tokens.eot] = NEG_INF
    stamps = [t for t in sampled if t >= begin]
    if stamps:
        # Timestamps never decrease; a segment's end lies after its start (else it could loop).
        last = stamps[-1] if last_was_timestamp and not penultimate_was_timestamp else stamps[-1] + 1
        logits[begin:last] = NEG_INF
    if not sampled:
        logits[:begin] = NEG_INF  # a window opens with a timestamp
        if tokens.max_initial_timestamp_index is not None:
            logits[begin + tokens.max_initial_timestamp_index + 1:] = NEG_INF
    logprobs = _log_softmax(logits)
    text = logprobs[:begin]
    if np.isfinite(logprobs[begin:]).any() and _logsumexp(logprobs[begin:]) > (text.max() if text.size else -np.inf):
        logits[:begin] = NEG_INF


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = np.max(x)
    if not np.isfinite(top):
        return np.full_like(x, -np.inf)
    shifted = x.astype(np.float64) - top
    return shifted - np.log(np.sum(np.exp(shifted)))


def _logsumexp(x: np.ndarray) -> float:
    top = float(np.max(x))
    return top + float(np.log(np.sum(np.exp(x - top)))) if np.isfinite(top) else -np.inf


def filtered(logits: np.ndarray, sampled: Sequence[int], tokens: WhisperTokens, timestamps: bool) -> np.ndarray:
    """A float32 copy of one row of logits with every rule above applied."""
    row = np.array(logits, dtype=np.float32).reshape(-1)
    if not sampled:
        suppress(row, tokens.begin_suppress)
    suppress(row, tokens.suppress)
    if timestamps:
        apply_timestamp_rules(row, sampled, tokens)
    return row


def decode_window(
    model: WhisperModel,
    encoded: np.ndarray,
    tokens: WhisperTokens,
    options: DecodingOptions,
    on_token: Callable[[int], None] | None = None,
) -> DecodedWindow:
    """Greedy decoding of one window's encoder output; `on_token` sees each sampled token."""
    session = model.decoder(encoded)
    language = options.language if tokens.multilingual else None
    if tokens.multilingual and language is None:
        language = detect_language(_last_row(session, [tokens.sot], model.vocab_size), tokens)
        prompt = tokens.prompt(language, options.task, options.timestamps)
        logits = _last_row(session, prompt[1:], model.vocab_size)
    else:
        prompt = tokens.prompt(language, options.task, options.timestamps)
        logits = _last_row(session, prompt, model.vocab_size)
    limit = options.max_tokens if options.max_tokens is not None else model.n_text_ctx // 2
    # The last sampled token is never fed back, so a session of `capacity` positions samples
    # capacity - len(prompt) + 1 tokens at most.
    limit = min(limit, session_capacity(model) - len(prompt) + 1)
    sampled: list[int] = []
    while True:
        token = int(np.argmax(filtered(logits, sampled, tokens, options.timestamps)))
        if token == tokens.eot:
            return DecodedWindow(prompt, sampled, language, True)
        sampled.append(token)
        if on_token is not None:
            on_token(token)
        if len(sampled) >= limit:
            return DecodedWindow(prompt, sampled, language, False)
        logits = _last_row(session, [token], model.vocab_size)


def session_capacity(model: WhisperModel) -> int:
    """Positions a decoder session holds: `cache_len` where the model says (WhisperKit's
    TextDecoder holds 224 of Whisper's 448), else `n_text_ctx`."""
    capacity = getattr(model, "cache_len", None)
    return int(capacity) if isinstance(capacity, int) and capacity > 0 else model.n_text_ctx


def _last_row(session: DecoderSession, ids: Sequence[int], vocab: int) -> np.ndarray:
    logits = np.asarray(session.step(ids))
    if logits.ndim != 2 or logits.shape[0] != len(ids) or logits.shape[1] < vocab:
        raise RlxMilError(
            f"the text decoder returned logits of shape {list(logits.shape)} for {counted(len(ids), 'token')}"
            f" (expected [{len(ids)}, {vocab}])"
        )
    return logits[-1, :vocab]
