"""Speech: Whisper transcription over converted packages (`rlx-mil transcribe`).

`rlx_mil.speech.transcribe(folder, audio, ...)` and `Transcriber` (`transcription`) are the
entry points; `model` holds the Protocols the decoder runs over (`WhisperModel`,
`DecoderSession`); `audio`, `tokens`, `decoding` and `segments` are the stages; `packages`,
`runner` and `stateful` write and run the WhisperKit folder.
"""

from rlx_mil.speech.model import DecoderSession, WhisperModel
from rlx_mil.speech.transcription import Transcriber, Transcript, transcribe

__all__ = ["DecoderSession", "Transcriber", "Transcript", "WhisperModel", "transcribe"]
