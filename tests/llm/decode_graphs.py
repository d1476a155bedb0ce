"""Tiny decoders written by hand in upstream RLX's decode form, for the stateful tests.

`decode_graph(config, new, past)`: inputs `input_ids`/`position_ids` `[1, new]` (and, for the
Custom mask, `attention_mask [1, past+new]`), per layer `past_k_{i}`/`past_v_{i}`
`[1, H_kv, past, D]` joined with the new rows by a `Concat` on axis 2 that feeds the Attention
and is output as `new_k_{i}`/`new_v_{i}`; output `logits [1, 1, vocab]` (last position).
`past=None` gives the plain graph over the whole sequence (no cache inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Param
from rlx_mil.models.transformer import rope_tables


@dataclass(frozen=True)
class TinyLM:
    vocab: int = 48
    hidden: int = 32
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    layers: int = 2
    intermediate: int = 48
    max_positions: int = 64
    mask: str = "causal"  # "causal", "sliding:<w>", "custom"
    layout: str = "bhsd"  # attention operands [B, H, S, D] (upstream's decode form) or "bshd"


def decode_graph(
    c: TinyLM, new: int, past: int | None, name: str = "tiny_decoder", cache_outputs: bool = False
) -> Graph:
    """`cache_outputs` (with `past=None`): also output each layer's K/V rows as `new_k_{i}` /
    `new_v_{i}` (the prefill form)."""
    g = Graph(name)
    d, h, hkv = c.head_dim, c.heads, c.kv_heads
    ids = g.input("input_ids", [1, new], "i32")
    positions = g.input("position_ids", [1, new], "i32")
    keys = new + (past or 0)
    mask = g.input("attention_mask", [1, keys]) if c.mask == "custom" else None
    x = g.gather(g.param("embed_tokens.weight", [c.vocab, c.hidden]), ids, 0, name="embed")
    flat_positions = g.reshape(positions, [new], name="positions_flat")
    cos = g.gather(g.param("rope.cos", [c.max_positions, d // 2]), flat_positions, 0, name="rope_cos_rows")
    sin = g.gather(g.param("rope.sin", [c.max_positions, d // 2]), flat_positions, 0, name="rope_sin_rows")
    caches: list[int] = []
    for i in range(c.layers):
        p = f"layers.{i}."

        def w(n: str, shape: list[int], p: str = p) -> int:
            return g.param(p + n, shape)

        hn = g.rms_norm(x, w("in_norm.weight", [c.hidden]), w("in_norm.bias", [c.hidden]), name=p + "in_norm")
        q = g.rope(g.matmul(hn, w("q.weight", [c.hidden, h * d])), cos, sin, d, name=p + "q_rope")
        k = g.rope(g.matmul(hn, w("k.weight", [c.hidden, hkv * d])), cos, sin, d, name=p + "k_rope")
        v = g.matmul(hn, w("v.weight", [c.hidden, hkv * d]), name=p + "v")
        qh = g.transpose(g.reshape(q, [1, new, h, d]), [0, 2, 1, 3], name=p + "q_heads")
        rows_named = past is None and cache_outputs
        bshd = c.layout == "bshd"
        perm = [0, 1, 2, 3] if bshd else [0, 2, 1, 3]
        seq_axis = 1 if bshd else 2
        kh = g.transpose(g.reshape(k, [1, new, hkv, d]), perm, name=f"new_k_{i}" if rows_named else p + "k_heads")
        vh = g.transpose(g.reshape(v, [1, new, hkv, d]), perm, name=f"new_v_{i}" if rows_named else p + "v_heads")
        if bshd:
            qh = g.reshape(q, [1, new, h, d], name=p + "q_heads")
        if rows_named:
            caches += [kh, vh]
        if past is not None:
            past_shape = [1, past, hkv, d] if bshd else [1, hkv, past, d]
            kh = g.concat([g.input(f"past_k_{i}", past_shape), kh], seq_axis, name=f"new_k_{i}")
            vh = g.concat([g.input(f"past_v_{i}", past_shape), vh], seq_axis, name=f"new_v_{i}")
            caches += [kh, vh]
        if mask is not None:
            att = g.attention(qh, kh, vh, mask, h, d, name=p + "attn")
        else:
            att = g.attention_kind(qh, kh, vh, h, d, c.mask, name=p + "attn")
        merged = g.reshape(g.transpose(att, perm), [1, new, h * d], name=p + "attn_merged")
        x = g.add(x, g.matmul(merged, w("o.weight", [h * d, c.hidden])), name=p + "attn_residual")
        hn = g.rms_norm(x, w("post_norm.weight", [c.hidden]), w("post_norm.bias", [c.hidden]), name=p + "post_norm")
        gate = g.silu(g.matmul(hn, w("gate.weight", [c.hidden, c.intermediate])))
        up = g.matmul(hn, w("up.weight", [c.hidden, c.intermediate]))
        x = g.add(x, g.matmul(g.mul(gate, up), w("down.weight", [c.intermediate, c.hidden])), name=p + "mlp_residual")
    x = g.rms_norm(x, g.param("norm.weight", [c.hidden]), g.param("norm.bias", [c.hidden]), name="final_norm")
    last = g.narrow(x, 1, new - 1, 1, name="last_position")
    logits = g.matmul(last, g.param("lm_head.weight", [c.hidden, c.vocab]), name="logits")
    g.set_outputs([logits, *caches])
    return g


def tiny_params(c: TinyLM, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    graph = decode_graph(c, 1, None)
    params: dict[str, np.ndarray] = {}
    for node in graph:
        if not isinstance(node.op, Param):
            continue
        shape = node.shape.sizes()
        name = node.op.name
        if name.endswith("norm.weight"):
            params[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("norm.bias"):
            params[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
        elif not name.startswith("rope."):
            params[name] = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    cos, sin = rope_tables(c.max_positions, c.head_dim)
    params["rope.cos"], params["rope.sin"] = cos, sin
    params["embed_tokens.weight"] *= np.float32(np.sqrt(c.vocab))
    return params
