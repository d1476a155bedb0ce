"""ModernBERT encoders (`modernbert`): alternating global and local attention with RoPE,
GeGLU feed-forward, pre-norm; graphs built by `rlx_mil.models.modernbert`."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.family_registry import encoder_family
from rlx_mil.models.hf_config import EncoderSpec, Fields, layer_type_ropes, layer_types
from rlx_mil.models.modernbert import MODERNBERT_IGNORED, ModernBertSpec

#: transformers 5.24.0 ModernBertConfig defaults (RoPE: `default_theta` global 160,000,
#: local 10,000; `layer_types` None: every `global_attn_every_n_layers` = 3rd layer from 0 global).
MODERNBERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
    "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192,
    "initializer_range": 0.02, "initializer_cutoff_factor": 2.0, "norm_eps": 1e-5, "norm_bias": False,
    "pad_token_id": 50283, "eos_token_id": 50282, "bos_token_id": 50281, "cls_token_id": 50281,
    "sep_token_id": 50282, "attention_bias": False, "attention_dropout": 0.0, "layer_types": None,
    "rope_parameters": None, "local_attention": 128, "embedding_dropout": 0.0, "mlp_bias": False,
    "mlp_dropout": 0.0, "decoder_bias": True, "classifier_pooling": "cls", "classifier_dropout": 0.0,
    "classifier_bias": False, "classifier_activation": "gelu", "deterministic_flash_attn": False,
    "sparse_prediction": False, "sparse_pred_ignore_index": -100, "tie_word_embeddings": True,
}
GLOBAL_THETA, LOCAL_THETA = 160_000.0, 10_000.0
#: The default of the < 5 field `global_attn_every_n_layers`.
GLOBAL_EVERY = 3
#: Fields of transformers 4.x's ModernBertConfig (the published configs'): the layer pattern
#: and RoPE bases as numbers, and flags of the training-time (un)padding and compilation.
_LEGACY = ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta", "rope_scaling", "reference_compile",
           "repad_logits_with_grad", "position_embedding_type", "gradient_checkpointing")
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

TINY_MODERNBERT: dict[str, Any] = {
    **MODERNBERT_DEFAULTS, "architectures": ["ModernBertModel"], "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 64,
    "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1, "cls_token_id": 1, "sep_token_id": 2,
    "local_attention": 4, "classifier_pooling": "mean",
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": GLOBAL_THETA},
                        "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA}},
}


@encoder_family("modernbert", name="ModernBERT", defaults=MODERNBERT_DEFAULTS, config_class="ModernBertConfig",
                legacy=_LEGACY, tiny=TINY_MODERNBERT, transformers_version="5.24.0")
def read_modernbert(f: Fields) -> EncoderSpec:
    hidden = f.int_("hidden_size")
    heads = f.int_("num_attention_heads")
    if hidden % heads:
        raise f.refuse("num_attention_heads", heads, f"must divide hidden_size {hidden}")
    if (hidden // heads) % 2:
        raise f.refuse("num_attention_heads", heads, f"RoPE needs an even head width (hidden_size {hidden} / heads)")
    layers = f.int_("num_hidden_layers")
    every = f.int_("global_attn_every_n_layers", GLOBAL_EVERY)
    types = layer_types(f, ["sliding_attention" if i % every else "full_attention" for i in range(layers)])
    # ModernBertConfig.sliding_window: local_attention is the whole window, half on either side.
    half_window = f.int_("local_attention", minimum=0) // 2
    ropes = layer_type_ropes(f, hidden // heads, {"full_attention": ("global_rope_theta", GLOBAL_THETA),
                                                  "sliding_attention": ("local_rope_theta", LOCAL_THETA)},
                             scaled=("full_attention", "sliding_attention"), what="ModernBERT")
    pooling = f.choice("classifier_pooling", {"cls": "cls", "mean": "mean"})
    return ModernBertSpec(
        family=f.family, vocab_size=f.int_("vocab_size"), hidden_size=hidden, num_layers=layers, num_heads=heads,
        intermediate_size=f.int_("intermediate_size"), max_position_embeddings=f.int_("max_position_embeddings"),
        type_vocab_size=0, layer_norm_eps=f.float_("norm_eps"), activation=f.choice("hidden_activation", _ACTIVATIONS),
        base_prefix="model", ignored_tensors=MODERNBERT_IGNORED, default_pooling=pooling,
        layer_windows=tuple(half_window if kind == "sliding_attention" else None for kind in types),
        layer_ropes=tuple(ropes[kind] for kind in types), norm_bias=f.bool_("norm_bias"),
        attention_bias=f.bool_("attention_bias"), mlp_bias=f.bool_("mlp_bias"),
    )
