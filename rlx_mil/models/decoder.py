"""Decoder-only transformers (Llama, Qwen2/3, Mistral, Gemma 2, Phi-3) as RLX graphs.

Weights are Params under their Hugging Face names, in their stored `[out, in]` layout: each
linear layer is `MatMul(x, Transpose(W))`, which the lowering turns into Core ML `linear` on
the weight as stored (no transposed copy). Attention runs head-major (`[B, H, S, D]`); RoPE
uses cos/sin tables passed as the Params `rope.cos` / `rope.sin` (a model whose layers have
different RoPEs, like Gemma 3's local and global layers, has one pair per RoPE: `rope_1.cos`
/ `rope_1.sin`, ... for the second and later).

Variants:
- prefill: `input_ids [B, S]` (and `position_ids [B, S]` when asked), causal attention,
  output `logits [B, S, V]` (`[B, 1, V]` with last_logits) and, when asked, each layer's
  K/V as `new_k_{i}` / `new_v_{i}` `[B, H_kv, S, D]`;
- decode: `input_ids [B, n]`, `position_ids [B, n]`, `past_k_{i}` / `past_v_{i}`
  `[B, H_kv, P, D]`; per layer `Concat(past, new, axis=2)` feeds a causal (bottom-right
  aligned) Attention and is the output `new_k_{i}` / `new_v_{i}` `[B, H_kv, P + n, D]`;
  with `attention_mask` (one new token), an `attention_mask [B, P + 1]` key-padding input
  replaces the causal mask (which one new token does not need).

The residual stream of a spec with `stream_scale` s (Gemma 2 and 3, whose hidden states reach
~1e5 and beyond on some channels, past fp16's 65,504) is held divided by s: the embeddings are
multiplied by `embed_scale / s`, what each block adds to the stream by 1 / s (folded into the
sandwich post-norms' gammas), and the norms that read the stream (input, pre-feed-forward and
final) take `eps / s^2`. RmsNorm(x / s; eps / s^2) = RmsNorm(x; eps), so the logits, K and V
are the same in real arithmetic, and since s is a power of two every scaling is exact in
floating point as well (but for values pushed into fp16's subnormals). The stream's own values
(the residual adds) stay s times below the model's.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from rlx_mil.errors import AmbiguousLayoutWarning, InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.models.graph_builder import WeightGraph
from rlx_mil.models.hf_config import DecoderSpec
from rlx_mil.models.rope import RopeSpec, rope_tables

VARIANTS = ("prefill", "decode")


@dataclass(frozen=True)
class DecoderOptions:
    variant: str = "prefill"
    #: prefill: tokens S; decode: new tokens n per call.
    seq_len: int = 128
    #: decode: past positions P held in the KV cache.
    cache_len: int = 0
    batch_size: int = 1
    #: logits of the last position only.
    last_logits: bool = False
    #: prefill: also output every layer's K/V.
    kv_outputs: bool = False
    #: prefill: take `position_ids` as an input (decode always does).
    position_ids: bool = False
    #: rows of the RoPE tables (positions a graph can address); default: just enough.
    max_positions: int | None = None
    #: decode: a key-padding `attention_mask` F32 [B, P + n] input (>= 0.5 = attend).
    attention_mask: bool = False

    @property
    def table_rows(self) -> int:
        if self.max_positions is not None:
            return self.max_positions
        return self.seq_len + (self.cache_len if self.variant == "decode" else 0)

    def validate(self, spec: DecoderSpec) -> None:
        if self.variant not in VARIANTS:
            raise InvalidOptionError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        for field, minimum in (("seq_len", 1), ("batch_size", 1), ("cache_len", 0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidOptionError(f"{field} must be an integer >= {minimum}, got {value!r}")
        if self.variant == "decode" and self.cache_len < 1:
            raise InvalidOptionError("the decode variant needs cache_len >= 1 (past positions held in the KV cache)")
        if self.variant == "prefill" and self.cache_len:
            raise InvalidOptionError("cache_len applies to the decode variant only")
        if self.max_positions is not None:
            rows = self.max_positions
            if isinstance(rows, bool) or not isinstance(rows, int) or rows < self.seq_len + self.cache_len:
                raise InvalidOptionError(f"max_positions must be an integer >= seq_len + cache_len, got {rows!r}")
        if self.attention_mask:
            # The IR's Custom (key-padding) mask has no causal or window part: exact for one new
            # token attending to a full-attention cache.
            if self.variant != "decode" or self.seq_len != 1:
                raise InvalidOptionError("attention_mask applies to the decode variant with seq_len 1")
            if any(w is not None for w in spec.layer_windows):
                raise InvalidOptionError(f"attention_mask cannot be combined with the sliding-window layers of this {spec.family} model")
        if self.table_rows > spec.max_position_embeddings:
            raise InvalidOptionError(
                f"positions up to {self.table_rows} exceed the model's max_position_embeddings"
                f" {spec.max_position_embeddings}"
            )


class _Builder(WeightGraph):
    """Builds one decoder graph."""

    def __init__(self, spec: DecoderSpec, options: DecoderOptions, name: str) -> None:
        super().__init__(name)
        self.spec = spec
        self.options = options
        self.key_mask: int | None = None

    @property
    def stream_scale(self) -> float:
        """s: the residual stream is held divided by it (1.0: as the model computes it)."""
        return 1.0 if self.spec.stream_scale is None else self.spec.stream_scale

    def rms_norm(self, x: int, module: str, width: int, *, reads_stream: bool = False, adds_to_stream: bool = False) -> int:
        """RmsNorm with the (offset) gamma `module.weight`; one that `reads_stream` takes
        eps / s^2, one whose output the block adds to the stream has its gamma divided by s."""
        gamma = self.weight(f"{module}.weight", (width,))
        if self.spec.norm_offset:
            gamma = self.g.add(gamma, self.scalar(self.spec.norm_offset), name=f"{module}.scale")
        s = self.stream_scale
        if adds_to_stream and s != 1.0:
            gamma = self.g.mul(gamma, self.scalar(1.0 / s), name=f"{module}.stream_scale")
        eps = self.spec.rms_norm_eps / (s * s) if reads_stream else self.spec.rms_norm_eps
        return self.g.rms_norm(x, gamma, self.zeros(width), eps=eps, name=module)

    def to_stream(self, out: int, module: str) -> int:
        """A block's output without a post-norm as the stream holds it (divided by s)."""
        if self.stream_scale == 1.0:
            return out
        return self.g.mul(out, self.scalar(1.0 / self.stream_scale), name=f"{module}.stream_scale")

    def rope(self, x: int, cos: int, sin: int, rotary_dim: int, module: str) -> int:
        """RoPE on `[B, H, S, D]` with table rows already matching the S positions."""
        return self.g.rope(x, cos, sin, self.spec.head_dim, rotary_dim, name=f"{module}.rope")

    def rope_by_rows(self, x: int, cos: int, sin: int, rotary_dim: int, module: str) -> int:
        """RoPE on `[B, H, S, D]` with per-batch rows `cos`/`sin` `[B, 1, S, D/2]` (ordinary
        element-wise ops: the Rope op's tables are shared by the whole batch)."""
        g, s = self.g, self.spec
        half = rotary_dim // 2
        if half < s.head_dim // 2:
            cos = g.narrow(cos, 3, 0, half, name=f"{module}.rope_cos_rot")
            sin = g.narrow(sin, 3, 0, half, name=f"{module}.rope_sin_rot")
        x1 = g.narrow(x, 3, 0, half, name=f"{module}.rope_x1")
        x2 = g.narrow(x, 3, half, half, name=f"{module}.rope_x2")
        first = g.sub(g.mul(x1, cos), g.mul(x2, sin), name=f"{module}.rope_first")
        second = g.add(g.mul(x2, cos), g.mul(x1, sin), name=f"{module}.rope_second")
        parts = [first, second]
        if 2 * half < s.head_dim:
            parts.append(g.narrow(x, 3, 2 * half, s.head_dim - 2 * half, name=f"{module}.rope_pass"))
        return g.concat(parts, 3, name=f"{module}.rope")

    def mask_kind(self, layer: int) -> str:
        window = self.spec.layer_windows[layer] if self.spec.layer_windows else None
        # A prefill graph sees exactly its S keys, so a window covering them is plain causal
        # attention; a decode graph keeps the window, since a stateful conversion gives it a
        # longer cache than the graph's P.
        if window is None or (self.options.variant == "prefill" and window >= self.options.seq_len):
            return "causal"
        # Hugging Face's window W shows W keys including the query's own; the IR's w shows w + 1.
        return f"sliding:{window - 1}"

    def tables(self, positions: int | None) -> dict[RopeSpec, tuple[int, int]]:
        """(cos, sin) rows for the S positions of each distinct RoPE of the model."""
        s, o, g = self.spec, self.options, self.g
        b, n, half = o.batch_size, o.seq_len, s.head_dim // 2
        out: dict[RopeSpec, tuple[int, int]] = {}
        for rope, prefix in rope_names(s).items():
            cos = g.param(f"{prefix}.cos", [o.table_rows, half])
            sin = g.param(f"{prefix}.sin", [o.table_rows, half])
            if positions is not None:
                shape = [n, half] if b == 1 else [b, 1, n, half]
                cos = g.reshape(g.gather(cos, positions, name=f"{prefix}.cos_rows"), shape, name=f"{prefix}.cos_table")
                sin = g.reshape(g.gather(sin, positions, name=f"{prefix}.sin_rows"), shape, name=f"{prefix}.sin_table")
            out[rope] = (cos, sin)
        return out

    # ------------------------------------------------------------------ the model
    def token_inputs(self) -> tuple[int, dict[RopeSpec, tuple[int, int]], bool]:
        """`input_ids`, the RoPE rows of its positions (`position_ids` in decode graphs or when
        asked) and whether they are per batch row."""
        o, g = self.options, self.g
        b, n = o.batch_size, o.seq_len
        ids = g.input("input_ids", [b, n], "i32")
        positions = g.input("position_ids", [b, n], "i32") if o.variant == "decode" or o.position_ids else None
        return ids, self.tables(positions), positions is not None and b > 1

    def build(self) -> Graph:
        s, o, g = self.spec, self.options, self.g
        b, n = o.batch_size, o.seq_len
        decode = o.variant == "decode"
        ids, tables, per_batch_rows = self.token_inputs()
        scale = self.stream_scale
        if not (math.isfinite(scale) and scale > 0 and math.frexp(scale)[0] == 0.5):
            raise InvalidOptionError(f"stream_scale must be a positive power of two, got {s.stream_scale!r}")

        self.key_mask = g.input("attention_mask", [b, o.cache_len + n]) if o.attention_mask else None
        embed = self.weight(f"{s.root}.embed_tokens.weight", (s.vocab_size, s.hidden_size))
        x = g.gather(embed, ids, name=f"{s.root}.embed_tokens")
        if s.embed_scale is not None or scale != 1.0:
            x = g.mul(x, self.scalar((s.embed_scale or 1.0) / scale), name=f"{s.root}.embed_scale")
        kv_outputs: list[int] = []
        for i in range(s.num_layers):
            rope = s.rope_of(i)
            x, k, v = self.layer(x, i, rope, tables[rope] if rope is not None else None, per_batch_rows)
            if decode or o.kv_outputs:
                kv_outputs += [k, v]
        x = self.rms_norm(x, f"{s.root}.norm", s.hidden_size, reads_stream=True)
        if o.last_logits and n > 1:
            x = g.narrow(x, 1, n - 1, 1, name="last_position")
        if s.tie_word_embeddings:
            head = g.transpose(embed, [1, 0], name="lm_head.weight_t")
            logits = g.matmul(x, head, name="lm_head")
        else:
            logits = self.linear(x, "lm_head", s.vocab_size, s.hidden_size, False)
        if s.logits_scale is not None:
            logits = g.mul(logits, self.scalar(s.logits_scale), name="logits_scale")
        if s.final_softcap is not None:
            capped = g.tanh(g.mul(logits, self.scalar(1.0 / s.final_softcap)), name="final_softcap.tanh")
            logits = g.mul(capped, self.scalar(s.final_softcap), name="final_softcap")
        logits = g.reshape(logits, [b, 1 if o.last_logits else n, s.vocab_size], name="logits")
        g.set_outputs([logits, *kv_outputs])
        return g

    def layer(self, x: int, i: int, rope: RopeSpec | None, table: tuple[int, int] | None,
              per_batch_rows: bool) -> tuple[int, int, int]:
        s, o, g = self.spec, self.options, self.g
        p = f"{s.root}.layers.{i}"
        e, h, hkv, d = s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim
        hn = self.rms_norm(x, f"{p}.input_layernorm", e, reads_stream=True)
        if s.fused_qkv:
            qkv = self.linear(hn, f"{p}.self_attn.qkv_proj", (h + 2 * hkv) * d, e, s.qkv_bias)
            q = g.narrow(qkv, 2, 0, h * d, name=f"{p}.self_attn.q")
            k = g.narrow(qkv, 2, h * d, hkv * d, name=f"{p}.self_attn.k")
            v = g.narrow(qkv, 2, (h + hkv) * d, hkv * d, name=f"{p}.self_attn.v")
        else:
            q = self.linear(hn, f"{p}.self_attn.q_proj", h * d, e, s.qkv_bias)
            k = self.linear(hn, f"{p}.self_attn.k_proj", hkv * d, e, s.qkv_bias)
            v = self.linear(hn, f"{p}.self_attn.v_proj", hkv * d, e, s.qkv_bias)
        b, n = o.batch_size, o.seq_len
        # The q/k norms (over head_dim) go before the head-major transpose, where HF applies
        # them: a transpose feeding the norm would make Core ML's costly `reduce_transposes`
        # pass run for the whole program (most of a 28-layer Qwen3's pass time).
        q_norm = (lambda t: self.rms_norm(t, f"{p}.self_attn.q_norm", d)) if s.qk_norm else None
        k_norm = (lambda t: self.rms_norm(t, f"{p}.self_attn.k_norm", d)) if s.qk_norm else None
        q = self.split_heads(q, b, n, h, d, f"{p}.self_attn.q", q_norm)
        k = self.split_heads(k, b, n, hkv, d, f"{p}.self_attn.k", k_norm)
        v = self.split_heads(v, b, n, hkv, d, f"{p}.self_attn.v")
        if rope is not None and table is not None:  # None: a layer without RoPE (NoPE)
            rotate = self.rope_by_rows if per_batch_rows else self.rope
            q = rotate(q, *table, rope.rotary_dim, f"{p}.self_attn.q")
            k = rotate(k, *table, rope.rotary_dim, f"{p}.self_attn.k")
        if o.variant == "decode":
            past_k = g.input(f"past_k_{i}", [o.batch_size, hkv, o.cache_len, d])
            past_v = g.input(f"past_v_{i}", [o.batch_size, hkv, o.cache_len, d])
            k = g.concat([past_k, k], 2, name=f"new_k_{i}")
            v = g.concat([past_v, v], 2, name=f"new_v_{i}")
        elif o.kv_outputs:
            g.set_name(k, f"new_k_{i}")
            g.set_name(v, f"new_v_{i}")
        with warnings.catch_warnings():
            # q is [B, H, S, D] by construction; S == H is not the ambiguity the warning is for.
            warnings.simplefilter("ignore", AmbiguousLayoutWarning)
            if self.key_mask is not None:
                attn = g.attention(q, k, v, self.key_mask, h, d, s.score_scale, s.attn_softcap,
                                   name=f"{p}.self_attn.attention")
            else:
                attn = g.attention_kind(q, k, v, h, d, self.mask_kind(i), s.score_scale, s.attn_softcap,
                                        name=f"{p}.self_attn.attention")
        attn = self.merge_heads(attn, b, n, h * d, f"{p}.self_attn")
        out = self.linear(attn, f"{p}.self_attn.o_proj", e, h * d, s.o_bias)
        if s.residual_scale is not None:
            out = g.mul(out, self.scalar(s.residual_scale), name=f"{p}.self_attn.residual_scale")
        if s.sandwich_norms:
            out = self.rms_norm(out, f"{p}.post_attention_layernorm", e, adds_to_stream=True)
            x = g.add(x, out, name=f"{p}.attn_residual")
            hn = self.rms_norm(x, f"{p}.pre_feedforward_layernorm", e, reads_stream=True)
        else:
            x = g.add(x, self.to_stream(out, f"{p}.self_attn"), name=f"{p}.attn_residual")
            hn = self.rms_norm(x, f"{p}.post_attention_layernorm", e, reads_stream=True)
        out = self.mlp(hn, f"{p}.{s.mlp_names[0]}")
        if s.sandwich_norms:
            out = self.rms_norm(out, f"{p}.post_feedforward_layernorm", e, adds_to_stream=True)
        else:
            out = self.to_stream(out, f"{p}.mlp")
        if s.residual_scale is not None:
            out = g.mul(out, self.scalar(s.residual_scale), name=f"{p}.mlp.residual_scale")
        x = g.add(x, out, name=f"{p}.mlp_residual")
        return x, k, v

    def mlp(self, x: int, p: str) -> int:
        s, g = self.spec, self.g
        e, m = s.hidden_size, s.intermediate_size
        if s.fused_gate_up:
            both = self.linear(x, f"{p}.{s.mlp_names[1]}", 2 * m, e, s.mlp_bias)
            gate = g.narrow(both, 2, 0, m, name=f"{p}.gate")
            up = g.narrow(both, 2, m, m, name=f"{p}.up")
        else:
            gate = self.linear(x, f"{p}.gate_proj", m, e, s.mlp_bias)
            up = self.linear(x, f"{p}.up_proj", m, e, s.mlp_bias)
        act = g.gelu_approx(gate, name=f"{p}.act") if s.activation == "gelu_tanh" else g.silu(gate, name=f"{p}.act")
        return self.linear(g.mul(act, up, name=f"{p}.gated"), f"{p}.{s.mlp_names[2]}", e, m, s.mlp_bias)


def build_decoder(spec: DecoderSpec, options: DecoderOptions, name: str | None = None) -> tuple[Graph, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """The graph, the checkpoint tensors it reads (name -> shape) and the arrays the builder
    computes itself (RoPE tables)."""
    options.validate(spec)
    builder = _Builder(spec, options, name or f"{spec.family}_{options.variant}")
    graph = builder.build()
    computed: dict[str, np.ndarray] = {}
    for rope, prefix in rope_names(spec).items():
        computed[f"{prefix}.cos"], computed[f"{prefix}.sin"] = rope_tables(rope, spec.head_dim, options.table_rows)
    return graph, builder.expected, computed


def rope_names(spec: DecoderSpec) -> dict[RopeSpec, str]:
    """Each distinct RoPE of the model's layers, in layer order, with its params' name prefix:
    `rope` for the first, `rope_1`, `rope_2`, ... for the others."""
    ropes: list[RopeSpec] = []
    for i in range(spec.num_layers):
        rope = spec.rope_of(i)
        if rope is not None and rope not in ropes:
            ropes.append(rope)
    return {rope: "rope" if k == 0 else f"rope_{k}" for k, rope in enumerate(ropes)}
