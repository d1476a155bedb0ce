"""Independent NumPy forwards of the second round of decoder families (Gemma 3 text, SmolLM3,
Granite), written from transformers' modeling files (v5.23.0) in float64, sharing nothing with
rlx_mil's builders. Phi-4-mini is `hf_numpy.phi3_forward` (partial rotary and longrope come
from `hf_rope_numpy`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from models.hf_numpy import (
    Weights,
    _attend,
    _gelu_tanh,
    _linear,
    _merge,
    _rms_norm,
    _rotate,
    _split,
    _swiglu,
    _w,
)
from models.hf_rope_numpy import inv_freq, rope_dicts


def _heads(cfg: Mapping[str, Any], head_dim_default: int | None = None) -> tuple[int, int, int]:
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or head_dim_default or cfg["hidden_size"] // heads
    return heads, kv, head_dim


def gemma3_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Gemma3ForCausalLM (text): Gemma 2's sandwich block, GELU-tanh gate and (1 + w) RMSNorms,
    plus q_norm / k_norm over head_dim before RoPE; layer i slides unless (i + 1) % 6 == 0 (or as
    `layer_types` says); global layers use theta 1e6 (+ `rope_scaling`), local ones
    `rope_local_base_freq` 1e4; the final logits soft-capped where configured (attention never is)."""
    heads, kv, d = _heads(cfg, 256)
    eps = cfg.get("rms_norm_eps", 1e-6)
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % cfg.get("sliding_window_pattern", 6)
                                       else "full_attention" for i in range(layers)]
    given = cfg.get("rope_parameters") or {}
    full = {"rope_type": "default", **(given.get("full_attention") or {}), **(cfg.get("rope_scaling") or {})}
    local = {"rope_type": "default", **(given.get("sliding_attention") or {})}
    full.setdefault("rope_theta", cfg.get("rope_theta", 1e6))
    local.setdefault("rope_theta", cfg.get("rope_local_base_freq", 1e4))
    t = ids.shape[1]
    rope = {"full_attention": inv_freq(full, cfg, d, t), "sliding_attention": inv_freq(local, cfg, d, t)}
    scale = cfg.get("query_pre_attn_scalar", 256) ** -0.5
    # Gemma3Attention keeps attn_logit_softcapping in its config but passes no softcap to its
    # attention (transformers 5.24 modeling_gemma3): only the final logits are capped.
    final_cap = cfg.get("final_logit_softcapping")

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        return _rms_norm(x, 1.0 + _w(weights, name), eps)

    pos = np.arange(t, dtype=np.float64)
    x = _w(weights, "model.embed_tokens.weight")[ids] * math.sqrt(cfg["hidden_size"])
    caches = []
    for i in range(layers):
        p = f"model.layers.{i}"
        h = norm(x, f"{p}.input_layernorm.weight")
        q = norm(_split(_linear(weights, h, f"{p}.self_attn.q_proj"), heads, d), f"{p}.self_attn.q_norm.weight")
        k = norm(_split(_linear(weights, h, f"{p}.self_attn.k_proj"), kv, d), f"{p}.self_attn.k_norm.weight")
        v = _split(_linear(weights, h, f"{p}.self_attn.v_proj"), kv, d)
        inv, factor = rope[types[i]]
        q, k = _rotate(q, pos, inv, factor), _rotate(k, pos, inv, factor)
        caches += [k, v]
        window = cfg.get("sliding_window", 4096) if types[i] == "sliding_attention" else None
        a = _linear(weights, _merge(_attend(q, k, v, scale, window)), f"{p}.self_attn.o_proj")
        x = x + norm(a, f"{p}.post_attention_layernorm.weight")
        h = norm(x, f"{p}.pre_feedforward_layernorm.weight")
        gated = _gelu_tanh(_linear(weights, h, f"{p}.mlp.gate_proj")) * _linear(weights, h, f"{p}.mlp.up_proj")
        x = x + norm(_linear(weights, gated, f"{p}.mlp.down_proj"), f"{p}.post_feedforward_layernorm.weight")
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", True) else "lm_head.weight"
    logits = norm(x, "model.norm.weight") @ _w(weights, head).T
    if final_cap is not None:
        logits = np.tanh(logits / final_cap) * final_cap
    return logits, caches


def _llama_block(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray, *, theta: float, use_rope: list[int],
                 embed_mult: float = 1.0, attn_scale: float | None = None, residual_mult: float = 1.0,
                 logits_div: float = 1.0, tied_default: bool = False,
                 mlp: Any = None) -> tuple[np.ndarray, list[np.ndarray]]:
    heads, kv, d = _heads(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    params = rope_dicts({**cfg, "rope_theta": cfg.get("rope_theta", theta)})
    assert "rope_type" in params
    inv, factor = inv_freq(params, cfg, d, ids.shape[1])
    bias, mlp_bias = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    pos = np.arange(ids.shape[1], dtype=np.float64)
    x = _w(weights, "model.embed_tokens.weight")[ids] * embed_mult
    caches = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = _rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), eps)
        q = _split(_linear(weights, h, f"{p}.self_attn.q_proj", bias), heads, d)
        k = _split(_linear(weights, h, f"{p}.self_attn.k_proj", bias), kv, d)
        v = _split(_linear(weights, h, f"{p}.self_attn.v_proj", bias), kv, d)
        if use_rope[i]:
            q, k = _rotate(q, pos, inv, factor), _rotate(k, pos, inv, factor)
        caches += [k, v]
        a = _attend(q, k, v, d**-0.5 if attn_scale is None else attn_scale)
        x = x + _linear(weights, _merge(a), f"{p}.self_attn.o_proj", bias) * residual_mult
        h = _rms_norm(x, _w(weights, f"{p}.post_attention_layernorm.weight"), eps)
        x = x + (_swiglu(weights, h, p, mlp_bias) if mlp is None else mlp(h, p)) * residual_mult
    x = _rms_norm(x, _w(weights, "model.norm.weight"), eps)
    tied = cfg.get("tie_word_embeddings", tied_default)
    return x @ _w(weights, "model.embed_tokens.weight" if tied else "lm_head.weight").T / logits_div, caches


def smollm3_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """SmolLM3ForCausalLM: the Llama layout; layer i rotates q/k only when no_rope_layers[i] is 1
    (default: every `no_rope_layer_interval`-th layer, 4, skips RoPE); theta defaults to 2e6."""
    layers = cfg["num_hidden_layers"]
    interval = cfg.get("no_rope_layer_interval", 4)
    use_rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    assert not cfg.get("use_sliding_window")
    return _llama_block(weights, cfg, ids, theta=2e6, use_rope=use_rope, tied_default=True)


def granite_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """GraniteForCausalLM: the Llama layout with embeddings x embedding_multiplier, scores x
    attention_multiplier (instead of head_dim^-0.5), both residual branches x
    residual_multiplier and logits / logits_scaling."""
    return _llama_block(weights, cfg, ids, theta=1e4, use_rope=[1] * cfg["num_hidden_layers"],
                        embed_mult=cfg.get("embedding_multiplier", 1.0), attn_scale=cfg.get("attention_multiplier", 1.0),
                        residual_mult=cfg.get("residual_multiplier", 1.0), logits_div=cfg.get("logits_scaling", 1.0))


def granite4_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """GraniteMoeHybridForCausalLM with attention layers only and no experts (Granite 4 dense):
    Granite's multipliers; the feed-forward is shared_mlp: input_linear, chunked in two (gate
    first), silu(gate) * up, output_linear; RoPE only when position_embedding_type is "rope"."""
    assert all(t in ("attention", "full_attention") for t in cfg["layer_types"]) and not cfg.get("num_local_experts")
    layers = cfg["num_hidden_layers"]

    def shared_mlp(h: np.ndarray, p: str) -> np.ndarray:
        both = _linear(weights, h, f"{p}.shared_mlp.input_linear")
        gate, up = np.split(both, 2, axis=-1)
        return _linear(weights, gate / (1.0 + np.exp(-gate)) * up, f"{p}.shared_mlp.output_linear")

    rope = [int(cfg.get("position_embedding_type") == "rope")] * layers
    return _llama_block(weights, cfg, ids, theta=1e4, use_rope=rope, embed_mult=cfg.get("embedding_multiplier", 1.0),
                        attn_scale=cfg.get("attention_multiplier", 1.0), residual_mult=cfg.get("residual_multiplier", 1.0),
                        logits_div=cfg.get("logits_scaling", 1.0), mlp=shared_mlp)


MORE_FORWARDS = {"gemma3_text": gemma3_forward, "smollm3": smollm3_forward, "granite": granite_forward,
                 "granitemoehybrid": granite4_forward}
