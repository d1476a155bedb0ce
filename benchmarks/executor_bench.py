"""Speed of rlx_mil's NumPy MIL executor (`rlx_mil.milexec`) on converted decoder programs.

Converts each decoder once (fp16, iOS18), then runs the saved package through the executor
--runs times after one warm-up: median and p90 seconds per forward pass, tokens/s of the
prefill, and the ops executed. Cases: the 4-layer hidden-256 and the 16-layer hidden-1024
decoders at S=128, and one-token decode steps of a stateful Llama package (8 layers, hidden
1024, `rlx_mil.generate.Session` on the executor).

    python benchmarks/executor_bench.py [--runs 5 --json executor.jsonl]
    python benchmarks/executor_bench.py --llm [--llm-layers 28] [--int4] [--generate] [--llm-work DIR]

`--llm`: the Qwen3-0.6B-shaped checkpoint of `bench_hf_checkpoint.py` (28 layers, vocab 151936,
BF16) converted to a stateful fp16 package (max context 2048, prefill 64 + decode; `--int4`
also an int4 one), then, for each memory mode ("fast" and "lean"; for the int4 package also
the default, "auto", which picks "compact" for a compressed package), a fresh worker process: a
64-token prefill, 16 decode steps (tokens/s), its own peak RSS (VmHWM) against the package's
weight bytes, and the machine's bound for a decode step: the bytes of weights it reads
(float32 where cached, else fp16) over the measured copy bandwidth. Each row says the machine's 1-minute load before and
after it, the CPU time next to the wall time (what other processes' load does not stretch),
and the ratio of each figure to issue 20's target; `--generate` also times
`rlx-mil generate -n 32` on the fp16 package. The workers run with PyTorch blocked (coremltools
imports it whenever it is installed; rlx_mil never needs it).

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


def copy_bandwidth() -> float:
    """Bytes per second of a 256 MiB float32 copy (read + write counted once), best of 5."""
    import numpy as np

    src = np.ones(1 << 26, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best


def llm_worker(package: str, memory: str, steps: int) -> dict[str, Any]:
    """One Session in this process: prefill 64, `steps` decode steps, peak RSS."""
    import resource

    from peak_rss import peak_rss_bytes

    from rlx_mil.generate import Session

    start, cpu, system = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
    session = Session(package, engine="milexec", memory=memory)
    opened, opened_cpu = time.perf_counter() - start, time.process_time() - cpu
    opened_sys = resource.getrusage(resource.RUSAGE_SELF).ru_stime - system
    prompt = [1 + (37 * i) % 1000 for i in range(64)]
    start, cpu = time.perf_counter(), time.process_time()
    logits = session.feed(prompt)
    prefill, prefill_cpu = time.perf_counter() - start, time.process_time() - cpu
    times = []
    cpu = time.process_time()
    for _ in range(steps):
        start = time.perf_counter()
        logits = session.feed([int(logits.argmax())])
        times.append(time.perf_counter() - start)
    median, p90 = _stats(times)
    return {"memory": session.memory, "open_s": opened, "open_cpu_s": opened_cpu, "open_sys_s": opened_sys,
            "prefill64_s": prefill, "prefill64_cpu_s": prefill_cpu,
            "decode_median_s": median, "decode_p90_s": p90, "decode_tokens_per_s": 1 / median,
            "decode_cpu_s": (time.process_time() - cpu) / steps, "peak_rss_bytes": peak_rss_bytes(),
            "prepared_bytes": session._prepared.prepared_bytes}


def uptime() -> str:
    import subprocess

    line = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    return line.rsplit("load average:", 1)[-1].strip().split(",")[0] if "load average" in line else "?"


def generate_case(package: Path) -> dict[str, Any]:
    """`rlx-mil generate PACKAGE --prompt-ids 1,2,3 -n 32` in a fresh process: the command's wall
    and CPU time, and the part of it opening the package took (what the command reports)."""
    import os
    import re
    import resource
    import subprocess

    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    before, cpu = uptime(), children_cpu()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rlx_mil.cli", "generate", str(package), "--prompt-ids", "1,2,3", "-n", "32",
         "--engine", "milexec"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parent), "TQDM_DISABLE": "1"},
    )
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    lines = done.stderr.strip().splitlines()
    opened = re.search(r"package opened in ([\d.]+) s \(CPU ([\d.]+) s\)", lines[-1]) if lines else None
    return {"generate32_s": wall, "generate32_cpu_s": cpu, "load_before": before, "load_after": uptime(),
            "generate_open_s": float(opened.group(1)) if opened else None,
            "generate_open_cpu_s": float(opened.group(2)) if opened else None,
            "report": lines[-1] if lines else ""}


def llm_case(work: Path, layers: int, int4: bool, steps: int, generate: bool = False) -> list[dict[str, Any]]:
    import os
    import subprocess

    from rlx_mil.llm.package import convert_llm_checkpoint
    from rlx_mil.models.random_checkpoint import QWEN3_0_6B, write_random_checkpoint

    config = dict(QWEN3_0_6B, num_hidden_layers=layers)
    checkpoint = work / "qwen3"
    if not (checkpoint / "config.json").is_file():
        write_random_checkpoint(checkpoint, config, dtype="bfloat16", shards=2, seed=0)
    packages = {"fp16": work / "fp16.mlpackage"}
    if int4:
        packages["int4"] = work / "int4.mlpackage"
    rows = []
    bandwidth = copy_bandwidth()
    for kind, package in packages.items():
        start = time.perf_counter()
        options: dict[str, Any] = {"compress": "int4"} if kind == "int4" else {}
        if not package.exists():  # --llm-work keeps the packages of an earlier run
            convert_llm_checkpoint(checkpoint, package, max_context=2048, prefill=[64], **options)
        converted = time.perf_counter() - start
        weight_bytes = sum(p.stat().st_size for p in package.rglob("weight.bin"))
        fp16_bytes = weight_bytes if kind == "fp16" else rows[0]["weight_bytes"]
        for memory in ("auto", "fast", "lean") if kind == "int4" else ("fast", "lean"):
            load = uptime()
            done = subprocess.run(
                [sys.executable, __file__, "--llm-worker", str(package), memory, str(steps)],
                capture_output=True, text=True, check=True,
                env={**os.environ, "PYTHONPATH": str(HERE.parent), "RLX_BENCH_WITHOUT_TORCH": "1"},
            )
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["load"] = f"{load} -> {uptime()}"
            # float32 for what is cached, fp16 for the rest (what a decode step's products read).
            read = fp16_bytes + row["prepared_bytes"] // 2
            bound = read / bandwidth
            label = memory if memory == row["memory"] else f"{memory}={row['memory']}"
            rows.append({"case": f"qwen3_0.6b_{layers}l_{kind}_{label}", "kind": kind, "convert_s": converted,
                         "weight_bytes": weight_bytes, "fp16_weight_bytes": fp16_bytes,
                         "rss_over_weights": row["peak_rss_bytes"] / fp16_bytes, "copy_bandwidth": bandwidth,
                         "bound_s": bound, "bound_ratio": row["decode_median_s"] / bound, **row})
        if kind == "fp16" and generate:
            rows[-1].update(generate_case(package))
    return rows


#: Issue 20's targets: (row kind, memory) -> (decode tok/s at least, peak RSS / fp16 weights at most).
#: The int4 one is for the default policy ("auto" = "compact"); fast and lean show the two ends.
TARGETS = {("fp16", "fast"): (3.0, 2.5), ("fp16", "lean"): (None, 1.3), ("int4", "compact"): (2.0, 1.3),
           ("int4", "fast"): (2.0, 1.3), ("int4", "lean"): (2.0, 1.3)}


def print_llm(rows: list[dict[str, Any]]) -> None:
    print("| case | load | open (CPU; of it system) | prefill 64 (CPU) | decode tok/s (median, p90; CPU per step) | peak RSS | / fp16 weights"
          " | bound per step | x bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        opened = f"{r['open_s']:.1f} s" + (f" ({r['open_cpu_s']:.2f} s; {r['open_sys_s']:.2f} s)" if "open_cpu_s" in r else "")
        print(f"| {r['case']} | {r['load']} | {opened} | {r['prefill64_s']:.2f} s ({r['prefill64_cpu_s']:.2f} s)"
              f" | {r['decode_tokens_per_s']:.2f} ({r['decode_median_s']:.3f} s, {r['decode_p90_s']:.3f} s;"
              f" {r['decode_cpu_s']:.3f} s) | {r['peak_rss_bytes'] / 2**20:,.0f} MiB"
              f" | {r['rss_over_weights']:.2f}x | {r['bound_s'] * 1e3:.0f} ms | {r['bound_ratio']:.1f}x |")
    if rows:
        print(f"copy bandwidth {rows[0]['copy_bandwidth'] / 1e9:.1f} GB/s; fp16 weights {rows[0]['fp16_weight_bytes'] / 2**20:,.0f} MiB;"
              " conversions " + ", ".join(sorted({f"{r['kind']} {r['convert_s']:.0f} s" for r in rows})))
    print("targets (ratio = measured / target; decode >= 1 and RSS <= 1 meet them):")
    for r in rows:
        speed, rss = TARGETS.get((r["kind"], r["memory"]), (None, None))
        parts = [f"prefill 64 <= 5 s: {r['prefill64_s'] / 5:.2f}"]
        if speed is not None:
            parts.append(f"decode >= {speed:g} tok/s: {r['decode_tokens_per_s'] / speed:.2f}"
                         f" (from CPU time {1 / r['decode_cpu_s'] / speed:.2f})")
        if rss is not None:
            parts.append(f"RSS <= {rss:g}x: {r['rss_over_weights'] / rss:.2f}")
        print(f"  {r['case']} (load {r['load']}): " + "; ".join(parts))
    for r in rows:
        if "generate32_s" in r:
            print(f"  rlx-mil generate -n 32 on {r['kind']} (load {r['load_before']} -> {r['load_after']}):"
                  f" {r['generate32_s']:.1f} s (CPU {r['generate32_cpu_s']:.1f} s), target < 60 s:"
                  f" {r['generate32_s'] / 60:.2f}")
            if r.get("generate_open_s") is not None:
                print(f"    opening the package (load + prepare): {r['generate_open_s']:.2f} s"
                      f" (CPU {r['generate_open_cpu_s']:.2f} s)")
            print(f"    {r['report']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-decode", action="store_true", help="skip the stateful decode case")
    parser.add_argument("--llm", action="store_true", help="only the 0.6B-shaped stateful package (see the module doc)")
    parser.add_argument("--llm-layers", type=int, default=28)
    parser.add_argument("--llm-steps", type=int, default=16)
    parser.add_argument("--int4", action="store_true", help="--llm: also an int4-compressed package")
    parser.add_argument("--generate", action="store_true", help="--llm: also time `rlx-mil generate -n 32` on the fp16 package")
    parser.add_argument("--llm-work", type=Path, help="--llm: keep the checkpoint and packages here (reused if present)")
    parser.add_argument("--llm-worker", nargs=3, metavar=("PACKAGE", "MEMORY", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    _quiet()
    sys.path.insert(0, str(HERE))
    if args.llm_worker:
        import os

        if os.environ.get("RLX_BENCH_WITHOUT_TORCH") == "1":  # as peak_rss.py: coremltools would import it
            sys.modules["torch"] = None  # type: ignore[assignment]
        package, memory, steps = args.llm_worker
        print(json.dumps(llm_worker(package, memory, int(steps))))
        return
    if args.llm:
        if args.llm_work is not None:
            args.llm_work.mkdir(parents=True, exist_ok=True)
            rows = llm_case(args.llm_work, args.llm_layers, args.int4, args.llm_steps, args.generate)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                rows = llm_case(Path(tmp), args.llm_layers, args.int4, args.llm_steps, args.generate)
        print_llm(rows)
        if args.json:
            with args.json.open("a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        return
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
