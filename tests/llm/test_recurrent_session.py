"""A stateful package that keeps only recurrent states (a Qwen3.5 decoder whose layers are all
gated delta-net linear attention: no KV cache) generates through `Session`: its prompt's last
logits are the NumPy forward's, and its greedy tokens are the stateless graph's."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models.round2_numpy import FORWARDS

from rlx_mil.llm.generate import GenerationError, Session
from rlx_mil.llm.package import convert_llm_checkpoint, reference_greedy
from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.random_checkpoint import resized_round2_config, write_random_checkpoint

MAX_CONTEXT = 12


@pytest.fixture(scope="module")
def recurrent_only(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("recurrent_only")
    config = resized_round2_config("qwen3_5_text", hidden=32, heads=4, kv_heads=2, layers=2, vocab=96, max_positions=64)
    config.update(layer_types=["linear_attention", "linear_attention"], head_dim=16, linear_key_head_dim=8,
                  linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
    folder = write_random_checkpoint(root / "qwen3_5", config, dtype="bfloat16", seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        model = convert_llm_checkpoint(folder, root / "qwen3_5.mlpackage", max_context=MAX_CONTEXT, prefill=[2],
                                       precision="fp32")
    contract = json.loads(model.user_defined_metadata["rlx_mil.llm"])
    assert contract["max_context"] is None and contract["caches"] == {} and len(contract["recurrent_states"]) == 4
    return folder, root / "qwen3_5.mlpackage", config


def test_recurrent_only_package_generates_the_stateless_tokens(recurrent_only: tuple[Path, Path, dict[str, Any]]) -> None:
    folder, package, config = recurrent_only
    session = Session(package, engine="milexec", precision_model="float32")
    assert session.max_context == MAX_CONTEXT  # the positions its position_ids declare
    assert sorted(f.query_len for f in session.functions) == [1, 2]  # from each function's input_ids
    prompt = [5, 17, 42, 3, 88]
    logits = session.feed(prompt)
    assert session.calls == [("prefill_2", 2), ("prefill_2", 2), ("decode", 1)]
    full, _ = FORWARDS["qwen3_5_text"](Checkpoint(folder), config, np.asarray([prompt], np.int32))
    want = full[0, -1]
    # States are fp16 (Core ML's only state dtype): about 1e-3 of the logits' scale.
    np.testing.assert_allclose(logits, want, rtol=5e-3, atol=5e-3 * np.abs(want).max())
    session.reset()
    assert session.generate(prompt, MAX_CONTEXT - len(prompt)) == reference_greedy(folder, prompt, MAX_CONTEXT - len(prompt))
    assert session.position == MAX_CONTEXT - 1  # the last token picked is not fed
    with pytest.raises(GenerationError, match="holds 12 tokens"):
        session.feed([1, 2])

