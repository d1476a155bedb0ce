"""Decode time per token of stateful packages on the MIL executor, each against the first
(issue 31: a compressed package should run within 1.5x the fp16 package's time per token).

Each package and memory mode runs in a fresh process: open a `rlx_mil.generate.Session` on the
executor, feed a --prompt-token prompt, then time --steps one-token decode calls (CPU time of
the process and wall time, median per step). The first package is the peer every ratio is
against, measured in the same run.

    python benchmarks/package_decode_speed.py FP16.mlpackage INT8.mlpackage ... [--memory auto compact] [--steps 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(package: str, memory: str, prompt: int, steps: int) -> dict[str, object]:
    from rlx_mil.llm.generate import Session

    session = Session(package, engine="milexec", memory=memory)  # type: ignore[arg-type]
    session.feed([1 + (7 * i) % (session.vocab - 1) for i in range(prompt)])
    cpu, wall = [], []
    for step in range(steps):
        c, w = time.process_time(), time.perf_counter()
        session.feed([2 + step])
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {"package": package, "memory": memory, "chosen": session.memory, "cpu_s": statistics.median(cpu),
            "wall_s": statistics.median(wall)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--memory", nargs="+", default=["auto"], choices=["auto", "fast", "compact", "lean"])
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.packages[0], args.memory[0], args.prompt, args.steps)))
        return 0
    rows = []
    for package in args.packages:
        for memory in args.memory:
            out = subprocess.run([sys.executable, __file__, package, "--memory", memory, "--prompt", str(args.prompt),
                                  "--steps", str(args.steps), "--worker"], check=True, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": str(HERE.parent)})
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  {rows[-1]}", flush=True)
    peer = rows[0]
    print(f"| package | memory (chosen) | CPU s / token | wall s / token | CPU vs {Path(str(peer['package'])).name} |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {Path(str(r['package'])).name} | {r['memory']} ({r['chosen']}) | {r['cpu_s']:.4f} | {r['wall_s']:.4f}"
              f" | {float(r['cpu_s']) / float(peer['cpu_s']):.2f}x |")
    print(f"(load {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
