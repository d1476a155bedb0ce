"""Gemma 3 text decoders (`gemma3_text`: Gemma 3 270M / 1B, and the text model of the larger
ones): Gemma 2's block with q/k norms, sliding-window and global layers interleaved (five local
to one global by default), each kind with its own RoPE."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlx_mil.models.families.gemma2 import gemma_sandwich
from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import (
    DecoderSpec,
    Fields,
    decoder_common,
    layer_type_ropes,
    layer_types,
    text_config_fields,
    windows_of,
)
from rlx_mil.models.rope import RopeSpec

#: transformers 5.23.0 Gemma3TextConfig defaults (RoPE: `default_theta` global 1e6, local 1e4).
GEMMA3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True, "rope_parameters": None,
    "attention_bias": False, "attention_dropout": 0.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "layer_types": None, "final_logit_softcapping": None, "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
}
GLOBAL_THETA, LOCAL_THETA = 1_000_000.0, 10_000.0
#: transformers' default `sliding_window_pattern`: every sixth layer is global.
SLIDING_WINDOW_PATTERN = 6

TINY_GEMMA3: dict[str, Any] = {
    **GEMMA3_DEFAULTS, "architectures": ["Gemma3ForCausalLM"], "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 256, "query_pre_attn_scalar": 16, "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": GLOBAL_THETA},
                        "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA}},
}


_GEMMA3_LEGACY = ("rope_theta", "rope_scaling", "rope_local_base_freq", "sliding_window_pattern", "hidden_act")


@decoder_family("gemma3_text", name="Gemma 3", defaults=GEMMA3_DEFAULTS, config_class="Gemma3TextConfig",
                legacy=_GEMMA3_LEGACY, tiny=TINY_GEMMA3)
def read_gemma3(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    pattern = f.int_("sliding_window_pattern", SLIDING_WINDOW_PATTERN)
    default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(c["num_layers"])]
    types = layer_types(f, default)
    ropes = _ropes(f, c["head_dim"])
    layer_ropes = tuple(ropes[kind] for kind in types)
    # transformers' Gemma3Attention keeps `attn_logit_softcapping` in its config but passes no
    # softcap to the attention it calls: only `final_logit_softcapping` acts, as here.
    shared = {**gemma_sandwich(f, c), "attn_softcap": None}
    return DecoderSpec(**c, rope=layer_ropes[0], layer_ropes=layer_ropes, qk_norm=True, **shared,
                       layer_windows=windows_of(types, f.opt_int("sliding_window")))


def _ropes(f: Fields, head_dim: int) -> dict[str, RopeSpec]:
    """Gemma3TextConfig.convert_rope_params_to_dict: one RoPE per layer type; `rope_scaling`
    (the < 5 form) applies to the global layers, `rope_theta` is the global base and
    `rope_local_base_freq` the local one."""
    return layer_type_ropes(f, head_dim, {"full_attention": ("rope_theta", GLOBAL_THETA),
                                          "sliding_attention": ("rope_local_base_freq", LOCAL_THETA)},
                            scaled=("full_attention",), what="Gemma 3")


#: transformers 5.23.0 Gemma3Config (the vision-language wrapper) defaults.
GEMMA3_VLM_DEFAULTS: dict[str, Any] = {
    "text_config": None, "vision_config": None, "mm_tokens_per_image": 256, "boi_token_index": 255_999,
    "eoi_token_index": 256_000, "image_token_index": 262_144, "initializer_range": 0.02, "tie_word_embeddings": True,
}
#: The decoder's module path in the folder Gemma3ForConditionalGeneration's save_pretrained writes
#: (transformers 5); checkpoints written by transformers 4 (Google's published ones) store it as
#: `language_model.model`, which `from_pretrained` reads too.
VLM_ROOT = "model.language_model"
#: The vision tower and projector, in both layouts: text generation does not read them.
VLM_IGNORED = (r"(model\.)?vision_tower\..*", r"(model\.)?multi_modal_projector\..*", r"language_model\.lm_head\.weight")


@decoder_family("gemma3", name="Gemma 3", defaults=GEMMA3_VLM_DEFAULTS, config_class="Gemma3Config",
                legacy=("boi_token_id", "eoi_token_id", "image_token_id"),
                tiny={"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {**TINY_GEMMA3, "model_type": "gemma3_text"},
                      "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 16, "image_size": 16,
                                        "patch_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
                                        "intermediate_size": 32},
                      "mm_tokens_per_image": 4, "boi_token_index": 90, "eoi_token_index": 91,
                      "image_token_index": 92, "initializer_range": 0.02, "tie_word_embeddings": True})
def read_gemma3_vlm(f: Fields) -> DecoderSpec:
    """Gemma 3 4B and larger as published (Gemma3ForConditionalGeneration): the text decoder's
    config under `text_config`, its tensors under `model.language_model.` (or transformers 4's
    `language_model.model.`), the vision tower beside it unread."""
    text = f.config.get("text_config")
    if not isinstance(text, dict):
        raise f.refuse("text_config", text, "a gemma3 config needs its decoder's text_config object")
    if text.get("model_type", "gemma3_text") != "gemma3_text":
        raise f.refuse("text_config.model_type", text.get("model_type"), "expected 'gemma3_text'")
    given = {k: v for k, v in text_config_fields(f, text).items() if k != "model_type"}
    inner = Fields(given, f.family, f"{f.source} text_config", GEMMA3_DEFAULTS)
    inner.check_known(frozenset(GEMMA3_DEFAULTS) | frozenset(_GEMMA3_LEGACY))
    return replace(read_gemma3(inner), root=VLM_ROOT, ignored_tensors=VLM_IGNORED)
