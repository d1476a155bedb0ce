"""Decoder families from Hugging Face-layout checkpoints: the builders' math against an
independent NumPy forward, and the converted packages against the reference semantics."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.hf_numpy import FORWARDS
from rlx_mil import reference
from rlx_mil.errors import InvalidOptionError
from rlx_mil.lowering.target import Precision
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.families import family_of_model_type
from rlx_mil.models.random_checkpoint import ROUND2_FAMILIES, TINY_CONFIGS, write_random_checkpoint
from rlx_mil.testing import Tolerance, check_conversion

#: Documented in docs/models.md: fp16 logits of the tiny models agree to about 1e-2 of their scale.
FP16_MODEL_TOLERANCE = Tolerance(atol=5e-2, rtol=5e-2)

#: The dense decoders (the mixture-of-experts and hybrid ones: tests/models/test_round2.py).
DECODERS = [n for n, c in TINY_CONFIGS.items()
            if family_of_model_type(c["model_type"]).kind == "decoder" and n not in ROUND2_FAMILIES
            and "text_config" not in c]  # gemma3, a vision-language folder: test_round2_families
#: Every dense decoder's prefill packages (fp32 and fp16, BF16 sharded checkpoints) and stateful
#: package are checked in test_round2_families; the decode graphs of these are converted here too.
CONVERTED_ELSEWHERE = {"gemma3_text", "smollm3", "phi4_mini", "granite", "granitemoehybrid"}
CONFIGS: dict[str, dict[str, Any]] = {name: copy.deepcopy(TINY_CONFIGS[name]) for name in DECODERS}
# Llama 3.1-style scaling whose medium band is hit by the tiny head_dim (wavelengths 6.3 .. 6283).
CONFIGS["llama"]["rope_parameters"]["original_max_position_embeddings"] = 128
CONFIGS["llama_linear_bias"] = {**copy.deepcopy(TINY_CONFIGS["llama"]), "rope_scaling": {"type": "linear", "factor": 2.0},
                                "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}
CONFIGS["qwen2_windowed"] = {**copy.deepcopy(TINY_CONFIGS["qwen2"]), "use_sliding_window": True, "sliding_window": 3,
                             "max_window_layers": 1}
# Gemma 3 with both soft-caps configured (the published text models set neither); small caps bite.
CONFIGS["gemma3_softcapped"] = {**copy.deepcopy(TINY_CONFIGS["gemma3_text"]), "attn_logit_softcapping": 1.0,
                                "final_logit_softcapping": 2.0}
SEQ = 8


def family_of(name: str) -> str:
    return str(CONFIGS[name]["model_type"])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_decoders")
    return {name: write_random_checkpoint(root / name, cfg, seed=i) for i, (name, cfg) in enumerate(CONFIGS.items())}


def token_ids(vocab: int, length: int, batch: int = 1, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int32)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_matches_independent_forward(name: str, checkpoints: dict[str, Path]) -> None:
    cfg = CONFIGS[name]
    graph, params = from_pretrained(checkpoints[name], seq_len=SEQ)
    ids = token_ids(cfg["vocab_size"], SEQ)
    got = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = FORWARDS[family_of(name)](Checkpoint(checkpoints[name]), cfg, ids)
    assert got.shape == (1, SEQ, cfg["vocab_size"])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decode_continues_the_sequence(name: str, checkpoints: dict[str, Path]) -> None:
    """Prefill P tokens with K/V outputs, feed them as the cache of a decode step of n tokens:
    the logits and updated caches equal the full-sequence forward's."""
    cfg = CONFIGS[name]
    past, new = 6, 2
    ids = token_ids(cfg["vocab_size"], past + new)
    weights = Checkpoint(checkpoints[name])
    want_logits, want_caches = FORWARDS[family_of(name)](weights, cfg, ids)
    prefill, prefill_params = from_pretrained(checkpoints[name], seq_len=past, kv_outputs=True)
    cached = reference.evaluate(prefill, {"input_ids": ids[:, :past]}, prefill_params)
    decode, params = from_pretrained(checkpoints[name], "decode", seq_len=new, cache_len=past)
    feeds: dict[str, np.ndarray] = {"input_ids": ids[:, past:], "position_ids": np.arange(past, past + new, dtype=np.int32)[None]}
    for i in range(cfg["num_hidden_layers"]):
        feeds[f"past_k_{i}"] = cached[f"new_k_{i}"]
        feeds[f"past_v_{i}"] = cached[f"new_v_{i}"]
    got = reference.evaluate(decode, feeds, params)
    scale = np.abs(want_logits).max()
    np.testing.assert_allclose(got["logits"], want_logits[:, past:], rtol=2e-4, atol=2e-4 * scale)
    for i in range(cfg["num_hidden_layers"]):
        np.testing.assert_allclose(got[f"new_k_{i}"], want_caches[2 * i], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got[f"new_v_{i}"], want_caches[2 * i + 1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", [n for n in DECODERS if n not in CONVERTED_ELSEWHERE])
def test_decode_converts(name: str, checkpoints: dict[str, Path]) -> None:
    cfg = CONFIGS[name]
    past, new = 6, 2
    graph, params = from_pretrained(checkpoints[name], "decode", seq_len=new, cache_len=past)
    rng = np.random.default_rng(3)
    feeds: dict[str, np.ndarray] = {"input_ids": token_ids(cfg["vocab_size"], new),
                                    "position_ids": np.array([[past, past + 1]], np.int32)}
    kv_heads = cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    for i in range(cfg["num_hidden_layers"]):
        for kind in ("k", "v"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((1, kv_heads, past, head_dim)).astype(np.float32)
    check_conversion(graph, params, feeds, targets=["iOS18"], roundtrip=False,
                     tolerances={Precision.FP16: FP16_MODEL_TOLERANCE})


def test_batched_decode_rotates_each_row_at_its_own_position(checkpoints: dict[str, Path]) -> None:
    """Batch > 1 gathers RoPE rows per batch entry: each row's logits equal that row decoded
    alone at its position."""
    name = "qwen3"
    cfg = CONFIGS[name]
    past = 5
    graph, params = from_pretrained(checkpoints[name], "decode", seq_len=1, cache_len=past, batch_size=2)
    single, single_params = from_pretrained(checkpoints[name], "decode", seq_len=1, cache_len=past, max_positions=past + 4)
    rng = np.random.default_rng(5)
    head_dim = cfg["head_dim"]
    feeds: dict[str, np.ndarray] = {"input_ids": token_ids(cfg["vocab_size"], 1, batch=2),
                                    "position_ids": np.array([[past], [2]], np.int32)}
    for i in range(cfg["num_hidden_layers"]):
        for kind in ("k", "v"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((2, cfg["num_key_value_heads"], past, head_dim)).astype(np.float32)
    got = reference.evaluate(graph, feeds, params)["logits"]
    for row in range(2):
        alone = {k: v[row:row + 1] for k, v in feeds.items()}
        want = reference.evaluate(single, alone, single_params)["logits"]
        np.testing.assert_allclose(got[row:row + 1], want, rtol=1e-5, atol=1e-5)
    check_conversion(graph, params, feeds, targets=["iOS18"], precisions=["fp32"], roundtrip=False)


def test_last_logits_is_the_last_row(checkpoints: dict[str, Path]) -> None:
    name = "gemma2"
    full, params = from_pretrained(checkpoints[name], seq_len=SEQ)
    last, last_params = from_pretrained(checkpoints[name], seq_len=SEQ, last_logits=True)
    ids = token_ids(CONFIGS[name]["vocab_size"], SEQ)
    want = reference.evaluate(full, {"input_ids": ids}, params)["logits"][:, -1:]
    got = reference.evaluate(last, {"input_ids": ids}, last_params)["logits"]
    assert got.shape == (1, 1, CONFIGS[name]["vocab_size"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_prefill_position_ids_input_shifts_rope(checkpoints: dict[str, Path]) -> None:
    """A prefill graph taking position_ids at 0..S-1 equals the one without the input."""
    name = "llama"
    plain, params = from_pretrained(checkpoints[name], seq_len=SEQ)
    with_pos, pos_params = from_pretrained(checkpoints[name], seq_len=SEQ, position_ids=True)
    ids = token_ids(CONFIGS[name]["vocab_size"], SEQ)
    want = reference.evaluate(plain, {"input_ids": ids}, params)["logits"]
    got = reference.evaluate(with_pos, {"input_ids": ids, "position_ids": np.arange(SEQ, dtype=np.int32)[None]}, pos_params)
    np.testing.assert_allclose(got["logits"], want, rtol=1e-5, atol=1e-5)


def test_decode_graph_contract(checkpoints: dict[str, Path]) -> None:
    """Inputs, outputs and the per-layer Concat(past, new, axis=2) feeding Attention."""
    from rlx_mil.ir import Attention, Concat, Input

    cfg = CONFIGS["qwen3"]
    graph, _ = from_pretrained(checkpoints["qwen3"], "decode", seq_len=3, cache_len=4)
    inputs = {n.op.name: n.shape for n in graph if isinstance(n.op, Input)}
    layers = cfg["num_hidden_layers"]
    assert set(inputs) == {"input_ids", "position_ids", *(f"past_{k}_{i}" for i in range(layers) for k in "kv")}
    assert str(inputs["input_ids"]) == "I32[1, 3]" and str(inputs["position_ids"]) == "I32[1, 3]"
    assert inputs["past_k_0"].sizes() == (1, cfg["num_key_value_heads"], 4, cfg["head_dim"])
    outputs = [graph.node(i) for i in graph.outputs]
    assert [n.name for n in outputs] == ["logits", *(f"new_{k}_{i}" for i in range(layers) for k in "kv")]
    for node in outputs[1:]:
        assert isinstance(node.op, Concat) and node.op.axis == 2
        assert node.shape.sizes() == (1, cfg["num_key_value_heads"], 7, cfg["head_dim"])
        consumers = [graph.node(c).op for c in graph.consumers()[node.id]]
        assert any(isinstance(op, Attention) and op.mask_kind.type.value == "Causal" for op in consumers)


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral"])
def test_decode_key_padding_mask_hides_past_positions(name: str, checkpoints: dict[str, Path]) -> None:
    """Masking the first m cached positions equals decoding against a cache without them."""
    cfg = CONFIGS[name]
    past, hidden = 6, 2
    if cfg.get("sliding_window") is not None:  # window layers: the Custom mask cannot express them
        with pytest.raises(InvalidOptionError, match="sliding-window layers"):
            from_pretrained(checkpoints[name], "decode", cache_len=past, attention_mask=True)
        return
    masked, params = from_pretrained(checkpoints[name], "decode", cache_len=past, attention_mask=True, max_positions=16)
    short, short_params = from_pretrained(checkpoints[name], "decode", cache_len=past - hidden, max_positions=16)
    rng = np.random.default_rng(9)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    feeds: dict[str, np.ndarray] = {"input_ids": token_ids(cfg["vocab_size"], 1), "position_ids": np.array([[past]], np.int32)}
    for i in range(cfg["num_hidden_layers"]):
        for kind in ("k", "v"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((1, cfg["num_key_value_heads"], past, head_dim)).astype(np.float32)
    mask = np.ones((1, past + 1), np.float32)
    mask[0, :hidden] = 0
    got = reference.evaluate(masked, {**feeds, "attention_mask": mask}, params)
    trimmed = {k: (v[:, :, hidden:] if k.startswith("past_") else v) for k, v in feeds.items()}
    want = reference.evaluate(short, trimmed, short_params)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    check_conversion(masked, params, {**feeds, "attention_mask": mask}, targets=["iOS18"], roundtrip=False,
                     tolerances={Precision.FP16: FP16_MODEL_TOLERANCE})


def test_key_padding_mask_needs_one_new_token(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(InvalidOptionError, match="seq_len 1"):
        from_pretrained(checkpoints["llama"], "decode", seq_len=2, cache_len=4, attention_mask=True)
    with pytest.raises(InvalidOptionError, match="seq_len 1"):
        from_pretrained(checkpoints["llama"], seq_len=4, attention_mask=True)
