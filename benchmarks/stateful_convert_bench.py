"""Issue 20's conversion targets: a stateful 3-function package (decode, prefill 64, prefill 512)
against the plain prefill conversion of the same checkpoint.

Writes the Qwen3-0.6B-shaped BF16 checkpoint of `bench_hf_checkpoint.py` (or, with
`--model llama1b`, the Llama-3.2-1B-shaped one of `convert_bench.py`) once, then runs each
conversion as `rlx-mil convert-hf` in a fresh process through `peak_rss.py` (its own VmHWM;
PyTorch blocked, as rlx_mil runs without the bench extra) and prints wall time, CPU time
(user + system of the process: what the machine's load does not stretch), peak RSS, and the
ratios to the targets: stateful time <= 2x the plain prefill conversion's, stateful peak RSS
<= 1.3x the fp16 weight bytes. The machine's `uptime` is printed before and after each run.

    flock /tmp/rlx_bigmem.lock python benchmarks/stateful_convert_bench.py [--work DIR] [--model llama1b]

`--checkpoint DIR` converts that checkpoint folder instead (e.g. SmolLM2-135M from
`real_checkpoints.py`); `--compress SPEC` also converts the stateful package compressed (issue
31: a multifunction conversion compresses each weight once, so it should cost about the
uncompressed one plus one compression) and prints its ratios to the uncompressed stateful
conversion; `--code DIR` runs the conversions with the rlx_mil of another checkout (an older
commit, for a before/after in the same run).
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


#: The rlx_mil checkout the conversions run (--code).
CODE = HERE.parent


def run_convert(checkpoint: Path, output: Path, extra: list[str]) -> dict[str, Any]:
    """One `rlx-mil convert-hf` in a fresh process: wall s, CPU s, peak RSS bytes."""
    shutil.rmtree(output, ignore_errors=True)
    peak = output.with_suffix(".peak")
    command = [sys.executable, str(HERE / "peak_rss.py"), str(peak), "rlx_mil.cli", "convert-hf", str(checkpoint),
               "-o", str(output), "-q", *extra]
    env = {**os.environ, "PYTHONPATH": str(CODE), "RLX_BENCH_WITHOUT_TORCH": "1", "TQDM_DISABLE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = uptime()
    start = time.perf_counter()
    subprocess.run(command, cwd=CODE, env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    weights = sum(p.stat().st_size for p in output.rglob("weight.bin"))
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_bytes": int(peak.read_text()), "weight_bytes": weights,
            "uptime_before": load, "uptime_after": uptime()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="keep the checkpoint and packages here (reused)")
    parser.add_argument("--model", choices=["qwen3_0.6b", "llama1b"], default="qwen3_0.6b")
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--checkpoint", type=Path, help="convert this checkpoint folder instead of a random one")
    parser.add_argument("--compress", metavar="SPEC", help="also the stateful conversion compressed with SPEC")
    parser.add_argument("--code", type=Path, help="run the conversions with the rlx_mil checkout in DIR")
    parser.add_argument("--no-plain", action="store_true",
                        help="skip the plain prefill conversion (only the stateful ones and their ratios)")
    args = parser.parse_args()
    global CODE
    CODE = (args.code or CODE).resolve()
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from rlx_mil.models.random_checkpoint import QWEN3_0_6B, write_random_checkpoint

    work = args.work or Path(tempfile.mkdtemp(prefix="rlx_mil_stateful_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        checkpoint = args.checkpoint or work / args.model
        if not (checkpoint / "config.json").is_file():
            if args.model == "llama1b":
                from bench_models import LLAMA_1B_CONFIG
                config = dict(LLAMA_1B_CONFIG)
            else:
                config = dict(QWEN3_0_6B)
            write_random_checkpoint(checkpoint, config, dtype="bfloat16", shards=2, seed=0)
        plain = (None if args.no_plain else
                 run_convert(checkpoint, work / "plain.mlpackage", ["--variant", "prefill", "--seq-len", "128"]))
        stateful_flags = ["--stateful", "--max-context", str(args.max_context), "--prefill", "64,512"]
        stateful = run_convert(checkpoint, work / "stateful.mlpackage", stateful_flags)
        compressed = (run_convert(checkpoint, work / "compressed.mlpackage", [*stateful_flags, "--compress", args.compress])
                      if args.compress else None)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    # The stateful package stores each weight once, so its weight.bin is the fp16 weight bytes too.
    fp16 = plain["weight_bytes"] if plain is not None else stateful["weight_bytes"]
    model = args.checkpoint.name if args.checkpoint else args.model
    rows: dict[str, Any] = {"model": model, "plain_prefill": plain, "stateful_3_functions": stateful,
                            "rss_over_fp16_weights": stateful["peak_rss_bytes"] / fp16}
    mib = 2**20
    print(f"{model}: fp16 weights {fp16 / mib:,.0f} MiB, stateful package {stateful['weight_bytes'] / mib:,.0f} MiB")
    print("| conversion | wall | CPU | peak RSS | / fp16 weights | load before -> after |")
    print("|---|---|---|---|---|---|")
    runs = [("stateful decode + prefill 64 + 512", stateful)]
    if plain is not None:
        runs.insert(0, ("plain prefill (S=128)", plain))
    for name, r in runs:
        print(f"| {name} | {r['wall_s']:.1f} s | {r['cpu_s']:.1f} s | {r['peak_rss_bytes'] / mib:,.0f} MiB"
              f" | {r['peak_rss_bytes'] / fp16:.2f}x | {_load(r['uptime_before'])} -> {_load(r['uptime_after'])} |")
    if plain is not None:
        rows["time_ratio"] = stateful["wall_s"] / plain["wall_s"]
        rows["cpu_ratio"] = stateful["cpu_s"] / plain["cpu_s"]
        print(f"target time <= 2x plain: wall {rows['time_ratio']:.2f}x, CPU {rows['cpu_ratio']:.2f}x"
              f" ({'met' if rows['time_ratio'] <= 2 else 'not met'} on wall time)")
    print(f"target peak RSS <= 1.3x fp16 weights: {rows['rss_over_fp16_weights']:.2f}x"
          f" ({'met' if rows['rss_over_fp16_weights'] <= 1.3 else 'not met'})")
    if compressed is not None:
        rows["stateful_compressed"] = compressed
        print(f"| stateful compressed ({args.compress}) | {compressed['wall_s']:.1f} s | {compressed['cpu_s']:.1f} s"
              f" | {compressed['peak_rss_bytes'] / mib:,.0f} MiB | {compressed['peak_rss_bytes'] / fp16:.2f}x"
              f" | {_load(compressed['uptime_before'])} -> {_load(compressed['uptime_after'])} |")
        rows["compressed_cpu_ratio"] = compressed["cpu_s"] / stateful["cpu_s"]
        rows["compressed_peak_rss_ratio"] = compressed["peak_rss_bytes"] / stateful["peak_rss_bytes"]
        print(f"compressed / uncompressed stateful: CPU {compressed['cpu_s'] / stateful['cpu_s']:.2f}x, wall"
              f" {compressed['wall_s'] / stateful['wall_s']:.2f}x, peak RSS"
              f" {compressed['peak_rss_bytes'] / stateful['peak_rss_bytes']:.2f}x (code: {CODE})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _load(line: str) -> str:
    return line.rsplit("load average:", 1)[-1].strip().split(",")[0] if "load average" in line else "?"


if __name__ == "__main__":
    sys.exit(main())
