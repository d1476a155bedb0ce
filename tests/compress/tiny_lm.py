"""A tiny Llama-style language model (embedding, decoder layers, LM head) for compression tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Param
from rlx_mil.models.transformer import rope_tables


@dataclass(frozen=True)
class TinyLM:
    vocab: int = 256
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    layers: int = 2
    seq: int = 8
    #: The LM head is the embedding's transpose (Gemma's, SmolLM2's), not a `head.weight` of its own.
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def tiny_lm(c: TinyLM = TinyLM()) -> Graph:
    d = c.head_dim
    g = Graph("tiny_lm")
    ids = g.input("input_ids", [1, c.seq], "i32")
    embed = g.param("embed_tokens.weight", [c.vocab, c.hidden])
    x = g.gather(embed, ids, name="embed")
    cos = g.param("rope.cos", [c.seq, d // 2])
    sin = g.param("rope.sin", [c.seq, d // 2])
    for i in range(c.layers):
        p = f"layers.{i}."
        h = g.rms_norm(x, g.param(p + "input_layernorm.weight", [c.hidden]), g.param(p + "input_layernorm.bias", [c.hidden]),
                       eps=1e-5, name=p + "input_norm")
        q = g.rope(g.matmul(h, g.param(p + "self_attn.q_proj.weight", [c.hidden, c.heads * d]), name=p + "q_proj"),
                   cos, sin, d, name=p + "q_rope")
        k = g.rope(g.matmul(h, g.param(p + "self_attn.k_proj.weight", [c.hidden, c.kv_heads * d]), name=p + "k_proj"),
                   cos, sin, d, name=p + "k_rope")
        v = g.matmul(h, g.param(p + "self_attn.v_proj.weight", [c.hidden, c.kv_heads * d]), name=p + "v_proj")
        a = g.attention_kind(q, k, v, c.heads, d, "causal", name=p + "attn")
        x = g.add(x, g.matmul(a, g.param(p + "self_attn.o_proj.weight", [c.heads * d, c.hidden]), name=p + "o_proj"),
                  name=p + "attn_residual")
        h = g.rms_norm(x, g.param(p + "post_attention_layernorm.weight", [c.hidden]),
                       g.param(p + "post_attention_layernorm.bias", [c.hidden]), eps=1e-5, name=p + "post_norm")
        gate = g.matmul(h, g.param(p + "mlp.gate_proj.weight", [c.hidden, c.intermediate]), name=p + "gate_proj")
        up = g.matmul(h, g.param(p + "mlp.up_proj.weight", [c.hidden, c.intermediate]), name=p + "up_proj")
        act = g.mul(g.silu(gate, name=p + "gate_act"), up, name=p + "swiglu")
        x = g.add(x, g.matmul(act, g.param(p + "mlp.down_proj.weight", [c.intermediate, c.hidden]), name=p + "down_proj"),
                  name=p + "mlp_residual")
    h = g.rms_norm(x, g.param("norm.weight", [c.hidden]), g.param("norm.bias", [c.hidden]), eps=1e-5, name="final_norm")
    head = g.transpose(embed, [1, 0], name="head_t") if c.tied else g.param("head.weight", [c.hidden, c.vocab])
    logits = g.matmul(h, head, name="head")
    g.set_name(logits, "logits")
    g.set_outputs([logits])
    return g


def tiny_lm_params(graph: Graph, c: TinyLM = TinyLM(), seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    cos, sin = rope_tables(c.seq, c.head_dim)
    params: dict[str, np.ndarray] = {}
    for node in graph:
        if not isinstance(node.op, Param):
            continue
        name, shape = node.op.name, node.shape.sizes()
        if name == "rope.cos":
            params[name] = cos
        elif name == "rope.sin":
            params[name] = sin
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            params[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith(".bias"):
            params[name] = np.zeros(shape, np.float32)
        elif name == "embed_tokens.weight":
            params[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            params[name] = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    return params


def tiny_lm_inputs(c: TinyLM = TinyLM(), seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, c.vocab, size=(1, c.seq)).astype(np.int32)}
