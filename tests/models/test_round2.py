"""Mixture-of-experts (Qwen3-MoE, Qwen2-MoE, OLMoE) and hybrid (LFM2, Qwen3.5) decoders from
Hugging Face-layout checkpoints: the builders' graphs against independent NumPy forwards
(tests/models/round2_numpy.py), decode steps continuing a sequence from its state, converted
packages against the reference semantics, BF16 and sharded checkpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from models.round2_numpy import FORWARDS
from rlx_mil import reference
from rlx_mil.errors import CheckpointError, InvalidOptionError, UnsupportedConfigError
from rlx_mil.lowering.target import Precision
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.testing import Tolerance, check_conversion

FP16_MODEL_TOLERANCE = Tolerance(atol=5e-2, rtol=5e-2)
SEQ = 7

ROUND2_TINY_CONFIGS = {k: TINY_CONFIGS[k] for k in ("qwen3_moe", "olmoe", "lfm2", "qwen3_5")}
CONFIGS: dict[str, dict[str, Any]] = copy.deepcopy(ROUND2_TINY_CONFIGS)
CONFIGS["qwen3_moe_dense_layer"] = {**copy.deepcopy(ROUND2_TINY_CONFIGS["qwen3_moe"]), "norm_topk_prob": False,
                                    "mlp_only_layers": [1], "num_experts": 5, "num_experts_per_tok": 3}
CONFIGS["olmoe_clipped"] = {**copy.deepcopy(ROUND2_TINY_CONFIGS["olmoe"]), "clip_qkv": 0.4, "norm_topk_prob": True,
                            "tie_word_embeddings": True}
CONFIGS["qwen2_moe"] = copy.deepcopy(TINY_CONFIGS["qwen2_moe"])
CONFIGS["lfm2_default_layers"] = {**copy.deepcopy(ROUND2_TINY_CONFIGS["lfm2"]), "layer_types": None, "full_attn_idxs": [1],
                                  "conv_bias": True, "conv_L_cache": 4}
CONFIGS["qwen3_5_text"] = copy.deepcopy(TINY_CONFIGS["qwen3_5_text"])


def kinds_of(cfg: dict[str, Any]) -> list[str]:
    """Per layer "attention", "conv" or "linear_attention", as the NumPy forwards order their state."""
    text = cfg.get("text_config", cfg)
    layers = text["num_hidden_layers"]
    if cfg["model_type"] in ("qwen3_moe", "qwen2_moe", "olmoe"):
        return ["attention"] * layers
    if cfg["model_type"] == "lfm2":
        types = cfg.get("layer_types") or ["full_attention" if i in cfg["full_attn_idxs"] else "conv" for i in range(layers)]
        return ["attention" if t == "full_attention" else "conv" for t in types]
    types = text.get("layer_types") or ["full_attention" if (i + 1) % text["full_attention_interval"] == 0
                                        else "linear_attention" for i in range(layers)]
    return ["attention" if t == "full_attention" else "linear_attention" for t in types]


def numpy_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as transformers fills it in (layer_types from the interval)."""
    out = copy.deepcopy(cfg)
    if out["model_type"] == "lfm2":
        out["layer_types"] = ["full_attention" if k == "attention" else "conv" for k in kinds_of(cfg)]
    elif out["model_type"] == "qwen3_5_text":
        out["layer_types"] = ["full_attention" if k == "attention" else k for k in kinds_of(cfg)]
    return out


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("round2")
    return {name: write_random_checkpoint(root / name, cfg, seed=20 + i) for i, (name, cfg) in enumerate(CONFIGS.items())}


def token_ids(vocab: int, length: int, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (1, length)).astype(np.int32)


def vocab_of(cfg: dict[str, Any]) -> int:
    return int(cfg.get("text_config", cfg)["vocab_size"])


def forward(name: str, folder: Path, ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    cfg = numpy_config(CONFIGS[name])
    return FORWARDS[cfg["model_type"]](Checkpoint(folder), cfg, ids)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_matches_independent_forward(name: str, checkpoints: dict[str, Path]) -> None:
    graph, params = from_pretrained(checkpoints[name], seq_len=SEQ)
    ids = token_ids(vocab_of(CONFIGS[name]), SEQ)
    got = reference.evaluate(graph, {"input_ids": ids}, params)["logits"]
    want, _ = forward(name, checkpoints[name], ids)
    assert got.shape == want.shape and float(np.std(want)) > 0.1
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def decode_feeds(name: str, states: list[np.ndarray], ids: np.ndarray, past: int) -> dict[str, np.ndarray]:
    """Decode inputs continuing after `past` tokens whose state the NumPy forward gave."""
    feeds: dict[str, np.ndarray] = {"input_ids": ids, "position_ids": np.arange(past, past + ids.shape[1], dtype=np.int32)[None]}
    at = 0
    for i, kind in enumerate(kinds_of(CONFIGS[name])):
        if kind == "attention":
            feeds[f"past_k_{i}"], feeds[f"past_v_{i}"] = states[at], states[at + 1]
            at += 2
        elif kind == "conv":
            feeds[f"conv_state_{i}"] = states[at]
            at += 1
        else:
            feeds[f"conv_state_{i}"], feeds[f"recurrent_state_{i}"] = states[at], states[at + 1]
            at += 2
    return {k: v.astype(np.float32) for k, v in feeds.items() if k not in ("input_ids", "position_ids")} | {
        "input_ids": feeds["input_ids"], "position_ids": feeds["position_ids"]}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decode_continues_the_sequence(name: str, checkpoints: dict[str, Path]) -> None:
    """The state after P tokens (from the NumPy forward) fed to a decode graph of n tokens: its
    logits are the full forward's, and each state output is the forward's state after P + n."""
    past, new = 5, 2
    ids = token_ids(vocab_of(CONFIGS[name]), past + new)
    want, final = forward(name, checkpoints[name], ids)
    _, states = forward(name, checkpoints[name], ids[:, :past])
    graph, params = from_pretrained(checkpoints[name], "decode", seq_len=new, cache_len=past)
    got = reference.evaluate(graph, decode_feeds(name, states, ids[:, past:], past), params)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got["logits"], want[:, past:], rtol=2e-4, atol=2e-4 * scale)
    expected = decode_feeds(name, final, ids[:, past:], past + new)
    for key, value in expected.items():
        out = {"past_k": "new_k", "past_v": "new_v"}.get(key[:6], None)
        produced = got[f"{out}{key[6:]}"] if out else got.get(f"{key}_out")
        if key in ("input_ids", "position_ids"):
            continue
        assert produced is not None, key
        np.testing.assert_allclose(produced, value, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(value).max()))


@pytest.mark.parametrize("name", ["qwen3_moe", "olmoe", "lfm2", "qwen3_5"])
def test_decode_converts(name: str, checkpoints: dict[str, Path]) -> None:
    """A decode graph (state inputs, state outputs) converted: the executor's outputs equal the
    graph's (fp32 within 1e-4, fp16 within 5e-2 of each output's scale)."""
    past, new = 4, 2
    ids = token_ids(vocab_of(CONFIGS[name]), past + new)
    _, states = forward(name, checkpoints[name], ids[:, :past])
    graph, params = from_pretrained(checkpoints[name], "decode", seq_len=new, cache_len=past)
    check_conversion(graph, params, decode_feeds(name, states, ids[:, past:], past), targets=["iOS18"],
                     roundtrip=False, tolerances={Precision.FP16: FP16_MODEL_TOLERANCE})


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe", "olmoe", "lfm2", "qwen3_5"])
def test_bf16_sharded_packages_match_the_independent_forward(name: str, tmp_path: Path) -> None:
    """BF16 tensors in two shards, read as stored (never widened): the fp32 package's logits
    through the executor are within 1e-4 of the NumPy forward's largest logit, fp16 within 5e-2."""
    import ml_dtypes

    import rlx_mil
    from rlx_mil import milexec

    folder = write_random_checkpoint(tmp_path / name, CONFIGS[name], seed=3, dtype="bfloat16", shards=2)
    assert (folder / "model.safetensors.index.json").exists()
    graph, params = from_pretrained(folder, seq_len=SEQ)
    assert all(params.dtype_of(n) == ml_dtypes.bfloat16 for n in params if not n.startswith("rope."))  # type: ignore[attr-defined]
    ids = token_ids(vocab_of(CONFIGS[name]), SEQ)
    want, _ = forward(name, folder, ids)
    scale = np.abs(want).max()
    got = milexec.run(rlx_mil.convert(graph, params, precision="fp32"), {"input_ids": ids})["logits"]
    assert np.abs(got - want).max() <= 1e-4 * scale
    half = milexec.run(rlx_mil.convert(graph, params, precision="fp16"), {"input_ids": ids})["logits"]
    assert np.abs(half - want).max() <= 5e-2 * scale


def test_both_rope_forms_read_the_same() -> None:
    """`rope_theta` (and LFM2's own `theta`) give the spec `rope_parameters` gives."""
    from rlx_mil.models.families import model_spec

    for name, legacy_key in (("qwen3_moe", "rope_theta"), ("lfm2", "theta"), ("olmoe", "rope_theta")):
        cfg = copy.deepcopy(CONFIGS[name])
        theta = cfg.pop("rope_parameters")["rope_theta"]
        assert model_spec({**cfg, legacy_key: theta}) == model_spec(CONFIGS[name])
        assert model_spec({**cfg, legacy_key: theta * 2}) != model_spec(CONFIGS[name])


def test_fused_expert_layout(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    """transformers 5's fused `mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I]
    gives the same logits as the per-expert tensors it was made from."""
    name = "qwen3_moe"
    source = Checkpoint(checkpoints[name])
    cfg = CONFIGS[name]
    tensors = {k: np.asarray(source[k]) for k in source if ".experts." not in k}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts"
        experts = range(cfg["num_experts"])
        tensors[f"{p}.gate_up_proj"] = np.stack([np.concatenate([source[f"{p}.{e}.gate_proj.weight"], source[f"{p}.{e}.up_proj.weight"]])
                                                 for e in experts])
        tensors[f"{p}.down_proj"] = np.stack([np.asarray(source[f"{p}.{e}.down_proj.weight"]) for e in experts])
    folder = tmp_path / "fused"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"))
    ids = token_ids(vocab_of(cfg), SEQ)
    fused, fused_params = from_pretrained(folder, seq_len=SEQ)
    plain, plain_params = from_pretrained(checkpoints[name], seq_len=SEQ)
    np.testing.assert_allclose(reference.evaluate(fused, {"input_ids": ids}, fused_params)["logits"],
                               reference.evaluate(plain, {"input_ids": ids}, plain_params)["logits"], rtol=1e-6, atol=1e-6)


def test_qwen3_5_ignores_the_vision_tower(tmp_path: Path) -> None:
    """A Qwen3_5ForConditionalGeneration folder with `model.visual.*` and `mtp.*` tensors beside
    the decoder converts; a missing decoder tensor is still named."""
    cfg = CONFIGS["qwen3_5"]
    folder = write_random_checkpoint(tmp_path / "vl", cfg, seed=4)
    tensors = {k: np.asarray(v) for k, v in Checkpoint(folder).items()}
    tensors["model.visual.patch_embed.proj.weight"] = np.zeros((16, 3, 2, 4, 4), np.float32)
    tensors["mtp.fc.weight"] = np.zeros((32, 64), np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    _, params = from_pretrained(folder, seq_len=SEQ)
    assert not any("visual" in n for n in params)
    del tensors["model.language_model.layers.0.linear_attn.A_log"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        from_pretrained(folder, seq_len=SEQ)
    assert "model.language_model.layers.0.linear_attn.A_log" in str(err.value.problems)


def test_refusals(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(InvalidOptionError, match="recurrent"):
        from_pretrained(checkpoints["lfm2"], "decode", cache_len=3, attention_mask=True)
    with pytest.raises(InvalidOptionError, match="kv_outputs"):
        from_pretrained(checkpoints["qwen3_5"], seq_len=4, kv_outputs=True)
    from rlx_mil.models.families import model_spec

    text = {**CONFIGS["qwen3_5_text"], "linear_value_head_dim": 16}
    with pytest.raises(UnsupportedConfigError) as err:
        model_spec(text)
    assert err.value.field == "linear_value_head_dim"
    unknown = {**CONFIGS["qwen3_moe"], "rope_parameters": {"rope_type": "ntk_by_parts", "rope_theta": 1e6}}
    with pytest.raises(UnsupportedConfigError, match="ntk_by_parts"):
        model_spec(unknown)
    with pytest.raises(UnsupportedConfigError) as err:
        model_spec({**CONFIGS["lfm2"], "conv_dim": 48})
    assert err.value.field == "conv_dim"
    with pytest.raises(UnsupportedConfigError) as err:
        model_spec({**CONFIGS["olmoe"], "expert_bias": True})
    assert err.value.field == "expert_bias"


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe", "olmoe", "lfm2", "qwen3_5"])
def test_stateful_package_generates_the_stateless_tokens(name: str, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """One stateful package (a prefill bucket and decode, KV cache and recurrent states in Core
    ML states): a prompt then 16 greedy tokens equal the stateless graph's, and the prompt's last
    logits are the NumPy forward's."""
    import warnings

    from rlx_mil.llm.generate import Session
    from rlx_mil.llm.package import convert_llm_checkpoint, reference_greedy
    from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning

    folder = checkpoints[name]
    prompt = [int(t) for t in token_ids(vocab_of(CONFIGS[name]), 7, seed=11)[0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        model = convert_llm_checkpoint(folder, tmp_path / f"{name}.mlpackage", max_context=32, prefill=[4],
                                       precision="fp32")
    contract = json.loads(model.user_defined_metadata["rlx_mil.llm"])
    kinds = kinds_of(CONFIGS[name])
    assert len(contract["recurrent_states"]) == sum({"attention": 0, "conv": 1, "linear_attention": 2}[k] for k in kinds)
    session = Session(tmp_path / f"{name}.mlpackage", engine="milexec", precision_model="float32")
    logits = session.feed(prompt)
    want, _ = forward(name, folder, np.asarray([prompt], np.int32))
    # States are fp16 (Core ML's only state dtype): the logits agree to about 1e-3 of their scale.
    np.testing.assert_allclose(logits, want[0, -1], rtol=5e-3, atol=5e-3 * np.abs(want).max())
    if any(k != "attention" for k in kinds):
        # Every token fed enters the recurrent state: the 3-token tail goes through decode, unpadded.
        assert session.calls == [("prefill_4", 4), ("decode", 1), ("decode", 1), ("decode", 1)]
    else:  # attention only: the tail runs padded in the bucket, then its last token through decode
        assert session.calls == [("prefill_4", 4), ("prefill_4", 4), ("decode", 1)]
    session.reset()
    assert session.generate(prompt, 16) == reference_greedy(folder, prompt, 16)
