"""Reliability round 4: hostile inputs tried as a new user would, one `rlx-mil` process per case.

Every case runs the command line in a fresh process (TMPDIR a private folder) and passes when
it ends in a correct result (exit 0 and the check the case names) or in a typed failure: exit
1 or 2 (130 for an interrupt) with one `rlx-mil CMD: ...` line last on stderr (or a problem
list: that line, then `  - ` lines), no traceback, no internal error, JSON on stdout where
--json was given, and nothing left in TMPDIR. Each case's wall time, CPU time and peak RSS (the
child's `ru_maxrss`) are printed; a case over 60 s of CPU (of wall time too with --wall-limit,
for an idle machine: on a shared one wall time follows the load) or 1 GiB fails. A hang is
killed at 120 s.

Surfaces: templates, tokenizers, GGUF metadata, generation and evaluation limits, chunked
sets, packages from anywhere, compression options, deploy/target combinations, interrupts
and concurrency, audio files for `transcribe`, and Core AI `.aimodel` assets.

    python benchmarks/hostile_round4.py [--work DIR] [--only SUBSTRING] [--jobs 2]

The fixtures (tiny random checkpoints, their packages, a Whisper folder, a GGUF file, a
chunked set and a Core AI asset) are built once into --work (default a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from hostile_round4_cases import Case, cases
from hostile_round4_fixtures import LIMIT_RSS, LIMIT_SECONDS, _cli, _env, build_fixtures

WALL_LIMIT = [False]

def _one_failure(lines: list[str]) -> bool:
    """stderr ends in one `rlx-mil CMD: error: ...` (or `interrupted`) line, or in a problem
    list: its heading line and then one `  - problem` line each."""
    at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(("rlx-mil ", "rlx-mil:"))), None)
    if at is None:
        return False
    return all(line.startswith("  - ") for line in lines[at + 1:])


def interpreter_start(tmpdir: Path) -> float:
    """Seconds from spawn to the end of a bare `python -c pass` in the cases' environment (the
    median of three): the interpreter's own start (site, the editable install's finder)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=_env(tmpdir), check=True)
        times.append(time.perf_counter() - start)
    return sorted(times)[1]


def run_case(case: Case, tmp_root: Path) -> dict[str, Any]:
    tmpdir = Path(tempfile.mkdtemp(prefix="case-", dir=tmp_root))
    if case.before is not None:
        case.before()
    delay = case.interrupt_after
    if delay is not None and case.after_interpreter_start:
        delay += interpreter_start(tmpdir)
    start = time.perf_counter()
    proc = subprocess.Popen(_cli(*case.argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmpdir))
    if case.during is not None:
        os.environ["HOSTILE_TMP"] = str(tmpdir)
        threading.Thread(target=case.during, args=(proc,), daemon=True).start()
    timer = None
    if delay is not None:
        timer = threading.Timer(delay, lambda: proc.send_signal(signal.SIGINT))
        timer.start()
    outputs: dict[str, str] = {}

    def drain(name: str, stream: Any) -> None:
        if name != "err" or case.interrupt_on is None:
            outputs[name] = stream.read()
            return
        seen, sent = [], False
        for line in stream:  # the first line showing the text gets the SIGINT
            seen.append(line)
            if not sent and case.interrupt_on in line:
                proc.send_signal(signal.SIGINT)
                sent = True
        outputs[name] = "".join(seen)

    readers = [threading.Thread(target=drain, args=(n, st), daemon=True)
               for n, st in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    # a hang is killed at twice the limit (and fails on its time)
    killer = threading.Timer(2 * LIMIT_SECONDS, lambda: proc.send_signal(signal.SIGKILL))
    killer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    killer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    for reader in readers:
        reader.join(LIMIT_SECONDS)
    if timer is not None:
        timer.cancel()
    code = proc.returncode
    done = subprocess.CompletedProcess(case.argv, code, outputs.get("out", ""), outputs.get("err", ""))
    rss = usage.ru_maxrss * 1024
    cpu = usage.ru_utime + usage.ru_stime
    problems = []
    lines = done.stderr.strip().splitlines()
    if code not in case.codes:
        problems.append(f"exit {code}, expected {case.codes}")
    if "Traceback" in done.stderr or "internal error" in done.stderr:
        problems.append("a traceback or internal error")
    silent = case.silent_ok and code == -2 and not done.stderr.strip()
    if code != 0 and not silent and not _one_failure(lines):
        problems.append("no one-line rlx-mil error last")
    if code != 0 and sum(ln.startswith("rlx-mil ") and ": error:" in ln for ln in lines) > 1:
        problems.append("more than one error line")
    if code == 0 and case.check is not None:
        try:
            if not case.check(done):
                problems.append("the result's check failed")
        except Exception as err:  # any failure of the check is the case's failure
            problems.append(f"the result's check raised {type(err).__name__}: {err}")
    if case.json_out:
        try:
            json.loads(done.stdout)
        except ValueError:
            problems.append("--json printed no JSON")
    # On a shared machine wall time follows the load: the limit holds the CPU time (the wall
    # time too when --wall-limit is given).
    if cpu > LIMIT_SECONDS or (WALL_LIMIT[0] and seconds > LIMIT_SECONDS):
        problems.append(f"{seconds:.0f} s wall, {cpu:.0f} s CPU")
    if rss > LIMIT_RSS:
        problems.append(f"peak RSS {rss / 2**20:.0f} MiB")
    left = [p.name for p in tmpdir.iterdir()]
    if left:
        problems.append(f"left in TMPDIR: {left}")
    for path in case.absent if code != 0 else ():  # a command that finished leaves its result
        if path.exists():
            problems.append(f"left behind: {path}")
    shutil.rmtree(tmpdir, ignore_errors=True)
    # A Ctrl-C that landed in Python's own start (site, the editable install's finder, runpy)
    # before the package's first line: Python's traceback, no frame of ours. Counted apart.
    before_us = (case.interrupt_after is not None and "KeyboardInterrupt" in done.stderr
                 and f"{os.sep}rlx_mil{os.sep}" not in done.stderr and "rlx-mil" not in done.stderr)
    return {"case": case.name, "before_rlx_mil": bool(problems) and before_us, "exit": code, "seconds": round(seconds, 2), "cpu": round(cpu, 2),
            "rss_mib": round(rss / 2**20, 1),
            "ok": not problems, "problems": problems, "last_line": lines[-1] if lines else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="folder for the fixtures (kept; default a temporary folder)")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--wall-limit", action="store_true", help="hold the wall time to 60 s too (an idle machine)")
    args = parser.parse_args()
    WALL_LIMIT[0] = args.wall_limit
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started as a background job (`cmd &` without job control): SIGINT is ignored here and
        # in every child, and the interrupt cases would test nothing. A handler here is reset to
        # the default in each child, as a command a user Ctrl-Cs in a terminal starts.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    work = args.work or Path(tempfile.mkdtemp(prefix="hostile_round4_"))
    fx = build_fixtures(work)
    todo = [c for c in cases(fx, work) if args.only in c.name]
    tmp_root = work / "tmp"
    tmp_root.mkdir(exist_ok=True)
    print(f"{len(todo)} cases, fixtures in {work}", flush=True)
    serial = [c for c in todo if c.interrupt_after is not None or c.interrupt_on is not None or c.during is not None]

    def show(r: dict[str, Any]) -> dict[str, Any]:
        mark = "ok  " if r["ok"] else "PRE " if r["before_rlx_mil"] else "FAIL"
        print(f"{mark} {r['seconds']:6.1f} s ({r['cpu']:5.1f} s CPU) {r['rss_mib']:7.1f} MiB  exit {r['exit']:3d}"
              f"  {r['case']}"
              + ("" if r["ok"] else f"  <- {'; '.join(r['problems'])}: {r['last_line'][:160]}"), flush=True)
        return r

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = [pool.submit(run_case, c, tmp_root) for c in todo if c not in serial]
        results = [show(f.result()) for f in as_completed(futures)]
    results += [show(run_case(c, tmp_root)) for c in serial]
    passed = sum(r["ok"] for r in results)
    early = sum(r["before_rlx_mil"] for r in results)
    slowest = max(results, key=lambda r: r["seconds"])
    busiest = max(results, key=lambda r: r["cpu"])
    largest = max(results, key=lambda r: r["rss_mib"])
    print(f"\n{passed} of {len(results)} cases end in a typed error or a correct result; slowest"
          f" {slowest['seconds']:.1f} s wall ({slowest['case']}), most CPU {busiest['cpu']:.1f} s ({busiest['case']}),"
          f" largest peak RSS {largest['rss_mib']:.0f} MiB ({largest['case']}); load average"
          f" {os.getloadavg()[0]:.1f} at the end")
    if early:
        print(f"{early} of the failures (PRE) are a Ctrl-C that landed in Python's own start, before any"
              " rlx_mil code ran: Python's traceback; no code in the package can handle those")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
