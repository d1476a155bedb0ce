"""IBM Granite 3.x dense decoders (`granite`): the Llama block with its four multipliers."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.families import decoder_family
from rlx_mil.models.families.llama import TINY_LLAMA
from rlx_mil.models.hf_config import (
    GATE_ACTIVATIONS,
    ROPE_LEGACY_KEYS,
    DecoderSpec,
    Fields,
    decoder_common,
    read_rope,
)

#: transformers 5.23.0 GraniteConfig defaults.
GRANITE_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "pad_token_id": None, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False, "rope_parameters": None, "attention_bias": False,
    "attention_dropout": 0.0, "mlp_bias": False, "embedding_multiplier": 1.0, "logits_scaling": 1.0,
    "residual_multiplier": 1.0, "attention_multiplier": 1.0,
}


@decoder_family("granite", name="Granite", defaults=GRANITE_DEFAULTS, config_class="GraniteConfig",
                legacy=(*ROPE_LEGACY_KEYS, "head_dim"),
                tiny={**GRANITE_DEFAULTS, **TINY_LLAMA, "architectures": ["GraniteForCausalLM"],
                      "tie_word_embeddings": True, "embedding_multiplier": 12.0, "logits_scaling": 8.0,
                      "residual_multiplier": 0.22, "attention_multiplier": 0.0078125})
def read_granite(f: Fields) -> DecoderSpec:
    # GraniteAttention reads head_dim = hidden_size // num_attention_heads (no head_dim field).
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    rope, _ = read_rope(f, c["head_dim"])
    bias = f.bool_("attention_bias")
    return DecoderSpec(**c, rope=rope, qkv_bias=bias, o_bias=bias, mlp_bias=f.bool_("mlp_bias"),
                       layer_windows=(None,) * c["num_layers"],
                       embed_scale=f.float_("embedding_multiplier"), score_scale=f.float_("attention_multiplier"),
                       residual_scale=f.float_("residual_multiplier"), logits_scale=1.0 / f.float_("logits_scaling"))
