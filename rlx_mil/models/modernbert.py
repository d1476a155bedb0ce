"""ModernBERT encoders (transformers' `ModernBertModel`), as sentence-transformers run them.

Token embeddings and a LayerNorm (`embeddings.norm`), then pre-norm layers: attention (the
first layer without its norm) over a fused `attn.Wqkv` with RoPE on q and k, and a GeGLU
feed-forward whose `mlp.Wi` holds the activated input rows first and the gate rows second;
`final_norm` last. Layers alternate global attention (every key, one RoPE base) and local
attention (keys within `local_attention // 2` positions either side, another base). Norms
carry a bias only with `norm_bias`, the projections only with `attention_bias` / `mlp_bias`.

Inputs and outputs are the BERT encoders' (`rlx_mil.models.encoder`): `input_ids`,
`attention_mask`; `last_hidden_state` or the pooled `sentence_embedding`. The key-padding
mask of a global layer is the Attention op's Custom mask; a local layer adds the window as
an additive Bias mask `[B, 1, S, S]` (0 where a key is visible, `-MASKED` elsewhere), made
once per window at run time from the positions (no `[S, S]` constant in the package).
Outputs at padding positions are unspecified (a padded query of a local layer may see no
visible key at all); every token's and every pooled output is exact.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from rlx_mil.errors import AmbiguousLayoutWarning
from rlx_mil.ir import Graph
from rlx_mil.models.encoder import EncoderBuilder, EncoderOptions
from rlx_mil.models.hf_config import EncoderSpec
from rlx_mil.models.rope import RopeSpec, rope_tables

#: What a local layer adds to the scores of the keys it does not see: far below any score,
#: and finite in fp16 (exp of it underflows to 0 in the softmax either way).
MASKED = 1.0e4
#: Stored tensors the encoder never reads: ModernBertForMaskedLM's head and decoder bias,
#: the classifiers' heads.
MODERNBERT_IGNORED = (r"head\..*", r"decoder\..*", r"classifier\..*")


@dataclass(frozen=True)
class ModernBertSpec(EncoderSpec):
    """ModernBERT: `EncoderSpec` (no token types, no position table) plus its layers' kinds."""

    #: Per layer: how many positions a local layer sees on either side (|i - j| <= w), or
    #: None for a global layer.
    layer_windows: tuple[int | None, ...] = ()
    #: Per layer: its RoPE.
    layer_ropes: tuple[RopeSpec, ...] = ()
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    layer_pattern: ClassVar[str] = r"layers\.(\d+)\."

    @property
    def max_seq_len(self) -> int:
        return self.max_position_embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def header_shapes(self) -> list[tuple[str, tuple[int, ...], str]]:
        e, m = self.hidden_size, self.intermediate_size
        return [
            ("embeddings.tok_embeddings.weight", (self.vocab_size, e), f"vocab_size {self.vocab_size:,}, hidden_size {e:,}"),
            ("layers.0.attn.Wqkv.weight", (3 * e, e), f"hidden_size {e:,}"),
            ("layers.0.mlp.Wi.weight", (2 * m, e), f"intermediate_size {m:,}, hidden_size {e:,}"),
        ]

    def rope_names(self) -> dict[RopeSpec, str]:
        """Each distinct RoPE in layer order with its params' prefix: `rope`, `rope_1`, ..."""
        distinct = list(dict.fromkeys(self.layer_ropes))
        return {rope: "rope" if k == 0 else f"rope_{k}" for k, rope in enumerate(distinct)}

    def build_graph(self, options: EncoderOptions, name: str) -> tuple[Graph, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
        builder = _Builder(self, options, name)
        graph = builder.build()
        computed: dict[str, np.ndarray] = {}
        for rope, prefix in self.rope_names().items():
            computed[f"{prefix}.cos"], computed[f"{prefix}.sin"] = rope_tables(rope, self.head_dim, options.seq_len)
        return graph, builder.expected, computed


class _Builder(EncoderBuilder):
    spec: ModernBertSpec
    #: Each token's position + 1 (`[B, S]` int32), made once for the local layers' masks.
    _positions: int | None = None

    def build(self) -> Graph:
        s, o, g = self.spec, self.options, self.g
        n, e = o.seq_len, s.hidden_size
        ids, mask = self.token_inputs()
        x = g.gather(self.weight("embeddings.tok_embeddings.weight", (s.vocab_size, e)), ids, name="embeddings.tok_embeddings")
        x = self.layer_norm(x, "embeddings.norm", s.norm_bias)
        half = s.head_dim // 2
        tables = {rope: (g.param(f"{prefix}.cos", [n, half]), g.param(f"{prefix}.sin", [n, half]))
                  for rope, prefix in s.rope_names().items()}
        biases: dict[int, int] = {}
        for i in range(s.num_layers):
            window = s.layer_windows[i]
            if window is not None and window < n - 1 and window not in biases:
                biases[window] = self.window_bias(ids, mask, window)
            bias = None if window is None or window >= n - 1 else biases[window]
            x = self.layer(x, mask, bias, tables[s.layer_ropes[i]], i)
        x = self.layer_norm(x, "final_norm", s.norm_bias)
        return self.finish(x, mask)

    def window_bias(self, ids: int, mask: int, window: int) -> int:
        """`[B, 1, S, S]`: 0 where key j is a token within `window` of query i, else -MASKED.
        The distances are computed at run time from the token positions (int32, exact at any
        length), so the package holds no `[S, S]` constant."""
        g, b, n = self.g, self.options.batch_size, self.options.seq_len
        p = f"window_{window}"
        if self._positions is None:  # 1 .. S per row, from the input so no pass folds it
            ones = g.cast(g.ge_(ids, ids, name="positions.ones"), "i32", name="positions.ones_i32")
            self._positions = g.cumsum(ones, 1, name="positions")
        rows = g.reshape(self._positions, [b, 1, n, 1], name=f"{p}.rows")
        cols = g.reshape(self._positions, [b, 1, 1, n], name=f"{p}.cols")
        distance = g.abs(g.sub(rows, cols, name=f"{p}.offset"), name=f"{p}.distance")
        limit = g.constant(np.array([window], np.int32), name=f"{p}.limit")
        near = g.cast(g.le_(distance, limit, name=f"{p}.near"), "f32", name=f"{p}.near_f32")
        keys = g.reshape(mask, [b, 1, 1, n], name=f"{p}.keys")
        visible = g.mul(near, keys, name=f"{p}.visible")
        return g.mul(g.sub(visible, self.scalar(1.0), name=f"{p}.hidden"), self.scalar(MASKED), name=f"{p}.bias")

    def layer(self, x: int, mask: int, bias: int | None, table: tuple[int, int], i: int) -> int:
        s, o, g = self.spec, self.options, self.g
        b, n, e, h, d, m = o.batch_size, o.seq_len, s.hidden_size, s.num_heads, s.head_dim, s.intermediate_size
        p = f"layers.{i}"
        normed = x if i == 0 else self.layer_norm(x, f"{p}.attn_norm", s.norm_bias)  # layer 0: nn.Identity
        qkv = self.linear(normed, f"{p}.attn.Wqkv", 3 * e, e, s.attention_bias)
        heads = []
        for k, part in enumerate("qkv"):
            rows = g.narrow(qkv, 2, k * e, e, name=f"{p}.attn.{part}")
            heads.append(self.split_heads(rows, b, n, h, d, f"{p}.attn.{part}"))
        q, k_, v = heads
        q = g.rope(q, *table, d, name=f"{p}.attn.q.rope")
        k_ = g.rope(k_, *table, d, name=f"{p}.attn.k.rope")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmbiguousLayoutWarning)  # [B, H, S, D] by construction
            if bias is None:
                a = g.attention(q, k_, v, mask, h, d, name=f"{p}.attn")
            else:
                a = g.attention_bias(q, k_, v, bias, h, d, name=f"{p}.attn")
        a = self.linear(self.merge_heads(a, b, n, e, f"{p}.attn"), f"{p}.attn.Wo", e, e, s.attention_bias)
        x = g.add(x, a, name=f"{p}.attn.residual")
        wi = self.linear(self.layer_norm(x, f"{p}.mlp_norm", s.norm_bias), f"{p}.mlp.Wi", 2 * m, e, s.mlp_bias)
        up = g.narrow(wi, 2, 0, m, name=f"{p}.mlp.input")
        gate = g.narrow(wi, 2, m, m, name=f"{p}.mlp.gate")
        act = g.gelu(up, name=f"{p}.mlp.act") if s.activation == "gelu" else g.gelu_approx(up, name=f"{p}.mlp.act")
        y = self.linear(g.mul(act, gate, name=f"{p}.mlp.gated"), f"{p}.mlp.Wo", e, m, s.mlp_bias)
        return g.add(x, y, name=f"{p}.mlp.residual")
