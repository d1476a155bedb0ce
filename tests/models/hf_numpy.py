"""Independent NumPy forwards of the Hugging Face architectures, written from the published
model definitions (transformers' modeling_* files and the papers), in float64.

They read the checkpoint by its literal Hugging Face tensor names and share nothing with
rlx_mil's builders, so a wrong name, layout, norm, RoPE variant or mask in a builder shows
up as a mismatch. Each returns the logits (or hidden states) for the whole sequence plus,
for decoders, each layer's rotated keys and values `[B, H_kv, T, D]`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from models.hf_rope_numpy import inv_freq, rope_dicts

Weights = Mapping[str, np.ndarray]


def _w(weights: Weights, name: str) -> np.ndarray:
    return np.asarray(weights[name]).astype(np.float64)


def _linear(weights: Weights, x: np.ndarray, module: str, bias: bool = False) -> np.ndarray:
    y = x @ _w(weights, f"{module}.weight").T  # torch.nn.Linear: weight is [out, in]
    return y + _w(weights, f"{module}.bias") if bias else y


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _rotate(x: np.ndarray, positions: np.ndarray, inv: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """apply_rotary_pos_emb on `[B, H, T, D]`: rotate-half over the first 2*len(inv) dims, cos
    and sin multiplied by the RoPE's attention factor `scale`."""
    rot = 2 * len(inv)
    freqs = positions[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb) * scale, np.sin(emb) * scale
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    return np.concatenate([xr * cos + rotated * sin, xp], axis=-1)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, window: int | None = None,
            softcap: float | None = None, causal: bool = True, key_mask: np.ndarray | None = None) -> np.ndarray:
    """Eager attention `[B, H, T, D]`: repeat_kv, scores, soft-cap, mask, softmax."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = q @ k.swapaxes(-1, -2) * scale
    if softcap is not None:
        scores = np.tanh(scores / softcap) * softcap
    t_q, t_k = q.shape[2], k.shape[2]
    i = np.arange(t_q)[:, None] + (t_k - t_q)
    j = np.arange(t_k)[None, :]
    allowed = np.ones((t_q, t_k), bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= i - j < window  # sliding_window = W keys, the query's own included
    allowed = np.broadcast_to(allowed, scores.shape)
    if key_mask is not None:
        allowed = allowed & (key_mask[:, None, None, :] > 0)
    scores = np.where(allowed, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    p = np.exp(scores)
    return (p / p.sum(-1, keepdims=True)) @ v


def _split(x: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    b, t, _ = x.shape
    return x.reshape(b, t, heads, head_dim).transpose(0, 2, 1, 3)


def _merge(x: np.ndarray) -> np.ndarray:
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


class _Geometry:
    def __init__(self, cfg: Mapping[str, Any], seq_len: int = 0) -> None:
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.inv, self.rope_scale = inv_freq(rope_dicts(cfg), cfg, self.head_dim, seq_len)


def _logits(weights: Weights, cfg: Mapping[str, Any], x: np.ndarray) -> np.ndarray:
    tied = cfg.get("tie_word_embeddings", False)
    return x @ _w(weights, "model.embed_tokens.weight" if tied else "lm_head.weight").T


def _self_attention(weights: Weights, h: np.ndarray, p: str, geo: _Geometry, pos: np.ndarray, *,
                    bias: bool = False, o_bias: bool = False, qk_norm: bool = False, scale: float | None = None,
                    window: int | None = None, softcap: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`{p}.self_attn` with separate q/k/v/o projections: (output, rotated k, v)."""
    q = _split(_linear(weights, h, f"{p}.self_attn.q_proj", bias), geo.heads, geo.head_dim)
    k = _split(_linear(weights, h, f"{p}.self_attn.k_proj", bias), geo.kv_heads, geo.head_dim)
    v = _split(_linear(weights, h, f"{p}.self_attn.v_proj", bias), geo.kv_heads, geo.head_dim)
    if qk_norm:  # Qwen3Attention: q_norm / k_norm over head_dim, before RoPE
        q = _rms_norm(q, _w(weights, f"{p}.self_attn.q_norm.weight"), geo.eps)
        k = _rms_norm(k, _w(weights, f"{p}.self_attn.k_norm.weight"), geo.eps)
    q, k = _rotate(q, pos, geo.inv, geo.rope_scale), _rotate(k, pos, geo.inv, geo.rope_scale)
    a = _attend(q, k, v, geo.head_dim**-0.5 if scale is None else scale, window, softcap)
    return _linear(weights, _merge(a), f"{p}.self_attn.o_proj", o_bias), k, v


def _swiglu(weights: Weights, h: np.ndarray, p: str, bias: bool = False) -> np.ndarray:
    gated = _silu(_linear(weights, h, f"{p}.mlp.gate_proj", bias)) * _linear(weights, h, f"{p}.mlp.up_proj", bias)
    return _linear(weights, gated, f"{p}.mlp.down_proj", bias)


def _pre_norm_decoder(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray, windows: list[int | None], *,
                      bias: bool = False, o_bias: bool = False, mlp_bias: bool = False,
                      qk_norm: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
    """The Llama layout: x += attn(rms(x)); x += swiglu(rms(x)); rms; LM head."""
    geo = _Geometry(cfg, ids.shape[1])
    pos = np.arange(ids.shape[1], dtype=np.float64)
    x = _w(weights, "model.embed_tokens.weight")[ids]
    caches = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = _rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), geo.eps)
        a, k, v = _self_attention(weights, h, p, geo, pos, bias=bias, o_bias=o_bias, qk_norm=qk_norm, window=windows[i])
        caches += [k, v]
        x = x + a
        x = x + _swiglu(weights, _rms_norm(x, _w(weights, f"{p}.post_attention_layernorm.weight"), geo.eps), p, mlp_bias)
    x = _rms_norm(x, _w(weights, "model.norm.weight"), geo.eps)
    return _logits(weights, cfg, x), caches


def llama_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """LlamaForCausalLM (Llama 2/3/3.1/3.2): pre-RMSNorm, GQA, RoPE (llama3/linear scaling),
    SwiGLU; attention_bias on q/k/v/o, mlp_bias on the MLP."""
    bias = cfg.get("attention_bias", False)
    return _pre_norm_decoder(weights, cfg, ids, [None] * cfg["num_hidden_layers"], bias=bias, o_bias=bias,
                             mlp_bias=cfg.get("mlp_bias", False))


def _qwen_windows(cfg: Mapping[str, Any]) -> list[int | None]:
    layers = cfg["num_hidden_layers"]
    if not cfg.get("use_sliding_window", False):
        return [None] * layers
    return [cfg["sliding_window"] if i >= cfg.get("max_window_layers", layers) else None for i in range(layers)]


def qwen2_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Qwen2ForCausalLM: Llama layout with q/k/v biases (o_proj without), optional windows."""
    return _pre_norm_decoder(weights, cfg, ids, _qwen_windows(cfg), bias=True)


def qwen3_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Qwen3ForCausalLM: RMSNorm over head_dim on q and k (q_norm / k_norm) before RoPE."""
    bias = cfg.get("attention_bias", False)
    return _pre_norm_decoder(weights, cfg, ids, _qwen_windows(cfg), bias=bias, o_bias=bias, qk_norm=True)


def mistral_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """MistralForCausalLM: Llama layout, every layer attends within `sliding_window` keys."""
    return _pre_norm_decoder(weights, cfg, ids, [cfg.get("sliding_window", 4096)] * cfg["num_hidden_layers"])


def gemma2_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Gemma2ForCausalLM: embeddings * sqrt(hidden), (1 + w) RMSNorm, sandwich norms around
    attention and MLP, GELU-tanh gate, query_pre_attn_scalar, attention and final soft-caps,
    sliding window on even layers."""
    geo = _Geometry(cfg, ids.shape[1])
    # Gemma2Config's defaults: query_pre_attn_scalar 256, soft-caps 50 / 30, sliding_window 4096.
    scale = cfg.get("query_pre_attn_scalar", 256) ** -0.5
    cap, final_cap = cfg.get("attn_logit_softcapping", 50.0), cfg.get("final_logit_softcapping", 30.0)

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        return _rms_norm(x, 1.0 + _w(weights, name), geo.eps)

    pos = np.arange(ids.shape[1], dtype=np.float64)
    x = _w(weights, "model.embed_tokens.weight")[ids] * math.sqrt(geo.hidden)
    caches = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        window = cfg.get("sliding_window", 4096) if i % 2 == 0 else None
        h = norm(x, f"{p}.input_layernorm.weight")
        a, k, v = _self_attention(weights, h, p, geo, pos, scale=scale, window=window, softcap=cap)
        caches += [k, v]
        x = x + norm(a, f"{p}.post_attention_layernorm.weight")
        h = norm(x, f"{p}.pre_feedforward_layernorm.weight")
        gated = _gelu_tanh(_linear(weights, h, f"{p}.mlp.gate_proj")) * _linear(weights, h, f"{p}.mlp.up_proj")
        x = x + norm(_linear(weights, gated, f"{p}.mlp.down_proj"), f"{p}.post_feedforward_layernorm.weight")
    logits = _logits(weights, {**cfg, "tie_word_embeddings": cfg.get("tie_word_embeddings", True)},
                     norm(x, "model.norm.weight"))
    if final_cap is not None:
        logits = np.tanh(logits / final_cap) * final_cap
    return logits, caches


def phi3_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Phi3ForCausalLM: fused qkv_proj (q, k, v rows in that order) and gate_up_proj (gate
    rows first), sliding window."""
    geo = _Geometry(cfg, ids.shape[1])
    window = cfg.get("sliding_window")
    inter = cfg["intermediate_size"]
    pos = np.arange(ids.shape[1], dtype=np.float64)
    x = _w(weights, "model.embed_tokens.weight")[ids]
    caches = []
    q_width, kv_width = geo.heads * geo.head_dim, geo.kv_heads * geo.head_dim
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        h = _rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), geo.eps)
        qkv = _linear(weights, h, f"{p}.self_attn.qkv_proj")
        q = _rotate(_split(qkv[..., :q_width], geo.heads, geo.head_dim), pos, geo.inv, geo.rope_scale)
        k = _rotate(_split(qkv[..., q_width:q_width + kv_width], geo.kv_heads, geo.head_dim), pos, geo.inv,
                    geo.rope_scale)
        v = _split(qkv[..., q_width + kv_width:], geo.kv_heads, geo.head_dim)
        caches += [k, v]
        x = x + _linear(weights, _merge(_attend(q, k, v, geo.head_dim**-0.5, window)), f"{p}.self_attn.o_proj")
        h = _rms_norm(x, _w(weights, f"{p}.post_attention_layernorm.weight"), geo.eps)
        up_states = _linear(weights, h, f"{p}.mlp.gate_up_proj")
        gate, up = up_states[..., :inter], up_states[..., inter:]
        x = x + _linear(weights, up * _silu(gate), f"{p}.mlp.down_proj")
    x = _rms_norm(x, _w(weights, "model.norm.weight"), geo.eps)
    return _logits(weights, cfg, x), caches


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def bert_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray, attention_mask: np.ndarray,
                 token_type_ids: np.ndarray | None = None, prefix: str = "") -> np.ndarray:
    """BertModel's last_hidden_state: word + position + token-type embeddings, LayerNorm,
    post-LN layers with GELU, key-padding mask from attention_mask."""
    eps = cfg.get("layer_norm_eps", 1e-12)
    heads = cfg["num_attention_heads"]
    head_dim = cfg["hidden_size"] // heads
    act = _gelu if cfg.get("hidden_act", "gelu") == "gelu" else _gelu_tanh

    def ln(x: np.ndarray, module: str) -> np.ndarray:
        return _layer_norm(x, _w(weights, f"{prefix}{module}.weight"), _w(weights, f"{prefix}{module}.bias"), eps)

    def lin(x: np.ndarray, module: str) -> np.ndarray:
        return _linear(weights, x, prefix + module, True)

    types = np.zeros_like(ids) if token_type_ids is None else token_type_ids
    e = prefix + "embeddings."
    x = (_w(weights, e + "word_embeddings.weight")[ids] + _w(weights, e + "position_embeddings.weight")[np.arange(ids.shape[1])]
         + _w(weights, e + "token_type_embeddings.weight")[types])
    x = ln(x, "embeddings.LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q = _split(lin(x, f"{p}.attention.self.query"), heads, head_dim)
        k = _split(lin(x, f"{p}.attention.self.key"), heads, head_dim)
        v = _split(lin(x, f"{p}.attention.self.value"), heads, head_dim)
        a = _merge(_attend(q, k, v, head_dim**-0.5, causal=False, key_mask=attention_mask))
        x = ln(x + lin(a, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
        x = ln(x + lin(act(lin(x, f"{p}.intermediate.dense")), f"{p}.output.dense"), f"{p}.output.LayerNorm")
    return x


def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray, normalize: bool) -> np.ndarray:
    """sentence-transformers Pooling(mean) and optionally Normalize()."""
    m = attention_mask[..., None].astype(np.float64)
    pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    if normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled


FORWARDS = {
    "llama": llama_forward, "qwen2": qwen2_forward, "qwen3": qwen3_forward, "mistral": mistral_forward,
    "gemma2": gemma2_forward, "phi3": phi3_forward,
}


def _more() -> None:
    from models.hf_numpy_more import MORE_FORWARDS

    FORWARDS.update(MORE_FORWARDS)


_more()
