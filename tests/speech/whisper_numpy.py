"""An independent NumPy forward of Hugging Face's WhisperForConditionalGeneration (written from
the published architecture: Conv1d + GELU x2, learned/sinusoidal positions, pre-norm blocks,
final LayerNorm; the decoder with causal self-attention, cross-attention and the tied head),
in the sequence-major layout transformers uses, with no KV cache."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def _f(params: Mapping[str, Any], name: str) -> np.ndarray:
    return np.asarray(params[name], np.float64)


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _ln(x: np.ndarray, params: Mapping[str, Any], module: str) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * _f(params, f"{module}.weight") + _f(params, f"{module}.bias")


def _lin(x: np.ndarray, params: Mapping[str, Any], module: str, bias: bool = True) -> np.ndarray:
    y = x @ _f(params, f"{module}.weight").T
    return y + _f(params, f"{module}.bias") if bias else y


def _mha(x: np.ndarray, kv: np.ndarray, params: Mapping[str, Any], module: str, heads: int, causal: bool,
         weights: list[np.ndarray] | None = None) -> np.ndarray:
    e = x.shape[-1]
    d = e // heads
    q = _lin(x, params, f"{module}.q_proj") * d ** -0.5
    k = _lin(kv, params, f"{module}.k_proj", bias=False)
    v = _lin(kv, params, f"{module}.v_proj")
    out = np.zeros_like(q)
    for h in range(heads):
        s = q[:, h * d:(h + 1) * d] @ k[:, h * d:(h + 1) * d].T
        if causal:
            s = s + np.triu(np.full(s.shape, -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        if weights is not None:
            weights.append(p)
        out[:, h * d:(h + 1) * d] = p @ v[:, h * d:(h + 1) * d]
    return _lin(out, params, f"{module}.out_proj")


def _conv1d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """x [C, T], w [O, C, 3], padding 1."""
    padded = np.pad(x, ((0, 0), (1, 1)))
    t_out = (x.shape[1] + 2 - 3) // stride + 1
    cols = np.stack([padded[:, j * stride:j * stride + 3] for j in range(t_out)])  # [T, C, 3]
    return np.einsum("tck,ock->ot", cols, w) + b[:, None]


def encode(params: Mapping[str, Any], config: Mapping[str, Any], mel: np.ndarray) -> np.ndarray:
    """mel [n_mels, 2 * n_ctx] -> [n_ctx, d_model]."""
    x = _gelu(_conv1d(np.asarray(mel, np.float64), _f(params, "model.encoder.conv1.weight"),
                      _f(params, "model.encoder.conv1.bias"), 1))
    x = _gelu(_conv1d(x, _f(params, "model.encoder.conv2.weight"), _f(params, "model.encoder.conv2.bias"), 2)).T
    x = x + _f(params, "model.encoder.embed_positions.weight")[: x.shape[0]]
    for i in range(config["encoder_layers"]):
        p = f"model.encoder.layers.{i}"
        h = _ln(x, params, f"{p}.self_attn_layer_norm")
        x = x + _mha(h, h, params, f"{p}.self_attn", config["encoder_attention_heads"], False)
        h = _ln(x, params, f"{p}.final_layer_norm")
        x = x + _lin(_gelu(_lin(h, params, f"{p}.fc1")), params, f"{p}.fc2")
    return _ln(x, params, "model.encoder.layer_norm")


def decode(params: Mapping[str, Any], config: Mapping[str, Any], tokens: list[int], encoded: np.ndarray,
           cross_weights: list[list[np.ndarray]] | None = None) -> np.ndarray:
    """Teacher-forced logits [len(tokens), V] of `tokens` (positions 0..n-1) over `encoded`;
    `cross_weights` gets per layer the cross-attention weights of each head [len(tokens), n_kv]."""
    x = _f(params, "model.decoder.embed_tokens.weight")[tokens] + \
        _f(params, "model.decoder.embed_positions.weight")[: len(tokens)]
    enc = np.asarray(encoded, np.float64)
    for i in range(config["decoder_layers"]):
        p = f"model.decoder.layers.{i}"
        h = _ln(x, params, f"{p}.self_attn_layer_norm")
        x = x + _mha(h, h, params, f"{p}.self_attn", config["decoder_attention_heads"], True)
        h = _ln(x, params, f"{p}.encoder_attn_layer_norm")
        layer: list[np.ndarray] | None = [] if cross_weights is not None else None
        x = x + _mha(h, enc, params, f"{p}.encoder_attn", config["decoder_attention_heads"], False, layer)
        if cross_weights is not None and layer is not None:
            cross_weights.append(layer)
        h = _ln(x, params, f"{p}.final_layer_norm")
        x = x + _lin(_gelu(_lin(h, params, f"{p}.fc1")), params, f"{p}.fc2")
    x = _ln(x, params, "model.decoder.layer_norm")
    return x @ _f(params, "model.decoder.embed_tokens.weight").T
