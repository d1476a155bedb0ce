"""Whisper speech recognition (`whisper`): `WhisperForConditionalGeneration` checkpoints, tiny to
large-v3 / large-v3-turbo, distil-whisper and fine-tunes; graphs built by `rlx_mil.models.whisper`
and packaged by `rlx_mil.speech` (the WhisperKit folder)."""

from __future__ import annotations

from typing import Any

from rlx_mil.models.family_registry import speech_family
from rlx_mil.models.hf_config import Fields
from rlx_mil.models.whisper import WhisperSpec

#: transformers 5.23.0 WhisperConfig defaults.
WHISPER_DEFAULTS: dict[str, Any] = {
    "vocab_size": 51865, "num_mel_bins": 80, "encoder_layers": 4, "encoder_attention_heads": 6, "decoder_layers": 4,
    "decoder_attention_heads": 6, "decoder_ffn_dim": 1536, "encoder_ffn_dim": 1536, "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0, "decoder_start_token_id": 50257, "use_cache": True, "is_encoder_decoder": True,
    "activation_function": "gelu", "d_model": 384, "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
    "init_std": 0.02, "scale_embedding": False, "max_source_positions": 1500, "max_target_positions": 448,
    "pad_token_id": 50256, "bos_token_id": 50256, "eos_token_id": 50256, "suppress_tokens": None,
    "begin_suppress_tokens": [220, 50256], "use_weighted_layer_sum": False, "classifier_proj_size": 256,
    "apply_spec_augment": False, "mask_time_prob": 0.05, "mask_time_length": 10, "mask_time_min_masks": 2,
    "mask_feature_prob": 0.0, "mask_feature_length": 10, "mask_feature_min_masks": 0, "median_filter_width": 7,
    "tie_word_embeddings": True,
}

#: Fields older transformers versions and the published Whisper configs write.
WHISPER_LEGACY = ("forced_decoder_ids", "num_hidden_layers", "max_length", "decoder_input_ids", "transformers_version")

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}

#: A tiny Whisper: 2 + 2 layers of width 64 over Whisper's 1500 audio positions (30 s windows) and
#: 32 text positions.
TINY_WHISPER: dict[str, Any] = {
    **WHISPER_DEFAULTS, "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"], "vocab_size": 96, "num_mel_bins": 16,
    "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
    "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_source_positions": 1500, "max_target_positions": 32,
    "decoder_start_token_id": 90, "pad_token_id": 89, "bos_token_id": 89, "eos_token_id": 89,
    "begin_suppress_tokens": [5, 89],
}


def _token_list(f: Fields, field: str) -> tuple[int, ...]:
    value = f.config.get(field)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise f.refuse(field, value, "expected a list of token ids")
    return tuple(value)


@speech_family("whisper", name="Whisper", defaults=WHISPER_DEFAULTS, config_class="WhisperConfig",
               legacy=WHISPER_LEGACY, tiny=TINY_WHISPER)
def read_whisper(f: Fields) -> WhisperSpec:
    e = f.int_("d_model")
    for field in ("encoder_attention_heads", "decoder_attention_heads"):
        if e % f.int_(field):
            raise f.refuse(field, f.int_(field), f"must divide d_model {e}")
    if f.bool_("scale_embedding"):
        raise f.refuse("scale_embedding", True, "Whisper checkpoints do not scale embeddings; rlx_mil builds the unscaled form")
    if f.bool_("use_weighted_layer_sum"):
        raise f.refuse("use_weighted_layer_sum", True, "the audio-classification head is not built")
    if not f.bool_("tie_word_embeddings", True):
        raise f.refuse("tie_word_embeddings", False, "Whisper's output projection is the token embedding")
    return WhisperSpec(
        family=f.family, vocab_size=f.int_("vocab_size"), num_mel_bins=f.int_("num_mel_bins"), d_model=e,
        encoder_layers=f.int_("encoder_layers"), encoder_heads=f.int_("encoder_attention_heads"),
        encoder_ffn_dim=f.int_("encoder_ffn_dim"), decoder_layers=f.int_("decoder_layers"),
        decoder_heads=f.int_("decoder_attention_heads"), decoder_ffn_dim=f.int_("decoder_ffn_dim"),
        max_source_positions=f.int_("max_source_positions"), max_target_positions=f.int_("max_target_positions"),
        activation=f.choice("activation_function", _ACTIVATIONS),
        decoder_start_token_id=f.int_("decoder_start_token_id", minimum=0),
        eos_token_id=f.int_("eos_token_id", minimum=0), pad_token_id=f.int_("pad_token_id", minimum=0),
        suppress_tokens=_token_list(f, "suppress_tokens"), begin_suppress_tokens=_token_list(f, "begin_suppress_tokens"),
    )
