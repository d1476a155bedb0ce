"""Peak resident memory of the measured process itself.

`resource.getrusage(...).ru_maxrss` is the wrong measure in a freshly started worker: Linux
carries it across fork and exec, so a worker started by a large parent reports at least the
parent's size at the fork. The kernel's `VmHWM` (/proc/self/status) is the high-water mark of
this process's own memory; off Linux, ru_maxrss is what there is.

Run as a script it runs a module the way `python -m` does and writes its peak to a file:

    python benchmarks/peak_rss.py PEAK_FILE MODULE [ARGS...]

With `RLX_BENCH_WITHOUT_TORCH=1` in the environment the module runs as if PyTorch were not
installed: coremltools imports it whenever it is (~200 MB of RSS), and rlx_mil itself never
needs it.
"""

from __future__ import annotations

import os
import resource
import runpy
import sys
from pathlib import Path


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KB elsewhere


def main() -> None:
    report, module, *args = sys.argv[1:]
    if os.environ.get("RLX_BENCH_WITHOUT_TORCH") == "1":
        sys.modules["torch"] = None  # type: ignore[assignment]
    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()  # as `python -m` has it (not this script's folder)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        Path(report).write_text(str(peak_rss_bytes()))


if __name__ == "__main__":
    main()
