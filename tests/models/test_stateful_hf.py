"""Decode graphs built from Hugging Face checkpoints convert to stateful packages (KV cache in
Core ML state): a prompt chunk plus decode steps through the MIL executor match the
independent full-sequence NumPy forward at every position."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import rlx_mil
from models.hf_numpy import FORWARDS
from rlx_mil import milexec
from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

MAX_CONTEXT = 16
PROMPT = 3
STEPS = 4


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_prompt_then_steps_match_the_full_forward(family: str, tmp_path: Path) -> None:
    cfg = TINY_CONFIGS[family]
    folder = write_random_checkpoint(tmp_path / family, cfg, seed=5)
    tokens = np.random.default_rng(2).integers(0, cfg["vocab_size"], (1, PROMPT + STEPS)).astype(np.int32)
    want, _ = FORWARDS[family](Checkpoint(folder), cfg, tokens)
    models = {}
    for n in (PROMPT, 1):
        graph, params = from_pretrained(folder, "decode", seq_len=n, cache_len=2, max_positions=MAX_CONTEXT)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NeuralEngineWarning)
            models[n] = rlx_mil.convert(graph, params, precision="fp32", kv_cache="auto", max_context=MAX_CONTEXT)
    states: dict[str, np.ndarray] = {}
    position = 0
    for chunk in [tokens[:, :PROMPT]] + [tokens[:, i:i + 1] for i in range(PROMPT, PROMPT + STEPS)]:
        n = chunk.shape[1]
        feeds = {"input_ids": chunk, "position_ids": np.arange(position, position + n, dtype=np.int32)[None],
                 "cache_position": np.array([position], np.int32)}
        got = milexec.run(models[n], feeds, states=states, precision_model="float32")["logits"]
        expected = want[:, position:position + n]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        position += n
