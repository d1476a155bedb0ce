"""What opening a package for the MIL executor costs, part by part, each in a fresh process.

    python benchmarks/load_bench.py PACKAGE [--repeat 3]

Parts: `import coremltools` (with PyTorch and transformers blocked, as the `rlx-mil` command
runs, and as an ordinary import where they are installed); reading the package's program with
coremltools' milproto loader (`milexec.load_program`, a pymil Program) and with rlx_mil's
protobuf reader (`milexec.protoread.read_program`, what `prepare` uses); and a whole
`prepare(PACKAGE)` in each memory mode. Each is wall and CPU seconds (system time apart: on a
VM the first touch of fresh memory is system time), the best of --repeat fresh processes, with
the machine's 1-minute load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_WORKER = r"""
import json, resource, sys, time
part, package = sys.argv[1], sys.argv[2]
if part != "import_with_torch":
    sys.modules["torch"] = None
    sys.modules["transformers"] = None
import numpy
if part.startswith("import"):
    run = lambda: __import__("coremltools")
else:
    import coremltools
    import coremltools.converters.mil.frontend.milproto.load
    import rlx_mil.milexec.kernels
    from rlx_mil.milexec.loader import load_program
    from rlx_mil.milexec.prepared import prepare
    from rlx_mil.milexec.protoread import read_program
    run = {"load_program": lambda: load_program(package), "read_program": lambda: read_program(package),
           "prepare_fast": lambda: prepare(package, memory="fast"),
           "prepare_lean": lambda: prepare(package, memory="lean")}[part]
usage = resource.getrusage(resource.RUSAGE_SELF)
start, cpu = time.perf_counter(), time.process_time()
result = run()
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - usage.ru_stime
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "sys_s": system, "read": result is not None}))
"""

PARTS = ("import", "import_with_torch", "load_program", "read_program", "prepare_fast", "prepare_lean")


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def measure(part: str, package: str, repeat: int) -> dict[str, object]:
    runs = []
    before = load_average()
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", _WORKER, part, package], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["cpu_s"])
    return {"part": part, **best, "load": f"{before} -> {load_average()}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = [measure(part, args.package, args.repeat) for part in PARTS]
    print("| part | load | wall | CPU (of it system) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['part']} | {r['load']} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s ({r['sys_s']:.2f} s) |")
    if args.json:
        with args.json.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
