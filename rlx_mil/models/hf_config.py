"""Hugging Face `config.json` -> the architecture description the builders take.

Each family (`rlx_mil.models.families`) reads the transformers field names (`hidden_size`,
`num_key_value_heads`, `rope_parameters`, `sliding_window`, ...), with every missing field
taken from the family's table of transformers' own config-class defaults. A field whose value
changes the math in a way the builders do not implement, and a field the family does not
know, is refused with an `UnsupportedConfigError` naming the field and value, never ignored:
a silently wrong model is worse than no model.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rlx_mil.errors import CheckpointError, UnsupportedConfigError
from rlx_mil.fileio import nesting_depth, read_regular_file
from rlx_mil.models.rope import RopeSpec, config_refusal


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
    #: The feed-forward module and its fused gate-and-up (gate rows first) and down projections.
    mlp_names: tuple[str, str, str] = ("mlp", "gate_up_proj", "down_proj")
    #: Module path of the decoder stack ("model", or "model.language_model" in a VLM checkpoint).
    root: str = "model"
    #: Stored tensors text generation does not read (a vision tower, MTP heads): regexes.
    ignored_tensors: tuple[str, ...] = ()
    #: Per layer: its RoPE, or None for a layer without (SmolLM3's NoPE layers); () = `rope` everywhere.
    layer_ropes: tuple[RopeSpec | None, ...] = ()
    #: Granite: the attention and MLP outputs are multiplied by it before the residual add.
    residual_scale: float | None = None
    #: Granite: logits are multiplied by it (1 / logits_scaling).
    logits_scale: float | None = None
    #: Gemma 2 / 3: the residual stream is held divided by this power of two (see
    #: `rlx_mil.models.decoder`), which keeps their large activations inside fp16's range.
    stream_scale: float | None = None

    def rope_of(self, layer: int) -> RopeSpec | None:
        return self.layer_ropes[layer] if self.layer_ropes else self.rope


#: Stored tensors a BERT-style encoder never reads: the pooler / pretraining heads and buffers.
BERT_IGNORED = (r"pooler\..*", r"cls\..*", r"embeddings\.position_ids", r"lm_head\..*", r"classifier\..*")


@dataclass(frozen=True)
class EncoderSpec:
    """A BERT-style post-LN encoder (BERT, MiniLM, RoBERTa, XLM-RoBERTa, sentence-transformers
    models); subclasses with their own `build_graph` (ModernBERT) share the options and pooling."""

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
    #: RoBERTa / XLM-RoBERTa: token i's position is padding_idx + 1 + (its index among the
    #: non-padding tokens), padding tokens' is padding_idx (None: BERT's 0, 1, 2, ...).
    padding_idx: int | None = None
    #: The module a task model (`BertForMaskedLM`, `XLMRobertaModel` inside a classifier, ...)
    #: stores the encoder under; checkpoints store names with or without it.
    base_prefix: str = "bert"
    #: Stored tensors the encoder never reads (regexes on the names less `base_prefix`).
    ignored_tensors: tuple[str, ...] = BERT_IGNORED
    #: The pooling when neither the caller nor a sentence-transformers config names one.
    default_pooling: str | None = None

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the position table covers."""
        return self.max_position_embeddings - (0 if self.padding_idx is None else self.padding_idx + 1)

    #: Stored layer names (less the prefix); group 1 is the layer index.
    layer_pattern: ClassVar[str] = r"encoder\.layer\.(\d+)\."

    def header_shapes(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(stored name less the prefix, the shape the config gives it, the fields that do) for
        the tensors whose shapes carry the config's sizes; the first is the token embedding."""
        e, m = self.hidden_size, self.intermediate_size
        return [
            ("embeddings.word_embeddings.weight", (self.vocab_size, e), f"vocab_size {self.vocab_size:,}, hidden_size {e:,}"),
            ("embeddings.position_embeddings.weight", (self.max_position_embeddings, e),
             f"max_position_embeddings {self.max_position_embeddings:,}, hidden_size {e:,}"),
            ("encoder.layer.0.intermediate.dense.weight", (m, e), f"intermediate_size {m:,}, hidden_size {e:,}"),
        ]


@dataclass(frozen=True)
class VisionSpec:
    """A ViT image encoder: DINOv2 (with or without registers) or the vision tower of a SigLIP /
    SigLIP2 dual encoder; graphs built by `rlx_mil.models.vision`."""

    family: str
    #: "dinov2" or "siglip": the block layout and tensor names.
    layout: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    num_channels: int
    patch_size: int
    #: The trained image (height, width) in pixels; None for SigLIP2's NaFlex patches.
    image_size: tuple[int, int] | None
    #: Side of the learned square grid of patch position embeddings.
    position_grid: int
    layer_norm_eps: float
    #: "gelu" (erf) or "gelu_tanh".
    activation: str
    qkv_bias: bool = True
    #: DINOv2: the SwiGLU feed-forward (`mlp.weights_in` gate rows first, `mlp.weights_out`).
    swiglu: bool = False
    num_register_tokens: int = 0
    #: DINOv2 with registers resizes its position grid with antialias.
    antialias: bool = False
    #: SigLIP: the multihead attention pooling head (`vision_use_head`).
    use_head: bool = True
    #: SigLIP2: pixel values arrive as patches with a mask (NaFlex).
    naflex: bool = False
    #: Where the tower's tensors live ("vision_model." in a dual-encoder folder).
    root: str = ""
    #: Stored tensors the image encoder never reads (regexes): a text tower, a mask token.
    ignored_tensors: tuple[str, ...] = ()
    #: Those a checkpoint of this family holds (name, shape), for the random checkpoints.
    unread_tensors: tuple[tuple[str, tuple[int, ...]], ...] = ()


ModelSpec = DecoderSpec | EncoderSpec | VisionSpec


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


#: Keys every transformers config may carry that do not change inference: PreTrainedConfig's
#: own fields (v5.23.0) and what older versions wrote (`torch_dtype`, generation defaults).
INERT_KEYS = frozenset({
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "auto_map",
    "use_cache", "output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "initializer_range", "tokenizer_class", "prefix",
    "task_specific_params", "finetuning_task", "torchscript", "tie_encoder_decoder", "keys_to_ignore_at_inference",
    "pretraining_tp", "cache_implementation", "max_length", "min_length", "do_sample", "temperature", "top_k",
    "top_p", "num_beams", "repetition_penalty", "use_bfloat16", "tf_legacy_loss", "return_dict_in_generate",
    "output_scores", "add_cross_attention", "cross_attention_hidden_size", "num_return_sequences",
})


def _inert(key: str) -> bool:
    return (key in INERT_KEYS or key.startswith("_") or key.endswith(("_token_id", "_token_ids", "pdrop"))
            or "dropout" in key)


class Fields:
    """Typed access to one config's fields, each missing one taken from `defaults` (the
    family's transformers config-class defaults); every refusal names the field and value."""

    def __init__(self, config: Mapping[str, Any], family: str, source: str,
                 defaults: Mapping[str, Any] | None = None) -> None:
        self.given = config
        self.config: dict[str, Any] = {**(defaults or {}), **config}
        self.family = family
        self.source = source

    def refuse(self, field: str, value: object, why: str) -> UnsupportedConfigError:
        return config_refusal(self.source, self.family, field, value, why)

    def check_known(self, known: frozenset[str]) -> None:
        """Refuse the first field that is neither the family's (`known`) nor inert."""
        for key in self.given:
            if key not in known and not _inert(key):
                raise self.refuse(key, self.given[key], "not a field of this model type that rlx_mil knows; it may"
                                  " change the architecture")

    def has(self, field: str) -> bool:
        return self.config.get(field) is not None

    def _missing(self, field: str) -> UnsupportedConfigError:
        return UnsupportedConfigError(f"{self.source}: required field {field!r} is missing", field=field)

    def int_(self, field: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.config.get(field)
        value = default if value is None else value
        if value is None:
            raise self._missing(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.refuse(field, value, f"expected an integer >= {minimum}")
        return value

    def float_(self, field: str, default: float | None = None, *, positive: bool = True) -> float:
        value = self.config.get(field)
        value = default if value is None else value
        if value is None:
            raise self._missing(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.refuse(field, value, "expected a finite number")
        if positive and value <= 0:
            raise self.refuse(field, value, "expected a positive number")
        return float(value)

    def opt_float(self, field: str) -> float | None:
        return self.float_(field) if self.has(field) else None

    def opt_int(self, field: str) -> int | None:
        return self.int_(field) if self.has(field) else None

    def bool_(self, field: str, default: bool = False) -> bool:
        value = self.config.get(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.refuse(field, value, "expected true or false")
        return value

    def choice(self, field: str, allowed: Mapping[str, str]) -> str:
        value = self.config.get(field)
        if not isinstance(value, str) or value not in allowed:
            raise self.refuse(field, value, f"implemented values are {sorted(allowed)}")
        return allowed[value]

    def must_be(self, field: str, allowed: tuple[object, ...], why: str) -> None:
        if field in self.config and self.config[field] not in allowed:
            raise self.refuse(field, self.config[field], why)


GATE_ACTIVATIONS = {"silu": "silu", "swish": "silu"}
GEMMA_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
#: Gemma 2 / 3: the residual stream is held divided by 2^6 (`DecoderSpec.stream_scale`). Gemma 3
#: 270M's hidden states reach about 104,000 in float32 (layer 14; transformers on its Q4_K_M
#: GGUF file, a few prompts), past fp16's 65,504; held / 64 they stay below 2,000, with room
#: for the larger models.
GEMMA_STREAM_SCALE = 64.0

#: Top-level RoPE fields transformers reads besides `rope_parameters` (the < 5 form).
ROPE_LEGACY_KEYS = ("rope_theta", "rope_scaling", "partial_rotary_factor", "original_max_position_embeddings")

#: Layer types a `layer_types` list may hold.
LAYER_TYPES = ("full_attention", "sliding_attention")


#: Keys of a composite config (a `...ForConditionalGeneration` wrapper with a `text_config`)
#: that transformers reads from the top level for the text decoder: the model ties its head by
#: the wrapper's own `tie_word_embeddings`.
WRAPPER_KEYS = ("tie_word_embeddings",)


def text_config_fields(wrapper: Fields, text: Mapping[str, Any]) -> dict[str, Any]:
    """A composite config's `text_config` fields, with the top-level keys transformers reads
    for the text decoder (WRAPPER_KEYS) put over them where the top level gives them."""
    given = dict(text)
    for key in WRAPPER_KEYS:
        if key in wrapper.given:
            given[key] = wrapper.given[key]
    return given


def decoder_common(f: Fields, *, head_dim_default: int | None = None) -> dict[str, Any]:
    """The fields every decoder family reads, as DecoderSpec keyword arguments (RoPE apart)."""
    hidden = f.int_("hidden_size")
    heads = f.int_("num_attention_heads")
    kv_heads = f.int_("num_key_value_heads", heads)  # transformers: None -> num_attention_heads
    if heads % kv_heads:
        raise f.refuse("num_key_value_heads", kv_heads, f"must divide num_attention_heads {heads}")
    if not f.has("head_dim") and head_dim_default is None and hidden % heads:
        raise f.refuse("num_attention_heads", heads, f"must divide hidden_size {hidden} when head_dim is not given")
    head_dim = f.int_("head_dim", hidden // heads if head_dim_default is None else head_dim_default)
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
        "rms_norm_eps": f.float_("rms_norm_eps"),
        "max_position_embeddings": f.int_("max_position_embeddings"),
        "tie_word_embeddings": f.bool_("tie_word_embeddings"),
    }


def layer_types(f: Fields, default: list[str]) -> tuple[str, ...]:
    """The per-layer attention types: the config's `layer_types` list, else `default` (what the
    family's transformers config builds when the list is absent)."""
    layers = len(default)
    given = f.config.get("layer_types")
    if given is None:
        return tuple(default)
    if not isinstance(given, list) or len(given) != layers:
        raise f.refuse("layer_types", given, f"expected a list of {layers} layer types")
    for kind in given:
        if kind not in LAYER_TYPES:
            raise f.refuse("layer_types", given, f"entries must be one of {list(LAYER_TYPES)}")
    return tuple(given)


def windows_of(types: tuple[str, ...], window: int | None) -> tuple[int | None, ...]:
    """Per layer: `window` for sliding layers (None: full attention), None for full ones."""
    return tuple(window if kind == "sliding_attention" else None for kind in types)


def read_rope(f: Fields, head_dim: int, *, default_theta: float = 10000.0,
              types: tuple[str, ...] = (), partial_default: float = 1.0,
              partial: bool = False) -> tuple[RopeSpec, tuple[RopeSpec | None, ...]]:
    """(the model's RoPE, per-layer RoPEs or () when every layer has the same) from either
    config form: `rope_theta` + `rope_scaling`, or `rope_parameters` (flat or per layer type).
    `partial`: the family rotates `partial_rotary_factor` of each head (else a factor < 1 is refused)."""
    from rlx_mil.models.rope import RopeReader

    reader = RopeReader(f.config, f.source, f.family, partial=partial or partial_default != 1.0)
    field, params = reader.parameters(types)
    limit = f.int_("max_position_embeddings")

    def spec(params: Mapping[str, Any], where: str) -> RopeSpec:
        return reader.spec(params, where, head_dim=head_dim, default_theta=default_theta,
                           max_position_embeddings=limit, partial_default=partial_default)

    if params and all(isinstance(v, dict) or v is None for v in params.values()) and set(params) <= set(types):
        by_type = {kind: spec(params[kind] or {}, f"{field}.{kind}") for kind in params}
        missing = sorted(set(types) - set(by_type))
        if missing:
            raise f.refuse(field, params, f"has no RoPE for layer type {missing[0]!r}")
        ropes = tuple(by_type[kind] for kind in types)
        return ropes[0], ropes
    return spec(params, field), ()


def layer_type_ropes(f: Fields, head_dim: int, thetas: Mapping[str, tuple[str, float]], *, scaled: tuple[str, ...],
                     what: str) -> dict[str, RopeSpec]:
    """One RoPE per layer type, as the `convert_rope_params_to_dict` of Gemma 3's and
    ModernBERT's config classes read it: `rope_parameters` nested by layer type (`thetas`'
    keys), `rope_scaling` (the < 5 form) merged into the types in `scaled`, and each type's
    base from its dict, else the top-level field `thetas[kind][0]`, else `thetas[kind][1]`."""
    import copy

    from rlx_mil.models.rope import RopeReader

    reader = RopeReader(f.config, f.source, f.family)
    given = f.config.get("rope_parameters")
    if given is not None and (not isinstance(given, dict) or not set(given) <= set(thetas)):
        raise f.refuse("rope_parameters", given, f"{what} takes one RoPE dict per layer type"
                       f" ({', '.join(repr(kind) for kind in thetas)})")
    scaling = f.config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise f.refuse("rope_scaling", scaling, "expected an object or null")
    out: dict[str, RopeSpec] = {}
    for kind, (theta_field, theta_default) in thetas.items():
        own = (given or {}).get(kind)
        if own is not None and not isinstance(own, dict):
            raise f.refuse(f"rope_parameters.{kind}", own, "expected an object or null")
        params: dict[str, Any] = copy.deepcopy(own) if own else {"rope_type": "default"}
        if scaling is not None and kind in scaled:
            params = {**params, **scaling}
        params.setdefault("rope_theta", f.float_(theta_field, theta_default))
        out[kind] = reader.spec(params, f"rope_parameters.{kind}", head_dim=head_dim, default_theta=params["rope_theta"],
                                max_position_embeddings=f.int_("max_position_embeddings"))
    return out
