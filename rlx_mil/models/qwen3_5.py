"""Qwen3.5 small dense models (`model_type` `qwen3_5`, the `Qwen3_5ForConditionalGeneration`
checkpoints Qwen publishes, and `qwen3_5_text`, `Qwen3_5ForCausalLM`): gated delta-net
linear-attention layers with a full-attention layer every `full_attention_interval` (or as
`layer_types` lists them), as transformers' `modeling_qwen3_5` defines them.

A `qwen3_5` checkpoint nests the decoder's config under `text_config` and its tensors under
`model.language_model.`, beside a vision tower (`model.visual.*`) that text generation does not
read; `lm_head.weight` sits at the top level.

Linear-attention layer (`Qwen3_5GatedDeltaNet`): `in_proj_qkv` -> depthwise causal conv
(`linear_conv_kernel_dim` taps) -> SiLU -> q, k, v; q and k L2-normalised and repeated to the
value heads (repeat_interleave); `g = -exp(A_log) * softplus(in_proj_a(h) + dt_bias)`,
`beta = sigmoid(in_proj_b(h))`; the gated delta rule (queries scaled by `d ** -0.5`); an RmsNorm
over each value head (plain weight) times `silu(in_proj_z(h))`; `out_proj`. Full-attention
layer (`Qwen3_5Attention`): `q_proj` gives per head `[q | gate]`, `(1 + w)` RmsNorms on q and k,
partial RoPE (`partial_rotary_factor`, default 0.25), attention, `* sigmoid(gate)`, `o_proj`.
Every other norm scales by `(1 + w)`. The MLP is a dense SwiGLU.

M-RoPE (`mrope_section`, `mrope_interleaved`) only differs from plain RoPE where the three
position streams differ (images and video); text positions are equal in all three, so text
generation uses plain RoPE. The config reader is the family record in
`rlx_mil.models.families.qwen3_5`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlx_mil.models.decoder import DecoderOptions
from rlx_mil.models.recurrent_decoder import HybridBuilder, HybridSpec, build_hybrid


@dataclass(frozen=True)
class Qwen35Spec(HybridSpec):
    linear_key_heads: int = 16
    linear_value_heads: int = 32
    #: Key and value head width of the linear-attention layers (equal: the IR's state is d x d).
    linear_head_dim: int = 128

    def build_graph(self, options: DecoderOptions, name: str) -> Any:
        return build_hybrid(Qwen35Builder(self, options, name))


class Qwen35Builder(HybridBuilder):
    spec: Qwen35Spec
    gated_query = True

    def mixer(self, x: int, layer: int, kind: str) -> int:
        s, o, g = self.spec, self.options, self.g
        b, n, e, d = o.batch_size, o.seq_len, s.hidden_size, s.linear_head_dim
        hk, hv = s.linear_key_heads, s.linear_value_heads
        key_dim, value_dim = hk * d, hv * d
        channels = 2 * key_dim + value_dim
        p = f"{s.root}.layers.{layer}.linear_attn"
        qkv = self.linear(x, f"{p}.in_proj_qkv", channels, e, False)
        z = self.linear(x, f"{p}.in_proj_z", value_dim, e, False)
        beta_logits = self.linear(x, f"{p}.in_proj_b", hv, e, False)
        a = self.linear(x, f"{p}.in_proj_a", hv, e, False)
        conv = g.silu(self.causal_conv(qkv, layer, f"{p}.conv1d", channels, False), name=f"{p}.conv_act")
        q = g.reshape(g.narrow(conv, 2, 0, key_dim), [b, n, hk, d], name=f"{p}.q")
        k = g.reshape(g.narrow(conv, 2, key_dim, key_dim), [b, n, hk, d], name=f"{p}.k")
        v = g.reshape(g.narrow(conv, 2, 2 * key_dim, value_dim), [b, n, hv, d], name=f"{p}.v")
        q = self.repeat_heads(self.l2_norm(q, f"{p}.q_l2"), hv // hk, f"{p}.q_heads")
        k = self.repeat_heads(self.l2_norm(k, f"{p}.k_l2"), hv // hk, f"{p}.k_heads")
        decay = g.neg(g.exp(self.weight(f"{p}.A_log", (hv,))), name=f"{p}.decay")
        gate = g.mul(decay, g.softplus(g.add(a, self.weight(f"{p}.dt_bias", (hv,)))), name=f"{p}.g")
        beta = g.sigmoid(beta_logits, name=f"{p}.beta")
        state = g.input(f"recurrent_state_{layer}", [b, hv, d, d]) if o.variant == "decode" else None
        out = g.gated_delta_net(q, k, v, gate, beta, d, state, name=f"{p}.gated_delta_rule")
        normed = g.rms_norm(out, self.weight(f"{p}.norm.weight", (d,)), self.zeros(d), eps=s.rms_norm_eps, name=f"{p}.norm")
        gated = g.mul(normed, g.silu(g.reshape(z, [b, n, hv, d])), name=f"{p}.gated")
        return self.linear(g.reshape(gated, [b, n, value_dim]), f"{p}.out_proj", e, value_dim, False)

    def mlp(self, x: int, p: str) -> int:
        q = f"{p}.mlp"
        return self.swiglu(x, f"{q}.gate_proj", f"{q}.up_proj", f"{q}.down_proj", self.spec.intermediate_size)
