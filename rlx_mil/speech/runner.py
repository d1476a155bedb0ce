"""Whisper packages as a `WhisperModel` (`rlx_mil.speech.model`): the WhisperKit folder's
three packages, run through the NumPy MIL executor (`rlx_mil.milexec.prepare`, each package
loaded once), the decoder session holding WhisperKit's caches and masks itself.

The stateful form (`TextDecoderStateful.mlpackage`, when the folder has one and
`stateful=True`) keeps the self-attention cache in the package's state and computes the
cross-attention keys and values once per utterance (its `prefill` function)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError
from rlx_mil.speech.model import N_AUDIO_CTX, N_FRAMES, N_SAMPLES
from rlx_mil.speech.packages import DECODER, ENCODER, MEL, STATEFUL_DECODER

#: WhisperKit's value for a cache slot not attended.
_MASKED = -1e4


def _input_shapes(package: Path) -> dict[str, tuple[int, ...]]:
    from rlx_mil.milexec import load_program

    program = load_program(package)
    function = program.functions[getattr(program, "default_function_name", "main")]
    return {name: tuple(int(d) for d in var.shape) for name, var in function.inputs.items()}


class PackagedWhisper:
    """A WhisperKit folder written by `convert_whisper`, ready to transcribe."""

    def __init__(self, folder: str | os.PathLike[str], *, stateful: bool = False) -> None:
        from rlx_mil.fileio import check_package_tree
        from rlx_mil.milexec.prepared import prepare

        self.folder = Path(folder)
        for role in (MEL, ENCODER, DECODER) + ((STATEFUL_DECODER,) if stateful else ()):
            path = self.folder / f"{role}.mlpackage"
            if not path.is_dir():
                raise InvalidOptionError(f"{self.folder}: no {role}.mlpackage (a WhisperKit folder from"
                                         f" `rlx-mil convert-hf WHISPER_DIR -o OUT_DIR{' --stateful' if stateful else ''}`)")
            check_package_tree(path)
        config = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        self.n_mels = int(config["num_mel_bins"])
        self.vocab_size = int(config["vocab_size"])
        self.n_text_ctx = int(config["max_target_positions"])
        self.d_model = int(config["d_model"])
        self.layers = int(config["decoder_layers"])
        self.stateful = stateful
        self._mel = prepare(self.folder / f"{MEL}.mlpackage")
        self._encoder = prepare(self.folder / f"{ENCODER}.mlpackage")
        decoder = STATEFUL_DECODER if stateful else DECODER
        self._decoder = prepare(self.folder / f"{decoder}.mlpackage")
        shapes = _input_shapes(self.folder / f"{DECODER}.mlpackage")
        self.cache_len = shapes["key_cache"][-1]

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        samples = np.asarray(audio, np.float32).reshape(-1)
        if samples.size != N_SAMPLES:
            raise InvalidOptionError(f"log_mel takes one window of {N_SAMPLES} samples, got {samples.size}")
        out = self._mel.run({"audio": samples})["melspectrogram_features"]
        return np.asarray(out, np.float32).reshape(self.n_mels, N_FRAMES)

    def encode(self, mel: np.ndarray) -> np.ndarray:
        features = np.asarray(mel, np.float32)
        if features.shape != (self.n_mels, N_FRAMES):
            raise InvalidOptionError(f"encode takes a [{self.n_mels}, {N_FRAMES}] log-mel, got {list(features.shape)}")
        out = self._encoder.run({"melspectrogram_features": features.reshape(1, self.n_mels, 1, N_FRAMES)})
        return np.asarray(out["encoder_output_embeds"], np.float32).reshape(self.d_model, N_AUDIO_CTX).T.copy()

    def decoder(self, encoded: np.ndarray) -> Any:
        states = np.asarray(encoded, np.float32)
        if states.shape != (N_AUDIO_CTX, self.d_model):
            raise InvalidOptionError(f"the decoder attends to a [{N_AUDIO_CTX}, {self.d_model}] encoder output,"
                                     f" got {list(states.shape)}")
        if self.stateful:
            from rlx_mil.speech.stateful import StatefulSession

            return StatefulSession(self._decoder, states, self.n_text_ctx // 2)
        return WhisperKitSession(self, states)


class WhisperKitSession:
    """One utterance over the WhisperKit TextDecoder: one token per call, the caches, the
    update mask and the padding mask kept here as WhisperKit keeps them."""

    def __init__(self, model: PackagedWhisper, encoded: np.ndarray) -> None:
        self.model = model
        width, slots = model.d_model * model.layers, model.cache_len
        self.keys = np.zeros((1, width, 1, slots), np.float32)
        self.values = np.zeros((1, width, 1, slots), np.float32)
        self.encoded = np.ascontiguousarray(encoded.T.reshape(1, model.d_model, 1, N_AUDIO_CTX))
        self.position = 0

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        rows = []
        for token in tokens:
            if self.position >= self.model.cache_len:
                raise InvalidOptionError(f"the TextDecoder's cache holds {self.model.cache_len} tokens; this"
                                         " utterance needs more")
            p = self.position
            update = np.zeros((1, self.model.cache_len), np.int32)
            update[0, p] = 1
            padding = np.full((1, self.model.cache_len), _MASKED, np.float32)
            padding[0, : p + 1] = 0
            out = self.model._decoder.run({
                "input_ids": np.array([token], np.int32), "cache_length": np.array([p], np.int32),
                "key_cache": self.keys, "value_cache": self.values, "kv_cache_update_mask": update,
                "encoder_output_embeds": self.encoded, "decoder_key_padding_mask": padding})
            self.keys[..., p] = np.asarray(out["key_cache_updates"], np.float32)[..., 0]
            self.values[..., p] = np.asarray(out["value_cache_updates"], np.float32)[..., 0]
            rows.append(np.asarray(out["logits"], np.float32).reshape(-1))
            self.position += 1
        return np.stack(rows) if rows else np.zeros((0, self.model.vocab_size), np.float32)
