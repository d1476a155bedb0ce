"""How soon `rlx-mil` answers: the wall time of `--help`, `--version` and a usage error, and the
time to the first output line of the commands that open a package or checkpoint (on a
pseudo-terminal, where the commands print their first line before their imports' seconds),
each against the peer `python -c pass` measured in the same run.

    python benchmarks/cli_startup.py [--package PKG] [--checkpoint DIR] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def wall(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=_env(), capture_output=True, check=False)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def first_line(argv: list[str], timeout: float = 120) -> float:
    """Seconds until the command writes its first full line on a pseudo-terminal (then it is stopped)."""
    start = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:
        os.environ.update(_env())
        os.execvp(argv[0], argv)
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a terminal's size
    seen = b""
    try:
        while time.perf_counter() - start < timeout:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    seen += os.read(fd, 4096)
                except OSError:
                    break
                if b"\n" in seen or b"\r" in seen:
                    return time.perf_counter() - start
        return float("nan")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, help="a stateful LLM package (generate, chat, eval, preflight, inspect)")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint folder (convert-hf)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "rlx_mil.cli"]
    runs = [wall([sys.executable, "-c", "pass"]) for _ in range(args.repeat)]
    peer = statistics.median(r[0] for r in runs)
    print(f"peer `python -c pass`: {peer:.3f} s (CPU {statistics.median(r[1] for r in runs):.3f} s)")
    for label, argv in (("--help", [*cli, "--help"]), ("--version", [*cli, "--version"]),
                        ("usage error (--temperature -1)", [*cli, "generate", "x", "--prompt", "hi", "--temperature", "-1"])):
        runs = [wall(argv) for _ in range(args.repeat)]
        t, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        print(f"{label}: {t:.3f} s, CPU {cpu:.3f} s ({t / peer:.1f}x the peer)")
    firsts: list[tuple[str, list[str]]] = []
    if args.package is not None:
        p = str(args.package)
        firsts += [("generate", [*cli, "generate", p, "--prompt", "hi"]), ("chat", [*cli, "chat", p]),
                   ("eval", [*cli, "eval", p]), ("preflight", [*cli, "preflight", p]), ("inspect", [*cli, "inspect", p])]
    if args.checkpoint is not None:
        firsts.append(("convert-hf", [*cli, "convert-hf", str(args.checkpoint), "-o", "/tmp/rlx_mil_startup.mlpackage"]))
    for label, argv in firsts:
        t = statistics.median(first_line(argv) for _ in range(max(1, args.repeat // 2)))
        print(f"{label}: first line after {t:.3f} s ({t / peer:.1f}x the peer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
