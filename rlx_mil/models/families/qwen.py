"""Qwen2 / Qwen2.5 (`qwen2`) and Qwen3 (`qwen3`) dense decoders."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.families.llama import NO_TOKEN_IDS, TINY_LLAMA, default_rope
from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import (
    GATE_ACTIVATIONS,
    ROPE_LEGACY_KEYS,
    DecoderSpec,
    Fields,
    decoder_common,
    layer_types,
    read_rope,
    windows_of,
)

#: transformers 5.23.0 Qwen2Config defaults.
QWEN2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
    "rope_parameters": None, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    "layer_types": None, "attention_dropout": 0.0, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
}

#: transformers 5.23.0 Qwen3Config defaults.
QWEN3_DEFAULTS: dict[str, Any] = {
    **QWEN2_DEFAULTS, "head_dim": 128, "attention_bias": False,
}


def qwen_layers(f: Fields, layers: int) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    """transformers' Qwen2/Qwen3: (layer types, windows): `sliding_window` only with
    `use_sliding_window` (else None); by default sliding from layer `max_window_layers` on."""
    window = f.opt_int("sliding_window") if f.bool_("use_sliding_window") else None
    first = f.int_("max_window_layers", minimum=0)
    default = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(layers)]
    types = layer_types(f, default)
    return types, windows_of(types, window)


@decoder_family("qwen2", name="Qwen2", defaults=QWEN2_DEFAULTS, config_class="Qwen2Config",
                legacy=(*ROPE_LEGACY_KEYS, "head_dim"),
                tiny={**QWEN2_DEFAULTS, **TINY_LLAMA, **NO_TOKEN_IDS, "architectures": ["Qwen2ForCausalLM"],
                      "tie_word_embeddings": True, "rope_parameters": default_rope(1000000.0),
                      "use_sliding_window": False, "sliding_window": None})
def read_qwen2(f: Fields) -> DecoderSpec:
    # Qwen2 has no head_dim field; its attention reads one when the config carries it.
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    types, windows = qwen_layers(f, c["num_layers"])
    rope, ropes = read_rope(f, c["head_dim"], types=types)
    return DecoderSpec(**c, rope=rope, layer_ropes=ropes, qkv_bias=True, layer_windows=windows)


@decoder_family("qwen3", name="Qwen3", defaults=QWEN3_DEFAULTS, config_class="Qwen3Config", legacy=ROPE_LEGACY_KEYS,
                tiny={**QWEN3_DEFAULTS, **TINY_LLAMA, **NO_TOKEN_IDS, "architectures": ["Qwen3ForCausalLM"],
                      "head_dim": 16, "tie_word_embeddings": True, "rope_parameters": default_rope(1000000.0),
                      "rms_norm_eps": 1e-6, "sliding_window": None})
def read_qwen3(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    types, windows = qwen_layers(f, c["num_layers"])
    rope, ropes = read_rope(f, c["head_dim"], types=types)
    bias = f.bool_("attention_bias")
    return DecoderSpec(**c, rope=rope, layer_ropes=ropes, qkv_bias=bias, o_bias=bias, qk_norm=True,
                       layer_windows=windows)
