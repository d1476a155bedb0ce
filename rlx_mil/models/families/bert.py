"""BERT / MiniLM encoders (`bert`), as sentence-transformers run them."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.family_registry import encoder_family
from rlx_mil.models.hf_config import EncoderSpec, Fields

#: transformers 5.23.0 BertConfig defaults.
BERT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    "pad_token_id": 0, "use_cache": True, "classifier_dropout": None, "is_decoder": False,
    "add_cross_attention": False, "bos_token_id": None, "eos_token_id": None, "tie_word_embeddings": True,
}

_BERT_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


#: Fields older transformers versions wrote (the published configs carry them).
BERT_LEGACY = ("position_embedding_type", "gradient_checkpointing", "output_past")

TINY_BERT: dict[str, Any] = {
    **BERT_DEFAULTS, "architectures": ["BertModel"], "vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64, "type_vocab_size": 2,
    "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute",
}


def bert_fields(f: Fields) -> dict[str, Any]:
    """The EncoderSpec fields of a BERT-layout config (BERT, RoBERTa, XLM-RoBERTa)."""
    hidden = f.int_("hidden_size")
    heads = f.int_("num_attention_heads")
    if hidden % heads:
        raise f.refuse("num_attention_heads", heads, f"must divide hidden_size {hidden}")
    # transformers 5 builds absolute position embeddings only; older configs name the kind.
    f.must_be("position_embedding_type", ("absolute",), "only absolute position embeddings are built")
    if f.bool_("is_decoder") or f.bool_("add_cross_attention"):
        raise f.refuse("is_decoder", True, "only the encoder form is built")
    return {
        "family": f.family, "vocab_size": f.int_("vocab_size"), "hidden_size": hidden,
        "num_layers": f.int_("num_hidden_layers"), "num_heads": heads, "intermediate_size": f.int_("intermediate_size"),
        "max_position_embeddings": f.int_("max_position_embeddings"), "type_vocab_size": f.int_("type_vocab_size"),
        "layer_norm_eps": f.float_("layer_norm_eps"), "activation": f.choice("hidden_act", _BERT_ACTIVATIONS),
    }


@encoder_family("bert", name="BERT", defaults=BERT_DEFAULTS, config_class="BertConfig", aliases=("minilm",),
                legacy=BERT_LEGACY, tiny=TINY_BERT)
def read_bert(f: Fields) -> EncoderSpec:
    return EncoderSpec(**bert_fields(f))
