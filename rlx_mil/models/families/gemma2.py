"""Gemma 2 (`gemma2`)."""

from __future__ import annotations

import math
from typing import Any

from rlx_mil.models.families.llama import NO_TOKEN_IDS, TINY_LLAMA, default_rope
from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import (
    GEMMA_ACTIVATIONS,
    GEMMA_STREAM_SCALE,
    ROPE_LEGACY_KEYS,
    DecoderSpec,
    Fields,
    decoder_common,
    layer_types,
    read_rope,
    windows_of,
)

#: transformers 5.23.0 Gemma2Config defaults.
GEMMA2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True, "rope_parameters": None,
    "attention_bias": False, "attention_dropout": 0.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "layer_types": None, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
    "use_bidirectional_attention": None,
}


def gemma_sandwich(f: Fields, c: dict[str, Any]) -> dict[str, Any]:
    """What Gemma 2 and 3 share: GELU-tanh gate, (1 + w) norms, embeddings x sqrt(hidden),
    sandwich norms, query_pre_attn_scalar, causal attention only, and a residual stream held
    divided by `GEMMA_STREAM_SCALE` (fp16's range)."""
    # transformers' Gemma MLP reads hidden_activation; the legacy hidden_act is not used.
    f.choice("hidden_activation", GEMMA_ACTIVATIONS)
    if f.bool_("use_bidirectional_attention"):
        raise f.refuse("use_bidirectional_attention", True, "only causal (decoder) attention is built")
    bias = f.bool_("attention_bias")
    return {"activation": "gelu_tanh", "qkv_bias": bias, "o_bias": bias, "norm_offset": 1.0,
            "embed_scale": math.sqrt(c["hidden_size"]), "sandwich_norms": True, "stream_scale": GEMMA_STREAM_SCALE,
            "score_scale": f.float_("query_pre_attn_scalar") ** -0.5,
            "attn_softcap": f.opt_float("attn_logit_softcapping"),
            "final_softcap": f.opt_float("final_logit_softcapping")}


@decoder_family("gemma2", name="Gemma 2", defaults=GEMMA2_DEFAULTS, config_class="Gemma2Config",
                legacy=(*ROPE_LEGACY_KEYS, "hidden_act"),
                tiny={**GEMMA2_DEFAULTS, **TINY_LLAMA, **NO_TOKEN_IDS, "architectures": ["Gemma2ForCausalLM"],
                      "head_dim": 16, "rope_parameters": default_rope(10000.0),
                      "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
                      "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 24,
                      "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4})
def read_gemma2(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    # transformers' Gemma 2: even layers (0, 2, ...) slide.
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(c["num_layers"])]
    types = layer_types(f, default)
    rope, ropes = read_rope(f, c["head_dim"], types=types)  # rope_parameters may be per layer type
    return DecoderSpec(**c, rope=rope, layer_ropes=ropes, **gemma_sandwich(f, c),
                       layer_windows=windows_of(types, f.opt_int("sliding_window")))
