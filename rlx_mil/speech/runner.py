"""Whisper packages as a `WhisperModel` (`rlx_mil.speech.model`): the WhisperKit folder's
three packages, run through the NumPy MIL executor (`rlx_mil.milexec.prepare`, each package
loaded once) or, on macOS, through Core ML (`CoreMLProgram`: `MLModel.predict`, the stateful
decoder's cache in an `MLState`), the decoder session holding WhisperKit's caches and masks
itself.

The stateful form (`TextDecoderStateful.mlpackage`, when the folder has one and
`stateful=True`) keeps the self-attention cache in the package's state and computes the
cross-attention keys and values once per utterance (its `prefill` function)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.coreml.runtime import coreml_available
from rlx_mil.errors import InvalidOptionError
from rlx_mil.speech.model import DECODER, ENCODER, MEL, N_AUDIO_CTX, N_FRAMES, N_SAMPLES, STATEFUL_DECODER

#: WhisperKit's value for a cache slot not attended.
_MASKED = -1e4
#: What runs the packages: "auto" is Core ML where it can predict (macOS), else the executor.
ENGINES = ("auto", "coreml", "milexec")
#: The key of a Core ML state in a session's state dict.
_COREML_STATE = "coreml_state"
#: Where Core ML runs each package unless told otherwise: WhisperKit's defaults
#: (`ModelComputeOptions` in its Models.swift, macOS 14 / iOS 17 on). The mel front end reads the
#: 480,000-sample `audio`, which no Neural Engine layer takes (`rlx-mil preflight`'s
#: `interface-copy` note), so it never asks for the Neural Engine; the encoder and decoders do.
COMPUTE_UNITS = {MEL: "CPU_AND_GPU", ENCODER: "CPU_AND_NE", DECODER: "CPU_AND_NE", STATEFUL_DECODER: "CPU_AND_NE"}


def engine_for(engine: str) -> str:
    """"coreml" or "milexec" for `engine` (one of ENGINES)."""
    if engine not in ENGINES:
        raise InvalidOptionError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "auto":
        return "coreml" if coreml_available() else "milexec"
    if engine == "coreml" and not coreml_available():
        raise InvalidOptionError("engine 'coreml' needs macOS with the Core ML runtime (coremltools' libcoremlpython);"
                                 " here the NumPy MIL executor runs the packages (engine 'milexec')")
    return engine


class CoreMLProgram:
    """A package run by Core ML with the executor's `run(feeds, function_name=, states=)`: one
    `MLModel` per function, float feeds cast to the dtype each input declares (WhisperKit's fp16
    interfaces), and a stateful function's `MLState` made on the first call with a session's
    state dict and kept in it."""

    def __init__(self, path: Path, compute_units: str = "ALL") -> None:
        self.path, self.compute_units = path, compute_units
        self._models: dict[str | None, tuple[Any, dict[str, Any]]] = {}

    def _model(self, function_name: str | None) -> tuple[Any, dict[str, Any]]:
        found = self._models.get(function_name)
        if found is None:
            import coremltools as ct

            options = {"function_name": function_name} if function_name else {}
            model = ct.models.MLModel(str(self.path), compute_units=getattr(ct.ComputeUnit, self.compute_units), **options)
            kinds = ct.proto.FeatureTypes_pb2.ArrayFeatureType
            dtypes = {kinds.FLOAT16: np.float16, kinds.FLOAT32: np.float32, kinds.INT32: np.int32}
            declared = {f.name: dtypes.get(f.type.multiArrayType.dataType) for f in model.get_spec().description.input}
            found = self._models[function_name] = (model, {k: v for k, v in declared.items() if v is not None})
        return found

    def run(self, feeds: Mapping[str, np.ndarray], function_name: str | None = None,
            states: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        model, dtypes = self._model(function_name)
        cast = {k: np.ascontiguousarray(v, dtypes.get(k, np.asarray(v).dtype)) for k, v in feeds.items()}
        if states is None:
            return dict(model.predict(cast))
        if _COREML_STATE not in states:
            states[_COREML_STATE] = model.make_state()
        return dict(model.predict(cast, state=states[_COREML_STATE]))


def _input_shapes(package: Path) -> dict[str, tuple[int, ...]]:
    from rlx_mil.milexec import load_program

    program = load_program(package)
    function = program.functions[getattr(program, "default_function_name", "main")]
    return {name: tuple(int(d) for d in var.shape) for name, var in function.inputs.items()}


class PackagedWhisper:
    """A WhisperKit folder written by `convert_whisper`, ready to transcribe. With the Core ML
    engine, `compute_units` (a `coremltools.ComputeUnit` name) runs every package; None, each on
    WhisperKit's own (`COMPUTE_UNITS`)."""

    def __init__(self, folder: str | os.PathLike[str], *, stateful: bool = False, engine: str = "milexec",
                 compute_units: str | None = None) -> None:
        from rlx_mil.fileio import check_package_tree
        from rlx_mil.milexec.prepared import prepare

        self.engine = engine_for(engine)
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
        decoder = STATEFUL_DECODER if stateful else DECODER
        roles = (MEL, ENCODER, decoder)
        programs: list[Any] = ([CoreMLProgram(self.folder / f"{role}.mlpackage", compute_units or COMPUTE_UNITS[role])
                                for role in roles] if self.engine == "coreml"
                               else [prepare(self.folder / f"{role}.mlpackage") for role in roles])
        self._mel, self._encoder, self._decoder = programs
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
