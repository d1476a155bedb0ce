"""Independent NumPy forwards (float64) of the mixture-of-experts and hybrid families, written
from transformers' modeling_qwen3_moe / modeling_qwen2_moe / modeling_olmoe / modeling_lfm2 /
modeling_qwen3_5 (eager paths, the gated delta rule in its token-by-token form).

They read the checkpoint by its literal tensor names (per-expert `mlp.experts.{e}.*` weights,
Qwen3.5's `model.language_model.` prefix) and share nothing with rlx_mil's builders. Each
returns the logits of the whole sequence and the state after it: per attention layer the rotated
keys and values `[B, H_kv, T, D]`, per conv layer the last `kernel - 1` conv inputs
`[B, kernel - 1, C]`, per gated delta-net layer the final state `[B, H_v, d, d]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from models.hf_numpy import Weights, _attend, _linear, _merge, _rms_norm, _rotate, _silu, _split, _w


def _inv_freq(rope: Mapping[str, Any], head_dim: int) -> np.ndarray:
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    return 1.0 / rope["rope_theta"] ** (np.arange(0, dim, 2) / dim)


def _tokens(weights: Weights, name: str, ids: np.ndarray) -> np.ndarray:
    return _w(weights, name)[ids]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _expert(weights: Weights, x: np.ndarray, p: str) -> np.ndarray:
    return _linear(weights, _silu(_linear(weights, x, f"{p}.gate_proj")) * _linear(weights, x, f"{p}.up_proj"), f"{p}.down_proj")


def sparse_moe(weights: Weights, cfg: Mapping[str, Any], x: np.ndarray, p: str) -> np.ndarray:
    """`*SparseMoeBlock.forward`: softmax router, top-k (ties: lower index), optional
    renormalisation, weighted sum of the picked experts; Qwen2-MoE's gated shared expert."""
    b, t, e = x.shape
    rows = x.reshape(b * t, e)
    probs = _softmax(_linear(weights, rows, f"{p}.gate"))
    k = cfg["num_experts_per_tok"]
    out = np.zeros_like(rows)
    for r in range(rows.shape[0]):
        picked = np.argsort(-probs[r], kind="stable")[:k]
        w = probs[r, picked]
        if cfg.get("norm_topk_prob", False):
            w = w / w.sum()
        for weight, expert in zip(w, picked, strict=True):
            out[r] += weight * _expert(weights, rows[r:r + 1], f"{p}.experts.{expert}")[0]
    if cfg.get("shared_expert_intermediate_size"):
        shared = _expert(weights, rows, f"{p}.shared_expert")
        gate = 1.0 / (1.0 + np.exp(-_linear(weights, rows, f"{p}.shared_expert_gate")))
        out = out + gate * shared
    return out.reshape(b, t, e)


def moe_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Qwen3MoeForCausalLM / Qwen2MoeForCausalLM / OlmoeForCausalLM."""
    kind = cfg["model_type"]
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    eps = cfg.get("rms_norm_eps", 1e-5 if kind == "olmoe" else 1e-6)
    inv = _inv_freq(cfg["rope_parameters"], head_dim)
    pos = np.arange(ids.shape[1], dtype=np.float64)
    layers = cfg["num_hidden_layers"]
    step, only = cfg.get("decoder_sparse_step", 1), cfg.get("mlp_only_layers") or []
    bias = cfg.get("attention_bias", False) if kind != "qwen2_moe" else cfg.get("qkv_bias", True)
    clip = cfg.get("clip_qkv")
    x = _tokens(weights, "model.embed_tokens.weight", ids)
    caches = []
    for i in range(layers):
        p = f"model.layers.{i}"
        h = _rms_norm(x, _w(weights, f"{p}.input_layernorm.weight"), eps)
        q = _linear(weights, h, f"{p}.self_attn.q_proj", bias)
        k = _linear(weights, h, f"{p}.self_attn.k_proj", bias)
        v = _linear(weights, h, f"{p}.self_attn.v_proj", bias)
        if kind == "olmoe":  # OlmoeAttention: norms over the whole projection, then clip
            q = _rms_norm(q, _w(weights, f"{p}.self_attn.q_norm.weight"), eps)
            k = _rms_norm(k, _w(weights, f"{p}.self_attn.k_norm.weight"), eps)
            if clip is not None:
                q, k, v = (np.clip(t, -clip, clip) for t in (q, k, v))
        q, k, v = _split(q, heads, head_dim), _split(k, kv_heads, head_dim), _split(v, kv_heads, head_dim)
        if kind == "qwen3_moe":  # Qwen3Attention: per-head norms
            q = _rms_norm(q, _w(weights, f"{p}.self_attn.q_norm.weight"), eps)
            k = _rms_norm(k, _w(weights, f"{p}.self_attn.k_norm.weight"), eps)
        q, k = _rotate(q, pos, inv), _rotate(k, pos, inv)
        caches += [k, v]
        x = x + _linear(weights, _merge(_attend(q, k, v, head_dim**-0.5)), f"{p}.self_attn.o_proj")
        h = _rms_norm(x, _w(weights, f"{p}.post_attention_layernorm.weight"), eps)
        sparse = kind == "olmoe" or (i not in only and (i + 1) % step == 0)
        x = x + (sparse_moe(weights, cfg, h, f"{p}.mlp") if sparse else _expert(weights, h, f"{p}.mlp"))
    x = _rms_norm(x, _w(weights, "model.norm.weight"), eps)
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", False) else "lm_head.weight"
    return x @ _w(weights, head).T, caches


def _causal_conv(x: np.ndarray, w: np.ndarray, kernel: int) -> tuple[np.ndarray, np.ndarray]:
    """nn.Conv1d(groups=C, padding=K-1)[..., :T] on `[B, T, C]` with weight `[C, 1, K]`; also
    the last K-1 inputs (zeros before the first)."""
    b, t, c = x.shape
    padded = np.concatenate([np.zeros((b, kernel - 1, c)), x], axis=1)
    out = np.zeros((b, t, c))
    for j in range(kernel):
        out += padded[:, j:j + t] * w[:, 0, j]
    return out, padded[:, t:]


def lfm2_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Lfm2ForCausalLM (slow_forward path)."""
    e, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv_heads, head_dim = cfg["num_key_value_heads"], e // heads
    eps, kernel = cfg.get("norm_eps", 1e-5), cfg.get("conv_L_cache", 3)
    inv = _inv_freq(cfg["rope_parameters"], head_dim)
    pos = np.arange(ids.shape[1], dtype=np.float64)
    x = _tokens(weights, "model.embed_tokens.weight", ids)
    states: list[np.ndarray] = []
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}"
        h = _rms_norm(x, _w(weights, f"{p}.operator_norm.weight"), eps)
        if kind == "full_attention":
            q = _rms_norm(_split(_linear(weights, h, f"{p}.self_attn.q_proj"), heads, head_dim),
                          _w(weights, f"{p}.self_attn.q_layernorm.weight"), eps)
            k = _rms_norm(_split(_linear(weights, h, f"{p}.self_attn.k_proj"), kv_heads, head_dim),
                          _w(weights, f"{p}.self_attn.k_layernorm.weight"), eps)
            v = _split(_linear(weights, h, f"{p}.self_attn.v_proj"), kv_heads, head_dim)
            q, k = _rotate(q, pos, inv), _rotate(k, pos, inv)
            states += [k, v]
            out = _linear(weights, _merge(_attend(q, k, v, head_dim**-0.5)), f"{p}.self_attn.out_proj")
        else:
            bias = cfg.get("conv_bias", False)
            bcx = _linear(weights, h, f"{p}.conv.in_proj", bias)
            bg, cg, xs = bcx[..., :e], bcx[..., e:2 * e], bcx[..., 2 * e:]
            conv, state = _causal_conv(bg * xs, _w(weights, f"{p}.conv.conv.weight"), kernel)
            if bias:
                conv = conv + _w(weights, f"{p}.conv.conv.bias")
            states.append(state)
            out = _linear(weights, cg * conv, f"{p}.conv.out_proj", bias)
        x = x + out
        h = _rms_norm(x, _w(weights, f"{p}.ffn_norm.weight"), eps)
        f = f"{p}.feed_forward"
        x = x + _linear(weights, _silu(_linear(weights, h, f"{f}.w1")) * _linear(weights, h, f"{f}.w3"), f"{f}.w2")
    x = _rms_norm(x, _w(weights, "model.embedding_norm.weight"), eps)
    head = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings", True) else "lm_head.weight"
    return x @ _w(weights, head).T, states


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def gated_delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torch_recurrent_gated_delta_rule on `[B, T, H, d]` (q, k already normalised and
    repeated): state decays by exp(g), delta-rule update, read with q / sqrt(d)."""
    b, t, h, d = q.shape
    state = np.zeros((b, h, d, v.shape[-1]))
    out = np.zeros_like(v)
    q = q / np.sqrt(d)
    for i in range(t):
        state = state * np.exp(g[:, i])[..., None, None]
        kv_mem = (state * k[:, i][..., None]).sum(-2)
        delta = (v[:, i] - kv_mem) * beta[:, i][..., None]
        state = state + k[:, i][..., None] * delta[..., None, :]
        out[:, i] = (state * q[:, i][..., None]).sum(-2)
    return out, state


def qwen3_5_forward(weights: Weights, cfg: Mapping[str, Any], ids: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Qwen3_5ForConditionalGeneration (text only) / Qwen3_5ForCausalLM."""
    text = cfg["text_config"] if cfg["model_type"] == "qwen3_5" else cfg
    root = "model.language_model" if cfg["model_type"] == "qwen3_5" else "model"
    heads, kv_heads = text["num_attention_heads"], text["num_key_value_heads"]
    head_dim, eps = text["head_dim"], text["rms_norm_eps"]
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    dk, dv, kernel = text["linear_key_head_dim"], text["linear_value_head_dim"], text["linear_conv_kernel_dim"]
    inv = _inv_freq(text["rope_parameters"], head_dim)
    pos = np.arange(ids.shape[1], dtype=np.float64)
    b, t = ids.shape

    def norm(x: np.ndarray, name: str) -> np.ndarray:  # Qwen3_5RMSNorm: (1 + w)
        return _rms_norm(x, 1.0 + _w(weights, name), eps)

    x = _tokens(weights, f"{root}.embed_tokens.weight", ids)
    states: list[np.ndarray] = []
    for i, kind in enumerate(text["layer_types"]):
        p = f"{root}.layers.{i}"
        h = norm(x, f"{p}.input_layernorm.weight")
        if kind == "full_attention":
            a = f"{p}.self_attn"
            qg = _linear(weights, h, f"{a}.q_proj").reshape(b, t, heads, 2 * head_dim)
            q, gate = qg[..., :head_dim], qg[..., head_dim:].reshape(b, t, heads * head_dim)
            q = norm(q, f"{a}.q_norm.weight").transpose(0, 2, 1, 3)
            k = norm(_linear(weights, h, f"{a}.k_proj").reshape(b, t, kv_heads, head_dim), f"{a}.k_norm.weight").transpose(0, 2, 1, 3)
            v = _split(_linear(weights, h, f"{a}.v_proj"), kv_heads, head_dim)
            q, k = _rotate(q, pos, inv), _rotate(k, pos, inv)
            states += [k, v]
            attn = _merge(_attend(q, k, v, head_dim**-0.5)) * (1.0 / (1.0 + np.exp(-gate)))
            out = _linear(weights, attn, f"{a}.o_proj")
        else:
            la = f"{p}.linear_attn"
            mixed, conv_state = _causal_conv(_linear(weights, h, f"{la}.in_proj_qkv"), _w(weights, f"{la}.conv1d.weight"), kernel)
            mixed = _silu(mixed)
            kd = hk * dk
            q = mixed[..., :kd].reshape(b, t, hk, dk)
            k = mixed[..., kd:2 * kd].reshape(b, t, hk, dk)
            v = mixed[..., 2 * kd:].reshape(b, t, hv, dv)
            q, k = (np.repeat(_l2norm(y), hv // hk, axis=2) for y in (q, k))  # repeat_interleave
            beta = 1.0 / (1.0 + np.exp(-_linear(weights, h, f"{la}.in_proj_b")))
            shifted = _linear(weights, h, f"{la}.in_proj_a") + _w(weights, f"{la}.dt_bias")
            g = -np.exp(_w(weights, f"{la}.A_log")) * np.log1p(np.exp(shifted))
            core, final = gated_delta_rule(q, k, v, g, beta)
            z = _linear(weights, h, f"{la}.in_proj_z").reshape(b, t, hv, dv)
            core = _rms_norm(core, _w(weights, f"{la}.norm.weight"), eps) * _silu(z)
            states += [conv_state, final]
            out = _linear(weights, core.reshape(b, t, hv * dv), f"{la}.out_proj")
        x = x + out
        h = norm(x, f"{p}.post_attention_layernorm.weight")
        m = f"{p}.mlp"
        x = x + _linear(weights, _silu(_linear(weights, h, f"{m}.gate_proj")) * _linear(weights, h, f"{m}.up_proj"), f"{m}.down_proj")
    x = norm(x, f"{root}.norm.weight")
    head = f"{root}.embed_tokens.weight" if text.get("tie_word_embeddings", False) else "lm_head.weight"
    return x @ _w(weights, head).T, states


FORWARDS = {"qwen3_moe": moe_forward, "qwen2_moe": moe_forward, "olmoe": moe_forward, "lfm2": lfm2_forward,
            "qwen3_5": qwen3_5_forward, "qwen3_5_text": qwen3_5_forward}
