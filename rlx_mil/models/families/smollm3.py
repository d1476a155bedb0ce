"""SmolLM3 (`smollm3`): the Llama block with RoPE skipped on every few layers (NoPE layers,
`no_rope_layers`), optionally sliding windows on those."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.families.llama import NO_TOKEN_IDS
from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import (
    GATE_ACTIVATIONS,
    ROPE_LEGACY_KEYS,
    DecoderSpec,
    Fields,
    decoder_common,
    layer_types,
    read_rope,
)

#: transformers 5.23.0 SmolLM3Config defaults (`default_theta` 2e6).
SMOLLM3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "pad_token_id": 128004,
    "bos_token_id": 128000, "eos_token_id": 128001, "rope_parameters": None, "use_sliding_window": False,
    "sliding_window": None, "no_rope_layers": None, "no_rope_layer_interval": 4, "layer_types": None,
    "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "tie_word_embeddings": True,
}
DEFAULT_THETA = 2_000_000.0


@decoder_family("smollm3", name="SmolLM3", defaults=SMOLLM3_DEFAULTS, config_class="SmolLM3Config",
                legacy=(*ROPE_LEGACY_KEYS, "head_dim"),
                tiny={**SMOLLM3_DEFAULTS, **NO_TOKEN_IDS, "architectures": ["SmolLM3ForCausalLM"], "vocab_size": 96,
                      "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "max_position_embeddings": 256, "no_rope_layer_interval": 2,
                      "no_rope_layers": [1, 0, 1], "layer_types": ["full_attention"] * 3,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0}})
def read_smollm3(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    rope, _ = read_rope(f, c["head_dim"], default_theta=DEFAULT_THETA)
    layers = c["num_layers"]
    interval = f.int_("no_rope_layer_interval")
    uses_rope = f.config.get("no_rope_layers")
    if uses_rope is None:
        uses_rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(uses_rope, list) or len(uses_rope) < layers or any(v not in (0, 1) for v in uses_rope):
        raise f.refuse("no_rope_layers", uses_rope, f"expected a list of at least {layers} entries 1 (RoPE) or 0 (NoPE)")
    window = f.opt_int("sliding_window") if f.bool_("use_sliding_window") else None
    default = ["sliding_attention" if window is not None and not uses_rope[i] else "full_attention" for i in range(layers)]
    types = layer_types(f, default)
    bias = f.bool_("attention_bias")
    return DecoderSpec(**c, rope=rope, layer_ropes=tuple(rope if uses_rope[i] else None for i in range(layers)),
                       qkv_bias=bias, o_bias=bias, mlp_bias=f.bool_("mlp_bias"),
                       layer_windows=tuple(window if kind == "sliding_attention" else None for kind in types))
