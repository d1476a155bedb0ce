"""What a speech folder's `autoN` plan measures on: audio and a transcript.

The user's audio (`--compress-calibration FILE...`, any file `read_audio` takes) when given;
else the **built-in calibration clip** (`calibration_clip`): espeak-ng saying a sentence of the
project's built-in *calibration* text (`rlx_mil.compress.builtin_text`), 16 kHz mono FLAC
shipped in `rlx_mil/speech/clips/` (`benchmarks/make_builtin_speech.py` makes it). It is not
the clip the conversion's quality check judges on (`rlx_mil.speech.quality_check`: the
*held-out* text's opening), so the folder is never judged on the speech it was planned on.
Either way the decoder is teacher-forced over the float model's greedy transcript of the audio.

Speech, not a speech-shaped signal: measured on Whisper base, a plan calibrated on the
generated signal below predicted every decoder weight about 4x too costly (its transcript, the
built-in text, is not what the signal says, so the decoder is measured as a language model)
and once took cross-attention for free; calibrated on speech it finds a better mix at the same
size (docs/compression.md, "auto4 planned across the folder").

The generated signal (`builtin_speech`) stays as the fallback when the clip is not installed:
syllables of a voiced vowel (a harmonic series on a gliding pitch of 90-230 Hz, shaped by the
first three formants of English vowels, moving between vowels) after a consonant-like noise
burst, grouped into words with pauses between them, teacher-forced over the built-in
calibration text. At most `CALIBRATION_SECONDS` of audio are measured: the encoder runs over
that many frames (`rlx_mil.speech.folder_plan`), not the 30 s window, so a measurement costs a
quarter of a full run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.speech.audio import Audio
from rlx_mil.speech.model import SAMPLE_RATE

#: Seconds of calibration audio the plan measures (the first of the user's files, joined).
CALIBRATION_SECONDS = 8.0
#: Tokens of the transcript the decoder is teacher-forced over, at most.
TRANSCRIPT_TOKENS = 48
#: The built-in calibration clip (and its words) in `rlx_mil/speech/clips/`; the quality check's
#: clip is another file (`rlx_mil.speech.quality_check.CLIP_FILE`).
CLIP_FILE, CLIP_TEXT = "builtin_en_calibration.flac", "builtin_en_calibration.txt"
#: The first three formants (Hz) of English vowels (Peterson & Barney's adult male means).
VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
          (660, 1720, 2410), (490, 1350, 1690), (440, 1020, 2240), (390, 1990, 2550), (640, 1190, 2390))
_BANDWIDTHS = (90.0, 110.0, 170.0)


@dataclass(frozen=True)
class SpeechCalibration:
    """Audio the plan measures and what it says: `samples` (16 kHz, at most
    `CALIBRATION_SECONDS`), and `label` naming them for the report."""

    samples: np.ndarray
    label: str
    #: True: speech (the user's or the built-in clip), teacher-forced over the float model's
    #: greedy transcript of it; False: the generated signal, over the built-in text.
    spoken: bool


def _vowel(rng: np.random.Generator, length: int, pitch: float, start: tuple[int, ...], end: tuple[int, ...]) -> np.ndarray:
    """A voiced vowel: harmonics of a gliding pitch, each weighted by the formant envelope at
    its frequency (formants moving from `start` to `end`), a -6 dB/octave source tilt."""
    t = np.arange(length) / SAMPLE_RATE
    glide = pitch * (1 + rng.uniform(-0.12, 0.12) * t / max(t[-1], 1e-3)) * (1 + 0.01 * np.sin(2 * np.pi * 5.5 * t))
    phase = 2 * np.pi * np.cumsum(glide) / SAMPLE_RATE
    share = np.linspace(0.0, 1.0, length)
    formants = [(1 - share) * a + share * b for a, b in zip(start, end, strict=True)]
    out = np.zeros(length)
    for k in range(1, int(5000 // (pitch * 1.15)) + 1):
        frequency = k * glide
        envelope = sum(1.0 / (1.0 + ((frequency - f) / bw) ** 2) for f, bw in zip(formants, _BANDWIDTHS, strict=True))
        out += envelope / k * np.cos(k * phase + rng.uniform(0, 2 * np.pi))
    return out * np.hanning(length) ** 0.5


def _consonant(rng: np.random.Generator, length: int) -> np.ndarray:
    noise = rng.standard_normal(length + 8)
    kind = int(rng.integers(3))
    if kind == 0:  # hissing: the noise's high band
        noise = np.diff(noise, 2)
    elif kind == 1:  # breathy: a softer, lower band
        noise = np.convolve(noise, np.ones(6) / 6, "same")
    else:  # plosive: a short burst
        noise = noise * np.exp(-np.arange(noise.size) / (0.2 * length))
    return 0.15 * noise[:length] * np.hanning(length)


def builtin_speech(seconds: float = CALIBRATION_SECONDS, seed: int = 0) -> np.ndarray:
    """The built-in speech-shaped signal (see the module doc), `seconds` of 16 kHz float32
    samples, peak 0.5; the same for the same arguments."""
    rng = np.random.default_rng(seed)
    total = int(seconds * SAMPLE_RATE)
    out = np.zeros(total)
    pos = int(0.2 * SAMPLE_RATE)
    pitch = 120.0
    vowel = VOWELS[0]
    while pos < total - int(0.4 * SAMPLE_RATE):
        pitch = float(np.clip(pitch * rng.uniform(0.85, 1.15), 90, 230))
        for _ in range(int(rng.integers(1, 4))):  # the syllables of one word
            burst = int(rng.uniform(0.03, 0.09) * SAMPLE_RATE)
            length = int(rng.uniform(0.1, 0.26) * SAMPLE_RATE)
            if pos + burst + length >= total:
                break
            out[pos:pos + burst] += _consonant(rng, burst)
            pos += burst
            following = VOWELS[int(rng.integers(len(VOWELS)))]
            out[pos:pos + length] += rng.uniform(0.6, 1.0) * _vowel(rng, length, pitch, vowel, following)
            vowel = following
            pos += length
        pos += int(rng.uniform(0.08, 0.3) * SAMPLE_RATE)  # the pause after a word
    out += 1e-3 * rng.standard_normal(total)
    return (0.5 * out / max(float(np.abs(out).max()), 1e-9)).astype(np.float32)


def _clip_resource() -> Any:
    return resources.files("rlx_mil.speech").joinpath("clips").joinpath(CLIP_FILE)


def calibration_clip() -> Audio:
    """The built-in calibration clip (see the module doc) as 16 kHz float32 samples."""
    from rlx_mil.speech.audio import read_audio

    with resources.as_file(_clip_resource()) as path:
        audio = read_audio(path)
    return Audio(audio.samples, audio.source_rate, audio.source_channels, f"the built-in calibration clip {CLIP_FILE}")


def calibration_clip_text() -> str:
    """The words the built-in calibration clip says."""
    return resources.files("rlx_mil.speech").joinpath("clips").joinpath(CLIP_TEXT).read_text(encoding="utf-8").strip()


def speech_calibration(audio: Sequence[str | os.PathLike[str]] | None) -> SpeechCalibration:
    """The audio a speech folder's plan measures: the user's files (read and refused as
    `read_audio` does, joined, the first `CALIBRATION_SECONDS`), else the built-in calibration
    clip, else (not installed) the generated signal."""
    from rlx_mil.speech.audio import as_audio

    if not audio:
        if not _clip_resource().is_file():
            return SpeechCalibration(builtin_speech(), f"the built-in speech-shaped signal ({CALIBRATION_SECONDS:g} s;"
                                     f" {CLIP_FILE} is not installed)", False)
        clip = calibration_clip()
        samples = clip.samples[:int(CALIBRATION_SECONDS * SAMPLE_RATE)].astype(np.float32)
        return SpeechCalibration(samples, f"the built-in English calibration clip ({len(samples) / SAMPLE_RATE:.1f} s,"
                                 " espeak-ng)", True)
    limit = int(CALIBRATION_SECONDS * SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    names: list[str] = []
    for path in audio:
        clip = as_audio(path)
        if sum(len(p) for p in pieces) < limit:
            pieces.append(clip.samples)
            names.append(Path(clip.name).name)
    samples = np.concatenate(pieces)[:limit].astype(np.float32)
    return SpeechCalibration(samples, f"{len(samples) / SAMPLE_RATE:.1f} s of {', '.join(names)}", True)
