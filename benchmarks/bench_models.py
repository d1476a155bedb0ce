"""The architectures `convert_bench.py` converts, as rlx_mil graphs and as PyTorch modules.

The PyTorch modules compute what the rlx_mil graphs compute (same weights, same formulas);
they are only used by the benchmark, never by rlx_mil.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.models.transformer import DecoderConfig

#: The 16-layer hidden-1024 decoder (`rlx_mil.models.transformer.llama_decoder`).
DECODER16 = DecoderConfig(hidden=1024, heads=16, kv_heads=4, intermediate=2816, layers=16, seq=128)

_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "max_position_embeddings": 8192, "rope_theta": 500000.0,
}
#: Llama-3.2-1B's shape (without its rope_scaling, which does not change conversion work).
LLAMA_1B_CONFIG: dict[str, Any] = {
    **_LLAMA, "vocab_size": 128256, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 8192, "tie_word_embeddings": True,
}
#: Llama-3.1-8B's shape.
BIG_CONFIG: dict[str, Any] = {
    **_LLAMA, "vocab_size": 128256, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "tie_word_embeddings": False,
}

ATTENTION_VARIANTS = ("none", "causal", "gqa", "scale", "window")
ATTENTION_LENGTHS = (128, 1024, 4096)
ATTN_HEADS, ATTN_HEAD_DIM, ATTN_WINDOW, ATTN_SCALE = 8, 64, 256, 0.1


def _attention_case(case: str) -> tuple[str, int]:
    variant, seq = case[len("attn_"):].rsplit("_s", 1)
    return variant, int(seq)


def attention_graph(case: str) -> Graph:
    """One Attention node on q/k/v inputs `[1, S, H*D]` (`attn_<variant>_s<S>`)."""
    variant, seq = _attention_case(case)
    kv_heads = 2 if variant == "gqa" else ATTN_HEADS
    g = Graph(case)
    q = g.input("q", [1, seq, ATTN_HEADS * ATTN_HEAD_DIM])
    k = g.input("k", [1, seq, kv_heads * ATTN_HEAD_DIM])
    v = g.input("v", [1, seq, kv_heads * ATTN_HEAD_DIM])
    kind = {"none": "none", "window": f"sliding:{ATTN_WINDOW}"}.get(variant, "causal")
    scale = ATTN_SCALE if variant == "scale" else None
    y = g.attention_kind(q, k, v, ATTN_HEADS, ATTN_HEAD_DIM, kind, score_scale=scale, name="y")
    g.set_outputs([y])
    return g


def torch_attention(case: str) -> tuple[Any, tuple[Any, ...]]:
    """The same attention in PyTorch: (module, example inputs)."""
    import torch
    import torch.nn.functional as F

    variant, seq = _attention_case(case)
    kv_heads = 2 if variant == "gqa" else ATTN_HEADS
    d = ATTN_HEAD_DIM

    class Attention(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            q = q.view(1, seq, ATTN_HEADS, d).transpose(1, 2)
            k = k.view(1, seq, kv_heads, d).transpose(1, 2)
            v = v.view(1, seq, kv_heads, d).transpose(1, 2)
            if kv_heads != ATTN_HEADS:
                k = k.repeat_interleave(ATTN_HEADS // kv_heads, dim=1)
                v = v.repeat_interleave(ATTN_HEADS // kv_heads, dim=1)
            if variant == "none":
                y = F.scaled_dot_product_attention(q, k, v)
            elif variant == "window":
                i = torch.arange(seq)[:, None]
                j = torch.arange(seq)[None, :]
                mask = (j <= i) & (j >= i - ATTN_WINDOW)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=ATTN_SCALE if variant == "scale" else None)
            return y.transpose(1, 2).reshape(1, seq, ATTN_HEADS * d)

    example = (
        torch.zeros(1, seq, ATTN_HEADS * d), torch.zeros(1, seq, kv_heads * d), torch.zeros(1, seq, kv_heads * d),
    )
    return Attention().eval(), example


def _rms(x: Any, w: Any, eps: float, b: Any = None) -> Any:
    import torch

    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    return y if b is None else y + b


def _rotate(x: Any, cos: Any, sin: Any, half: int) -> Any:
    """Rotate-half RoPE; `half` is a Python int so tracing records no shape arithmetic."""
    import torch

    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _rope_tables(seq: int, head_dim: int, base: float) -> tuple[Any, Any]:
    import torch

    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    return torch.from_numpy(np.cos(angles).astype(np.float32)), torch.from_numpy(np.sin(angles).astype(np.float32))


def torch_decoder(c: DecoderConfig, w: dict[str, Any]) -> Any:
    """`llama_decoder(c)` in PyTorch, on the same (name -> [K, N] tensor) weights."""
    import torch
    import torch.nn.functional as F

    d = c.head_dim
    cos, sin = w["rope.cos"][:, None, :], w["rope.sin"][:, None, :]

    class Decoder(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            for i in range(c.layers):
                p = f"layers.{i}."
                h = _rms(x, w[p + "input_layernorm.weight"], c.eps, w[p + "input_layernorm.bias"])
                q = _rotate((h @ w[p + "self_attn.q_proj.weight"]).view(c.batch, c.seq, c.heads, d), cos, sin, d // 2).transpose(1, 2)
                k = _rotate((h @ w[p + "self_attn.k_proj.weight"]).view(c.batch, c.seq, c.kv_heads, d), cos, sin, d // 2).transpose(1, 2)
                v = (h @ w[p + "self_attn.v_proj.weight"]).view(c.batch, c.seq, c.kv_heads, d).transpose(1, 2)
                k = k.repeat_interleave(c.heads // c.kv_heads, dim=1)
                v = v.repeat_interleave(c.heads // c.kv_heads, dim=1)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + a.transpose(1, 2).reshape(c.batch, c.seq, c.heads * d) @ w[p + "self_attn.o_proj.weight"]
                h = _rms(x, w[p + "post_attention_layernorm.weight"], c.eps, w[p + "post_attention_layernorm.bias"])
                x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"]) * (h @ w[p + "mlp.up_proj.weight"])) @ w[p + "mlp.down_proj.weight"]
            return x

    return Decoder().eval()


def torch_llama(config: dict[str, Any], w: dict[str, Any], seq: int) -> Any:
    """A Llama causal LM in PyTorch on Hugging Face-named weights ([out, in] Linear layout,
    tied head when the checkpoint has no lm_head): token ids -> logits `[1, S, vocab]`."""
    import torch
    import torch.nn.functional as F

    e, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    d, eps = e // heads, config["rms_norm_eps"]
    cos, sin = _rope_tables(seq, d, config["rope_theta"])
    cos, sin = cos[:, None, :], sin[:, None, :]
    embed = w["model.embed_tokens.weight"]
    head = w.get("lm_head.weight", embed)

    class Llama(torch.nn.Module):
        def forward(self, ids: Any) -> Any:
            x = F.embedding(ids.long(), embed)
            for i in range(config["num_hidden_layers"]):
                p = f"model.layers.{i}."
                h = _rms(x, w[p + "input_layernorm.weight"], eps)
                q = _rotate(F.linear(h, w[p + "self_attn.q_proj.weight"]).view(1, seq, heads, d), cos, sin, d // 2).transpose(1, 2)
                k = _rotate(F.linear(h, w[p + "self_attn.k_proj.weight"]).view(1, seq, kv, d), cos, sin, d // 2).transpose(1, 2)
                v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(1, seq, kv, d).transpose(1, 2)
                k = k.repeat_interleave(heads // kv, dim=1)
                v = v.repeat_interleave(heads // kv, dim=1)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(1, seq, e)
                x = x + F.linear(a, w[p + "self_attn.o_proj.weight"])
                h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
                gate = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"]))
                x = x + F.linear(gate * F.linear(h, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"])
            return F.linear(_rms(x, w["model.norm.weight"], eps), head)

    return Llama().eval()
