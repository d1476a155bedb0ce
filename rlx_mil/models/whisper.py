"""Whisper (`WhisperForConditionalGeneration`) as RLX graphs in the form WhisperKit runs.

Three graphs, each an ordinary RLX graph reading Hugging Face tensor names
(`model.encoder.*`, `model.decoder.*`):

* `build_audio_encoder`: `melspectrogram_features [1, n_mels, 1, 2 * n_audio_ctx]` -> two
  convolutions (kernel 3, the second with stride 2) with GELU, plus the stored position table,
  pre-norm blocks (self-attention, GELU feed-forward), the final LayerNorm; output
  `encoder_output_embeds [1, d_model, 1, n_audio_ctx]` (channels first, WhisperKit's layout).
* `build_text_decoder`: one token per call against a KV cache held by the caller, WhisperKit's
  contract (argmaxinc/whisperkittools `text_decoder.py`): `input_ids [1]`, `cache_length [1]`,
  `key_cache` / `value_cache [1, d_model * layers, 1, S]`, `kv_cache_update_mask [1, S]` (1 at
  the slot this token takes), `encoder_output_embeds`, `decoder_key_padding_mask [1, S]`
  (additive: 0 attends, -1e4 does not) -> `logits [1, 1, V]` (the head tied to the token
  embedding) and this token's `key_cache_updates` / `value_cache_updates [1, d_model * layers, 1, 1]`.
* `rlx_mil.models.whisper_mel.build_log_mel`: the log-mel front end.

The projections are `x @ W.T (+ b)` on the stored `[out, in]` weights; the Neural Engine form
(`deploy="ane"`) turns them into 1x1 convolutions.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rlx_mil.coreml.preflight_rules import ANE_MAX_DIM
from rlx_mil.errors import AmbiguousLayoutWarning, InvalidOptionError
from rlx_mil.ir import Graph
from rlx_mil.models.graph_builder import WeightGraph

#: 30 s of 16 kHz audio, Whisper's window.
N_SAMPLES = 480_000
#: The mel frames of one window (hop 160).
N_FRAMES = 3000
#: Additive mask value of a cache slot not attended (WhisperKit's).
MASKED = -1e4


@dataclass(frozen=True)
class WhisperSpec:
    """A Whisper encoder-decoder read from `config.json` (rlx_mil.models.families.whisper)."""

    family: str
    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_heads: int
    encoder_ffn_dim: int
    decoder_layers: int
    decoder_heads: int
    decoder_ffn_dim: int
    max_source_positions: int
    max_target_positions: int
    #: "gelu" (erf) or "gelu_tanh".
    activation: str = "gelu"
    layer_norm_eps: float = 1e-5
    decoder_start_token_id: int = 50257
    eos_token_id: int = 50256
    pad_token_id: int = 50256
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = (220, 50256)

    @property
    def n_audio_ctx(self) -> int:
        return self.max_source_positions

    @property
    def kv_width(self) -> int:
        """Channels of WhisperKit's stacked cache: d_model * decoder layers."""
        return self.d_model * self.decoder_layers

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the three graphs read (stored names, shapes)."""
        e = self.d_model
        out: dict[str, tuple[int, ...]] = {
            "model.encoder.conv1.weight": (e, self.num_mel_bins, 3), "model.encoder.conv1.bias": (e,),
            "model.encoder.conv2.weight": (e, e, 3), "model.encoder.conv2.bias": (e,),
            "model.encoder.embed_positions.weight": (self.max_source_positions, e),
            "model.encoder.layer_norm.weight": (e,), "model.encoder.layer_norm.bias": (e,),
            "model.decoder.embed_tokens.weight": (self.vocab_size, e),
            "model.decoder.embed_positions.weight": (self.max_target_positions, e),
            "model.decoder.layer_norm.weight": (e,), "model.decoder.layer_norm.bias": (e,),
        }
        for side, layers, ffn, attns in (("encoder", self.encoder_layers, self.encoder_ffn_dim, ("self_attn",)),
                                         ("decoder", self.decoder_layers, self.decoder_ffn_dim, ("self_attn", "encoder_attn"))):
            for i in range(layers):
                p = f"model.{side}.layers.{i}"
                for attn in attns:
                    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                        out[f"{p}.{attn}.{proj}.weight"] = (e, e)
                        if proj != "k_proj":  # Whisper's key projections have no bias
                            out[f"{p}.{attn}.{proj}.bias"] = (e,)
                    out[f"{p}.{attn}_layer_norm.weight"] = (e,)
                    out[f"{p}.{attn}_layer_norm.bias"] = (e,)
                out[f"{p}.fc1.weight"], out[f"{p}.fc1.bias"] = (ffn, e), (ffn,)
                out[f"{p}.fc2.weight"], out[f"{p}.fc2.bias"] = (e, ffn), (e,)
                out[f"{p}.final_layer_norm.weight"], out[f"{p}.final_layer_norm.bias"] = (e,), (e,)
        return out


#: Stored tensors no graph reads: the tied output projection some exports store.
IGNORED_TENSORS = (r"proj_out\.weight",)


def float_input(g: Graph, name: str, shape: list[int], fp16: bool) -> int:
    """A float input, declared F16 (then widened: the graph computes in F32) for an fp16
    interface (`rlx_mil.convert(..., fp16_io=True)`, WhisperKit's contract)."""
    if not fp16:
        return g.input(name, shape)
    return g.cast(g.input(name, shape, "f16"), "f32", name=f"{name}.f32")


def float_output(g: Graph, x: int, name: str, fp16: bool) -> int:
    """Name `x` as the output `name`, narrowed to F16 for an fp16 interface."""
    if fp16:
        return g.cast(x, "f16", name=name)
    g.set_name(x, name)
    return x


class _WhisperGraph(WeightGraph):
    def __init__(self, spec: WhisperSpec, name: str) -> None:
        super().__init__(name)
        self.spec = spec
        self.weights: list[int] = []

    def layer_norm(self, x: int, module: str) -> int:
        e = self.spec.d_model
        return self.g.layer_norm(x, self.weight(f"{module}.weight", (e,)), self.weight(f"{module}.bias", (e,)),
                                 eps=self.spec.layer_norm_eps, name=module)

    def act(self, x: int, name: str) -> int:
        return self.g.gelu(x, name=name) if self.spec.activation == "gelu" else self.g.gelu_approx(x, name=name)

    def attention(self, x: int, kv: int, module: str, heads: int, seq: int, kv_seq: int,
                  bias: int | None = None, cache: tuple[int, int, int] | None = None,
                  weights_of: Sequence[int] = ()) -> tuple[int, int, int]:
        """Multi-head attention of `x [1, seq, E]` over `kv [1, kv_seq, E]`; returns (output,
        this call's K, V). `cache` (K cache, V cache [1, S, E], update mask [1, S, 1]): the keys
        and values are the caches with this token's K / V written where the mask is 1.
        `weights_of`: heads whose attention weights (softmax of the scaled scores, no bias)
        `self.weights` collects, each `[1, 1, seq, kv_seq]`."""
        g, e = self.g, self.spec.d_model
        d = e // heads
        q = self.linear(x, f"{module}.q_proj", e, e, True)
        k = self.linear(kv, f"{module}.k_proj", e, e, False)
        v = self.linear(kv, f"{module}.v_proj", e, e, True)
        keys, values, keys_seq = k, v, kv_seq
        if cache is not None:
            key_cache, value_cache, update = cache
            keep = g.sub(self.scalar(1.0), update, name=f"{module}.keep")
            keys = g.add(g.mul(key_cache, keep, name=f"{module}.key_kept"), g.mul(k, update, name=f"{module}.key_new"),
                         name=f"{module}.keys")
            values = g.add(g.mul(value_cache, keep, name=f"{module}.value_kept"),
                           g.mul(v, update, name=f"{module}.value_new"), name=f"{module}.values")
            keys_seq = g.node(key_cache).shape.sizes()[1]
        qh = self.split_heads(q, 1, seq, heads, d, f"{module}.q")
        kh = self.split_heads(keys, 1, keys_seq, heads, d, f"{module}.k")
        vh = self.split_heads(values, 1, keys_seq, heads, d, f"{module}.v")
        for head in weights_of:  # Whisper's alignment heads (word timestamps): their weights apart
            qj = g.narrow(qh, 1, head, 1, name=f"{module}.q.{head}")
            kj = g.transpose(g.narrow(kh, 1, head, 1, name=f"{module}.k.{head}"), [0, 1, 3, 2], name=f"{module}.k.{head}.t")
            scores = g.mul(g.matmul(qj, kj, name=f"{module}.scores.{head}"), self.scalar(d ** -0.5),
                           name=f"{module}.scores.{head}.scaled")
            self.weights.append(g.softmax(scores, -1, name=f"{module}.weights.{head}"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AmbiguousLayoutWarning)  # [B, H, S, D] by construction
            if bias is None:
                a = g.attention_kind(qh, kh, vh, heads, d, "none", name=f"{module}.sdpa")
            else:
                a = g.attention_bias(qh, kh, vh, bias, heads, d, name=f"{module}.sdpa")
        a = self.merge_heads(a, 1, seq, e, f"{module}.sdpa")
        return self.linear(a, f"{module}.out_proj", e, e, True), k, v

    def feed_forward(self, x: int, p: str, ffn: int) -> int:
        e = self.spec.d_model
        h = self.layer_norm(x, f"{p}.final_layer_norm")
        h = self.act(self.linear(h, f"{p}.fc1", ffn, e, True), f"{p}.act")
        return self.g.add(x, self.linear(h, f"{p}.fc2", e, ffn, True), name=f"{p}.ffn_residual")

    def channels_first(self, x: int, seq: int, name: str) -> int:
        """`[1, seq, E]` -> `[1, E, 1, seq]`."""
        t = self.g.transpose(x, [0, 2, 1], name=f"{name}.channels_first")
        return self.g.reshape(t, [1, self.spec.d_model, 1, seq], name=name)

    def sequence_major(self, x: int, seq: int, name: str) -> int:
        """`[1, C, 1, seq]` -> `[1, seq, C]`."""
        c = self.g.node(x).shape.sizes()[1]
        flat = self.g.reshape(x, [1, c, seq], name=f"{name}.flat")
        return self.g.transpose(flat, [0, 2, 1], name=name)


def _conv(b: _WhisperGraph, x: int, module: str, in_ch: int, stride: int) -> int:
    """A stored Conv1d (kernel 3, padding 1) on `[1, C, 1, T]` as a 2-D convolution over (1, T)."""
    g, e = b.g, b.spec.d_model
    w = g.reshape(b.weight(f"{module}.weight", (e, in_ch, 3)), [e, in_ch, 1, 3], name=f"{module}.kernel")
    y = g.conv(x, w, stride=(1, stride), padding=(0, 1), name=module)
    bias = g.reshape(b.weight(f"{module}.bias", (e,)), [1, e, 1, 1], name=f"{module}.bias_4d")
    return b.act(g.add(y, bias, name=f"{module}.add_bias"), f"{module}.act")


def build_audio_encoder(spec: WhisperSpec, name: str = "AudioEncoder", *,
                        fp16_io: bool = False) -> tuple[Graph, dict[str, tuple[int, ...]]]:
    """The audio encoder graph and the tensors it reads (`fp16_io`: F16 input and output)."""
    b = _WhisperGraph(spec, name)
    g, e, n = b.g, spec.d_model, spec.n_audio_ctx
    mel = float_input(g, "melspectrogram_features", [1, spec.num_mel_bins, 1, 2 * n], fp16_io)
    x = _conv(b, mel, "model.encoder.conv1", spec.num_mel_bins, 1)
    x = _conv(b, x, "model.encoder.conv2", e, 2)
    x = b.sequence_major(x, n, "model.encoder.sequence_major")
    positions = b.weight("model.encoder.embed_positions.weight", (spec.max_source_positions, e))
    x = g.add(x, positions, name="model.encoder.add_positions")
    for i in range(spec.encoder_layers):
        p = f"model.encoder.layers.{i}"
        h = b.layer_norm(x, f"{p}.self_attn_layer_norm")
        a, _, _ = b.attention(h, h, f"{p}.self_attn", spec.encoder_heads, n, n)
        x = b.feed_forward(g.add(x, a, name=f"{p}.attn_residual"), p, spec.encoder_ffn_dim)
    x = b.layer_norm(x, "model.encoder.layer_norm")
    out = float_output(g, b.channels_first(x, n, "model.encoder.output"), "encoder_output_embeds", fp16_io)
    g.set_outputs([out])
    return g, b.expected


def vocab_pieces(vocab: int, widest: int = ANE_MAX_DIM) -> list[tuple[int, int]]:
    """(start, rows) of the fewest near-equal pieces of at most `widest` rows a `vocab`-row
    token table is cut into (Whisper's 51,865: four of 12,967 or fewer)."""
    count = -(-vocab // widest)
    rows = -(-vocab // count)
    return [(start, min(rows, vocab - start)) for start in range(0, vocab, rows)]


TOKEN_TABLE = "model.decoder.embed_tokens.weight"
_ROWS = re.compile(r"^(?P<name>.+)\[(?P<start>\d+):(?P<stop>\d+)\]$")


def rows_name(name: str, start: int, stop: int) -> str:
    """The param name of rows start..stop of the tensor `name` (a view of it, never a copy:
    `rlx_mil.models.whisper_checkpoint.ParamsOf` reads it)."""
    return f"{name}[{start}:{stop}]"


def parse_rows_name(name: str) -> tuple[str, int, int] | None:
    """(tensor, start, stop) of a `rows_name`, else None."""
    found = _ROWS.match(name)
    return None if found is None else (found["name"], int(found["start"]), int(found["stop"]))


def tied_embedding_and_head(b: _WhisperGraph, ids: int, name: str = "model.decoder") -> tuple[int, Callable[[int], list[int]]]:
    """The token embedding of `ids` ([1] int32) and the tied LM head (hidden [1, 1, d_model] ->
    the logits [1, 1, rows] of each piece, in order) over the token table cut into
    `vocab_pieces`, each piece a param of its own (`rows_name`: a view of the table's rows): no
    tensor but the logits themselves is wider than the Neural Engine's 16,384, and the table is
    still stored once (each piece is read by the lookup and by the head). A token's row comes
    from the piece holding it: each piece looks up the clamped index and keeps the row only
    where the index was in range."""
    g, vocab, width = b.g, b.spec.vocab_size, b.spec.d_model
    pieces = vocab_pieces(vocab)
    if len(pieces) == 1:
        table = b.weight(TOKEN_TABLE, (vocab, width))
        return (g.gather(table, ids, name=f"{name}.token"),
                lambda x: [g.matmul(x, g.transpose(table, [1, 0], name="lm_head.weight_t"), name="lm_head")])
    zero = g.constant(np.zeros((1, width), np.float32), name=f"{name}.token.zero")
    parts, rows = [], None
    for j, (start, count) in enumerate(pieces):
        part = b.weight(rows_name(TOKEN_TABLE, start, start + count), (count, width))
        parts.append(part)
        local = g.sub(ids, g.constant(np.array([start], np.int32), name=f"{name}.token.{j}.start"), name=f"{name}.token.{j}.local")
        index = g.minimum(g.maximum(local, g.constant(np.array([0], np.int32), name=f"{name}.token.{j}.first"),
                                    name=f"{name}.token.{j}.low"),
                          g.constant(np.array([count - 1], np.int32), name=f"{name}.token.{j}.last"), name=f"{name}.token.{j}.index")
        inside = g.reshape(g.eq_(index, local, name=f"{name}.token.{j}.inside"), [1, 1], name=f"{name}.token.{j}.inside_2d")
        row = g.where_(inside, g.gather(part, index, name=f"{name}.token.{j}.row"), zero, name=f"{name}.token.{j}.kept")
        rows = row if rows is None else g.add(rows, row, name=f"{name}.token.{j}.sum")
    assert rows is not None

    def head(x: int) -> list[int]:
        return [g.matmul(x, g.transpose(part, [1, 0], name=f"lm_head.{j}.weight_t"), name=f"lm_head.{j}")
                for j, part in enumerate(parts)]

    return rows, head


def check_cache_len(spec: WhisperSpec, cache_len: int) -> None:
    if isinstance(cache_len, bool) or not isinstance(cache_len, int) or not 1 <= cache_len <= spec.max_target_positions:
        raise InvalidOptionError(f"cache_len must be an integer in [1, max_target_positions = {spec.max_target_positions}],"
                                 f" got {cache_len!r}")


def build_text_decoder(spec: WhisperSpec, cache_len: int, name: str = "TextDecoder", *,
                       fp16_io: bool = False,
                       alignment_heads: Sequence[tuple[int, int]] = ()) -> tuple[Graph, dict[str, tuple[int, ...]]]:
    """WhisperKit's one-token text decoder over `cache_len` cache slots, and the tensors it
    reads (`fp16_io`: the float inputs and outputs F16, as WhisperKit feeds them).
    `alignment_heads` ((layer, head) pairs, the checkpoint's generation config's): an output
    `alignment_heads_weights [1, n_audio_ctx]`, the mean of those heads' cross-attention weights
    (whisperkittools' `compute_alignment_heads_attention_weights`; WhisperKit's word
    timestamps read it)."""
    check_cache_len(spec, cache_len)
    for layer, which in alignment_heads:
        if not (0 <= layer < spec.decoder_layers and 0 <= which < spec.decoder_heads):
            raise InvalidOptionError(f"alignment_heads: ({layer}, {which}) is outside the decoder's"
                                     f" {spec.decoder_layers} layers x {spec.decoder_heads} heads")
    b = _WhisperGraph(spec, name)
    g, e, s, n = b.g, spec.d_model, cache_len, spec.n_audio_ctx
    ids = g.input("input_ids", [1], "i32")
    position = g.input("cache_length", [1], "i32")
    key_cache = float_input(g, "key_cache", [1, spec.kv_width, 1, s], fp16_io)
    value_cache = float_input(g, "value_cache", [1, spec.kv_width, 1, s], fp16_io)
    update_mask = g.input("kv_cache_update_mask", [1, s], "i32")
    encoded = float_input(g, "encoder_output_embeds", [1, e, 1, n], fp16_io)
    padding = float_input(g, "decoder_key_padding_mask", [1, s], fp16_io)
    positions = b.weight("model.decoder.embed_positions.weight", (spec.max_target_positions, e))
    token, lm_head = tied_embedding_and_head(b, ids)
    x = g.add(token, g.gather(positions, position, name="model.decoder.position"), name="model.decoder.embed")
    x = g.reshape(x, [1, 1, e], name="model.decoder.hidden")
    enc = b.sequence_major(encoded, n, "model.decoder.encoder_states")
    update = g.reshape(g.cast(update_mask, "f32", name="kv_cache_update_mask_float"), [1, s, 1], name="update_mask")
    bias = g.reshape(padding, [1, 1, 1, s], name="padding_bias")
    key_updates: list[int] = []
    value_updates: list[int] = []
    for i in range(spec.decoder_layers):
        p = f"model.decoder.layers.{i}"
        caches = tuple(b.sequence_major(g.narrow(c, 1, i * e, e, name=f"{p}.{what}_cache"), s, f"{p}.{what}_cache_rows")
                       for c, what in ((key_cache, "key"), (value_cache, "value")))
        h = b.layer_norm(x, f"{p}.self_attn_layer_norm")
        a, k, v = b.attention(h, h, f"{p}.self_attn", spec.decoder_heads, 1, 1, bias, (caches[0], caches[1], update))
        key_updates.append(b.channels_first(k, 1, f"{p}.key_update"))
        value_updates.append(b.channels_first(v, 1, f"{p}.value_update"))
        x = g.add(x, a, name=f"{p}.attn_residual")
        h = b.layer_norm(x, f"{p}.encoder_attn_layer_norm")
        a, _, _ = b.attention(h, enc, f"{p}.encoder_attn", spec.decoder_heads, 1, n,
                              weights_of=[j for layer, j in alignment_heads if layer == i])
        x = b.feed_forward(g.add(x, a, name=f"{p}.cross_residual"), p, spec.decoder_ffn_dim)
    x = b.layer_norm(x, "model.decoder.layer_norm")
    pieces = lm_head(x)
    if len(pieces) == 1:
        outputs = [float_output(g, pieces[0], "logits", fp16_io)]
    else:  # narrowed piece by piece: the concatenation is the output, no other tensor is as wide
        narrowed = [g.cast(p, "f16", name=f"lm_head.{j}.f16") if fp16_io else p for j, p in enumerate(pieces)]
        outputs = [g.concat(narrowed, 2, name="logits")]
    for parts, out_name in ((key_updates, "key_cache_updates"), (value_updates, "value_cache_updates")):
        stacked = parts[0] if len(parts) == 1 else g.concat(parts, 1, name=f"{out_name}.stacked")
        outputs.append(float_output(g, stacked, out_name, fp16_io))
    if b.weights:
        total = b.weights[0]
        for j, w in enumerate(b.weights[1:]):
            total = g.add(total, w, name=f"alignment_heads.sum.{j}")
        mean = g.mul(total, b.scalar(1.0 / len(b.weights)), name="alignment_heads.mean")
        outputs.append(float_output(g, g.reshape(mean, [1, n], name="alignment_heads.rows"), "alignment_heads_weights", fp16_io))
    g.set_outputs(outputs)
    return g, b.expected


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's sinusoidal encoder positions `[length, channels]` (sin half, then cos half),
    as openai/whisper's `sinusoids` makes them (CTranslate2 folders may omit the table)."""
    half = channels // 2
    increment = np.log(max_timescale) / (half - 1)
    inv = np.exp(-increment * np.arange(half, dtype=np.float64))
    scaled = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


# ---------------------------------------------------------------------------- the stateful form


def build_cross_kv(spec: WhisperSpec, name: str = "cross_attention") -> tuple[Graph, dict[str, tuple[int, ...]]]:
    """Every decoder layer's cross-attention keys and values of one encoder output, computed
    once per utterance: `encoder_output_embeds [1, E, 1, n_audio]` -> `cross_keys` /
    `cross_values [layers, 1, heads, n_audio, head_dim]`."""
    b = _WhisperGraph(spec, name)
    g, e, n, h = b.g, spec.d_model, spec.n_audio_ctx, spec.decoder_heads
    d = e // h
    enc = b.sequence_major(g.input("encoder_output_embeds", [1, e, 1, n]), n, "encoder_states")
    keys, values = [], []
    for i in range(spec.decoder_layers):
        p = f"model.decoder.layers.{i}.encoder_attn"
        keys.append(b.split_heads(b.linear(enc, f"{p}.k_proj", e, e, False), 1, n, h, d, f"{p}.k"))
        values.append(b.split_heads(b.linear(enc, f"{p}.v_proj", e, e, True), 1, n, h, d, f"{p}.v"))
    outs = []
    for parts, out_name in ((keys, "cross_keys"), (values, "cross_values")):
        stacked = g.concat([g.reshape(t, [1, 1, h, n, d], name=f"{out_name}.{j}") for j, t in enumerate(parts)], 0,
                           name=f"{out_name}.stacked") if len(parts) > 1 else g.reshape(parts[0], [1, 1, h, n, d])
        outs.append(float_output(g, stacked, out_name, False))
    g.set_outputs(outs)
    return g, b.expected


def build_stateful_decoder(spec: WhisperSpec, tokens: int = 1, name: str = "decode", *,
                           past: int = 1) -> tuple[Graph, dict[str, tuple[int, ...]]]:
    """The text decoder in upstream's decode form (`past_k_{i}` / `past_v_{i}` Inputs
    `[1, heads, past, head_dim]` concatenated with the new tokens' K / V, causal attention,
    `new_k_{i}` / `new_v_{i}` outputs), which `rlx_mil.convert(..., kv_cache="auto")` turns into
    Core ML state: `input_ids` / `position_ids [1, tokens]`, the cross-attention `cross_keys` /
    `cross_values` of `build_cross_kv` as inputs, `logits [1, tokens, V]`. With `past` 0 there
    are no past inputs (the first call of an utterance, as the reference runs it)."""
    b = _WhisperGraph(spec, name)
    g, e, n, h, heads_dim = b.g, spec.d_model, spec.n_audio_ctx, spec.decoder_heads, spec.d_model // spec.decoder_heads
    ids = g.input("input_ids", [1, tokens], "i32")
    position_ids = g.input("position_ids", [1, tokens], "i32")
    cross_keys = g.input("cross_keys", [spec.decoder_layers, 1, h, n, heads_dim])
    cross_values = g.input("cross_values", [spec.decoder_layers, 1, h, n, heads_dim])
    table = b.weight("model.decoder.embed_tokens.weight", (spec.vocab_size, e))
    positions = b.weight("model.decoder.embed_positions.weight", (spec.max_target_positions, e))
    x = g.add(g.gather(table, ids, name="model.decoder.token"), g.gather(positions, position_ids, name="model.decoder.position"),
              name="model.decoder.embed")
    caches: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmbiguousLayoutWarning)  # [B, H, S, D] by construction
        for i in range(spec.decoder_layers):
            p = f"model.decoder.layers.{i}"
            hn = b.layer_norm(x, f"{p}.self_attn_layer_norm")
            a = f"{p}.self_attn"
            q = b.split_heads(b.linear(hn, f"{a}.q_proj", e, e, True), 1, tokens, h, heads_dim, f"{a}.q")
            k = b.split_heads(b.linear(hn, f"{a}.k_proj", e, e, False), 1, tokens, h, heads_dim, f"{a}.k")
            v = b.split_heads(b.linear(hn, f"{a}.v_proj", e, e, True), 1, tokens, h, heads_dim, f"{a}.v")
            if past:
                k = g.concat([g.input(f"past_k_{i}", [1, h, past, heads_dim]), k], 2, name=f"new_k_{i}")
                v = g.concat([g.input(f"past_v_{i}", [1, h, past, heads_dim]), v], 2, name=f"new_v_{i}")
            else:
                k = g.reshape(k, [1, h, tokens, heads_dim], name=f"new_k_{i}")
                v = g.reshape(v, [1, h, tokens, heads_dim], name=f"new_v_{i}")
            caches += [k, v]
            att = g.attention_kind(q, k, v, h, heads_dim, "causal", name=f"{a}.sdpa")
            x = g.add(x, b.linear(b.merge_heads(att, 1, tokens, e, a), f"{a}.out_proj", e, e, True), name=f"{p}.attn_residual")
            hn = b.layer_norm(x, f"{p}.encoder_attn_layer_norm")
            c = f"{p}.encoder_attn"
            q = b.split_heads(b.linear(hn, f"{c}.q_proj", e, e, True), 1, tokens, h, heads_dim, f"{c}.q")
            ck = g.reshape(g.narrow(cross_keys, 0, i, 1), [1, h, n, heads_dim], name=f"{c}.keys")
            cv = g.reshape(g.narrow(cross_values, 0, i, 1), [1, h, n, heads_dim], name=f"{c}.values")
            att = g.attention_kind(q, ck, cv, h, heads_dim, "none", name=f"{c}.sdpa")
            x = g.add(x, b.linear(b.merge_heads(att, 1, tokens, e, c), f"{c}.out_proj", e, e, True), name=f"{p}.cross_residual")
            x = b.feed_forward(x, p, spec.decoder_ffn_dim)
    x = b.layer_norm(x, "model.decoder.layer_norm")
    logits = g.matmul(x, g.transpose(table, [1, 0], name="lm_head.weight_t"), name="logits")
    g.set_outputs([logits, *caches])
    return g, b.expected
