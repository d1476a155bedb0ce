"""LFM2 (`model_type` `lfm2`, Liquid AI): short gated convolutions interleaved with GQA
attention, as transformers' `modeling_lfm2` defines them.

Conv layer (`Lfm2ShortConv`): `B, C, x = in_proj(h)` (three `hidden`-wide chunks in that order),
`y = C * conv(B * x)` with a depthwise causal convolution of `conv_L_cache` taps, then
`out_proj`. Attention layer: RmsNorm over head_dim on q and k (`q_layernorm`, `k_layernorm`)
before RoPE, `out_proj`. Every layer: `operator_norm` before the mixer, `ffn_norm` before the
SwiGLU `feed_forward` (`w1` gate, `w3` up, `w2` down), whose width transformers derives from
`intermediate_size` when `block_auto_adjust_ff_dim` is set; `model.embedding_norm` is the final
norm. The conv state of a decode graph is the last `conv_L_cache - 1` values of `B * x`.
The config reader is the family record in `rlx_mil.models.families.lfm2`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlx_mil.models.decoder import DecoderOptions
from rlx_mil.models.recurrent_decoder import HybridBuilder, HybridSpec, build_hybrid


@dataclass(frozen=True)
class Lfm2Spec(HybridSpec):
    conv_bias: bool = False

    def build_graph(self, options: DecoderOptions, name: str) -> Any:
        return build_hybrid(Lfm2Builder(self, options, name))


class Lfm2Builder(HybridBuilder):
    spec: Lfm2Spec
    input_norm, post_norm, final_norm = "operator_norm", "ffn_norm", "embedding_norm"
    q_norm, k_norm, o_proj = "q_layernorm", "k_layernorm", "out_proj"

    def mixer(self, x: int, layer: int, kind: str) -> int:
        s, g = self.spec, self.g
        e = s.hidden_size
        p = f"{s.root}.layers.{layer}.conv"
        bcx = self.linear(x, f"{p}.in_proj", 3 * e, e, s.conv_bias)
        b_gate = g.narrow(bcx, 2, 0, e, name=f"{p}.B")
        c_gate = g.narrow(bcx, 2, e, e, name=f"{p}.C")
        values = g.narrow(bcx, 2, 2 * e, e, name=f"{p}.x")
        conv = self.causal_conv(g.mul(b_gate, values, name=f"{p}.Bx"), layer, f"{p}.conv", e, s.conv_bias)
        return self.linear(g.mul(c_gate, conv, name=f"{p}.Cy"), f"{p}.out_proj", e, e, s.conv_bias)

    def mlp(self, x: int, p: str) -> int:
        q = f"{p}.feed_forward"
        return self.swiglu(x, f"{q}.w1", f"{q}.w3", f"{q}.w2", self.spec.intermediate_size)
