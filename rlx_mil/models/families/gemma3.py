"""Gemma 3 text decoders (`gemma3_text`: Gemma 3 270M / 1B, and the text model of the larger
ones): Gemma 2's block with q/k norms, sliding-window and global layers interleaved (five local
to one global by default), each kind with its own RoPE."""

from __future__ import annotations

import copy
from typing import Any

from rlx_mil.models.families import decoder_family
from rlx_mil.models.families.gemma2 import gemma_sandwich
from rlx_mil.models.hf_config import DecoderSpec, Fields, decoder_common, layer_types, windows_of
from rlx_mil.models.rope import RopeReader

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


@decoder_family("gemma3_text", name="Gemma 3", defaults=GEMMA3_DEFAULTS, config_class="Gemma3TextConfig",
                legacy=("rope_theta", "rope_scaling", "rope_local_base_freq", "sliding_window_pattern", "hidden_act"),
                tiny=TINY_GEMMA3)
def read_gemma3(f: Fields) -> DecoderSpec:
    c = decoder_common(f)
    pattern = f.int_("sliding_window_pattern", SLIDING_WINDOW_PATTERN)
    default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(c["num_layers"])]
    types = layer_types(f, default)
    ropes = _ropes(f, c["head_dim"], c["max_position_embeddings"])
    layer_ropes = tuple(ropes[kind] for kind in types)
    return DecoderSpec(**c, rope=layer_ropes[0], layer_ropes=layer_ropes, qk_norm=True, **gemma_sandwich(f, c),
                       layer_windows=windows_of(types, f.opt_int("sliding_window")))


def _ropes(f: Fields, head_dim: int, max_positions: int) -> dict[str, Any]:
    """Gemma3TextConfig.convert_rope_params_to_dict: one RoPE per layer type; `rope_scaling`
    (the < 5 form) applies to the global layers, `rope_theta` is the global base and
    `rope_local_base_freq` the local one."""
    reader = RopeReader(f.config, f.source, f.family)
    given = f.config.get("rope_parameters")
    if given is not None and (not isinstance(given, dict) or not set(given) <= {"full_attention", "sliding_attention"}):
        raise f.refuse("rope_parameters", given, "Gemma 3 takes one RoPE dict per layer type"
                       " ('full_attention', 'sliding_attention')")
    params: dict[str, Any] = copy.deepcopy(given) if given else {}
    scaling = f.config.get("rope_scaling")
    full = params.get("full_attention") or {"rope_type": "default"}
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise f.refuse("rope_scaling", scaling, "expected an object or null")
        full = {**full, **scaling}
    local = params.get("sliding_attention") or {"rope_type": "default"}
    full.setdefault("rope_theta", f.float_("rope_theta", GLOBAL_THETA))
    local.setdefault("rope_theta", f.float_("rope_local_base_freq", LOCAL_THETA))
    out = {}
    for kind, dict_ in (("full_attention", full), ("sliding_attention", local)):
        out[kind] = reader.spec(dict_, f"rope_parameters.{kind}", head_dim=head_dim, default_theta=dict_["rope_theta"],
                                max_position_embeddings=max_positions)
    return out
