"""Regenerate the built-in English speech clip a Whisper conversion checks its quality on.

`rlx_mil/speech/clips/builtin_en.flac` is the opening of the project's own held-out text
(`rlx_mil/compress/texts/heldout.txt`, the passage the LLM quality check scores), spoken by
espeak-ng (Debian's `espeak-ng`, voice en-us), resampled to 16 kHz mono by soxr and stored as
16-bit FLAC by soundfile; `builtin_en.txt` beside it holds the words it says. The product never
runs espeak-ng: it reads the shipped file (`rlx_mil.speech.calibration.builtin_clip`).

    python benchmarks/make_builtin_speech.py [--check]

`--check` regenerates into memory and reports whether the shipped clip matches (espeak-ng's
output is deterministic for one version; another version may differ slightly, which is fine:
the shipped file is what the checks use).
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile
import soxr

ROOT = Path(__file__).resolve().parents[1]
CLIPS = ROOT / "rlx_mil" / "speech" / "clips"
#: Sentences of the held-out text the clip says (its first two).
SENTENCES = 2
VOICE, WORDS_PER_MINUTE = "en-us", 165


def clip_text() -> str:
    text = " ".join((ROOT / "rlx_mil" / "compress" / "texts" / "heldout.txt").read_text(encoding="utf-8").split())
    ends = [i + 1 for i, c in enumerate(text) if c == "." and (i + 1 == len(text) or text[i + 1] == " ")]
    return text[:ends[SENTENCES - 1]]


def synthesize(text: str) -> np.ndarray:
    """16 kHz mono float32 samples of `text` spoken by espeak-ng, peak 0.5."""
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is not installed (Debian: apt-get install -y espeak-ng)")
    wav = subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "--stdout", text],
                         check=True, capture_output=True).stdout
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    samples = soxr.resample(samples.reshape(-1), rate, 16_000, quality="HQ")
    return (0.5 * samples / max(float(np.abs(samples).max()), 1e-9)).astype(np.float32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped clip instead of writing it")
    args = parser.parse_args()
    text = clip_text()
    samples = synthesize(text)
    flac, txt = CLIPS / "builtin_en.flac", CLIPS / "builtin_en.txt"
    if args.check:
        shipped, _ = soundfile.read(flac, dtype="float32")
        same = shipped.shape == samples.shape and float(np.abs(shipped - samples).max()) < 1e-3
        print(f"{flac}: {'matches' if same else 'differs from'} espeak-ng's output ({len(samples) / 16_000:.2f} s)")
        return 0 if same and txt.read_text(encoding="utf-8").strip() == text else 1
    CLIPS.mkdir(parents=True, exist_ok=True)
    soundfile.write(flac, samples, 16_000, format="FLAC", subtype="PCM_16")
    txt.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {flac} ({len(samples) / 16_000:.2f} s, {flac.stat().st_size} bytes): {text!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
