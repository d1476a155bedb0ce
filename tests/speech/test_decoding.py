"""Whisper's decoding rules on crafted logits: each test fails without the rule it names."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from rlx_mil.errors import RlxMilError
from rlx_mil.speech.decoding import DecodingOptions, decode_window, detect_language, filtered
from rlx_mil.speech.tokens import non_speech_tokens, tokens_from
from tests.speech.fake_whisper import (
    EOT,
    HASH,
    NO_SPEECH,
    NO_TIMESTAMPS,
    SOT,
    SPACE,
    TRANSCRIBE,
    TRANSLATE,
    TS,
    VOCAB,
    ScriptedWhisper,
    row,
    special,
    text_id,
    tiny_tokens,
    whisper_tokenizer,
)

TOKENS = tiny_tokens()
ENCODED = np.zeros((1500, 4), np.float32)
A, B, H, LETTER_I = (text_id(c) for c in "abhi")


def pick(logits: np.ndarray, sampled: Sequence[int], timestamps: bool = False) -> int:
    return int(np.argmax(filtered(logits, list(sampled), TOKENS, timestamps)))


def test_the_tokenizer_reads_whispers_special_tokens() -> None:
    assert (TOKENS.eot, TOKENS.sot, TOKENS.no_timestamps, TOKENS.timestamp_begin) == (EOT, SOT, NO_TIMESTAMPS, TS)
    assert TOKENS.languages == {"en": SOT + 1, "de": SOT + 2, "fr": SOT + 3}
    assert (TOKENS.translate, TOKENS.transcribe, TOKENS.no_speech) == (TRANSLATE, TRANSCRIBE, NO_SPEECH)
    assert TOKENS.prompt("de", "translate", timestamps=False) == [SOT, SOT + 2, TRANSLATE, NO_TIMESTAMPS]
    assert TOKENS.prompt("fr", "transcribe", timestamps=True) == [SOT, SOT + 3, TRANSCRIBE]
    assert TOKENS.text([TS, SPACE, H, LETTER_I, TS + 5, EOT]) == " hi"
    assert special("<|1.00|>") == TS + 50 and TOKENS.time_of(TS + 50) == pytest.approx(1.0)


def test_english_only_checkpoints_have_no_language_or_task_tokens_in_the_prompt() -> None:
    english = tiny_tokens(multilingual=False)
    assert not english.multilingual and english.languages == {}
    assert english.prompt(None, "transcribe", timestamps=False) == [SOT, NO_TIMESTAMPS]
    with pytest.raises(RlxMilError, match="English-only"):
        DecodingOptions(task="translate").check(english)
    with pytest.raises(RlxMilError, match="English-only"):
        DecodingOptions(language="de").check(english)
    DecodingOptions(language="en").check(english)
    # Without a generation config, openai-whisper's rule: a multilingual vocabulary is 51865 long.
    assert not tokens_from(whisper_tokenizer(), None).multilingual


def test_begin_suppress_keeps_a_window_from_opening_with_a_blank_or_ending_at_once() -> None:
    logits = row((SPACE, 9.0), (EOT, 8.0), (A, 7.0))
    assert pick(logits, []) == A
    assert pick(logits, [A]) == SPACE  # only at the first position


def test_suppress_tokens_are_never_sampled() -> None:
    logits = row((HASH, 9.0), (A, 7.0))
    assert pick(logits, [B]) == A
    assert pick(row((TRANSCRIBE, 9.0), (A, 7.0)), [B]) == A


def test_without_a_generation_config_openai_whispers_symbols_are_suppressed() -> None:
    tokens = tokens_from(whisper_tokenizer(), {"is_multilingual": True})
    assert HASH in tokens.suppress and text_id("(") in tokens.suppress and A not in tokens.suppress
    assert {SOT, TRANSLATE, TRANSCRIBE, NO_SPEECH} <= set(tokens.suppress)
    assert tokens.begin_suppress == (SPACE, EOT)
    assert set(non_speech_tokens(whisper_tokenizer())) >= {text_id('"'), text_id("@"), text_id("~")}


def test_a_timestamp_window_opens_with_a_timestamp_no_later_than_the_initial_maximum() -> None:
    # text is likelier than any timestamp, and <|1.20|> is the likeliest timestamp
    logits = row((A, 9.0), (TS + 60, 5.0), (TS + 3, 4.0))
    assert pick(logits, [], timestamps=True) == TS + 3
    # without max_initial_timestamp_index the late timestamp is taken
    late = tiny_tokens(max_initial_timestamp_index=None)
    assert int(np.argmax(filtered(logits, [], late, True))) == TS + 60


def test_no_timestamps_token_is_never_sampled_in_timestamp_mode() -> None:
    assert pick(row((NO_TIMESTAMPS, 20.0), (A, 9.0)), [TS, B], timestamps=True) == A


def test_after_a_closing_timestamp_comes_a_timestamp_or_eot_never_text() -> None:
    logits = row((A, 9.0), (TS + 10, 3.0))
    assert pick(logits, [TS, B, TS + 5], timestamps=True) == TS + 10
    assert pick(row((A, 9.0), (EOT, 4.0), (TS + 10, 3.0), base=-20.0), [TS, B, TS + 5], timestamps=True) == EOT


def test_after_a_pair_of_timestamps_comes_text() -> None:
    logits = row((TS + 40, 9.0), (A, 2.0), base=-5.0)
    assert pick(logits, [TS, B, TS + 5, TS + 5], timestamps=True) == A


def test_timestamps_never_decrease_and_segments_have_length() -> None:
    # inside a segment opened at <|0.20|>, an earlier or equal closing timestamp is ruled out
    logits = row((TS + 3, 9.0), (TS + 10, 8.0), (TS + 11, 7.0), base=-5.0)
    assert pick(logits, [TS + 10, A], timestamps=True) == TS + 11
    # a new segment may open exactly where the last one closed
    assert pick(row((TS + 10, 9.0), (TS + 12, 8.0), base=-5.0), [TS, A, TS + 10], timestamps=True) == TS + 10


def test_timestamps_are_taken_when_together_they_outweigh_the_likeliest_text_token() -> None:
    # text A: logit 5; 600 timestamps at logit 0 hold more probability together (600 > e^5 = 148)
    logits = np.full(VOCAB, -30.0, np.float32)
    logits[A] = 5.0
    logits[TS + 11: TS + 611] = 0.0
    assert pick(logits, [TS + 10, B], timestamps=True) == TS + 11
    logits[TS + 11: TS + 611] = -3.0  # 600 e^-3 = 30 < 148: text
    assert pick(logits, [TS + 10, B], timestamps=True) == A


class _Detect:
    """Logits after SOT: text token A beats every language; among languages, French wins."""

    def __call__(self, window: int, fed: Sequence[int]) -> np.ndarray:
        if fed == [SOT]:
            return row((A, 20.0), (SOT + 1, 3.0), (SOT + 3, 4.0))
        return row((EOT, 10.0)) if fed[-1] == A else row((A, 10.0))


def test_language_detection_reads_only_the_language_tokens_after_sot() -> None:
    model = ScriptedWhisper(_Detect())
    decoded = decode_window(model, ENCODED, TOKENS, DecodingOptions())
    assert decoded.language == "fr"
    assert model.calls[0] == [SOT] and model.calls[1] == [SOT + 3, TRANSCRIBE, NO_TIMESTAMPS]
    assert decoded.prompt == [SOT, SOT + 3, TRANSCRIBE, NO_TIMESTAMPS] and decoded.tokens == [A] and decoded.ended
    assert detect_language(row((SOT + 2, 1.0)), TOKENS) == "de"


def test_a_given_language_is_not_detected() -> None:
    model = ScriptedWhisper(_Detect())
    decoded = decode_window(model, ENCODED, TOKENS, DecodingOptions(language="en", task="translate"))
    assert model.calls[0] == [SOT, SOT + 1, TRANSLATE, NO_TIMESTAMPS] and decoded.language == "en"


def test_decoding_stops_after_half_the_text_context() -> None:
    model = ScriptedWhisper(lambda window, fed: row((A, 10.0)), n_text_ctx=40)
    decoded = decode_window(model, ENCODED, TOKENS, DecodingOptions(language="en"))
    assert decoded.tokens == [A] * 20 and not decoded.ended
    assert sum(len(c) for c in model.calls) == 4 + 19  # the prompt, then each sampled token but the last


def test_decoding_stops_before_the_session_is_full() -> None:
    model = ScriptedWhisper(lambda window, fed: row((A, 10.0)))
    model.cache_len = 12  # type: ignore[attr-defined]
    decoded = decode_window(model, ENCODED, TOKENS, DecodingOptions(language="en"))
    assert len(decoded.tokens) == 9 and sum(len(c) for c in model.calls) == 12


def test_logits_of_the_wrong_shape_are_a_typed_error() -> None:
    model = ScriptedWhisper(lambda window, fed: np.zeros(10, np.float32))
    with pytest.raises(RlxMilError, match="logits of shape"):
        decode_window(model, ENCODED, TOKENS, DecodingOptions(language="en"))


def test_options_are_checked() -> None:
    with pytest.raises(RlxMilError, match="task"):
        DecodingOptions(task="summarize").check(TOKENS)
    with pytest.raises(RlxMilError, match="unknown language 'xx'"):
        DecodingOptions(language="xx").check(TOKENS)
