"""A decoded window's tokens as timed segments, and where the next window starts (Whisper's
seek logic, openai-whisper's `transcribe`).

Seek runs in mel frames (10 ms). Without timestamps a window is one segment and the next
window starts 30 s later (or where the audio ends). With timestamps the tokens split into
segments at each pair of consecutive timestamps: `<|t0|> text <|t1|><|t1|> text <|t2|>`. When
the window ends on a single timestamp the speech in it is complete and seek advances a whole
window; otherwise the unfinished segment after the last pair is dropped and the next window
starts at the last complete segment's end, so the cut words are decoded again whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlx_mil.speech.audio import FRAMES_PER_SECOND
from rlx_mil.speech.model import N_AUDIO_CTX, N_FRAMES
from rlx_mil.speech.tokens import WhisperTokens

#: Mel frames per encoder position (and per timestamp step).
INPUT_STRIDE = N_FRAMES // N_AUDIO_CTX


@dataclass(frozen=True)
class Segment:
    """A stretch of speech: start and end in seconds from the start of the audio, its text,
    and its tokens (timestamp tokens included)."""

    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"start": round(self.start, 3), "end": round(self.end, 3), "text": self.text, "tokens": self.tokens}


@dataclass(frozen=True)
class WindowSplit:
    """A window's kept token slices (half-open index ranges into its tokens), their times, and
    how many mel frames seek advances."""

    slices: list[tuple[int, int]]
    times: list[tuple[float, float]]
    advance: int

    @property
    def kept(self) -> int:
        """Tokens of the window that stay in the transcript (a prefix)."""
        return self.slices[-1][1] if self.slices else 0


def split_window(sampled: list[int], tokens: WhisperTokens, seek: int, frames: int, timestamps: bool) -> WindowSplit:
    """Segments of a window decoded at mel frame `seek` holding `frames` frames of audio."""
    offset = seek / FRAMES_PER_SECOND
    whole = (offset, offset + frames / FRAMES_PER_SECOND)
    if not timestamps:
        return WindowSplit([(0, len(sampled))], [whole], frames)
    is_stamp = [tokens.is_timestamp(t) for t in sampled]
    single_ending = is_stamp[-2:] == [False, True]
    consecutive = [i + 1 for i in range(len(sampled) - 1) if is_stamp[i] and is_stamp[i + 1]]
    if consecutive:
        cuts = consecutive + ([len(sampled)] if single_ending else [])
        slices, times, last = [], [], 0
        for cut in cuts:
            piece = sampled[last:cut]
            slices.append((last, cut))
            times.append((offset + tokens.time_of(piece[0]), offset + tokens.time_of(piece[-1])))
            last = cut
        if single_ending:
            advance = frames
        else:  # the unfinished segment is decoded again from the last complete one's end
            advance = (sampled[last - 1] - tokens.timestamp_begin) * INPUT_STRIDE
        return WindowSplit(slices, times, advance if advance > 0 else frames)
    stamps = [t for t, s in zip(sampled, is_stamp, strict=True) if s]
    end = whole[1]
    if stamps and stamps[-1] != tokens.timestamp_begin:  # no pair, but a timestamp: the speech ends there
        end = offset + tokens.time_of(stamps[-1])
    return WindowSplit([(0, len(sampled))], [(offset, end)], frames)
