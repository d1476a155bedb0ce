"""IBM Granite 3.x dense decoders (`granite`): the Llama block with its four multipliers."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.families.llama import TINY_LLAMA, default_rope
from rlx_mil.models.family_registry import decoder_family
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
                      "rope_parameters": default_rope(10000.0),
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


#: transformers 5.23.0 GraniteMoeHybridConfig defaults.
GRANITE4_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "pad_token_id": None, "bos_token_id": 1,
    "eos_token_id": 2, "tie_word_embeddings": False, "rope_parameters": None, "attention_bias": False,
    "attention_dropout": 0.0, "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
    "attention_multiplier": 1.0, "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
    "router_aux_loss_coef": 0.001, "shared_intermediate_size": 1024, "position_embedding_type": None,
    "layer_types": None, "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_head": "auto",
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False,
    "time_step_limit": [0.0, float("inf")],
}
#: transformers' names for attention layers (`attention` is what configs before 5 wrote).
_ATTENTION_LAYERS = ("full_attention", "attention")


@decoder_family("granitemoehybrid", name="Granite 4", defaults=GRANITE4_DEFAULTS,
                config_class="GraniteMoeHybridConfig", legacy=(*ROPE_LEGACY_KEYS, "head_dim", "normalization_function"),
                tiny={**{k: v for k, v in GRANITE4_DEFAULTS.items() if k != "time_step_limit"},
                      **TINY_LLAMA, "architectures": ["GraniteMoeHybridForCausalLM"], "tie_word_embeddings": True,
                      "rope_parameters": default_rope(10000.0),
                      "embedding_multiplier": 12.0, "logits_scaling": 4.0, "residual_multiplier": 0.22,
                      "attention_multiplier": 0.0078125, "num_local_experts": 0, "num_experts_per_tok": 0,
                      "shared_intermediate_size": 48, "position_embedding_type": "rope",
                      "layer_types": ["attention", "attention"], "mamba_n_heads": 4, "mamba_d_head": 16})
def read_granite4(f: Fields) -> DecoderSpec:
    """Granite 4 dense (granite-4.0-micro's layout: `granitemoehybrid` with attention layers only
    and no experts): Granite 3's multipliers, the feed-forward as `shared_mlp.input_linear`
    (gate and up, gate first) and `output_linear`, RoPE only with position_embedding_type "rope"."""
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    types = f.config.get("layer_types")
    if types is None:  # GraniteMoeHybridConfig's default: every layer Mamba
        types = ["linear_attention"] * c["num_layers"]
    if not isinstance(types, list) or len(types) != c["num_layers"] or any(t not in _ATTENTION_LAYERS for t in types):
        raise f.refuse("layer_types", types, "only attention layers are built (Granite 4 dense); Mamba layers"
                       " ('mamba' / 'linear_attention') are not")
    if f.int_("num_local_experts", minimum=0):
        raise f.refuse("num_local_experts", f.config["num_local_experts"], "mixture-of-experts layers are not built")
    f.must_be("normalization_function", ("rmsnorm",), "only RMSNorm is built")
    kind = f.config.get("position_embedding_type")
    if kind not in (None, "rope", "nope"):
        raise f.refuse("position_embedding_type", kind, "implemented values are 'rope', 'nope' and null")
    rope, _ = read_rope(f, c["head_dim"])
    c["intermediate_size"] = f.int_("shared_intermediate_size")
    bias = f.bool_("attention_bias")
    return DecoderSpec(**c, rope=rope, layer_ropes=(rope if kind == "rope" else None,) * c["num_layers"],
                       qkv_bias=bias, o_bias=bias, layer_windows=(None,) * c["num_layers"],
                       fused_gate_up=True, mlp_names=("shared_mlp", "input_linear", "output_linear"),
                       embed_scale=f.float_("embedding_multiplier"), score_scale=f.float_("attention_multiplier"),
                       residual_scale=f.float_("residual_multiplier"), logits_scale=1.0 / f.float_("logits_scaling"))
