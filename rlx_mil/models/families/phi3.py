"""Phi-3 / Phi-3.5 / Phi-4-mini (`phi3`): fused projections, partial rotary, longrope."""

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
    read_rope,
)

#: transformers 5.23.0 Phi3Config defaults.
PHI3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    "attention_dropout": 0.0, "hidden_act": "silu", "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096, "initializer_range": 0.02, "rms_norm_eps": 1e-5, "use_cache": True,
    "tie_word_embeddings": False, "rope_parameters": None, "bos_token_id": 1, "eos_token_id": 32000,
    "pad_token_id": 32000, "sliding_window": None,
}

#: Fields of Microsoft's own Phi-3 / Phi-4-mini configuration code that transformers' Phi3 does
#: not read, with the only values its Phi3 model computes.
_MICROSOFT_FIELDS: dict[str, tuple[object, ...]] = {
    "attention_bias": (False,), "mlp_bias": (False,), "lm_head_bias": (False,), "full_attn_mod": (1,),
    "interpolate_factor": (1, 1.0),
}


#: Phi-4-mini's layout at tiny size, as its config.json writes it: GQA, 3/4 of each head rotated,
#: longrope (factors for the 6 rotated frequencies; `original_max_position_embeddings` at the
#: top level), tied embeddings and Microsoft's own fields; no token ids (Phi3Config's lie outside
#: the tiny vocabulary, where transformers refuses a pad token).
TINY_PHI4_MINI: dict[str, Any] = {
    **PHI3_DEFAULTS, **NO_TOKEN_IDS, "architectures": ["Phi3ForCausalLM"], "vocab_size": 96, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "original_max_position_embeddings": 64, "partial_rotary_factor": 0.75,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "sliding_window": 262144, "attention_bias": False,
    "mlp_bias": False, "lm_head_bias": False, "full_attn_mod": 1, "interpolate_factor": 1,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.05, 1.2, 1.5, 2.0, 2.6],
                     "long_factor": [1.0, 1.6, 2.4, 3.8, 5.5, 8.0]},
}


@decoder_family("phi3", name="Phi-3", defaults=PHI3_DEFAULTS, config_class="Phi3Config",
                legacy=(*ROPE_LEGACY_KEYS, "head_dim", *_MICROSOFT_FIELDS),
                tiny={**PHI3_DEFAULTS, **TINY_LLAMA, **NO_TOKEN_IDS, "architectures": ["Phi3ForCausalLM"],
                      "num_key_value_heads": 4, "sliding_window": 6,
                      "rope_parameters": default_rope(10000.0, partial_rotary_factor=1.0)},
                variants={"phi4_mini": TINY_PHI4_MINI})
def read_phi3(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    f.choice("hidden_act", GATE_ACTIVATIONS)
    for field, allowed in _MICROSOFT_FIELDS.items():
        f.must_be(field, allowed, f"transformers' Phi3 model builds {field} = {allowed[0]}")
    # transformers' Phi3Config renames the rope types "su" and "yarn" to "longrope".
    for field in ("rope_scaling", "rope_parameters"):
        params = f.config.get(field)
        if isinstance(params, dict) and params.get("rope_type", params.get("type")) in ("su", "yarn"):
            f.config[field] = {**{k: v for k, v in params.items() if k != "type"}, "rope_type": "longrope"}
    rope, _ = read_rope(f, c["head_dim"], partial=True)
    if rope.kind not in ("default", "longrope"):
        raise f.refuse("rope_scaling", rope.kind, "transformers' Phi3 reads rope types 'default' and 'longrope' only")
    window = f.opt_int("sliding_window")
    return DecoderSpec(**c, rope=rope, fused_qkv=True, fused_gate_up=True, layer_windows=(window,) * c["num_layers"])
