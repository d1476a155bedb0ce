"""Speech: Whisper transcription over converted packages (`rlx-mil transcribe`).

`model` holds the Protocols the decoder runs over (`WhisperModel`, `DecoderSession`);
`convert_whisper` (`rlx_mil.speech.packages`) writes the WhisperKit folder of a Whisper
checkpoint, `PackagedWhisper` (`rlx_mil.speech.runner`) runs one.
"""

from typing import Any

from rlx_mil.speech.model import DecoderSession, WhisperModel

__all__ = ["DecoderSession", "PackagedWhisper", "WhisperModel", "convert_whisper"]


def __getattr__(name: str) -> Any:
    # the converter and the runner load on first use: transcription's imports stay light
    if name == "convert_whisper":
        from rlx_mil.speech.packages import convert_whisper

        return convert_whisper
    if name == "PackagedWhisper":
        from rlx_mil.speech.runner import PackagedWhisper

        return PackagedWhisper
    raise AttributeError(f"module 'rlx_mil.speech' has no attribute {name!r}")
