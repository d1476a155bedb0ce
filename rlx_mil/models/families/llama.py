"""Llama 2 / 3 / 3.1 / 3.2 (`llama`) and Mistral (`mistral`)."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import (
    GATE_ACTIVATIONS,
    ROPE_LEGACY_KEYS,
    DecoderSpec,
    Fields,
    decoder_common,
    read_rope,
)

#: transformers 5.23.0 LlamaConfig defaults.
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "pad_token_id": None, "bos_token_id": 1,
    "eos_token_id": 2, "pretraining_tp": 1, "tie_word_embeddings": False, "rope_parameters": None,
    "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "head_dim": None,
}

#: transformers 5.23.0 MistralConfig defaults.
MISTRAL_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
    "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    "rope_parameters": None, "sliding_window": 4096, "attention_dropout": 0.0,
}

#: The tiny decoders' sizes. A family's tiny config is its defaults table updated with these and
#: its own fields, as transformers' `to_dict()` writes a config: every field of the config class,
#: RoPE as `rope_parameters`; fields transformers derives when null (`head_dim`, `layer_types`)
#: stay null, so a test or the demo that resizes a tiny config gets them derived again.
TINY_LLAMA: dict[str, Any] = {
    "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
}
#: No special token ids: random tiny models have no tokenizer of their own.
NO_TOKEN_IDS: dict[str, Any] = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def default_rope(theta: float, **extra: Any) -> dict[str, Any]:
    """A `rope_parameters` dict as transformers 5 writes a default RoPE."""
    return {"rope_type": "default", "rope_theta": theta, **extra}


@decoder_family("llama", name="Llama", defaults=LLAMA_DEFAULTS, config_class="LlamaConfig", legacy=ROPE_LEGACY_KEYS,
                tiny={**LLAMA_DEFAULTS, **TINY_LLAMA, **NO_TOKEN_IDS, "architectures": ["LlamaForCausalLM"],
                      "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
                                                         "rope_theta": 10000.0}})
def read_llama(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    rope, _ = read_rope(f, c["head_dim"])
    bias = f.bool_("attention_bias")
    return DecoderSpec(**c, rope=rope, qkv_bias=bias, o_bias=bias, mlp_bias=f.bool_("mlp_bias"),
                       layer_windows=(None,) * c["num_layers"])


@decoder_family("mistral", name="Mistral", defaults=MISTRAL_DEFAULTS, config_class="MistralConfig",
                legacy=(*ROPE_LEGACY_KEYS, "layer_types"),
                tiny={**MISTRAL_DEFAULTS, **TINY_LLAMA, **NO_TOKEN_IDS, "architectures": ["MistralForCausalLM"],
                      "sliding_window": 5, "rope_parameters": default_rope(10000.0)})
def read_mistral(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    rope, _ = read_rope(f, c["head_dim"])
    window = f.opt_int("sliding_window")  # null: full attention
    # transformers' Mistral applies `sliding_window` to every layer and ignores `layer_types`
    # (that is Ministral's): a list saying otherwise is refused rather than ignored.
    kind = "sliding_attention" if window is not None else "full_attention"
    given = f.config.get("layer_types")
    if given is not None and given != [kind] * c["num_layers"]:
        raise f.refuse("layer_types", given, f"transformers' Mistral gives every layer {kind!r} (sliding_window"
                       f" {window}); per-layer types are Ministral's")
    return DecoderSpec(**c, rope=rope, layer_windows=(window,) * c["num_layers"])
