"""BERT-style encoders (BERT, MiniLM, RoBERTa, XLM-RoBERTa) as sentence-transformers run them.

Inputs `input_ids`, `attention_mask` (1 = token, 0 = padding) and, when asked,
`token_type_ids`, all I32 `[B, S]`. Word + position + token-type embeddings, LayerNorm, then
post-LN layers (self-attention with the key-padding mask, GELU feed-forward). RoBERTa's
positions count from `padding_idx + 1` over the tokens that are not `padding_idx` (computed
from `input_ids` in the graph, as transformers does). Output `last_hidden_state [B, S, E]`, or
with pooling `sentence_embedding [B, E]` (mean over the unmasked tokens, or the first token),
optionally L2-normalised. `EncoderBuilder` (options, norms, pooling) is shared with the
encoders that build their own layers (ModernBERT).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlx_mil.errors import AmbiguousLayoutWarning, CheckpointError, InvalidOptionError, UnsupportedConfigError
from rlx_mil.ir import Graph
from rlx_mil.models.graph_builder import WeightGraph
from rlx_mil.models.hf_config import MAX_CONFIG_BYTES, EncoderSpec, read_json_file

POOLING = (None, "mean", "cls")


@dataclass(frozen=True)
class EncoderOptions:
    seq_len: int = 128
    batch_size: int = 1
    pooling: str | None = None
    normalize: bool = False
    token_type_ids: bool = False

    def validate(self, spec: EncoderSpec) -> None:
        for field in ("seq_len", "batch_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"{field} must be an integer >= 1, got {value!r}")
        if self.seq_len > spec.max_seq_len:
            offset = "" if spec.padding_idx is None else f" less padding_idx + 1 = {spec.padding_idx + 1}"
            raise InvalidOptionError(f"seq_len {self.seq_len} exceeds max_position_embeddings"
                                     f" {spec.max_position_embeddings}{offset}")
        if self.token_type_ids and spec.type_vocab_size < 1:
            raise InvalidOptionError(f"{spec.family} has no token type embeddings: token_type_ids does not apply")
        if self.pooling not in POOLING:
            raise InvalidOptionError(f"pooling must be one of {POOLING}, got {self.pooling!r}")
        if self.normalize and self.pooling is None:
            raise InvalidOptionError("normalize needs a pooling ('mean' or 'cls')")


def sentence_transformers_pipeline(directory: Path) -> tuple[str | None, bool]:
    """(pooling, normalize) from a sentence-transformers `modules.json` (None, False without one)."""
    modules_file = directory / "modules.json"
    if not modules_file.is_symlink() and not modules_file.exists():
        return None, False
    # Present in any form: a dangling link, a folder or a FIFO is a broken pipeline, not an
    # absent one (treating it as absent would silently drop the pooling and normalisation).
    if modules_file.is_symlink() and not modules_file.exists():
        raise CheckpointError(f"{modules_file}: a link to a missing file; the sentence-transformers pipeline cannot be read")
    modules = read_json_file(modules_file, MAX_CONFIG_BYTES)
    try:
        kinds = {str(m["type"]).rsplit(".", 1)[-1]: str(m.get("path", "")) for m in modules}
    except (KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{modules_file}: not a sentence-transformers module list ({err})") from None
    pooling: str | None = None
    if "Pooling" in kinds:
        folder = Path(kinds["Pooling"])
        if folder.is_absolute() or ".." in folder.parts:
            raise CheckpointError(f"{modules_file}: the Pooling module's path {kinds['Pooling']!r} leaves the checkpoint folder")
        config_file = directory / folder / "config.json"
        config = read_json_file(config_file, MAX_CONFIG_BYTES)
        if not isinstance(config, dict):
            raise CheckpointError(f"{config_file}: unreadable pooling config (not a JSON object)")
        modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v is True)
        known = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
        if len(modes) != 1 or modes[0] not in known:
            raise UnsupportedConfigError(
                f"{config_file}: pooling modes {modes} are not supported; rlx_mil pools by exactly one of"
                " pooling_mode_mean_tokens or pooling_mode_cls_token", field="pooling_mode", value=modes,
            )
        pooling = known[modes[0]]
    return pooling, "Normalize" in kinds


class EncoderBuilder(WeightGraph):
    """An encoder graph under construction: its inputs, LayerNorms and pooled output."""

    def __init__(self, spec: EncoderSpec, options: EncoderOptions, name: str) -> None:
        super().__init__(name)
        self.spec = spec
        self.options = options

    def layer_norm(self, x: int, module: str, bias: bool = True) -> int:
        e = self.spec.hidden_size
        gamma = self.weight(f"{module}.weight", (e,))
        beta = self.weight(f"{module}.bias", (e,)) if bias else self.zeros(e)
        return self.g.layer_norm(x, gamma, beta, eps=self.spec.layer_norm_eps, name=module)

    def token_inputs(self) -> tuple[int, int]:
        """`input_ids` and the attention mask as F32 `[B, S]` (1 = token)."""
        b, n = self.options.batch_size, self.options.seq_len
        ids = self.g.input("input_ids", [b, n], "i32")
        mask = self.g.cast(self.g.input("attention_mask", [b, n], "i32"), "f32", name="attention_mask_float")
        return ids, mask

    def finish(self, x: int, mask: int) -> Graph:
        """Output `last_hidden_state`, or its pooled (and normalised) `sentence_embedding`."""
        s, o, g = self.spec, self.options, self.g
        b, n, e = o.batch_size, o.seq_len, s.hidden_size
        if o.pooling is None:
            g.set_name(x, "last_hidden_state")
            g.set_outputs([x])
            return g
        if o.pooling == "cls":
            pooled = g.reshape(g.narrow(x, 1, 0, 1, name="pool.first_token"), [b, e], name="pool")
        else:
            weights = g.reshape(mask, [b, n, 1], name="pool.mask")
            total = g.sum(g.mul(x, weights, name="pool.masked"), 1, name="pool.sum")
            count = g.maximum(g.sum(weights, 1, name="pool.count"), self.scalar(1e-9), name="pool.count_floor")
            pooled = g.div(total, count, name="pool")
        if o.normalize:
            norm = g.sqrt(g.sum(g.mul(pooled, pooled, name="normalize.square"), 1, keep_dim=True), name="normalize.norm")
            pooled = g.div(pooled, g.maximum(norm, self.scalar(1e-12), name="normalize.floor"), name="normalize")
        g.set_name(pooled, "sentence_embedding")
        g.set_outputs([pooled])
        return g


class _Builder(EncoderBuilder):
    def build(self) -> Graph:
        s, o, g = self.spec, self.options, self.g
        b, n, e = o.batch_size, o.seq_len, s.hidden_size
        ids, mask = self.token_inputs()
        x = g.gather(self.weight("embeddings.word_embeddings.weight", (s.vocab_size, e)), ids, name="embeddings.word")
        positions = self.weight("embeddings.position_embeddings.weight", (s.max_position_embeddings, e))
        x = g.add(x, self.position_rows(positions, ids), name="embeddings.add_positions")
        types = self.weight("embeddings.token_type_embeddings.weight", (s.type_vocab_size, e))
        if o.token_type_ids:
            type_rows = g.gather(types, g.input("token_type_ids", [b, n], "i32"), name="embeddings.token_types")
        else:  # transformers' default: every token of segment 0
            type_rows = g.narrow(types, 0, 0, 1, name="embeddings.token_types")
        x = g.add(x, type_rows, name="embeddings.add_token_types")
        x = self.layer_norm(x, "embeddings.LayerNorm")
        for i in range(s.num_layers):
            x = self.layer(x, mask, f"encoder.layer.{i}")
        return self.finish(x, mask)

    def position_rows(self, table: int, ids: int) -> int:
        """The position embeddings of the S tokens: rows 0..S-1 (BERT), or RoBERTa's
        `cumsum(ids != pad) * (ids != pad) + pad` (transformers' create_position_ids_from_input_ids)."""
        g, pad, n = self.g, self.spec.padding_idx, self.options.seq_len
        if pad is None:
            return g.narrow(table, 0, 0, n, name="embeddings.positions")
        pad_id = g.constant(np.array([pad], np.int32), name="embeddings.padding_idx")
        real = g.cast(g.ne_(ids, pad_id, name="embeddings.not_padding"), "i32", name="embeddings.not_padding_i32")
        counted = g.mul(g.cumsum(real, 1, name="embeddings.count"), real, name="embeddings.counted")
        position_ids = g.add(counted, pad_id, name="embeddings.position_ids")
        return g.gather(table, position_ids, name="embeddings.positions")

    def layer(self, x: int, mask: int, p: str) -> int:
        s, o, g = self.spec, self.options, self.g
        b, n, e, h = o.batch_size, o.seq_len, s.hidden_size, s.num_heads
        d = e // h
        q = self.split_heads(self.linear(x, f"{p}.attention.self.query", e, e, True), b, n, h, d, f"{p}.attention.self.query")
        k = self.split_heads(self.linear(x, f"{p}.attention.self.key", e, e, True), b, n, h, d, f"{p}.attention.self.key")
        v = self.split_heads(self.linear(x, f"{p}.attention.self.value", e, e, True), b, n, h, d, f"{p}.attention.self.value")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmbiguousLayoutWarning)  # [B, H, S, D] by construction
            a = g.attention(q, k, v, mask, h, d, name=f"{p}.attention.self")
        a = self.merge_heads(a, b, n, e, f"{p}.attention.self")
        a = self.linear(a, f"{p}.attention.output.dense", e, e, True)
        x = self.layer_norm(g.add(x, a, name=f"{p}.attention.residual"), f"{p}.attention.output.LayerNorm")
        m = self.linear(x, f"{p}.intermediate.dense", s.intermediate_size, e, True)
        m = g.gelu(m, name=f"{p}.intermediate.act") if s.activation == "gelu" else g.gelu_approx(m, name=f"{p}.intermediate.act")
        m = self.linear(m, f"{p}.output.dense", e, s.intermediate_size, True)
        return self.layer_norm(g.add(x, m, name=f"{p}.output.residual"), f"{p}.output.LayerNorm")


def build_encoder(spec: EncoderSpec, options: EncoderOptions, name: str | None = None) -> tuple[Graph, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """The graph, the checkpoint tensors it reads (name -> shape), and the arrays the builder
    computes (ModernBERT's RoPE tables)."""
    options.validate(spec)
    own_builder = getattr(spec, "build_graph", None)
    if own_builder is not None:  # ModernBERT (rlx_mil.models.modernbert)
        built: tuple[Graph, dict[str, tuple[int, ...]], dict[str, np.ndarray]] = own_builder(
            options, name or f"{spec.family}_encoder")
        return built
    builder = _Builder(spec, options, name or f"{spec.family}_encoder")
    return builder.build(), builder.expected, {}
