"""What transcription needs of a Whisper model: the log-mel front end, the encoder, and a
decoder session holding its own KV cache.

`rlx_mil.speech.decoding` is written against these Protocols only, so the same greedy decoder
runs over converted packages (`rlx_mil.speech.runner`) and over NumPy fakes in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

#: Samples in one Whisper window: 30 s at 16 kHz.
N_SAMPLES = 480_000
#: Mel frames in one window (10 ms hop).
N_FRAMES = 3000
#: Encoder positions per window (one per two mel frames, 20 ms each).
N_AUDIO_CTX = 1500
SAMPLE_RATE = 16_000
#: The packages of a WhisperKit folder (`rlx_mil.speech.packages`).
MEL, ENCODER, DECODER = "MelSpectrogram", "AudioEncoder", "TextDecoder"
#: rlx_mil's stateful text decoder package beside them (`rlx_mil.speech.stateful`).
STATEFUL_DECODER = "TextDecoderStateful"


class DecoderSession(Protocol):
    """One utterance's text decoder: the cross-attention over one encoder output and a
    self-attention cache that grows with every `step`."""

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        """Append `tokens` to the cache and return their logits, float32 `[len(tokens), V]`
        (row i predicts the token after `tokens[i]`)."""
        ...


class WhisperModel(Protocol):
    """A Whisper checkpoint ready to run: sizes from its config and its three stages."""

    #: Mel bins of the front end (80, or 128 for large-v3).
    n_mels: int
    #: Rows of the logits (the tokenizer's vocabulary, specials included).
    vocab_size: int
    #: Decoder positions (448): a window decodes at most `n_text_ctx // 2` tokens.
    n_text_ctx: int

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        """float32 `[480000]` of 16 kHz audio (one window, zero padded) -> the log-mel
        spectrogram `[n_mels, 3000]` Whisper's encoder reads."""
        ...

    def encode(self, mel: np.ndarray) -> np.ndarray:
        """`[n_mels, 3000]` -> the encoder output `[1500, d_model]`."""
        ...

    def decoder(self, encoded: np.ndarray) -> DecoderSession:
        """A fresh decoder session (empty cache) attending to `encoded` `[1500, d_model]`.

        A model whose sessions hold fewer than `n_text_ctx` positions (WhisperKit's TextDecoder
        keeps 224) says so in an int attribute `cache_len`; decoding stops before overfilling it."""
        ...
