"""Independent NumPy forwards of the round-2 text encoders, written from transformers'
modeling files (5.x): `ModernBertModel` and `RobertaModel` / `XLMRobertaModel`. They read
the config's own fields the way the config classes do, and share nothing with rlx_mil."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from models.hf_numpy import Weights, _gelu, _gelu_tanh, _layer_norm, _linear, _merge, _split, _w


def _softmax_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Bidirectional attention `[B, H, S, D]` where `allowed` `[B, 1, S, S]` (a row with no
    allowed key gives an average over all keys: padded queries only)."""
    scores = q @ k.swapaxes(-1, -2) * q.shape[-1] ** -0.5
    scores = np.where(allowed, scores, -1e30)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(-1, keepdims=True)) @ v


def _rotate_half(x: np.ndarray, theta: float) -> np.ndarray:
    """apply_rotary_pos_emb with the default RoPE of base `theta` over positions 0..S-1."""
    dim, s = x.shape[-1], x.shape[2]
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    emb = np.concatenate([np.arange(s)[:, None] * inv] * 2, axis=-1)
    rotated = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def modernbert_layer_types(cfg: Mapping[str, Any]) -> list[str]:
    """ModernBertConfig.__post_init__: `layer_types`, else global every
    `global_attn_every_n_layers` (3) layers from layer 0."""
    if cfg.get("layer_types") is not None:
        return list(cfg["layer_types"])
    every = cfg.get("global_attn_every_n_layers", 3)
    return ["sliding_attention" if i % every else "full_attention" for i in range(cfg["num_hidden_layers"])]


def modernbert_thetas(cfg: Mapping[str, Any]) -> dict[str, float]:
    """ModernBertConfig.convert_rope_params_to_dict for default RoPE."""
    params = cfg.get("rope_parameters") or {}
    legacy = {"full_attention": cfg.get("global_rope_theta", 160000.0),
              "sliding_attention": cfg.get("local_rope_theta", 10000.0)}
    return {kind: (params.get(kind) or {}).get("rope_theta", legacy[kind]) for kind in legacy}


def modernbert_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray, attention_mask: np.ndarray,
                       prefix: str = "") -> np.ndarray:
    """ModernBertModel's last_hidden_state."""
    eps = cfg.get("norm_eps", 1e-5)
    heads = cfg["num_attention_heads"]
    e = cfg["hidden_size"]
    d = e // heads
    act = _gelu if cfg.get("hidden_activation", "gelu") == "gelu" else _gelu_tanh
    norm_bias = cfg.get("norm_bias", False)

    def ln(x: np.ndarray, module: str) -> np.ndarray:
        w = _w(weights, f"{prefix}{module}.weight")
        b = _w(weights, f"{prefix}{module}.bias") if norm_bias else np.zeros_like(w)
        return _layer_norm(x, w, b, eps)

    def lin(x: np.ndarray, module: str, bias: bool) -> np.ndarray:
        return _linear(weights, x, prefix + module, bias)

    s = ids.shape[1]
    keys = attention_mask[:, None, None, :] > 0
    distance = np.abs(np.arange(s)[:, None] - np.arange(s)[None, :])
    half_window = cfg.get("local_attention", 128) // 2
    allowed = {"full_attention": keys, "sliding_attention": keys & (distance <= half_window)[None, None]}
    thetas = modernbert_thetas(cfg)
    x = ln(_w(weights, prefix + "embeddings.tok_embeddings.weight")[ids], "embeddings.norm")
    attn_bias, mlp_bias = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    for i, kind in enumerate(modernbert_layer_types(cfg)):
        p = f"layers.{i}"
        h = x if i == 0 else ln(x, f"{p}.attn_norm")
        qkv = lin(h, f"{p}.attn.Wqkv", attn_bias).reshape(*ids.shape, 3, heads, d)
        q, k, v = (qkv[:, :, j].transpose(0, 2, 1, 3) for j in range(3))
        q, k = _rotate_half(q, thetas[kind]), _rotate_half(k, thetas[kind])
        a = _softmax_attention(q, k, v, allowed[kind])
        x = x + lin(_merge(a), f"{p}.attn.Wo", attn_bias)
        up, gate = np.split(lin(ln(x, f"{p}.mlp_norm"), f"{p}.mlp.Wi", mlp_bias), 2, axis=-1)
        x = x + lin(act(up) * gate, f"{p}.mlp.Wo", mlp_bias)
    return ln(x, "final_norm")


def roberta_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray, attention_mask: np.ndarray,
                    prefix: str = "") -> np.ndarray:
    """RobertaModel's / XLMRobertaModel's last_hidden_state: positions from
    create_position_ids_from_input_ids, token type 0, BERT's post-LN layers."""
    eps = cfg.get("layer_norm_eps", 1e-12)
    heads = cfg["num_attention_heads"]
    d = cfg["hidden_size"] // heads
    act = _gelu if cfg.get("hidden_act", "gelu") == "gelu" else _gelu_tanh
    pad = cfg.get("pad_token_id", 1)

    def ln(x: np.ndarray, module: str) -> np.ndarray:
        return _layer_norm(x, _w(weights, f"{prefix}{module}.weight"), _w(weights, f"{prefix}{module}.bias"), eps)

    def lin(x: np.ndarray, module: str) -> np.ndarray:
        return _linear(weights, x, prefix + module, True)

    real = (ids != pad).astype(np.int64)
    positions = np.cumsum(real, axis=1) * real + pad
    emb = prefix + "embeddings."
    x = (_w(weights, emb + "word_embeddings.weight")[ids] + _w(weights, emb + "position_embeddings.weight")[positions]
         + _w(weights, emb + "token_type_embeddings.weight")[np.zeros_like(ids)])
    x = ln(x, "embeddings.LayerNorm")
    allowed = np.broadcast_to(attention_mask[:, None, None, :] > 0, (ids.shape[0], 1, ids.shape[1], ids.shape[1]))
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q, k, v = (_split(lin(x, f"{p}.attention.self.{n}"), heads, d) for n in ("query", "key", "value"))
        a = _merge(_softmax_attention(q, k, v, allowed))
        x = ln(x + lin(a, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
        x = ln(x + lin(act(lin(x, f"{p}.intermediate.dense")), f"{p}.output.dense"), f"{p}.output.LayerNorm")
    return x


def cls_pool(hidden: np.ndarray, normalize: bool) -> np.ndarray:
    """sentence-transformers Pooling(cls) and optionally Normalize()."""
    pooled = hidden[:, 0]
    if normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled
