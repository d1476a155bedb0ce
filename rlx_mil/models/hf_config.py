"""Hugging Face `config.json` -> the architecture description the builders take.

Each family reads the transformers field names (`hidden_size`, `num_key_value_heads`,
`rope_scaling`, `sliding_window`, ...). A field whose value changes the math in a way the
builders do not implement is refused with an `UnsupportedConfigError` naming the field and
value, never ignored: a silently wrong model is worse than no model.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx_mil.errors import CheckpointError, UnsupportedConfigError
from rlx_mil.fileio import nesting_depth, read_regular_file

DECODER_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "phi3")
ENCODER_FAMILIES = ("bert",)
#: model_type values read as one of the families above.
MODEL_TYPE_ALIASES = {"minilm": "bert"}


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding: frequencies `theta ** (-2i / rotary_dim)`, rescaled per `scaling`."""

    theta: float
    rotary_dim: int
    #: None, "linear" or "llama3".
    scaling: str | None = None
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    #: Per-frequency divisors (GGUF's `rope_freqs` tensor, how llama.cpp stores Llama 3.1's
    #: scaling): frequency i is `theta ** (-2i / rotary_dim) / freq_factors[i]`.
    freq_factors: tuple[float, ...] | None = None


@dataclass(frozen=True)
class DecoderSpec:
    """A pre-norm decoder-only transformer, normalised across the families."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeSpec
    max_position_embeddings: int
    tie_word_embeddings: bool
    #: "silu" or "gelu_tanh" applied to the gate of the gated MLP.
    activation: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    #: Qwen3: RmsNorm over head_dim on q and k before RoPE.
    qk_norm: bool = False
    #: Gemma: norms scale by (1 + weight).
    norm_offset: float = 0.0
    #: Gemma: embeddings are multiplied by sqrt(hidden_size).
    embed_scale: float | None = None
    #: Gemma 2: post-attention norm on the attention output, pre/post feed-forward norms.
    sandwich_norms: bool = False
    #: None: head_dim ** -0.5.
    score_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    #: Per layer: the Hugging Face sliding window W (keys visible incl. the query's own) or None.
    layer_windows: tuple[int | None, ...] = ()
    #: Phi-3: one qkv_proj and one gate_up_proj weight.
    fused_qkv: bool = False
    fused_gate_up: bool = False


@dataclass(frozen=True)
class EncoderSpec:
    """A BERT-style post-LN encoder (BERT, MiniLM, sentence-transformers models)."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    #: "gelu" (erf) or "gelu_tanh".
    activation: str = "gelu"


ModelSpec = DecoderSpec | EncoderSpec


#: config.json files are a few kilobytes; anything near this is not one.
MAX_CONFIG_BYTES = 16 * 2**20
#: config.json nests a few levels (rope_scaling, quantization_config, text_config...).
MAX_CONFIG_DEPTH = 64


def read_json_file(file: Path, limit: int) -> Any:
    """The JSON document in regular file `file` (at most `limit` bytes, nesting bounded), or a
    typed CheckpointError naming the file; devices, FIFOs and folders are refused up front
    (typed FileAccessError)."""
    raw = read_regular_file(file, limit, CheckpointError, what="JSON file")
    depth = nesting_depth(raw)
    if depth > MAX_CONFIG_DEPTH:
        raise CheckpointError(f"{file}: not readable JSON (nests {depth} levels deep, more than the limit of {MAX_CONFIG_DEPTH})")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{file}: not readable JSON ({err})") from None


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed `config.json` of a checkpoint folder (or the file itself)."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.exists():
        raise CheckpointError(f"{file}: no config.json (a Hugging Face checkpoint folder holds config.json and *.safetensors)")
    config = read_json_file(file, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise CheckpointError(f"{file}: the top level is not a JSON object")
    return config


class _Fields:
    """Typed access to config fields; every refusal names the field and value."""

    def __init__(self, config: Mapping[str, Any], family: str, source: str) -> None:
        self.config = config
        self.family = family
        self.source = source

    def refuse(self, field: str, value: object, why: str) -> UnsupportedConfigError:
        return UnsupportedConfigError(
            f"{self.source}: {field} = {json.dumps(value)} is not supported for {self.family}: {why}",
            field=field, value=value,
        )

    def has(self, field: str) -> bool:
        return self.config.get(field) is not None

    def int_(self, field: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.config.get(field, default)
        if value is None:
            raise UnsupportedConfigError(f"{self.source}: required field {field!r} is missing", field=field)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.refuse(field, value, f"expected an integer >= {minimum}")
        return value

    def float_(self, field: str, default: float | None = None, *, positive: bool = True) -> float:
        value = self.config.get(field, default)
        if value is None:
            raise UnsupportedConfigError(f"{self.source}: required field {field!r} is missing", field=field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.refuse(field, value, "expected a finite number")
        if positive and value <= 0:
            raise self.refuse(field, value, "expected a positive number")
        return float(value)

    def opt_float(self, field: str) -> float | None:
        return self.float_(field) if self.has(field) else None

    def bool_(self, field: str, default: bool) -> bool:
        value = self.config.get(field, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.refuse(field, value, "expected true or false")
        return value

    def choice(self, field: str, default: str | None, allowed: Mapping[str, str]) -> str:
        value = self.config.get(field, default)
        if not isinstance(value, str) or value not in allowed:
            raise self.refuse(field, value, f"implemented values are {sorted(allowed)}")
        return allowed[value]

    def must_be(self, field: str, allowed: tuple[object, ...], why: str) -> None:
        if field in self.config and self.config[field] not in allowed:
            raise self.refuse(field, self.config[field], why)


_GATE_ACTIVATIONS = {"silu": "silu", "swish": "silu"}
_GEMMA_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
_BERT_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def _rope(f: _Fields, head_dim: int) -> RopeSpec:
    theta = f.float_("rope_theta", 10000.0)
    partial = f.float_("partial_rotary_factor", 1.0)
    rotary_dim = int(head_dim * partial)
    if not 0 < partial <= 1 or rotary_dim % 2:
        raise f.refuse("partial_rotary_factor", partial, f"needs an even rotary width <= head_dim {head_dim}")
    scaling = f.config.get("rope_scaling")
    if scaling is None:
        return RopeSpec(theta, rotary_dim)
    if not isinstance(scaling, dict):
        raise f.refuse("rope_scaling", scaling, "expected an object or null")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return RopeSpec(theta, rotary_dim)
    sub = _Fields(scaling, f.family, f"{f.source} rope_scaling")
    if kind == "linear":
        return RopeSpec(theta, rotary_dim, "linear", factor=sub.float_("factor"))
    if kind == "llama3":
        low, high = sub.float_("low_freq_factor"), sub.float_("high_freq_factor")
        if high <= low:
            raise f.refuse("rope_scaling", scaling, "llama3 scaling needs high_freq_factor > low_freq_factor")
        return RopeSpec(
            theta, rotary_dim, "llama3", factor=sub.float_("factor"), low_freq_factor=low, high_freq_factor=high,
            original_max_position_embeddings=sub.int_("original_max_position_embeddings"),
        )
    raise f.refuse("rope_scaling", scaling, "implemented rope_type values are 'default', 'linear' and 'llama3'")


def _common(f: _Fields) -> dict[str, Any]:
    hidden = f.int_("hidden_size")
    heads = f.int_("num_attention_heads")
    kv_heads = f.int_("num_key_value_heads", heads)
    if heads % kv_heads:
        raise f.refuse("num_key_value_heads", kv_heads, f"must divide num_attention_heads {heads}")
    if not f.has("head_dim") and hidden % heads:
        raise f.refuse("num_attention_heads", heads, f"must divide hidden_size {hidden} when head_dim is not given")
    head_dim = f.int_("head_dim", hidden // heads)
    f.must_be("attention_dropout", (0, 0.0), "dropout at inference must be 0")
    if f.has("quantization_config"):
        raise f.refuse("quantization_config", f.config["quantization_config"], "pre-quantized checkpoints are not read")
    return {
        "family": f.family,
        "vocab_size": f.int_("vocab_size"),
        "hidden_size": hidden,
        "num_layers": f.int_("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": f.int_("intermediate_size"),
        "rms_norm_eps": f.float_("rms_norm_eps", 1e-6),
        "rope": _rope(f, head_dim),
        "max_position_embeddings": f.int_("max_position_embeddings", 2048),
        "tie_word_embeddings": f.bool_("tie_word_embeddings", False),
    }


def _layer_windows(f: _Fields, windows: list[int | None], window: int | None) -> tuple[int | None, ...]:
    """Per-layer windows: `windows` by default, or an explicit `layer_types` list
    (transformers >= 4.53 writes one), whose sliding layers use `window` (None: full)."""
    layer_types = f.config.get("layer_types")
    if layer_types is None:
        return tuple(windows)
    if not isinstance(layer_types, list) or len(layer_types) != len(windows):
        raise f.refuse("layer_types", layer_types, f"expected a list of {len(windows)} layer types")
    out: list[int | None] = []
    for kind in layer_types:
        if kind not in ("full_attention", "sliding_attention"):
            raise f.refuse("layer_types", layer_types, "entries must be 'full_attention' or 'sliding_attention'")
        out.append(window if kind == "sliding_attention" else None)
    return tuple(out)


def _window(f: _Fields) -> int | None:
    return f.int_("sliding_window") if f.has("sliding_window") else None


def _llama(f: _Fields) -> DecoderSpec:
    c = _common(f)
    f.choice("hidden_act", "silu", _GATE_ACTIVATIONS)
    bias = f.bool_("attention_bias", False)
    return DecoderSpec(**c, qkv_bias=bias, o_bias=bias, mlp_bias=f.bool_("mlp_bias", False),
                       layer_windows=_layer_windows(f, [None] * c["num_layers"], None))


def _mistral(f: _Fields) -> DecoderSpec:
    c = _common(f)
    f.choice("hidden_act", "silu", _GATE_ACTIVATIONS)
    window = _window(f)
    return DecoderSpec(**c, layer_windows=_layer_windows(f, [window] * c["num_layers"], window))


def _qwen_windows(f: _Fields, layers: int) -> tuple[int | None, ...]:
    # transformers' Qwen2/Qwen3: sliding attention only with use_sliding_window, and then
    # only from layer max_window_layers on.
    if not f.bool_("use_sliding_window", False):
        return _layer_windows(f, [None] * layers, None)
    window = f.int_("sliding_window")
    first = f.int_("max_window_layers", layers, minimum=0)
    return _layer_windows(f, [window if i >= first else None for i in range(layers)], window)


def _qwen2(f: _Fields) -> DecoderSpec:
    c = _common(f)
    f.choice("hidden_act", "silu", _GATE_ACTIVATIONS)
    return DecoderSpec(**c, qkv_bias=True, layer_windows=_qwen_windows(f, c["num_layers"]))


def _qwen3(f: _Fields) -> DecoderSpec:
    c = _common(f)
    f.choice("hidden_act", "silu", _GATE_ACTIVATIONS)
    bias = f.bool_("attention_bias", False)
    return DecoderSpec(**c, qkv_bias=bias, o_bias=bias, qk_norm=True,
                       layer_windows=_qwen_windows(f, c["num_layers"]))


def _gemma2(f: _Fields) -> DecoderSpec:
    c = _common(f)
    # transformers' Gemma 2 MLP reads hidden_activation; the legacy hidden_act is not used.
    f.choice("hidden_activation", "gelu_pytorch_tanh", _GEMMA_ACTIVATIONS)
    c["tie_word_embeddings"] = f.bool_("tie_word_embeddings", True)
    bias = f.bool_("attention_bias", False)
    window = _window(f)
    # transformers' Gemma 2: even layers (0, 2, ...) use the sliding window.
    default = [window if i % 2 == 0 else None for i in range(c["num_layers"])]
    scalar = f.float_("query_pre_attn_scalar", c["head_dim"])
    return DecoderSpec(
        **c, activation="gelu_tanh", qkv_bias=bias, o_bias=bias, norm_offset=1.0,
        embed_scale=math.sqrt(c["hidden_size"]), sandwich_norms=True, score_scale=scalar**-0.5,
        attn_softcap=f.opt_float("attn_logit_softcapping"), final_softcap=f.opt_float("final_logit_softcapping"),
        layer_windows=_layer_windows(f, default, window),
    )


def _phi3(f: _Fields) -> DecoderSpec:
    c = _common(f)
    f.choice("hidden_act", "silu", _GATE_ACTIVATIONS)
    if c["rope"].scaling is not None:
        raise f.refuse("rope_scaling", f.config.get("rope_scaling"), "Phi-3's long-context (su/longrope) scaling is not implemented")
    window = _window(f)
    return DecoderSpec(**c, fused_qkv=True, fused_gate_up=True,
                       layer_windows=_layer_windows(f, [window] * c["num_layers"], window))


def _bert(f: _Fields) -> EncoderSpec:
    hidden = f.int_("hidden_size")
    heads = f.int_("num_attention_heads")
    if hidden % heads:
        raise f.refuse("num_attention_heads", heads, f"must divide hidden_size {hidden}")
    f.choice("position_embedding_type", "absolute", {"absolute": "absolute"})
    if f.bool_("is_decoder", False):
        raise f.refuse("is_decoder", True, "only the encoder form is built")
    return EncoderSpec(
        family=f.family, vocab_size=f.int_("vocab_size"), hidden_size=hidden, num_layers=f.int_("num_hidden_layers"),
        num_heads=heads, intermediate_size=f.int_("intermediate_size"),
        max_position_embeddings=f.int_("max_position_embeddings", 512), type_vocab_size=f.int_("type_vocab_size", 2),
        layer_norm_eps=f.float_("layer_norm_eps", 1e-12),
        activation=f.choice("hidden_act", "gelu", _BERT_ACTIVATIONS),
    )


_FAMILIES: dict[str, Callable[[_Fields], ModelSpec]] = {
    "llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "mistral": _mistral, "gemma2": _gemma2, "phi3": _phi3,
    "bert": _bert,
}


def model_spec(config: Mapping[str, Any], source: str = "config.json") -> ModelSpec:
    """The architecture a Hugging Face config describes, by its `model_type`."""
    model_type = config.get("model_type")
    family = MODEL_TYPE_ALIASES.get(model_type, model_type) if isinstance(model_type, str) else None
    if family not in _FAMILIES:
        raise UnsupportedConfigError(
            f"{source}: model_type = {json.dumps(model_type)} is not supported; rlx_mil builds"
            f" {', '.join(sorted(_FAMILIES))}", field="model_type", value=model_type,
        )
    assert family is not None
    return _FAMILIES[family](_Fields(config, family, source))
