"""The independent peer of `benchmarks/speech_bench.py`: transformers' greedy Whisper decoding.

Run by speech_bench.py in the interpreter that has PyTorch and transformers (the `bench`
extra, or a separate environment given with --reference-python), so this file imports neither
rlx_mil nor anything beyond NumPy, PyTorch and transformers. It reads the clips as 16 kHz float32
`.npy` arrays (the very samples rlx_mil transcribes: resampling is not what is compared) and
writes, per clip, the generated token ids (the prompt and EOT left out), the text, the detected
language and the seconds it took.

    python benchmarks/speech_reference.py HF_FOLDER OUT.json CLIP.npy... [--language en]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path, help="a Whisper checkpoint folder in Hugging Face layout")
    parser.add_argument("output", type=Path)
    parser.add_argument("clips", type=Path, nargs="+", help="16 kHz mono float32 .npy arrays")
    parser.add_argument("--language", help="the language; detected when not given")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from tokenizers import Tokenizer
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    torch.set_num_threads(args.threads)
    model = WhisperForConditionalGeneration.from_pretrained(args.checkpoint, torch_dtype=torch.float32).eval()
    features = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    tokenizer = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json"))
    config = model.generation_config
    id_to_language = {v: k.strip("<|>") for k, v in config.lang_to_id.items()}
    results: dict[str, Any] = {}
    for clip in args.clips:
        audio = np.load(clip).astype(np.float32)
        start, cpu = time.perf_counter(), time.process_time()
        inputs = features(audio, sampling_rate=16000, return_tensors="pt")
        long_form = len(audio) > 30 * 16000
        extra: dict[str, Any] = {}
        if long_form:  # transformers' sequential long-form decoding needs the mask and timestamps
            inputs = features(audio, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest",
                              return_attention_mask=True)
            extra = {"attention_mask": inputs.attention_mask, "return_timestamps": True}
        with torch.no_grad():
            out = model.generate(inputs.input_features, language=args.language, task="transcribe", do_sample=False,
                                 num_beams=1, **extra)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        ids = [int(t) for t in (out.sequences if hasattr(out, "sequences") else out)[0]]
        language = args.language
        if language is None:  # generate's output may leave the prompt out: ask the model, as generate does
            with torch.no_grad():
                detected = model.detect_language(inputs.input_features[..., :3000])
            language = id_to_language.get(int(detected.reshape(-1)[0]))
        begin = config.no_timestamps_token_id + 1
        text_ids = [t for t in ids if t < config.eos_token_id]
        sampled = [t for t in ids if t < config.eos_token_id or t >= begin]
        results[clip.stem] = {
            "tokens": sampled, "text": tokenizer.decode(text_ids, skip_special_tokens=True), "language": language,
            "seconds": seconds, "cpu_seconds": cpu_seconds, "long_form": long_form,
        }
        print(f"transformers {clip.stem}: {results[clip.stem]['text']!r}", flush=True)
    args.output.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
