"""LFM2 (`lfm2`, Liquid AI): short gated convolutions interleaved with GQA attention; graphs
built by `rlx_mil.models.lfm2`.

Defaults: transformers' Lfm2Config at commit 05cd1ec (5.x development line). Liquid's published
config.json files also carry the original training config's keys (`block_dim`, `conv_dim`,
`num_heads`, `block_use_swiglu`, `use_pos_enc`, ...); the ones that restate a size must agree
with it, the initialisation ones change nothing at inference."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.family_registry import decoder_family
from rlx_mil.models.hf_config import ROPE_LEGACY_KEYS, Fields, decoder_common, read_rope
from rlx_mil.models.lfm2 import Lfm2Spec

#: transformers Lfm2Config defaults.
LFM2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128000, "initializer_range": 0.02,
    "norm_eps": 1e-5, "use_cache": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": True, "rope_parameters": None, "conv_bias": False, "conv_L_cache": 3,
    "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
    "full_attn_idxs": None, "layer_types": None,
}
#: Keys of Liquid's original configs: sizes that must agree with the transformers fields, and
#: flags that must hold the value transformers' code assumes.
_SAME_AS = {"block_dim": "hidden_size", "conv_dim": "hidden_size", "conv_dim_out": "hidden_size",
            "num_heads": "num_attention_heads", "block_ff_dim": "intermediate_size"}
_MUST_BE = {"block_use_swiglu": True, "use_pos_enc": True}
_INIT_KEYS = ("block_mlp_init_scale", "block_out_init_scale", "block_use_xavier_init", "conv_use_xavier_init",
              "block_norm_eps")


def feed_forward_width(f: Fields, intermediate: int) -> int:
    """Lfm2MLP's width: `intermediate_size`, or with `block_auto_adjust_ff_dim` 2/3 of it,
    times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`."""
    if not f.bool_("block_auto_adjust_ff_dim"):
        return intermediate
    width = int(2 * intermediate / 3)
    if f.config.get("block_ffn_dim_multiplier") is not None:
        multiple = f.int_("block_multiple_of")
        width = int(f.float_("block_ffn_dim_multiplier") * width)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def _layer_kinds(f: Fields, layers: int) -> tuple[str, ...]:
    kinds = f.config.get("layer_types")
    if kinds is None:
        full = f.config.get("full_attn_idxs")
        full = list(range(layers)) if full is None else full
        if not isinstance(full, list):
            raise f.refuse("full_attn_idxs", full, "expected a list of layer indices")
        return tuple("attention" if i in full else "conv" for i in range(layers))
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in ("full_attention", "conv") for k in kinds):
        raise f.refuse("layer_types", kinds, f"expected {layers} entries, each 'full_attention' or 'conv'")
    return tuple("attention" if k == "full_attention" else "conv" for k in kinds)


@decoder_family("lfm2", name="LFM2", defaults=LFM2_DEFAULTS, config_class="Lfm2Config",
                legacy=(*ROPE_LEGACY_KEYS, "theta", "tie_embedding", "head_dim", *_SAME_AS, *_MUST_BE, *_INIT_KEYS),
                tiny={"architectures": ["Lfm2ForCausalLM"], "vocab_size": 96, "hidden_size": 32, "intermediate_size": 72,
                      "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                      "max_position_embeddings": 256, "initializer_range": 0.02, "norm_eps": 1e-5, "use_cache": True,
                      "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "conv_bias": False,
                      "conv_L_cache": 3, "block_multiple_of": 16, "block_ffn_dim_multiplier": 1.0,
                      "block_auto_adjust_ff_dim": True, "full_attn_idxs": None,
                      "layer_types": ["conv", "full_attention", "conv"]})
def read_lfm2(f: Fields) -> Lfm2Spec:
    # Lfm2Config's own spellings: norm_eps, block_ff_dim, theta, tie_embedding.
    given = f.given
    if "block_ff_dim" in given:
        f.config["intermediate_size"] = given["block_ff_dim"]
    if "tie_embedding" in given:
        f.config["tie_word_embeddings"] = given["tie_embedding"]
    f.config["rms_norm_eps"] = f.config["norm_eps"]
    for key, same in _SAME_AS.items():
        if key in given and given[key] != f.config[same]:
            raise f.refuse(key, given[key], f"must equal {same} {f.config[same]}")
    for key, value in _MUST_BE.items():
        if key in given and given[key] is not value:
            raise f.refuse(key, given[key], f"transformers' LFM2 is built with {key} = {str(value).lower()}")
    c = decoder_common(f)
    theta = given.get("theta", 1000000.0)
    rope, _ = read_rope(f, c["head_dim"], default_theta=theta)
    kernel = f.int_("conv_L_cache", minimum=2)
    c["intermediate_size"] = feed_forward_width(f, c["intermediate_size"])
    return Lfm2Spec(
        **c, rope=rope, layer_windows=(None,) * c["num_layers"], layer_kinds=_layer_kinds(f, c["num_layers"]),
        conv_kernel=kernel, conv_bias=f.bool_("conv_bias"),
    )
