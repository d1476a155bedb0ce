"""Core AI (Apple's runtime, here its Linux CPU build) beside Core ML packages and milexec.

Real checkpoint (SmolLM2-135M-Instruct, `real_checkpoints.smollm2`, cached under --cache):

* conversion time and size of the `.aimodel` against the `.mlpackage` of the same checkpoint
  (fp32, stateful, prefill 64 + decode), and for `--compress int4` and `lut4`;
* greedy tokens of the asset through Apple's runtime against the package through milexec
  (fp32), and perplexity (`rlx-mil eval`) of both;
* decode tok/s of the asset (Apple's runtime, fp32) beside the package through milexec.

`--deploy ane|gpu` and `--precision fp16` convert the package in that form (the asset
computes in fp32 either way): its size against the package's and the greedy tokens.

`--shape06b` adds decode tok/s at the Qwen3-0.6B shape (random weights, `--layers` of its 28
layers, as `executor_bench.py --llm` builds it): Core AI fp32 beside milexec.

    python benchmarks/coreai_bench.py --cache /work/cache/rlx_mil_bench [--shape06b --layers 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PROMPT = "What is the capital of France?"
TEXT = ("The capital of France is Paris. It is known for the Eiffel Tower, museums such as the Louvre, "
        "and its cafes. Paris is also the country's largest city and its economic centre. ") * 3


def _bytes(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def _decode_rate(session: Any, prompt: list[int], steps: int) -> tuple[list[int], float]:
    """(tokens, decode tok/s) of a greedy generation from a fresh cache."""
    session.reset()
    tokens = session.generate(prompt, steps)
    stats = session.stats
    return tokens, stats.new_tokens / stats.seconds if stats.seconds > 0 else float("nan")


def real_checkpoint(cache: Path, work: Path, steps: int, schemes: list[str], deploy: str = "plain",
                    precision: str = "fp32") -> list[dict[str, Any]]:
    from real_checkpoints import smollm2

    from rlx_mil.cli import main
    from rlx_mil.coreai.asset import save_aimodel
    from rlx_mil.llm.generate import Session
    from rlx_mil.llm.text import TextTokenizer

    checkpoint = smollm2(cache)
    tokenizer = TextTokenizer(checkpoint)
    prompt = tokenizer.encode(PROMPT)
    text_file = work / "text.txt"
    text_file.write_text(TEXT)
    rows = []
    for compress in [None if s == "fp32" else s for s in schemes]:
        label = compress or precision
        extra = ["--compress", compress] if compress else []
        package, asset = work / f"{label}.mlpackage", work / f"{label}.aimodel"
        argv = ["convert-hf", str(checkpoint), "--stateful", "--max-context", "256", "--prefill", "64",
                "--precision", precision, "--deploy", deploy, "--allow-quality-loss", "-q", *extra]
        start = time.perf_counter()
        assert main([*argv, "-o", str(package)]) == 0
        package_s = time.perf_counter() - start
        start = time.perf_counter()
        save_aimodel(package, asset, overwrite=True)
        export_s = time.perf_counter() - start
        weights = _bytes(package, "weight.bin")
        asset_bytes = _bytes(asset, "main.mlirb")
        milexec_session = Session(package, engine="milexec", precision_model="float32")
        want, exec_rate = _decode_rate(milexec_session, prompt, steps)
        got, core_rate = _decode_rate(Session(asset), prompt, steps)
        row = {"checkpoint": "SmolLM2-135M-Instruct", "scheme": label, "deploy": deploy, "precision": precision, "package_convert_s": round(package_s, 1),
               "aimodel_from_package_s": round(export_s, 1), "package_weight_bytes": weights,
               "aimodel_program_bytes": asset_bytes, "aimodel_over_package": round(asset_bytes / weights, 4),
               "same_greedy_tokens": got == want, "tokens": got, "coreai_decode_tok_s": round(core_rate, 2),
               "milexec_decode_tok_s": round(exec_rate, 2), "coreai_over_milexec": round(core_rate / exec_rate, 2)}
        if compress is None and precision == "fp32":
            for source, engine, key in ((asset, "coreai", "aimodel_ppl"), (package, "milexec", "package_ppl")):
                import contextlib
                import io

                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    assert main(["eval", str(source), "--text", str(text_file), "--max-tokens", "120", "--json", "-q",
                                 "--engine", engine]) == 0
                row[key] = json.loads(out.getvalue())["perplexity"]
            row["ppl_rel_diff"] = abs(row["aimodel_ppl"] - row["package_ppl"]) / row["package_ppl"]
            row["text"] = tokenizer.decode(got)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def shape06b(work: Path, layers: int, steps: int) -> dict[str, Any]:
    from rlx_mil.coreai.asset import save_aimodel
    from rlx_mil.llm.generate import Session
    from rlx_mil.llm.package import convert_llm_checkpoint
    from rlx_mil.models.random_checkpoint import QWEN3_0_6B, write_random_checkpoint

    checkpoint = work / "qwen3"
    write_random_checkpoint(checkpoint, dict(QWEN3_0_6B, num_hidden_layers=layers), dtype="bfloat16", seed=0)
    package, asset = work / "q06.mlpackage", work / "q06.aimodel"
    convert_llm_checkpoint(checkpoint, package, max_context=512, prefill=[64], precision="fp32")
    save_aimodel(package, asset)
    prompt = list(range(1, 9))
    _, core_rate = _decode_rate(Session(asset), prompt, steps)
    _, exec_rate = _decode_rate(Session(package, engine="milexec", precision_model="float32"), prompt, steps)
    row = {"case": f"qwen3_0.6b_shape_{layers}l_fp32", "coreai_decode_tok_s": round(core_rate, 2),
           "milexec_decode_tok_s": round(exec_rate, 2), "coreai_over_milexec": round(core_rate / exec_rate, 2)}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "rlx_mil_bench")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--shape06b", action="store_true")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--schemes", default="fp32,int4,lut4", help="comma-separated: fp32 (no compression), int4, lut4")
    parser.add_argument("--deploy", default="plain", choices=["plain", "gpu", "ane"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16"],
                        help="the package's precision (the asset computes in fp32 either way)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(prefix="coreai_bench_") as tmp:
        work = Path(tmp)
        if not args.skip_real:
            real_checkpoint(args.cache, work, args.steps, args.schemes.split(","), args.deploy, args.precision)
        if args.shape06b:
            shape06b(work, args.layers, args.steps)


if __name__ == "__main__":
    main()
