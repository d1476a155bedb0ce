"""RoBERTa and XLM-RoBERTa encoders (`roberta`, `xlm-roberta`; E5 and BGE models among them):
BERT's layers, positions counted from `padding_idx + 1`, one token type."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.families.bert import BERT_LEGACY, bert_fields
from rlx_mil.models.family_registry import encoder_family
from rlx_mil.models.hf_config import EncoderSpec, Fields

#: transformers 5.24.0 RobertaConfig defaults.
ROBERTA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50265, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "use_cache": True, "classifier_dropout": None,
    "is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": True,
}
#: transformers 5.24.0 XLMRobertaConfig defaults (RoBERTa's but for the vocabulary).
XLM_ROBERTA_DEFAULTS: dict[str, Any] = {**ROBERTA_DEFAULTS, "vocab_size": 30522}

#: The published configs' shape (xlm-roberta-base, multilingual-e5, bge-m3): 514 positions for
#: 512 tokens after padding_idx + 1, one token type, eps 1e-5.
_TINY = {"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 66, "type_vocab_size": 1, "layer_norm_eps": 1e-5}


def _read(f: Fields) -> EncoderSpec:
    padding_idx = f.int_("pad_token_id", minimum=0)
    spec = EncoderSpec(**bert_fields(f), padding_idx=padding_idx, base_prefix="roberta")
    if padding_idx + 1 >= spec.max_position_embeddings:
        raise f.refuse("pad_token_id", padding_idx, f"positions start at pad_token_id + 1, beyond"
                       f" max_position_embeddings {spec.max_position_embeddings}")
    return spec


@encoder_family("roberta", name="RoBERTa", defaults=ROBERTA_DEFAULTS, config_class="RobertaConfig",
                legacy=BERT_LEGACY, tiny={**ROBERTA_DEFAULTS, **_TINY, "architectures": ["RobertaModel"]},
                transformers_version="5.24.0")
def read_roberta(f: Fields) -> EncoderSpec:
    return _read(f)


@encoder_family("xlm-roberta", name="XLM-RoBERTa", defaults=XLM_ROBERTA_DEFAULTS, config_class="XLMRobertaConfig",
                legacy=BERT_LEGACY, tiny={**XLM_ROBERTA_DEFAULTS, **_TINY, "architectures": ["XLMRobertaModel"]},
                transformers_version="5.24.0")
def read_xlm_roberta(f: Fields) -> EncoderSpec:
    return _read(f)
