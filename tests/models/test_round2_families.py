"""The dense decoders — Llama, Qwen2, Qwen3, Mistral, Gemma 2, Phi-3, Gemma 3 text, SmolLM3,
Phi-4-mini and Granite 3 / 4 — from tiny random checkpoints in the layout transformers'
save_pretrained writes (BF16, sharded): logits of the fp32 and fp16 packages through the MIL
executor against the independent NumPy forward, stateful packages generating the stateless
graph's greedy tokens, both config forms, and the published model shapes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
from models.hf_numpy import FORWARDS
from rlx_mil import milexec, reference
from rlx_mil.generate import Session
from rlx_mil.ir import Attention
from rlx_mil.llm.package import convert_llm_checkpoint, reference_greedy
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.families import model_spec
from rlx_mil.models.hf_config import DecoderSpec
from rlx_mil.models.pretrained import build
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3", "gemma3_text", "smollm3", "phi4_mini", "granite",
            "granitemoehybrid"]
#: Families whose prompt also runs through a prefill function: sliding windows and Gemma 3's
#: two RoPEs in a multi-token chunk (the others feed the prompt through decode).
PREFILL_FUNCTION = {"mistral", "gemma2", "gemma3_text"}


def forward(name: str) -> Any:
    return FORWARDS[TINY_CONFIGS[name]["model_type"]]


def token_ids(length: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 96, (1, length)).astype(np.int32)


@pytest.fixture(scope="module")
def bf16_sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("round2")
    return {name: write_random_checkpoint(root / name, TINY_CONFIGS[name], dtype="bfloat16", shards=2, seed=i)
            for i, name in enumerate(FAMILIES)}


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_sharded_packages_match_the_independent_forward(name: str, bf16_sharded: dict[str, Path]) -> None:
    """fp32 within 1e-4 of the logits' largest magnitude, fp16 within 5e-2 of it."""
    folder = bf16_sharded[name]
    assert len(list(folder.glob("model-*.safetensors"))) == 2
    ids = token_ids(8)
    graph, params = from_pretrained(folder, seq_len=8)
    want, _ = forward(name)(Checkpoint(folder), TINY_CONFIGS[name], ids)
    got = milexec.run(rlx_mil.convert(graph, params, precision="fp32"), {"input_ids": ids})["logits"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    half = milexec.run(rlx_mil.convert(graph, params, precision="fp16"), {"input_ids": ids})["logits"]
    # docs/models.md: fp16 within 5e-2 of each output's largest magnitude.
    assert np.abs(half - want).max() <= 5e-2 * np.abs(want).max()


@pytest.mark.parametrize("name", FAMILIES)
def test_stateful_package_generates_the_stateless_greedy_tokens(name: str, bf16_sharded: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    out = tmp_path / f"{name}.mlpackage"
    prefill = [4] if name in PREFILL_FUNCTION else []
    convert_llm_checkpoint(bf16_sharded[name], out, max_context=32, prefill=prefill, precision="fp32")
    session = Session(out, engine="milexec", precision_model="float32")
    prompt = [3, 14, 15, 92, 65]
    assert session.generate(prompt, 16) == reference_greedy(bf16_sharded[name], prompt, 16)


def test_phi4_mini_uses_long_factors_beyond_the_original_length(tmp_path: Path) -> None:
    """longrope: a graph of 72 positions (> original_max_position_embeddings 64) rotates with
    long_factor, as transformers does for a 72-token forward."""
    cfg = TINY_CONFIGS["phi4_mini"]
    folder = write_random_checkpoint(tmp_path / "phi4", cfg, seed=4)
    ids = token_ids(72)
    graph, params = from_pretrained(folder, seq_len=72)
    got = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = forward("phi4_mini")(Checkpoint(folder), cfg, ids)
    short, _ = forward("phi4_mini")(Checkpoint(folder), {**cfg, "original_max_position_embeddings": 128}, ids)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    assert np.abs(short - want).max() > 1e-2 * np.abs(want).max()  # the factors matter


def test_gemma3_legacy_config_form_reads_the_same() -> None:
    """Gemma 3 as transformers 4.5x wrote it: rope_theta (global), rope_local_base_freq,
    rope_scaling for the global layers, sliding_window_pattern instead of layer_types."""
    modern = TINY_CONFIGS["gemma3_text"]
    legacy = {k: v for k, v in copy.deepcopy(modern).items() if k not in ("rope_parameters", "layer_types")}
    legacy |= {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window_pattern": 2,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert model_spec(legacy) == model_spec(modern)
    spec = model_spec({"model_type": "gemma3_text", "num_hidden_layers": 12})
    assert isinstance(spec, DecoderSpec)
    assert [w is None for w in spec.layer_windows] == [(i + 1) % 6 == 0 for i in range(12)]
    assert {r.theta for r in spec.layer_ropes if r is not None} == {1e6, 1e4}
    assert spec.final_softcap is None and spec.attn_softcap is None and spec.score_scale == 256**-0.5


#: Gemma 3 text configs of the published sizes (transformers' to_dict keys that differ from the
#: defaults), built as graphs without weights: tensor shapes, windows and RoPE per layer.
GEMMA3_SHAPES = {
    "270m": {"vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
             "num_attention_heads": 4, "num_key_value_heads": 1, "sliding_window": 512,
             "max_position_embeddings": 32768},
    "1b": {"vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
           "num_attention_heads": 4, "num_key_value_heads": 1, "sliding_window": 512, "max_position_embeddings": 32768},
    "4b": {"vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
           "num_attention_heads": 8, "num_key_value_heads": 4, "sliding_window": 1024,
           "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
}


@pytest.mark.parametrize("size", list(GEMMA3_SHAPES))
def test_gemma3_published_shapes_build(size: str) -> None:
    cfg = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **GEMMA3_SHAPES[size]}
    spec = model_spec(cfg)
    assert isinstance(spec, DecoderSpec)
    graph, expected, computed = build(spec, seq_len=2, max_positions=8)
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    assert sum(isinstance(node.op, Attention) for node in graph) == layers
    assert expected["model.embed_tokens.weight"] == (cfg["vocab_size"], hidden)
    assert expected["model.layers.0.self_attn.q_norm.weight"] == (256,)
    assert expected["model.layers.0.self_attn.q_proj.weight"] == (cfg["num_attention_heads"] * 256, hidden)
    assert "lm_head.weight" not in expected  # tied
    assert len([n for n in expected if n.endswith("post_feedforward_layernorm.weight")]) == layers
    assert sum(w is None for w in spec.layer_windows) == layers // 6
    assert set(computed) == {"rope.cos", "rope.sin", "rope_1.cos", "rope_1.sin"}
    local, global_ = spec.layer_ropes[0], spec.layer_ropes[5]
    assert local is not None and global_ is not None and (local.theta, global_.theta) == (1e4, 1e6)
    assert global_.kind == ("linear" if size == "4b" else "default")


@pytest.mark.parametrize("layout", ["model.language_model", "language_model.model"])
def test_gemma3_vision_language_folder_reads_its_text_decoder(layout: str, tmp_path: Path) -> None:
    """Gemma3ForConditionalGeneration folders (4B and up as published): text_config, the decoder
    under model.language_model. (transformers 5) or language_model.model. (transformers 4), a
    vision tower beside it that is not read."""
    from safetensors.numpy import load_file, save_file

    cfg = TINY_CONFIGS["gemma3"]
    folder = write_random_checkpoint(tmp_path / "vlm", cfg, seed=6)
    stored = load_file(folder / "model.safetensors")
    text = {k.replace("model.language_model.", "model."): v for k, v in stored.items()}
    renamed = {k.replace("model.language_model.", f"{layout}."): v for k, v in stored.items()}
    vision = "model.vision_tower" if layout.startswith("model.") else "vision_tower"
    renamed[f"{vision}.vision_model.embeddings.patch_embedding.weight"] = np.ones((16, 3, 8, 8), np.float32)
    save_file(renamed, folder / "model.safetensors", metadata={"format": "pt"})
    ids = token_ids(8)
    graph, params = from_pretrained(folder, seq_len=8)
    got = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = forward("gemma3_text")(text, cfg["text_config"], ids)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("family", ["qwen3_5", "gemma3"])
def test_composite_configs_tie_the_head_by_the_top_level_flag(family: str, tmp_path: Path) -> None:
    """transformers 5 writes Qwen3_5ForConditionalGeneration with `tie_word_embeddings` true at
    the top, false in text_config and no lm_head.weight: the head is the embedding, as
    transformers ties it by the wrapper's flag."""
    from safetensors.numpy import load_file, save_file

    cfg = copy.deepcopy(TINY_CONFIGS[family])
    cfg["text_config"]["tie_word_embeddings"] = False
    untied = write_random_checkpoint(tmp_path / "untied", {**cfg, "tie_word_embeddings": False}, seed=4)
    stored = load_file(untied / "model.safetensors")
    embed = next(k for k in stored if k.endswith("embed_tokens.weight"))
    stored["lm_head.weight"] = stored[embed]
    save_file(stored, untied / "model.safetensors", metadata={"format": "pt"})
    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    save_file({k: v for k, v in stored.items() if k != "lm_head.weight"}, tied / "model.safetensors", metadata={"format": "pt"})
    ids = token_ids(6)
    want = reference.evaluate(*_graph_and_feed(untied, ids))["logits"]
    got = reference.evaluate(*_graph_and_feed(tied, ids))["logits"]
    np.testing.assert_array_equal(got, want)


def _graph_and_feed(folder: Path, ids: np.ndarray) -> tuple[Any, dict[str, np.ndarray], Any]:
    graph, params = from_pretrained(folder, seq_len=len(ids[0]) if ids.ndim == 2 else len(ids))
    return graph, {"input_ids": ids}, params
