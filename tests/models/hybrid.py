"""A Qwen3.5-style hybrid decoder built with the graph builder, following upstream's Qwen3.5
builder conventions (rlx-models `rlx-qwen35` builder): Gated DeltaNet "linear attention" layers
with a full-attention layer every `full_attention_interval`, and a mixture-of-experts MLP.

Linear-attention layer: RMSNorm -> in_proj_qkv / in_proj_z / in_proj_a / in_proj_b -> depthwise
causal conv (kernel 4, unrolled) -> SiLU -> q/k/v split -> L2 norm of q and k -> GQA repeat by
concat -> log-gate g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) -> GatedDeltaNet
-> RMSNorm(o) * SiLU(z) -> out_proj -> residual. Full-attention layer: joint q + gate projection
-> per-head q/k RMSNorm -> partial RoPE -> causal attention -> * sigmoid(gate) -> o_proj ->
residual. MLP: softmax router, top-k experts (GroupedMatMul SwiGLU, renormalised weights) plus a
sigmoid-gated shared expert. Norm weights are stored as offsets from 1 (Qwen3.5's RMSNorm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.models.graph_builder import WeightGraph
from rlx_mil.models.transformer import rope_tables


@dataclass(frozen=True)
class HybridConfig:
    vocab: int = 32
    hidden: int = 16
    batch: int = 1
    seq: int = 5
    layers: int = 4
    full_attention_interval: int = 4
    # full attention
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 8
    rotary_dim: int = 4
    # linear attention (Gated DeltaNet): key and value heads share the width `state`
    k_heads: int = 1
    v_heads: int = 2
    state: int = 4
    conv_kernel: int = 4
    # mixture of experts
    experts: int = 4
    top_k: int = 2
    expert_width: int = 8
    shared_width: int = 8
    #: Softplus and GatherElements as the newest JSON has them; False spells them with ops
    #: 0.2.2 has (log(1 + exp(x)); a Gather of the flattened router probabilities).
    newest_ops: bool = True

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0


class HybridBuilder(WeightGraph):
    def __init__(self, config: HybridConfig, name: str = "qwen35_hybrid") -> None:
        super().__init__(name)
        self.c = config

    # ------------------------------------------------------------------ shared pieces
    def norm(self, x: int, module: str, width: int, offset: bool = True) -> int:
        gamma = self.weight(f"{module}.weight", (width,))
        if offset:
            gamma = self.g.add(gamma, self.scalar(1.0), name=f"{module}.scale")
        return self.g.rms_norm(x, gamma, self.zeros(width), eps=1e-6, name=module)

    def proj(self, x: int, module: str, out_features: int, in_features: int) -> int:
        return self.linear(x, module, out_features, in_features, False)

    # ------------------------------------------------------------------ layers
    def linear_attention(self, x: int, p: str) -> int:
        c, g = self.c, self.g
        b, s, d = c.batch, c.seq, c.hidden
        key_dim, value_dim = c.k_heads * c.state, c.v_heads * c.state
        channels = 2 * key_dim + value_dim
        h = self.norm(x, f"{p}.input_layernorm", d)
        qkv = self.proj(h, f"{p}.linear_attn.in_proj_qkv", channels, d)
        z = self.proj(h, f"{p}.linear_attn.in_proj_z", value_dim, d)
        a = self.proj(h, f"{p}.linear_attn.in_proj_a", c.v_heads, d)
        beta_logits = self.proj(h, f"{p}.linear_attn.in_proj_b", c.v_heads, d)
        # Depthwise causal conv over time, unrolled: zero history of kernel-1 steps, then one
        # shifted window per tap times that tap's per-channel weight.
        taps = self.weight(f"{p}.linear_attn.conv1d.weight", (channels, c.conv_kernel))
        history = g.constant(np.zeros((b, c.conv_kernel - 1, channels), np.float32))
        padded = g.concat([history, qkv], 1, name=f"{p}.linear_attn.conv_pad")
        conv = None
        for j in range(c.conv_kernel):
            tap = g.reshape(g.narrow(taps, 1, j, 1), [channels])
            term = g.mul(g.narrow(padded, 1, j, s), tap)
            conv = term if conv is None else g.add(conv, term)
        assert conv is not None
        conv = g.silu(conv, name=f"{p}.linear_attn.conv")
        q = g.reshape(g.narrow(conv, 2, 0, key_dim), [b, s, c.k_heads, c.state])
        k = g.reshape(g.narrow(conv, 2, key_dim, key_dim), [b, s, c.k_heads, c.state])
        v = g.reshape(g.narrow(conv, 2, 2 * key_dim, value_dim), [b, s, c.v_heads, c.state])
        q = self.repeat_heads(self.l2_norm(q, f"{p}.linear_attn.q_l2"), c.v_heads // c.k_heads, f"{p}.linear_attn.q_rep")
        k = self.repeat_heads(self.l2_norm(k, f"{p}.linear_attn.k_l2"), c.v_heads // c.k_heads, f"{p}.linear_attn.k_rep")
        a_log = self.weight(f"{p}.linear_attn.A_log", (c.v_heads,))
        dt_bias = self.weight(f"{p}.linear_attn.dt_bias", (c.v_heads,))
        decay = g.neg(g.exp(a_log))
        shifted = g.add(a, dt_bias)
        soft = g.softplus(shifted) if c.newest_ops else g.log(g.add(g.exp(shifted), self.scalar(1.0)))
        gate = g.mul(decay, soft, name=f"{p}.linear_attn.g")
        beta = g.sigmoid(beta_logits, name=f"{p}.linear_attn.beta")
        o = g.gated_delta_net(q, k, v, gate, beta, c.state, name=f"{p}.linear_attn.gdn")
        o = self.norm(o, f"{p}.linear_attn.norm", c.state, offset=False)
        o = g.mul(o, g.silu(g.reshape(z, [b, s, c.v_heads, c.state])), name=f"{p}.linear_attn.gated")
        out = self.proj(g.reshape(o, [b, s, value_dim]), f"{p}.linear_attn.out_proj", d, value_dim)
        return g.add(x, out, name=f"{p}.mixer_residual")

    def full_attention(self, x: int, p: str, cos: int, sin: int) -> int:
        c, g = self.c, self.g
        b, s, d, hd = c.batch, c.seq, c.hidden, c.head_dim
        h = self.norm(x, f"{p}.input_layernorm", d)
        q_gate = g.reshape(self.proj(h, f"{p}.self_attn.q_proj", 2 * c.heads * hd, d), [b, s, c.heads, 2 * hd])
        q = g.transpose(g.narrow(q_gate, 3, 0, hd), [0, 2, 1, 3])
        gate = g.reshape(g.narrow(q_gate, 3, hd, hd), [b, s, c.heads * hd])
        k = self.split_heads(self.proj(h, f"{p}.self_attn.k_proj", c.kv_heads * hd, d), b, s, c.kv_heads, hd, f"{p}.k")
        v = self.split_heads(self.proj(h, f"{p}.self_attn.v_proj", c.kv_heads * hd, d), b, s, c.kv_heads, hd, f"{p}.v")
        q = g.rope(self.norm(q, f"{p}.self_attn.q_norm", hd), cos, sin, hd, c.rotary_dim, name=f"{p}.q_rope")
        k = g.rope(self.norm(k, f"{p}.self_attn.k_norm", hd), cos, sin, hd, c.rotary_dim, name=f"{p}.k_rope")
        attn = g.attention_kind(q, k, v, c.heads, hd, "causal", name=f"{p}.self_attn.attention")
        attn = g.mul(self.merge_heads(attn, b, s, c.heads * hd, f"{p}.self_attn"), g.sigmoid(gate), name=f"{p}.gated")
        out = self.proj(attn, f"{p}.self_attn.o_proj", d, c.heads * hd)
        return g.add(x, out, name=f"{p}.mixer_residual")

    def moe(self, x: int, p: str) -> int:
        c, g = self.c, self.g
        rows, d = c.batch * c.seq, c.hidden
        h = g.reshape(self.norm(x, f"{p}.post_attention_layernorm", d), [rows, d])
        probs = g.softmax(self.proj(h, f"{p}.mlp.gate", c.experts, d), name=f"{p}.mlp.router")
        chosen = g.topk(probs, c.top_k, name=f"{p}.mlp.chosen")
        if c.newest_ops:
            weights = g.gather_elements(probs, chosen, 1)
        else:
            row_starts = g.constant((np.arange(rows, dtype=np.float32) * c.experts)[:, None])
            flat = g.reshape(probs, [rows * c.experts])
            weights = g.gather(flat, g.add(chosen, row_starts))
        weights = g.div(weights, g.sum(weights, [1], keep_dim=True), name=f"{p}.mlp.weights")
        w_gate = self.weight(f"{p}.mlp.experts.gate_proj", (c.experts, d, c.expert_width))
        w_up = self.weight(f"{p}.mlp.experts.up_proj", (c.experts, d, c.expert_width))
        w_down = self.weight(f"{p}.mlp.experts.down_proj", (c.experts, c.expert_width, d))
        total = None
        for j in range(c.top_k):
            ids = g.reshape(g.narrow(chosen, 1, j, 1), [rows], name=f"{p}.mlp.expert{j}")
            hidden = g.mul(g.silu(g.grouped_matmul(h, w_gate, ids)), g.grouped_matmul(h, w_up, ids))
            term = g.mul(g.grouped_matmul(hidden, w_down, ids), g.narrow(weights, 1, j, 1))
            total = term if total is None else g.add(total, term)
        shared_gate = g.silu(self.proj(h, f"{p}.mlp.shared_expert.gate_proj", c.shared_width, d))
        shared = g.mul(shared_gate, self.proj(h, f"{p}.mlp.shared_expert.up_proj", c.shared_width, d))
        shared = self.proj(shared, f"{p}.mlp.shared_expert.down_proj", d, c.shared_width)
        shared = g.mul(shared, g.sigmoid(self.proj(h, f"{p}.mlp.shared_expert_gate", 1, d)))
        out = g.reshape(g.add(total, shared), [c.batch, c.seq, d])
        return g.add(x, out, name=f"{p}.mlp_residual")

    # ------------------------------------------------------------------ models
    def rope_inputs(self) -> tuple[int, int]:
        cos, sin = rope_tables(self.c.seq, self.c.head_dim)
        return self.g.constant(cos), self.g.constant(sin)

    def model(self, layer_kinds: list[str] | None = None) -> Graph:
        """Embedding, the layers (by config, or `layer_kinds` of "linear" / "full"), final norm,
        LM head; output `logits [B, S, vocab]`."""
        c, g = self.c, self.g
        kinds = layer_kinds or ["full" if c.is_full_attention(i) else "linear" for i in range(c.layers)]
        ids = g.input("input_ids", [c.batch, c.seq], "i32")
        x = g.gather(self.weight("model.embed_tokens.weight", (c.vocab, c.hidden)), ids, name="model.embed_tokens")
        cos, sin = self.rope_inputs() if "full" in kinds else (0, 0)
        for i, kind in enumerate(kinds):
            p = f"model.layers.{i}"
            x = self.full_attention(x, p, cos, sin) if kind == "full" else self.linear_attention(x, p)
            x = self.moe(x, p)
        x = self.norm(x, "model.norm", c.hidden)
        g.set_outputs([g.reshape(self.proj(x, "lm_head", c.vocab, c.hidden), [c.batch, c.seq, c.vocab], name="logits")])
        return g


def hybrid_params(builder: HybridBuilder, seed: int) -> dict[str, np.ndarray]:
    """Random weights of O(1/sqrt(fan_in)) scale; A_log and dt_bias in Qwen's usual ranges."""
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for name, shape in builder.expected.items():
        if name.endswith("A_log"):
            value = np.log(rng.uniform(1.0, 4.0, shape))
        elif name.endswith("dt_bias"):
            value = rng.uniform(-1.0, 0.5, shape)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            value = rng.uniform(-0.2, 0.2, shape) + (1.0 if name.endswith("linear_attn.norm.weight") else 0.0)
        elif name.endswith("conv1d.weight"):
            value = rng.standard_normal(shape) * 0.5
        elif name == "model.embed_tokens.weight":
            value = rng.standard_normal(shape)
        else:
            fan_in = shape[-2] if len(shape) == 3 else shape[-1]
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        params[name] = value.astype(np.float32)
    return params
