"""Regenerate the built-in English speech clips a Whisper conversion plans and checks on.

Two clips ship in `rlx_mil/speech/clips/`, each spoken by espeak-ng (Debian's `espeak-ng`, voice
en-us, 165 words a minute), resampled to 16 kHz mono by soxr and stored as 16-bit FLAC by
soundfile, with a `.txt` beside it holding the words it says:

* `builtin_en.flac`, what the conversion's quality check judges on
  (`rlx_mil.speech.quality_check.builtin_clip`): the first two sentences of the project's
  held-out text (`rlx_mil/compress/texts/heldout.txt`, the passage the LLM quality check scores);
* `builtin_en_calibration.flac`, what `--compress auto4` of a speech folder plans on
  (`rlx_mil.speech.calibration.calibration_clip`): the first sentence of the built-in
  *calibration* text (`calibration.txt`: other words than the held-out one, so the plan is not
  judged on what it was tuned on) that espeak-ng says within the plan's `CALIBRATION_SECONDS`
  (the plan measures no more), its trailing silence trimmed.

The product never runs espeak-ng: it reads the shipped files.

    python benchmarks/make_builtin_speech.py [--check]

`--check` regenerates into memory and reports whether the shipped clips match (espeak-ng's
output is deterministic for one version; another version may differ slightly, which is fine:
the shipped files are what the plan and the checks use).
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
sys.path.insert(0, str(ROOT))
from rlx_mil.speech.calibration import CALIBRATION_SECONDS, CLIP_FILE  # noqa: E402

CLIPS = ROOT / "rlx_mil" / "speech" / "clips"
TEXTS = ROOT / "rlx_mil" / "compress" / "texts"
#: Sentences of the held-out text the check's clip says (its first two).
SENTENCES = 2
VOICE, WORDS_PER_MINUTE, RATE = "en-us", 165, 16_000


def sentences(part: str) -> list[str]:
    text = " ".join((TEXTS / f"{part}.txt").read_text(encoding="utf-8").split())
    ends = [i + 1 for i, c in enumerate(text) if c == "." and (i + 1 == len(text) or text[i + 1] == " ")]
    return [text[a:b].strip() for a, b in zip([0, *ends], ends, strict=False)]


def synthesize(text: str) -> np.ndarray:
    """16 kHz mono float32 samples of `text` spoken by espeak-ng, peak 0.5."""
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is not installed (Debian: apt-get install -y espeak-ng)")
    wav = subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "--stdout", text],
                         check=True, capture_output=True).stdout
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    samples = soxr.resample(samples.reshape(-1), rate, RATE, quality="HQ")
    return (0.5 * samples / max(float(np.abs(samples).max()), 1e-9)).astype(np.float32)


def trimmed(samples: np.ndarray, tail: float = 0.1) -> np.ndarray:
    """`samples` without the silence after the last sound but `tail` seconds of it."""
    loud = np.nonzero(np.abs(samples) > 0.01 * float(np.abs(samples).max()))[0]
    return samples[: min(len(samples), int(loud[-1]) + 1 + int(tail * RATE))]


def check_clip() -> tuple[str, np.ndarray]:
    text = " ".join(sentences("heldout")[:SENTENCES])
    return text, synthesize(text)


def calibration_clip() -> tuple[str, np.ndarray]:
    for sentence in sentences("calibration"):
        samples = trimmed(synthesize(sentence))
        if len(samples) <= CALIBRATION_SECONDS * RATE:
            return sentence, samples
    sys.exit(f"no sentence of the calibration text is spoken within {CALIBRATION_SECONDS:g} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped clips instead of writing them")
    args = parser.parse_args()
    status = 0
    for (text, samples), stem in ((check_clip(), "builtin_en"), (calibration_clip(), Path(CLIP_FILE).stem)):
        flac, txt = CLIPS / f"{stem}.flac", CLIPS / f"{stem}.txt"
        if args.check:
            shipped, _ = soundfile.read(flac, dtype="float32")
            same = shipped.shape == samples.shape and float(np.abs(shipped - samples).max()) < 1e-3
            print(f"{flac}: {'matches' if same else 'differs from'} espeak-ng's output ({len(samples) / RATE:.2f} s)")
            status |= 0 if same and txt.read_text(encoding="utf-8").strip() == text else 1
            continue
        CLIPS.mkdir(parents=True, exist_ok=True)
        soundfile.write(flac, samples, RATE, format="FLAC", subtype="PCM_16")
        txt.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {flac} ({len(samples) / RATE:.2f} s, {flac.stat().st_size} bytes): {text!r}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
