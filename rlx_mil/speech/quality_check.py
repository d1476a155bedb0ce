"""The quality check of a compressed speech folder: its packages against the float checkpoint on
speech.

Every compressed Whisper conversion (`convert-hf WHISPER --compress ...`) judges the folder it
wrote as `rlx-mil eval FOLDER --audio ... --reference CHECKPOINT` does
(`rlx_mil.speech.evaluate.judge_folder`): the package's front end, encoder and decoder (run as
saved, by the executor or Core ML) against the checkpoint run by the NumPy reference in float32;
the encoder output by cosine / PSNR, the decoder teacher-forced over the float model's greedy
transcript (top-1, confident top-1, mean KL, perplexity ratio); the documented thresholds
(`rlx_mil.compress.quality.QualityThresholds`, or the user's `--max-kl` / `--min-top1`) decide.

On what: the user's calibration audio (`--compress-calibration FILE ...`, the first 30 s of
each), else the **built-in English speech clip** (`builtin_clip`): the opening of the project's
held-out text spoken by espeak-ng, 16 kHz mono FLAC shipped in `rlx_mil/speech/clips/`
(`benchmarks/make_builtin_speech.py` regenerates it). Generated inputs (random log-mels and
token ids) cannot tell a folder that keeps Whisper base's quality from one that does not (both
read mean KL 0.17); on this clip the two are far apart (docs/compression.md, "The conversion's
check on speech").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path

from rlx_mil.compress.quality import DEFAULT_THRESHOLDS, QualityThresholds
from rlx_mil.speech.audio import Audio, read_audio
from rlx_mil.speech.evaluate import SpeechEvalResult, judge_folder

#: The built-in clip's file (and its words, `CLIP_TEXT`) in `rlx_mil/speech/clips/`.
CLIP_FILE, CLIP_TEXT = "builtin_en.flac", "builtin_en.txt"
#: Tokens of each greedy transcript the check judges at most (the built-in clip's is about 60).
CHECK_TOKENS = 96


def builtin_clip() -> Audio:
    """The built-in English speech clip (see the module doc) as 16 kHz float32 samples."""
    clips = resources.files("rlx_mil.speech").joinpath("clips")
    with resources.as_file(clips.joinpath(CLIP_FILE)) as path:
        audio = read_audio(path)
    return Audio(audio.samples, audio.source_rate, audio.source_channels, f"the built-in clip {CLIP_FILE}")


def builtin_clip_text() -> str:
    """The words the built-in clip says."""
    return resources.files("rlx_mil.speech").joinpath("clips").joinpath(CLIP_TEXT).read_text(encoding="utf-8").strip()


def check_audio(audio: Sequence[str | os.PathLike[str]] | None) -> tuple[list[Audio], str]:
    """(clips, what the check's summary calls them): the user's files (each read, and refused,
    as `rlx-mil transcribe` reads them), else the built-in clip."""
    if audio:
        clips = [read_audio(path) for path in audio]
        seconds = sum(min(c.seconds, 30.0) for c in clips)
        return clips, f"{seconds:.1f} s of --compress-calibration ({', '.join(Path(c.name).name for c in clips)})"
    clip = builtin_clip()
    return [clip], f"the built-in English speech clip ({clip.seconds:.1f} s, espeak-ng)"


def folder_quality(
    folder: str | os.PathLike[str],
    checkpoint: str | os.PathLike[str],
    audio: Sequence[str | os.PathLike[str]] | None = None,
    *,
    thresholds: QualityThresholds = DEFAULT_THRESHOLDS,
    reports: Mapping[str, object] | None = None,
    progress: Callable[[str], None] | None = None,
) -> SpeechEvalResult:
    """The speech folder `folder` judged against `checkpoint` on `audio` (the built-in clip when
    None); its stateful text decoder too when it has one. `reports` (package role -> its `CompressionReport`) name the weights contributing
    most, the failing part's first."""
    clips, label = check_audio(audio)
    # The built-in clip is English; the user's audio may be any language the checkpoint knows.
    language = None if audio else "en"
    worst = _worst(reports or {})
    from rlx_mil.speech.model import STATEFUL_DECODER

    stateful = (Path(folder) / f"{STATEFUL_DECODER}.mlpackage").is_dir()
    result = judge_folder(folder, clips, checkpoint, language=language, max_tokens=CHECK_TOKENS, progress=progress,
                          inputs=label, thresholds=thresholds, worst=worst, stateful=stateful)
    encoder_failed = any(o.failures(thresholds) for o in result.check.outputs)
    if encoder_failed:  # the encoder's weights first: the decoder's numbers follow from them
        result.check.worst = _worst(reports or {}, encoder_first=True)
    return result


def _worst(reports: Mapping[str, object], encoder_first: bool = False) -> list[tuple[str, str]]:
    from rlx_mil.compress.report import CompressionReport, worst_weights
    from rlx_mil.speech.model import DECODER, ENCODER

    order = (ENCODER, DECODER) if encoder_first else (DECODER, ENCODER)
    named: list[tuple[str, str]] = []
    for role in order:
        report = reports.get(role)
        if isinstance(report, CompressionReport):
            named += worst_weights(report, 2)
    return named[:3]
