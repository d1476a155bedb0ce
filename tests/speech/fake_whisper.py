"""A Whisper-shaped tokenizer and a scripted NumPy model implementing `WhisperModel`, for
testing decoding and transcription without packages.

The tokenizer is byte-level BPE over single bytes (space is 220, as in Whisper) with one merge
per lower-case letter after a space (" a" is one token, as in Whisper), then Whisper's special tokens in Whisper's order and 1501 timestamps. The model's
logits come from a script: `script(window, fed)` -> logits row, where `window` is the index of
the window (the fake front end reads it from the audio: tests feed a ramp whose first sample
says where the window starts) and `fed` every token the decoder has been given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from rlx_mil.speech.model import N_AUDIO_CTX, N_FRAMES, N_SAMPLES
from rlx_mil.speech.tokens import N_TIMESTAMPS, WhisperTokens, tokens_from

LANGUAGES = ("en", "de", "fr")
EOT = 256 + 26


def whisper_tokenizer(multilingual: bool = True) -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = [("\u0120", c) for c in "abcdefghijklmnopqrstuvwxyz"]  # " a" is one token, as in Whisper
    vocab.update({a + b: len(alphabet) + i for i, (a, b) in enumerate(merges)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|startoftranscript|>", *[f"<|{c}|>" for c in LANGUAGES], "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>",
                *[f"<|{i * 0.02:.2f}|>" for i in range(N_TIMESTAMPS)]]
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    return tok


def text_id(text: str) -> int:
    """The one token of `text` (a byte, or a space and a lower-case letter)."""
    ids = whisper_tokenizer().encode(text, add_special_tokens=False).ids
    assert len(ids) == 1, text
    return int(ids[0])


def special(name: str) -> int:
    token = whisper_tokenizer().token_to_id(name)
    assert token is not None
    return int(token)


SOT = EOT + 1
TRANSLATE, TRANSCRIBE = SOT + 1 + len(LANGUAGES), SOT + 2 + len(LANGUAGES)
NO_SPEECH = TRANSCRIBE + 3
NO_TIMESTAMPS = TRANSCRIBE + 4
TS = NO_TIMESTAMPS + 1  # <|0.00|>
VOCAB = TS + N_TIMESTAMPS
SPACE, HASH = text_id(" "), text_id("#")


def generation_config(multilingual: bool = True, **extra: Any) -> dict[str, Any]:
    return {"is_multilingual": multilingual, "suppress_tokens": [HASH, SOT, TRANSLATE, TRANSCRIBE, NO_SPEECH],
            "begin_suppress_tokens": [SPACE, EOT], "max_initial_timestamp_index": 50, **extra}


def tiny_tokens(multilingual: bool = True, **extra: Any) -> WhisperTokens:
    return tokens_from(whisper_tokenizer(), generation_config(multilingual, **extra))


def write_speech_folder(folder: Path, multilingual: bool = True, generation: dict[str, Any] | None = None) -> Path:
    """A folder with what transcription reads besides the packages."""
    folder.mkdir(parents=True, exist_ok=True)
    whisper_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "generation_config.json").write_text(json.dumps(generation or generation_config(multilingual)))
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper", "vocab_size": VOCAB}))
    return folder


def write_text_checkpoint(folder: Path, config: dict[str, Any], seed: int = 7, says_text: bool = True) -> Path:
    """A random Whisper checkpoint in `folder` with the tiny tokenizer and generation config
    beside its weights; `says_text` zeroes the timestamp tokens' embeddings so the random model
    decodes text, not timestamps."""
    from safetensors.numpy import load_file, save_file

    from rlx_mil.models.random_checkpoint import write_random_checkpoint

    checkpoint = write_random_checkpoint(folder, config, seed=seed)
    if says_text:
        weights = load_file(checkpoint / "model.safetensors")
        weights["model.decoder.embed_tokens.weight"][TS:] = 0.0
        save_file(weights, checkpoint / "model.safetensors")
    whisper_tokenizer().save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "generation_config.json").write_text(json.dumps(generation_config()))
    return checkpoint


def row(*favoured: tuple[int, float], base: float = 0.0) -> np.ndarray:
    """A logits row: `base` everywhere, the given (token, logit) pairs on top."""
    out = np.full(VOCAB, base, np.float32)
    for token, value in favoured:
        out[token] = value
    return out


def ramp(seconds: float) -> np.ndarray:
    """Audio whose sample i is i / N_SAMPLES: a window's first sample tells where it starts."""
    return (np.arange(round(seconds * 16000)) / N_SAMPLES).astype(np.float32)


Script = Callable[[int, Sequence[int]], np.ndarray]


class ScriptedSession:
    def __init__(self, model: ScriptedWhisper, window: int) -> None:
        self.model, self.window = model, window
        self.fed: list[int] = []

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        rows = []
        for token in tokens:
            self.fed.append(int(token))
            rows.append(self.model.script(self.window, list(self.fed)))
        self.model.calls.append(list(tokens))
        return np.stack(rows).astype(np.float32)


class ScriptedWhisper:
    """`WhisperModel` over a script; records the windows' start samples and each step's tokens."""

    n_mels = 80
    vocab_size = VOCAB

    def __init__(self, script: Script, n_text_ctx: int = 448) -> None:
        self.script = script
        self.n_text_ctx = n_text_ctx
        self.starts: list[int] = []
        self.calls: list[list[int]] = []
        self.sessions: list[ScriptedSession] = []

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        assert audio.shape == (N_SAMPLES,) and audio.dtype == np.float32
        mel = np.zeros((self.n_mels, N_FRAMES), np.float32)
        mel[0, 0] = audio[0]
        return mel

    def encode(self, mel: np.ndarray) -> np.ndarray:
        assert mel.shape == (self.n_mels, N_FRAMES)
        start = round(float(mel[0, 0]) * N_SAMPLES)
        self.starts.append(start)
        encoded = np.zeros((N_AUDIO_CTX, 4), np.float32)
        encoded[0, 0] = len(self.starts) - 1
        return encoded

    def decoder(self, encoded: np.ndarray) -> ScriptedSession:
        session = ScriptedSession(self, int(encoded[0, 0]))
        self.sessions.append(session)
        return session


def speaking(per_window: Sequence[Sequence[int]]) -> Script:
    """A script that, in window w, says per_window[w] after its prompt and then EOT (the prompt
    ends at the first token after which the script is asked for text: the one past
    <|notimestamps|>, the task token, or the first timestamp decision)."""

    def script(window: int, fed: Sequence[int]) -> np.ndarray:
        said = _after_prompt(fed)
        wanted = list(per_window[min(window, len(per_window) - 1)])
        if said is None:
            return row((LANG_DE_FAVOURED, 5.0))
        if said < len(wanted):
            return row((wanted[said], 10.0))
        return row((EOT, 10.0))

    return script


LANG_DE_FAVOURED = SOT + 2  # <|de|>


def _after_prompt(fed: Sequence[int]) -> int | None:
    """Tokens sampled so far, or None while the prompt is still being read (after SOT alone)."""
    prompt_end = max((i for i, t in enumerate(fed) if t in (SOT, TRANSCRIBE, TRANSLATE, NO_TIMESTAMPS)), default=-1)
    if fed[-1] == SOT and len(fed) == 1:
        return None
    return len(fed) - 1 - prompt_end
