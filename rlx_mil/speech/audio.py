"""Audio in: a WAV (or FLAC) file read with libsndfile (`soundfile`), mixed to mono and
resampled to Whisper's 16 kHz with soxr, as float32; and Whisper's 30 s windows over it.

Everything that can be wrong with a file is found before a large allocation and raised as one
`AudioFormatError` naming the file: not a WAV, a header that does not parse, audio data cut
short (a WAV whose `data` chunk declares more bytes than the file holds, or fewer frames read
than the header declares), no samples, NaN or infinite float samples, a sample rate outside
2 kHz .. 768 kHz, more than two channels, or more than `MAX_SECONDS` of audio.

More than two channels is refused rather than mixed down: such files are surround mixes or
microphone arrays, where an equal-weight average buries the dialogue channel under the others
(a 5.1 mix puts it at a sixth of the level); the user picks the mix (e.g. `sox in.wav -c 1
out.wav remix 3` for a 5.1 centre channel), and the error says so.

The file is read in blocks and each block is mixed down and resampled as it arrives (soxr's
streaming resampler), so memory holds only the 16 kHz mono result.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from rlx_mil.errors import AudioFormatError
from rlx_mil.fileio import open_regular_file
from rlx_mil.speech.model import N_FRAMES, N_SAMPLES, SAMPLE_RATE
from rlx_mil.units import counted

#: Longest audio read (3 hours): 173 M samples, 0.7 GB of float32 at 16 kHz.
MAX_SECONDS = 3 * 3600
MIN_RATE, MAX_RATE = 2_000, 768_000
MAX_CHANNELS = 2
#: Container formats libsndfile reads that are accepted (WAV and its 64-bit forms, FLAC).
FORMATS = ("WAV", "WAVEX", "RF64", "W64", "FLAC")
#: Mel frames per second (10 ms hop) and samples per frame.
FRAMES_PER_SECOND = 100
HOP_LENGTH = SAMPLE_RATE // FRAMES_PER_SECOND
_BLOCK_FRAMES = 1 << 16
_MAX_RIFF_CHUNKS = 4096


@dataclass(frozen=True)
class Audio:
    """16 kHz mono float32 samples and where they came from."""

    samples: np.ndarray
    source_rate: int
    source_channels: int
    name: str

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


@dataclass(frozen=True)
class AudioInfo:
    """What a file's header says, checked: format, rate, channels and frames."""

    format: str
    subtype: str
    rate: int
    channels: int
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames / self.rate


@contextmanager
def _opened(path: str | os.PathLike[str], max_seconds: float) -> Iterator[tuple[Any, AudioInfo]]:
    """The file opened by libsndfile with its header checked (see the module docstring)."""
    import soundfile as sf

    stream, size = open_regular_file(path, "audio file")
    with stream:
        _check_riff_data(stream, size, path)
        stream.seek(0)
        try:
            sound = sf.SoundFile(stream)
        except (sf.SoundFileError, RuntimeError, ValueError, TypeError, OverflowError) as err:
            raise AudioFormatError(f"{path}: not a readable WAV file ({_libsndfile_reason(err)})") from None
        with sound:
            yield sound, _checked_info(sound, path, max_seconds)


def probe_audio(path: str | os.PathLike[str], *, max_seconds: float = MAX_SECONDS) -> AudioInfo:
    """The checked header of audio file `path`, without reading its samples: a bad file fails
    here before any model is opened."""
    with _opened(path, max_seconds) as (sound, info):
        if info.subtype in ("FLOAT", "DOUBLE"):  # NaN and inf too: a block at a time, nothing kept
            read = 0
            while read < info.frames:
                block = _read_block(sound, info, path, read)
                if len(block) == 0:
                    break
                read += len(block)
        return info


def read_audio(path: str | os.PathLike[str], *, max_seconds: float = MAX_SECONDS) -> Audio:
    """The audio of file `path` as 16 kHz mono float32 (see the module docstring for what is
    refused)."""
    with _opened(path, max_seconds) as (sound, info):
        return _decode(sound, info, path)


def _libsndfile_reason(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text.split(": ", 1)[1] if text.startswith("Error opening") and ": " in text else text


def _checked_info(sound: Any, path: str | os.PathLike[str], max_seconds: float) -> AudioInfo:
    if sound.format not in FORMATS:
        raise AudioFormatError(f"{path}: a {sound.format} file, not WAV; convert it (e.g. `sox IN -c 1 -r 16000 OUT.wav`)")
    rate, channels, frames = int(sound.samplerate), int(sound.channels), int(sound.frames)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioFormatError(f"{path}: sample rate {rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")
    if channels > MAX_CHANNELS:
        raise AudioFormatError(
            f"{path}: {channels} channels; transcription reads mono or stereo audio (an average would bury a"
            f" surround mix's dialogue): mix it down first, e.g. `sox IN.wav -c 1 OUT.wav remix 3` for a centre channel"
        )
    if channels < 1:
        raise AudioFormatError(f"{path}: the header declares {channels} channels")
    if frames <= 0:
        raise AudioFormatError(f"{path}: holds no audio samples")
    if frames / rate > max_seconds:
        raise AudioFormatError(f"{path}: {frames / rate:.0f} s of audio, more than the limit of {max_seconds:.0f} s")
    return AudioInfo(str(sound.format), str(sound.subtype), rate, channels, frames)


def _decode(sound: Any, info: AudioInfo, path: str | os.PathLike[str]) -> Audio:
    rate, channels, frames = info.rate, info.channels, info.frames
    resample = _resampler(rate)
    pieces: list[np.ndarray] = []
    read = 0
    while read < frames:
        block = _read_block(sound, info, path, read)
        if len(block) == 0:
            break
        read += len(block)
        pieces.append(resample(block.mean(axis=1, dtype=np.float32), False))
    if read < frames:
        raise AudioFormatError(f"{path}: truncated: the header declares {counted(frames, 'frame')}, the file holds {read}")
    pieces.append(resample(np.zeros(0, np.float32), True))
    samples = np.concatenate(pieces).astype(np.float32, copy=False)
    if len(samples) == 0:
        raise AudioFormatError(f"{path}: holds no audio samples")
    return Audio(samples, rate, channels, str(path))


def _read_block(sound: Any, info: AudioInfo, path: str | os.PathLike[str], read: int) -> np.ndarray:
    """The next block of frames `[n, channels]` float32, checked finite."""
    import soundfile as sf

    try:
        block = sound.read(min(_BLOCK_FRAMES, info.frames - read), dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError) as err:
        raise AudioFormatError(f"{path}: audio data unreadable after {read} frames ({err})") from None
    if info.subtype in ("FLOAT", "DOUBLE") and not np.isfinite(block).all():
        bad = read + int(np.argmin(np.isfinite(block).all(axis=1)))
        raise AudioFormatError(f"{path}: sample {bad} ({bad / info.rate:.3f} s) is NaN or infinite")
    return np.asarray(block)


def _resampler(rate: int) -> Callable[[np.ndarray, bool], np.ndarray]:
    """Mono float32 blocks at `rate` -> blocks at 16 kHz (soxr's high-quality streaming filter)."""
    if rate == SAMPLE_RATE:
        return lambda block, last: block
    import soxr

    stream = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
    return lambda block, last: np.asarray(stream.resample_chunk(block, last=last), np.float32).reshape(-1)


def _check_riff_data(stream: BinaryIO, size: int, path: str | os.PathLike[str]) -> None:
    """For a RIFF WAV: the `data` chunk must fit in the file. libsndfile silently reads a
    truncated WAV's remaining frames; a cut recording must not transcribe as a whole one."""
    head = stream.read(12)
    if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX") or head[8:12] != b"WAVE":
        return
    endian = "<" if head[:4] == b"RIFF" else ">"
    offset = 12
    for _ in range(_MAX_RIFF_CHUNKS):
        stream.seek(offset)
        chunk = stream.read(8)
        if len(chunk) < 8:
            return  # no data chunk: libsndfile says so
        chunk_id, chunk_size = chunk[:4], struct.unpack(endian + "I", chunk[4:])[0]
        if chunk_id == b"data":
            if chunk_size not in (0, 0xFFFFFFFF) and offset + 8 + chunk_size > size:
                raise AudioFormatError(
                    f"{path}: truncated: the WAV data chunk declares {chunk_size} bytes, the file holds"
                    f" {max(0, size - offset - 8)}"
                )
            return
        offset += 8 + chunk_size + (chunk_size & 1)
        if offset > size:
            raise AudioFormatError(f"{path}: truncated: the WAV chunk {chunk_id!r} runs past the end of the file")
    raise AudioFormatError(f"{path}: more than {_MAX_RIFF_CHUNKS} WAV chunks before the audio data")


def as_audio(audio: str | os.PathLike[str] | np.ndarray, name: str = "audio") -> Audio:
    """A path is read with `read_audio`; an array is taken as 16 kHz mono samples (checked:
    one dimension, finite, not empty)."""
    if isinstance(audio, (str, os.PathLike)):
        return read_audio(audio)
    samples = np.asarray(audio)
    if samples.ndim != 1 or samples.size == 0 or samples.dtype.kind != "f":
        raise AudioFormatError(
            f"{name}: audio arrays are non-empty 1-D float 16 kHz samples, got {samples.dtype}{list(samples.shape)}"
        )
    if not np.isfinite(samples).all():
        raise AudioFormatError(f"{name}: the samples hold NaN or infinite values")
    return Audio(samples.astype(np.float32, copy=False), SAMPLE_RATE, 1, name)


def content_frames(audio: Audio) -> int:
    """Mel frames (10 ms) the audio spans: Whisper's seek runs over these."""
    return len(audio.samples) // HOP_LENGTH


def window(audio: Audio, seek: int) -> np.ndarray:
    """The 30 s window starting at mel frame `seek`: `N_SAMPLES` samples, zero padded."""
    start = seek * HOP_LENGTH
    piece = audio.samples[start:start + N_SAMPLES]
    if len(piece) == N_SAMPLES:
        return piece
    out = np.zeros(N_SAMPLES, np.float32)
    out[: len(piece)] = piece
    return out


def window_frames(audio: Audio, seek: int) -> int:
    """Frames of real audio in the window at `seek` (at most `N_FRAMES`)."""
    return max(0, min(N_FRAMES, content_frames(audio) - seek))

