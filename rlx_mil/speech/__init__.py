"""Speech: Whisper transcription over converted packages (`rlx-mil transcribe`).

`model` holds the Protocols the decoder runs over (`WhisperModel`, `DecoderSession`).
"""

from rlx_mil.speech.model import DecoderSession, WhisperModel

__all__ = ["DecoderSession", "WhisperModel"]
