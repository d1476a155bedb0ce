"""Hybrid decoders: attention layers interleaved with recurrent ones (LFM2's short gated
convolutions, Qwen3.5's gated delta-net), as RLX graphs.

`HybridBuilder` builds what the families share: embeddings, RoPE tables, the per-layer loop
(mixer, residual, norm, SwiGLU, residual), the final norm and the LM head, attention with the
KV-cache interface of the dense decoders (`past_k_{i}` / `new_k_{i}` per attention layer i), and
a causal depthwise convolution whose last `kernel - 1` inputs are the conv state. The families
(`rlx_mil.models.lfm2`, `rlx_mil.models.qwen3_5`) supply the mixers and the module names.

Recurrent state in a decode graph (docs/models.md, "Hybrid decoders"):
- conv state: Input `conv_state_{i}` `[B, kernel - 1, C]` (the last inputs of layer i's conv,
  oldest first) and output `conv_state_{i}_out`, the same window after this call's tokens;
- gated delta-net state: Input `recurrent_state_{i}` `[B, H_v, d, d]` carried by the
  GatedDeltaNet op (`carry_state`), published as `recurrent_state_{i}_out`.
A stateful conversion (`kv_cache="auto"`) keeps both in Core ML states beside the KV cache.
Prefill graphs start from zero states, as transformers does without a cache.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import AmbiguousLayoutWarning, InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.models.decoder import DecoderOptions, _Builder, rope_names
from rlx_mil.models.hf_config import DecoderSpec
from rlx_mil.models.rope import RopeSpec, rope_tables

#: Suffix of the output carrying a state Input's next value (as for carried op states).
STATE_OUT = "_out"


@dataclass(frozen=True)
class HybridSpec(DecoderSpec):
    """A decoder whose layers are attention or a recurrent mixer (`layer_kinds`)."""

    #: Per layer: "attention" or the family's recurrent mixer ("conv", "linear_attention").
    layer_kinds: tuple[str, ...] = ()
    #: Kernel width of the recurrent layers' causal convolution.
    conv_kernel: int = 4

    def layers_of(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == kind]


class HybridBuilder(_Builder):
    """The shared skeleton; subclasses define `mixer`, `mlp` and the module names below."""

    spec: HybridSpec
    input_norm = "input_layernorm"
    post_norm = "post_attention_layernorm"
    final_norm = "norm"
    q_norm, k_norm, o_proj = "q_norm", "k_norm", "o_proj"
    #: Qwen3.5: q_proj also yields a per-head output gate (`[q | gate]` per head).
    gated_query = False

    def __init__(self, spec: HybridSpec, options: DecoderOptions, name: str) -> None:
        super().__init__(spec, options, name)
        self.state_outputs: list[int] = []

    # ------------------------------------------------------------------ the model
    def build(self) -> Graph:
        s, o, g = self.spec, self.options, self.g
        b, n = o.batch_size, o.seq_len
        decode = o.variant == "decode"
        ids, tables, per_batch_rows = self.token_inputs()
        embed = self.weight(f"{s.root}.embed_tokens.weight", (s.vocab_size, s.hidden_size))
        x = g.gather(embed, ids, name=f"{s.root}.embed_tokens")
        kv_outputs: list[int] = []
        for i, kind in enumerate(s.layer_kinds):
            p = f"{s.root}.layers.{i}"
            hn = self.rms_norm(x, f"{p}.{self.input_norm}", s.hidden_size)
            if kind == "attention":
                rope = s.rope_of(i)
                out, k, v = self.attention(hn, i, rope, tables.get(rope) if rope is not None else None, per_batch_rows)
                if decode or o.kv_outputs:
                    kv_outputs += [k, v]
            else:
                out = self.mixer(hn, i, kind)
            x = g.add(x, out, name=f"{p}.mixer_residual")
            out = self.mlp(self.rms_norm(x, f"{p}.{self.post_norm}", s.hidden_size), p)
            x = g.add(x, out, name=f"{p}.mlp_residual")
        x = self.rms_norm(x, f"{s.root}.{self.final_norm}", s.hidden_size)
        if o.last_logits and n > 1:
            x = g.narrow(x, 1, n - 1, 1, name="last_position")
        if s.tie_word_embeddings:
            logits = g.matmul(x, g.transpose(embed, [1, 0], name="lm_head.weight_t"), name="lm_head")
        else:
            logits = self.linear(x, "lm_head", s.vocab_size, s.hidden_size, False)
        logits = g.reshape(logits, [b, 1 if o.last_logits else n, s.vocab_size], name="logits")
        g.set_outputs([logits, *kv_outputs, *self.state_outputs])
        return g

    def mixer(self, x: int, layer: int, kind: str) -> int:
        raise NotImplementedError

    def mlp(self, x: int, p: str) -> int:
        raise NotImplementedError

    def swiglu(self, x: int, gate: str, up: str, down: str, width: int) -> int:
        e = self.spec.hidden_size
        act = self.g.silu(self.linear(x, gate, width, e, False), name=f"{gate}.act")
        return self.linear(self.g.mul(act, self.linear(x, up, width, e, False), name=f"{up}.gated"), down, e, width, False)

    # ------------------------------------------------------------------ attention
    def attention(self, hn: int, i: int, rope: RopeSpec | None, table: tuple[int, int] | None,
                  per_batch_rows: bool) -> tuple[int, int, int]:
        s, o, g = self.spec, self.options, self.g
        p = f"{s.root}.layers.{i}.self_attn"
        e, h, hkv, d = s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim
        b, n = o.batch_size, o.seq_len
        gate: int | None = None
        if self.gated_query:
            both = g.reshape(self.linear(hn, f"{p}.q_proj", 2 * h * d, e, s.qkv_bias), [b, n, h, 2 * d], name=f"{p}.q_and_gate")
            q = g.narrow(both, 3, 0, d, name=f"{p}.q")
            gate = g.reshape(g.narrow(both, 3, d, d), [b, n, h * d], name=f"{p}.gate")
            q = g.transpose(self.rms_norm(q, f"{p}.{self.q_norm}", d), [0, 2, 1, 3], name=f"{p}.q.head_major")
        else:
            q = self.split_heads(self.linear(hn, f"{p}.q_proj", h * d, e, s.qkv_bias), b, n, h, d, f"{p}.q",
                                 lambda t: self.rms_norm(t, f"{p}.{self.q_norm}", d))
        k = self.split_heads(self.linear(hn, f"{p}.k_proj", hkv * d, e, s.qkv_bias), b, n, hkv, d, f"{p}.k",
                             lambda t: self.rms_norm(t, f"{p}.{self.k_norm}", d))
        v = self.split_heads(self.linear(hn, f"{p}.v_proj", hkv * d, e, s.qkv_bias), b, n, hkv, d, f"{p}.v")
        if rope is not None and table is not None:
            rotate = self.rope_by_rows if per_batch_rows else self.rope
            q, k = rotate(q, *table, rope.rotary_dim, f"{p}.q"), rotate(k, *table, rope.rotary_dim, f"{p}.k")
        if o.variant == "decode":
            k = g.concat([g.input(f"past_k_{i}", [b, hkv, o.cache_len, d]), k], 2, name=f"new_k_{i}")
            v = g.concat([g.input(f"past_v_{i}", [b, hkv, o.cache_len, d]), v], 2, name=f"new_v_{i}")
        elif o.kv_outputs:
            g.set_name(k, f"new_k_{i}")
            g.set_name(v, f"new_v_{i}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmbiguousLayoutWarning)
            attn = g.attention_kind(q, k, v, h, d, self.mask_kind(i), s.score_scale, s.attn_softcap,
                                    name=f"{p}.attention")
        attn = self.merge_heads(attn, b, n, h * d, p)
        if gate is not None:
            attn = g.mul(attn, g.sigmoid(gate, name=f"{p}.gate_sigmoid"), name=f"{p}.gated")
        return self.linear(attn, f"{p}.{self.o_proj}", e, h * d, s.o_bias), k, v

    # ------------------------------------------------------------------ recurrent pieces
    def causal_conv(self, x: int, layer: int, module: str, channels: int, bias: bool) -> int:
        """Depthwise causal conv over time of `x [B, n, C]` with `{module}.weight` `[C, 1, K]`:
        `y[t] = sum_j w[:, j] * x[t - K + 1 + j]`, the inputs before the first token read from
        the conv state (decode) or zero (prefill)."""
        s, o, g = self.spec, self.options, self.g
        b, n, kernel = o.batch_size, o.seq_len, s.conv_kernel
        if o.variant == "decode":
            history = g.input(f"conv_state_{layer}", [b, kernel - 1, channels])
        else:
            history = g.constant(np.zeros((b, kernel - 1, channels), np.float32))
        padded = g.concat([history, x], 1, name=f"{module}.window")
        if o.variant == "decode":
            state = g.narrow(padded, 1, n, kernel - 1, name=f"conv_state_{layer}{STATE_OUT}")
            self.state_outputs.append(state)
        taps = self.weight(f"{module}.weight", (channels, 1, kernel))
        total: int | None = None
        for j in range(kernel):
            tap = g.reshape(g.narrow(taps, 2, j, 1), [channels], name=f"{module}.tap{j}")
            term = g.mul(g.narrow(padded, 1, j, n, name=f"{module}.shift{j}"), tap, name=f"{module}.term{j}")
            total = term if total is None else g.add(total, term, name=f"{module}.sum{j}")
        assert total is not None
        if bias:
            total = g.add(total, self.weight(f"{module}.bias", (channels,)), name=f"{module}.add_bias")
        return total


def check_hybrid_options(spec: HybridSpec, options: DecoderOptions) -> None:
    options.validate(spec)
    if options.attention_mask:
        raise InvalidOptionError(
            f"attention_mask cannot be combined with the recurrent layers of this {spec.family} model"
            " (a padded token would still enter their state)"
        )
    if options.kv_outputs and any(k != "attention" for k in spec.layer_kinds):
        raise InvalidOptionError(
            f"kv_outputs: this {spec.family} model also carries recurrent state; build the decode variant"
            " (or a stateful package) to continue a sequence"
        )


def build_hybrid(builder: HybridBuilder) -> tuple[Graph, dict[str, tuple[int, ...]], dict[str, Any]]:
    """(graph, stored tensors name -> shape, the RoPE tables)."""
    spec, options = builder.spec, builder.options
    check_hybrid_options(spec, options)
    graph = builder.build()
    computed: dict[str, Any] = {}
    for rope, prefix in rope_names(spec).items():
        computed[f"{prefix}.cos"], computed[f"{prefix}.sin"] = rope_tables(rope, spec.head_dim, options.table_rows)
    return graph, builder.expected, computed
