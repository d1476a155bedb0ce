"""Mixture-of-experts decoders: Qwen3-MoE (`qwen3_moe`), Qwen2-MoE (`qwen2_moe`) and OLMoE
(`olmoe`); graphs built by `rlx_mil.models.moe`.

Defaults: transformers' config classes at commit 008e574 (the 5.x development line; the same
field sets and values as the other records' 5.23.0 tables for these classes)."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import GATE_ACTIVATIONS, ROPE_LEGACY_KEYS, Fields, decoder_common, read_rope
from rlx_mil.models.moe import MoeSpec

_TOKENS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}

#: transformers Qwen3MoeConfig defaults.
QWEN3_MOE_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
    "rope_parameters": None, "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096,
    "attention_dropout": 0.0, "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
    "num_experts": 128, "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001,
    "mlp_only_layers": None, **_TOKENS,
}

#: transformers Qwen2MoeConfig defaults.
QWEN2_MOE_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu", "max_position_embeddings": 32768,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
    "rope_parameters": None, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    "attention_dropout": 0.0, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False,
    "output_router_logits": False, "router_aux_loss_coef": 0.001, "mlp_only_layers": None, "qkv_bias": True,
    "layer_types": None, **_TOKENS,
}

#: transformers OlmoeConfig defaults.
OLMOE_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 16, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 4096,
    "initializer_range": 0.02, "rms_norm_eps": 1e-5, "use_cache": True, "pad_token_id": 1, "bos_token_id": None,
    "eos_token_id": 50279, "tie_word_embeddings": False, "rope_parameters": None, "attention_bias": False,
    "attention_dropout": 0.0, "clip_qkv": None, "num_experts_per_tok": 8, "num_experts": 64,
    "output_router_logits": False, "router_aux_loss_coef": 0.01, "norm_topk_prob": False,
}

_TINY: dict[str, Any] = {
    "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_act": "silu", "max_position_embeddings": 256, "initializer_range": 0.02, "use_cache": True,
    "attention_dropout": 0.0, "tie_word_embeddings": False, "output_router_logits": False, **_TOKENS,
}


def _experts(f: Fields) -> dict[str, Any]:
    experts = f.int_("num_experts")
    top_k = f.int_("num_experts_per_tok")
    if top_k > experts:
        raise f.refuse("num_experts_per_tok", top_k, f"picks more experts than the {experts} there are")
    return {"num_experts": experts, "top_k": top_k, "norm_topk_prob": f.bool_("norm_topk_prob")}


def _sparse_layers(f: Fields, layers: int) -> tuple[bool, ...]:
    """transformers' Qwen2/Qwen3-MoE decoder layer: the mixture unless the layer is in
    `mlp_only_layers`, and only every `decoder_sparse_step`-th layer."""
    step = f.int_("decoder_sparse_step")
    only = f.config.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise f.refuse("mlp_only_layers", only, "expected a list of layer indices")
    return tuple(i not in only and (i + 1) % step == 0 for i in range(layers))


@decoder_family("qwen3_moe", name="Qwen3-MoE", defaults=QWEN3_MOE_DEFAULTS, config_class="Qwen3MoeConfig",
                legacy=(*ROPE_LEGACY_KEYS, "head_dim", "max_window_layers", "num_local_experts"),
                tiny={**_TINY, "architectures": ["Qwen3MoeForCausalLM"], "head_dim": 16, "intermediate_size": 64,
                      "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                      "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
                      "decoder_sparse_step": 1, "moe_intermediate_size": 16, "num_experts_per_tok": 2,
                      "num_experts": 4, "norm_topk_prob": True, "router_aux_loss_coef": 0.001, "mlp_only_layers": []})
def read_qwen3_moe(f: Fields) -> MoeSpec:
    # Qwen3MoeAttention is Qwen3's (head_dim read when the config carries it, per-head q/k norms);
    # its sliding window, when use_sliding_window is set, covers every layer.
    if f.has("num_local_experts") and not f.given.get("num_experts"):
        f.config["num_experts"] = f.config["num_local_experts"]
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    rope, _ = read_rope(f, c["head_dim"])
    bias = f.bool_("attention_bias")
    window = f.opt_int("sliding_window") if f.bool_("use_sliding_window") else None
    return MoeSpec(
        **c, rope=rope, qkv_bias=bias, o_bias=bias, qk_norm=True, layer_windows=(window,) * c["num_layers"],
        **_experts(f), expert_size=f.int_("moe_intermediate_size"), sparse_layers=_sparse_layers(f, c["num_layers"]),
    )


@decoder_family("qwen2_moe", name="Qwen2-MoE", defaults=QWEN2_MOE_DEFAULTS, config_class="Qwen2MoeConfig",
                legacy=(*ROPE_LEGACY_KEYS, "head_dim"),
                tiny={**QWEN2_MOE_DEFAULTS, **_TINY, "architectures": ["Qwen2MoeForCausalLM"], "intermediate_size": 48,
                      "rms_norm_eps": 1e-6,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "use_sliding_window": False,
                      "decoder_sparse_step": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
                      "num_experts_per_tok": 2, "num_experts": 4, "norm_topk_prob": False, "qkv_bias": True,
                      "mlp_only_layers": None})
def read_qwen2_moe(f: Fields) -> MoeSpec:
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    if f.bool_("use_sliding_window"):
        raise f.refuse("use_sliding_window", True, "Qwen2-MoE's sliding-window layers are not built")
    rope, _ = read_rope(f, c["head_dim"])
    return MoeSpec(
        **c, rope=rope, qkv_bias=f.bool_("qkv_bias"), layer_windows=(None,) * c["num_layers"], **_experts(f),
        expert_size=f.int_("moe_intermediate_size"), sparse_layers=_sparse_layers(f, c["num_layers"]),
        shared_expert_size=f.int_("shared_expert_intermediate_size", minimum=0),
    )


@decoder_family("olmoe", name="OLMoE", defaults=OLMOE_DEFAULTS, config_class="OlmoeConfig",
                legacy=(*ROPE_LEGACY_KEYS, "num_local_experts"),
                tiny={**_TINY, "architectures": ["OlmoeForCausalLM"], "intermediate_size": 16, "rms_norm_eps": 1e-5,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "attention_bias": False,
                      "clip_qkv": None, "num_experts_per_tok": 2, "num_experts": 4, "router_aux_loss_coef": 0.01,
                      "norm_topk_prob": False})
def read_olmoe(f: Fields) -> MoeSpec:
    if f.has("num_local_experts") and not f.given.get("num_experts"):
        f.config["num_experts"] = f.config["num_local_experts"]
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    if c["num_heads"] * c["head_dim"] != c["hidden_size"]:
        raise f.refuse("num_attention_heads", c["num_heads"],
                       "OLMoE's q_norm spans hidden_size, so the heads must divide it exactly")
    rope, _ = read_rope(f, c["head_dim"])
    bias = f.bool_("attention_bias")
    return MoeSpec(
        **c, rope=rope, qkv_bias=bias, o_bias=bias, layer_windows=(None,) * c["num_layers"], **_experts(f),
        expert_size=c["intermediate_size"], sparse_layers=(True,) * c["num_layers"], full_qk_norm=True,
        clip_qkv=f.opt_float("clip_qkv"),
    )
