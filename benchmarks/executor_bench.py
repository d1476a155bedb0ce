"""Speed of rlx_mil's NumPy MIL executor (`rlx_mil.milexec`) on converted decoder programs.

Converts each decoder once (fp16, iOS18), then runs the saved package through the executor
--runs times after one warm-up: median and p90 seconds per forward pass, tokens/s of the
prefill, and the ops executed. Cases: the 4-layer hidden-256 and the 16-layer hidden-1024
decoders at S=128, and one-token decode steps of a stateful Llama package (8 layers, hidden
1024, `rlx_mil.generate.Session` on the executor).

    python benchmarks/executor_bench.py [--runs 5 --json executor.jsonl]

OpenBLAS threads slow down badly when other processes hold the cores; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _quiet() -> None:
    import logging
    import os
    import warnings

    os.environ.setdefault("TQDM_DISABLE", "1")
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def _stats(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def decoder_case(name: str, config: Any, runs: int) -> dict[str, Any]:
    import rlx_mil
    from rlx_mil.models.transformer import example_inputs, llama_decoder, random_params

    graph = llama_decoder(config)
    model = rlx_mil.convert(graph, random_params(graph, config))
    feeds = example_inputs(config)
    rlx_mil.milexec.run(model, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        rlx_mil.milexec.run(model, feeds)
        times.append(time.perf_counter() - start)
    median, p90 = _stats(times)
    ops = Counter(op.op_type for op in model._mil_program.functions["main"].operations)
    return {
        "case": name, "median_s": median, "p90_s": p90, "tokens_per_s": config.seq / median,
        "ops": sum(v for k, v in ops.items() if k != "const"),
    }


def decode_case(runs: int, work: Path) -> dict[str, Any]:
    from apple_latency import TINY_LLAMA

    from rlx_mil.generate import Session
    from rlx_mil.llm.package import convert_llm_checkpoint
    from rlx_mil.models.random_checkpoint import write_random_checkpoint

    checkpoint = write_random_checkpoint(work / "llama", TINY_LLAMA, dtype="bfloat16")
    package = work / "llama_stateful.mlpackage"
    convert_llm_checkpoint(checkpoint, package, max_context=256)
    session = Session(package, engine="milexec")
    session.feed([1])
    times = []
    for step in range(runs):
        start = time.perf_counter()
        session.feed([step + 2])
        times.append(time.perf_counter() - start)
    median, p90 = _stats(times)
    return {"case": "llama8x1024_decode_step", "median_s": median, "p90_s": p90, "tokens_per_s": 1 / median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-decode", action="store_true", help="skip the stateful decode case")
    args = parser.parse_args()
    _quiet()
    sys.path.insert(0, str(HERE))
    from bench_models import DECODER16

    from rlx_mil.models.transformer import DecoderConfig

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        small = DecoderConfig(hidden=256, heads=4, kv_heads=2, intermediate=704, layers=4, seq=128)
        rows.append(decoder_case("decoder4x256_s128", small, args.runs))
        rows.append(decoder_case("decoder16x1024_s128", DECODER16, args.runs))
        if not args.no_decode:
            rows.append(decode_case(args.runs * 4, work))
    print("| case | median | p90 | tokens/s | non-const ops |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['median_s']:.3f} s | {r['p90_s']:.3f} s | {r['tokens_per_s']:.1f} | {r.get('ops', '')} |")
    if args.json:
        with args.json.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
