"""Checks a config's sizes before anything is built from them.

A `config.json` is a few numbers that the builders multiply: `hidden_size = 3e9` is a 12 GB
zero bias, `num_hidden_layers = 1e5` a graph of millions of nodes, `max_positions = 2e9` a
15 GiB RoPE table. So before a graph, table or array exists:

1. what building would allocate is estimated (RoPE tables and their float64 temporaries,
   shared constants, graph nodes);
2. when that is more than a cheap build (`CHEAP_BUILD_BYTES`), the sizes are compared with
   the checkpoint's headers (no tensor data read): the token embedding's `[vocab, hidden]`,
   the number of layers the tensor names hold, and layer 0's first projection and MLP
   weights (which carry the heads, head_dim and intermediate size);
3. an estimate above `MAX_BUILD_BYTES` is refused, saying how much and for what.

A cheap build goes ahead even when the sizes disagree: the full comparison of every tensor
(`Checkpoint.check`) after building lists every missing, unexpected and mis-shaped tensor
in one error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rlx_mil.errors import CheckpointError, InvalidOptionError
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS
from rlx_mil.models.hf_config import DecoderSpec, EncoderSpec, ModelSpec
from rlx_mil.units import human_bytes

#: The token models these checks size (the image encoders have their own: `rlx_mil.models.vision`).
TextSpec = DecoderSpec | EncoderSpec

#: Below this, building costs less than reading the checkpoint's headers does to explain.
CHEAP_BUILD_BYTES = 64 * 2**20
#: What building one graph may allocate before a weight is read (tables, constants, nodes).
MAX_BUILD_BYTES = 2 * 2**30
#: Python memory per IR node (node, shape, op, name; measured ~1.2 KB, rounded up).
NODE_BYTES = 2048
#: IR nodes per decoder / encoder layer (measured: 56-66 for the decoder families, 40 for BERT).
NODES_PER_LAYER = {"decoder": 80, "encoder": 50}
#: Bytes per RoPE table cell while computing it: float64 angles, cos and sin, float32 results.
ROPE_CELL_BYTES = 8 * 4 + 4 * 2

_DECODER_LAYER = re.compile(r"model\.(?:language_model\.)?layers\.(\d+)\.")  # Qwen3.5 VLM: model.language_model.


@dataclass(frozen=True)
class BuildCost:
    """What building a graph would allocate, by part (bytes)."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def describe(self) -> str:
        return "; ".join(f"{what}: {human_bytes(n)}" for what, n in sorted(self.parts, key=lambda p: -p[1]) if n)


def build_cost(spec: TextSpec, *, table_rows: int = 0, seq_len: int = 1, batch_size: int = 1) -> BuildCost:
    """The estimate for one graph of `spec` with RoPE tables of `table_rows` rows."""
    if isinstance(spec, EncoderSpec):
        nodes = NODES_PER_LAYER["encoder"] * spec.num_layers + 40
        ropes = len(set(getattr(spec, "layer_ropes", ())))  # ModernBERT: one table pair per RoPE
        half = spec.hidden_size // spec.num_heads // 2
        return BuildCost((
            (f"{nodes:,} graph nodes ({spec.num_layers:,} layers)", nodes * NODE_BYTES),
            (f"{seq_len * batch_size:,} input positions", 8 * seq_len * batch_size),
            (f"{ropes} RoPE table pairs of {seq_len:,} positions x {half:,} frequencies",
             ropes * seq_len * (8 + half * ROPE_CELL_BYTES)),
        ))
    nodes = NODES_PER_LAYER["decoder"] * spec.num_layers + 40
    half = spec.head_dim // 2
    return BuildCost((
        (f"RoPE tables of {table_rows:,} positions x {half:,} frequencies", table_rows * (8 + half * ROPE_CELL_BYTES)),
        (f"zero norm biases of hidden_size {spec.hidden_size:,} and head_dim {spec.head_dim:,}",
         4 * (spec.hidden_size + spec.head_dim)),
        (f"{nodes:,} graph nodes ({spec.num_layers:,} layers)", nodes * NODE_BYTES),
    ))


def check_build_cost(
    spec: TextSpec, source: str, precheck: Callable[[], None] | None = None, limit: int = MAX_BUILD_BYTES,
    **sizes: int,
) -> None:
    """Refuse (InvalidOptionError) to build a graph whose estimated allocation exceeds `limit`;
    a build costing more than `CHEAP_BUILD_BYTES` runs `precheck` (the comparison with the
    checkpoint's headers) first."""
    cost = build_cost(spec, **sizes)
    if cost.total > CHEAP_BUILD_BYTES and precheck is not None:
        precheck()
    if cost.total > limit:
        raise InvalidOptionError(
            f"{source}: building this {spec.family} graph would allocate about {human_bytes(cost.total)} before any weight"
            f" is read ({cost.describe()}), more than the limit of {human_bytes(limit)}; check the config's sizes and the"
            " requested positions (max_positions / --max-context)"
        )


def check_activation_sizes(
    spec: ModelSpec, source: str, *, seq_len: int, batch_size: int, last_logits: bool = False,
) -> None:
    """Refuse (InvalidOptionError) a graph whose activations Core ML could not address (more
    than `MAX_TENSOR_ELEMENTS` elements: MIL shapes and indices are int32), before it is built:
    `batch_size x seq_len` tokens (one for `last_logits`' logits) times a per-token width."""
    widths = {"hidden_size": (seq_len, spec.hidden_size), "intermediate_size": (seq_len, spec.intermediate_size)}
    if isinstance(spec, DecoderSpec):
        widths["vocab_size (logits)"] = (1 if last_logits else seq_len, spec.vocab_size)
        widths["attention projections"] = (seq_len, (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim)
        if spec.fused_gate_up:
            widths["fused gate/up projection"] = (seq_len, 2 * spec.intermediate_size)
    elif isinstance(spec, EncoderSpec):  # every query's scores over the S keys, per head
        widths["num_attention_heads x seq_len (attention scores)"] = (seq_len, spec.num_heads * seq_len)
    what, (tokens, width) = max(widths.items(), key=lambda item: item[1][0] * item[1][1])
    elements = batch_size * tokens * width
    if elements > MAX_TENSOR_ELEMENTS:
        raise InvalidOptionError(
            f"{source}: batch_size {batch_size:,} x {tokens:,} positions x {what} {width:,} = {elements:,} elements in"
            f" one activation, more than the {MAX_TENSOR_ELEMENTS:,} a Core ML tensor can address; use a smaller"
            " batch or sequence"
        )


def _layer_count(names: list[str], pattern: re.Pattern[str]) -> int:
    found = {int(m.group(1)) for name in names if (m := pattern.match(name))}
    return max(found) + 1 if found else 0


def check_sizes_against_checkpoint(
    spec: TextSpec, names: list[str], shape_of: Callable[[str], tuple[int, ...]], source: str, prefix: str = "",
) -> None:
    """The config's sizes against the checkpoint's headers, before anything is built: every
    disagreement in one CheckpointError naming the config field, its value and the tensor."""
    problems: list[str] = []
    present = set(names)

    def expect(name: str, shape: tuple[int, ...], fields: str) -> None:
        stored = prefix + name
        if stored in present and shape_of(stored) != shape:
            problems.append(
                f"{fields} give {stored!r} the shape {list(shape)}, but the checkpoint stores {list(shape_of(stored))}"
            )

    if isinstance(spec, DecoderSpec):
        layers = _layer_count(names, _DECODER_LAYER)
        e, h, hkv, d, m = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.intermediate_size
        expect("model.embed_tokens.weight", (spec.vocab_size, e), f"vocab_size {spec.vocab_size:,}, hidden_size {e:,}")
        layer0 = "model.layers.0."
        heads = f"num_attention_heads {h:,}, num_key_value_heads {hkv:,}, head_dim {d:,}, hidden_size {e:,}"
        if spec.fused_qkv:
            expect(layer0 + "self_attn.qkv_proj.weight", ((h + 2 * hkv) * d, e), heads)
        else:
            expect(layer0 + "self_attn.q_proj.weight", (h * d, e), heads)
            expect(layer0 + "self_attn.k_proj.weight", (hkv * d, e), heads)
        expect(layer0 + "mlp.down_proj.weight", (e, m), f"hidden_size {e:,}, intermediate_size {m:,}")
    else:
        bare = [name[len(prefix):] for name in names if name.startswith(prefix)]
        layers = _layer_count(bare, re.compile(spec.layer_pattern))
        for name, shape, fields in spec.header_shapes():
            expect(name, shape, fields)
    if layers != spec.num_layers:
        problems.append(f"num_hidden_layers is {spec.num_layers:,}, but the checkpoint's tensors hold {layers:,} layers")
    if problems:
        raise CheckpointError(f"{source}: the config's sizes disagree with the checkpoint's tensors", problems)
