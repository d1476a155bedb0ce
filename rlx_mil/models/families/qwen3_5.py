"""Qwen3.5 small dense models: `qwen3_5` (the `Qwen3_5ForConditionalGeneration` checkpoints
Qwen publishes: the decoder's config under `text_config`, its tensors under
`model.language_model.`, a vision tower beside it) and `qwen3_5_text` (`Qwen3_5ForCausalLM`);
graphs built by `rlx_mil.models.qwen3_5`.

Defaults: transformers' Qwen3_5TextConfig / Qwen3_5Config at commit 008e574 (5.x development
line)."""

from __future__ import annotations

from typing import Any

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import (
    GATE_ACTIVATIONS,
    ROPE_LEGACY_KEYS,
    Fields,
    decoder_common,
    read_rope,
    text_config_fields,
)
from rlx_mil.models.qwen3_5 import Qwen35Spec

#: transformers Qwen3_5TextConfig defaults (plus the two its __post_init__ sets).
QWEN3_5_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
    "rope_parameters": None, "attention_bias": False, "attention_dropout": 0.0, "head_dim": 256,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "layer_types": None, "pad_token_id": None,
    "bos_token_id": None, "eos_token_id": None, "full_attention_interval": 4, "partial_rotary_factor": 0.25,
}
#: transformers Qwen3_5Config (the vision-language wrapper) defaults.
QWEN3_5_DEFAULTS: dict[str, Any] = {
    "text_config": None, "vision_config": None, "image_token_id": 248056, "video_token_id": 248057,
    "vision_start_token_id": 248053, "vision_end_token_id": 248054, "tie_word_embeddings": False,
}
#: Keys published Qwen3.5 text configs carry beside the config class's fields: the output gate
#: transformers always builds, and settings of the multi-token-prediction head it does not load.
_TEXT_LEGACY = ("attn_output_gate", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "mamba_ssm_dtype",
                "model_type", "dtype")
#: rope_parameters keys transformers' validation skips (M-RoPE: equal for text positions).
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")

_TINY_TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_text", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 256,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    "attention_bias": False, "attention_dropout": 0.0, "head_dim": 16, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
}


def _layer_kinds(f: Fields, layers: int) -> tuple[str, ...]:
    kinds = f.config.get("layer_types")
    if kinds is None:
        interval = f.int_("full_attention_interval")
        return tuple("linear_attention" if (i + 1) % interval else "attention" for i in range(layers))
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("full_attention", "linear_attention") for k in kinds):
        raise f.refuse("layer_types", kinds, f"expected {layers} entries, each 'full_attention' or 'linear_attention'")
    return tuple("attention" if k == "full_attention" else "linear_attention" for k in kinds)


def _read_text(f: Fields, root: str, ignored: tuple[str, ...]) -> Qwen35Spec:
    if f.given.get("attn_output_gate", True) is not True:
        raise f.refuse("attn_output_gate", f.given["attn_output_gate"], "transformers' Qwen3.5 attention always gates its output")
    params = f.config.get("rope_parameters")
    if isinstance(params, dict):
        f.config["rope_parameters"] = {k: v for k, v in params.items() if k not in _MROPE_KEYS}
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    rope, _ = read_rope(f, c["head_dim"], partial_default=0.25)
    key_dim, value_dim = f.int_("linear_key_head_dim"), f.int_("linear_value_head_dim")
    if key_dim != value_dim:
        raise f.refuse("linear_value_head_dim", value_dim,
                       f"the gated delta-net state is d x d: key and value heads must share a width (key {key_dim})")
    k_heads, v_heads = f.int_("linear_num_key_heads"), f.int_("linear_num_value_heads")
    if v_heads % k_heads:
        raise f.refuse("linear_num_value_heads", v_heads, f"must be a multiple of linear_num_key_heads {k_heads}")
    bias = f.bool_("attention_bias")
    return Qwen35Spec(
        **c, rope=rope, qkv_bias=bias, o_bias=bias, qk_norm=True, norm_offset=1.0, layer_windows=(None,) * c["num_layers"],
        layer_kinds=_layer_kinds(f, c["num_layers"]), root=root, ignored_tensors=ignored,
        conv_kernel=f.int_("linear_conv_kernel_dim", minimum=2),
        linear_key_heads=k_heads, linear_value_heads=v_heads, linear_head_dim=key_dim,
    )


@decoder_family("qwen3_5_text", name="Qwen3.5", defaults=QWEN3_5_TEXT_DEFAULTS, config_class="Qwen3_5TextConfig",
                legacy=(*ROPE_LEGACY_KEYS, *_TEXT_LEGACY),
                tiny={**_TINY_TEXT, "architectures": ["Qwen3_5ForCausalLM"], "layer_types": None,
                      "full_attention_interval": 2, "tie_word_embeddings": True})
def read_qwen3_5_text(f: Fields) -> Qwen35Spec:
    return _read_text(f, "model", (r"mtp\..*",))


@decoder_family("qwen3_5", name="Qwen3.5", defaults=QWEN3_5_DEFAULTS, config_class="Qwen3_5Config",
                tiny={"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": _TINY_TEXT,
                      "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16,
                                        "hidden_act": "gelu_pytorch_tanh", "intermediate_size": 32, "num_heads": 2,
                                        "in_channels": 3, "patch_size": 4, "spatial_merge_size": 2,
                                        "temporal_patch_size": 2, "out_hidden_size": 32, "num_position_embeddings": 16,
                                        "initializer_range": 0.02},
                      "image_token_id": 95, "video_token_id": 94, "vision_start_token_id": 93, "vision_end_token_id": 92,
                      "tie_word_embeddings": False})
def read_qwen3_5(f: Fields) -> Qwen35Spec:
    text = f.config.get("text_config")
    if not isinstance(text, dict):
        raise UnsupportedConfigError(f"{f.source}: a qwen3_5 config needs a text_config object", field="text_config", value=text)
    # transformers 5 ties the head by the wrapper's top-level tie_word_embeddings (checkpoints it
    # writes say true at the top, false in text_config, and hold no lm_head.weight).
    given = text_config_fields(f, text)
    inner = Fields(given, f.family, f"{f.source} text_config", QWEN3_5_TEXT_DEFAULTS)
    inner.check_known(frozenset(QWEN3_5_TEXT_DEFAULTS) | frozenset(ROPE_LEGACY_KEYS) | frozenset(_TEXT_LEGACY))
    return _read_text(inner, "model.language_model", (r"model\.visual\..*", r"mtp\..*"))
