"""The three WhisperKit graphs of a Whisper checkpoint and the params each reads (what
`rlx_mil.speech.packages` converts and `rlx_mil.speech.evaluate`'s reference evaluates)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlx_mil.ir import Graph
from rlx_mil.models.whisper import build_audio_encoder, build_text_decoder
from rlx_mil.models.whisper_checkpoint import ParamsOf, WhisperCheckpoint
from rlx_mil.models.whisper_mel import build_log_mel
from rlx_mil.speech.model import DECODER, ENCODER, MEL


def graphs(checkpoint: WhisperCheckpoint, cache_len: int, fp16_io: bool) -> dict[str, tuple[Graph, Mapping[str, Any]]]:
    """The three WhisperKit graphs of `checkpoint` with the params each reads."""
    spec = checkpoint.spec
    mel, mel_params = build_log_mel(spec.num_mel_bins, MEL, fp16_io=fp16_io)
    encoder, encoder_names = build_audio_encoder(spec, ENCODER, fp16_io=fp16_io)
    decoder, decoder_names = build_text_decoder(spec, cache_len, DECODER, fp16_io=fp16_io,
                                                alignment_heads=checkpoint.alignment_heads)
    return {
        MEL: (mel, mel_params),
        ENCODER: (encoder, ParamsOf(checkpoint.params, encoder_names)),
        DECODER: (decoder, ParamsOf(checkpoint.params, decoder_names)),
    }
