"""rlx_mil's stateful Whisper decoder (`TextDecoderStateful.mlpackage`, `convert-hf --stateful`).

One multifunction package sharing the decoder's weights: `cross_attention` computes every
layer's cross-attention keys and values from the encoder output once per utterance
(`encoder_output_embeds [1, E, 1, 1500]` -> `cross_keys` / `cross_values
[layers, 1, heads, 1500, head_dim]`); `decode` takes one token (`input_ids`, `position_ids`
`[1, 1]`, `cache_position [1]` = tokens already cached) with those keys and values, keeps the
self-attention cache in Core ML state (`key_cache` / `value_cache`, docs/llm.md's contract) and
returns `logits [1, 1, V]`. Per token it does no cross-attention projection and moves no cache
through its interface, which WhisperKit's TextDecoder does every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError
from rlx_mil.models.whisper import build_cross_kv, build_stateful_decoder
from rlx_mil.models.whisper_checkpoint import ParamsOf, WhisperCheckpoint


def convert_stateful_decoder(checkpoint: WhisperCheckpoint, path: Path, *, precision: str = "fp16", compress: Any = None,
                             deploy: str = "plain", max_context: int = 224) -> Path:
    """Write the stateful decoder package of `checkpoint` to `path` (iOS18: Core ML state)."""
    from rlx_mil import api

    spec = checkpoint.spec
    cross, cross_names = build_cross_kv(spec)
    decode, decode_names = build_stateful_decoder(spec)
    functions: dict[str, Any] = {
        "cross_attention": (cross, {"kv_cache": None, "max_context": None, "params": ParamsOf(checkpoint.params, cross_names)}),
        "decode": (decode, {"params": ParamsOf(checkpoint.params, decode_names)}),
    }
    api.convert_functions(functions, None, default_function="decode", path=path, overwrite=True, target="iOS18",
                          precision=precision, compress=compress, deploy=deploy, kv_cache="auto", max_context=max_context,
                          split_logits=False)
    return path


class StatefulSession:
    """One utterance over the stateful decoder: the cross-attention K/V computed once, then one
    `decode` call per token against the package's state."""

    def __init__(self, program: Any, encoded: np.ndarray, max_context: int) -> None:
        self.program = program
        self.max_context = max_context
        n, e = encoded.shape
        cross = program.run({"encoder_output_embeds": np.ascontiguousarray(encoded.T.reshape(1, e, 1, n))},
                            function_name="cross_attention")
        self.cross_keys = np.asarray(cross["cross_keys"], np.float32)
        self.cross_values = np.asarray(cross["cross_values"], np.float32)
        self.states: dict[str, Any] = {}  # arrays on the executor, an MLState on Core ML
        self.position = 0

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        rows = []
        for token in tokens:
            if self.position >= self.max_context:
                raise InvalidOptionError(f"the stateful decoder holds {self.max_context} tokens; this utterance needs more")
            out = self.program.run({
                "input_ids": np.array([[token]], np.int32), "position_ids": np.array([[self.position]], np.int32),
                "cache_position": np.array([self.position], np.int32), "cross_keys": self.cross_keys,
                "cross_values": self.cross_values}, function_name="decode", states=self.states)
            rows.append(np.asarray(out["logits"], np.float32).reshape(-1))
            self.position += 1
        return np.stack(rows) if rows else np.zeros((0, 0), np.float32)

