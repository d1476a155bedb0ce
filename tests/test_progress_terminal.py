"""Progress on a pseudo-terminal: a stage's bar shows its count, rate and ETA moving, its clock
moves while nothing is counted, and deep code (the lowering's op loop, coremltools' passes)
reports to the running stage. Nothing but the stage lines when the stream is not a terminal."""

from __future__ import annotations

import fcntl
import io
import os
import re
import struct
import termios
import time
from collections.abc import Callable

import numpy as np
import pytest

from rlx_mil import progress as progress_module
from rlx_mil.progress import Progress, detail, expect, tick


def _terminal() -> tuple[int, io.TextIOWrapper]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    os.set_blocking(master, False)
    return master, io.TextIOWrapper(os.fdopen(slave, "wb", buffering=0), write_through=True)


def _screen(master: int) -> str:
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except (BlockingIOError, OSError):
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def _frames(text: str) -> list[str]:
    return [f for f in re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)) if f.strip()]


def test_the_count_rate_and_clock_move(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "REFRESH_SECONDS", 0.1)
    master, stream = _terminal()
    try:
        progress = Progress(stream=stream)
        progress.begin("converting function decode (1/1)", unit=" ops")
        expect(" ops", 40)
        for _ in range(20):
            tick(" ops")
            tick(" tensors")  # another stage's unit: not counted here
            time.sleep(0.03)
        detail("Core ML pass const_elimination")
        time.sleep(0.3)
        first = _frames(_screen(master))
        time.sleep(1.2)  # no count: the clock alone moves
        later = _frames(_screen(master))
        progress.begin("joining 1 functions")  # a stage that counts nothing shows a clock
        time.sleep(1.3)
        joining = _frames(_screen(master))
        progress.end()
    finally:
        stream.close()
        os.close(master)
    counts = [int(m.group(1)) for f in first if (m := re.search(r"\| *(\d+)/40 \[", f))]
    assert counts and counts == sorted(counts) and counts[-1] == 20 and len(set(counts)) > 3, first
    assert any("ops/s" in f for f in first) and any("Core ML pass const_elimination" in f for f in first + later)
    assert any(re.search(r"20/40 \[00:01<", f) for f in later), later  # the clock moved past 1 s
    assert any(re.search(r"joining 1 functions: 00:01", f) for f in joining), joining
    assert not any("?it/s" in f or "0it" in f for f in joining)


def test_not_a_terminal_gets_the_stage_lines_alone() -> None:
    stream = io.StringIO()
    progress = Progress(stream=stream)
    progress.begin("building the MIL program", unit=" ops")
    expect(" ops", 3)
    tick(" ops")
    progress.end("done")
    assert re.fullmatch(r"  building the MIL program: done \(\d+\.\d s\)\n", stream.getvalue())
    quiet = io.StringIO()
    Progress(enabled=False, stream=quiet).begin("x")
    assert quiet.getvalue() == ""


def test_a_conversion_counts_its_ops_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lowering's op loop, the weights compressed and coremltools' pass names reach the bar
    of the running stage."""
    import rlx_mil
    from rlx_mil import Graph
    from rlx_mil.milexec.prepared import prepare

    g = Graph("block")
    x = g.input("x", [1, 4, 64])
    h = x
    for i in range(6):
        h = g.gelu(g.matmul(h, g.param(f"w{i}", [64, 64])), name=f"h{i}")
    g.set_outputs([h])
    rng = np.random.default_rng(0)  # six different weights (Core ML merges equal ones), 4,096 elements: int8 takes them
    params = {f"w{i}": (rng.standard_normal((64, 64)) / 8).astype(np.float32) for i in range(6)}
    monkeypatch.setattr(progress_module, "REFRESH_SECONDS", 0.05)
    master, stream = _terminal()
    try:
        progress = Progress(stream=stream)
        progress.begin("converting function main (1/1)", unit=" ops")
        model = rlx_mil.convert(g, params, compress="int8;check=off")
        progress.begin("opening", unit=" weights")  # the executor counts the weights it prepares
        prepare(model, memory="fast")
        progress.end()
        text = _screen(master)
    finally:
        stream.close()
        os.close(master)
    frames = _frames(text)
    assert any(re.search(r"12/12 \[", f) for f in frames), frames  # 6 matmuls and 6 gelus
    assert any("Core ML pass " in f for f in frames), frames
    # the weights compressed while the ops are lowered: count, rate and ETA, the weight's name
    weights = [m.groups() for f in frames if (m := re.search(r"compressing weights (\d)/6(, [\d.e+-]+/s, ETA \d+:\d\d)?: w(\d)", f))]
    assert any(re.search(r"opening: .*\| *[1-6]/6 \[.*weights/s", f) for f in frames), frames
    assert weights and all(int(n) == int(w) + 1 for n, _, w in weights) and any(rate for _, rate, _ in weights), frames


def test_verify_counts_its_steps_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--verify` of a stateful package on a terminal: a clock while the executor opens it, then
    a bar counting the greedy steps (each step's verdict beside it), no line per step; the
    summary line at the end. (The comparison itself: tests/llm/test_verify_greedy.py.)"""
    import sys

    from rlx_mil.cli.convert_hf import VERIFY_STEPS, verify_stateful_command
    from rlx_mil.testing import GreedyComparison, compare_greedy_step

    def comparison(*args: object, report: Callable[[str], None], opened: Callable[[], None], **kwargs: object) -> object:
        time.sleep(0.3)  # opening the package
        opened()
        done = GreedyComparison("llm.mlpackage")
        for step in range(1, VERIFY_STEPS + 1):
            time.sleep(0.15)
            done.steps.append(compare_greedy_step(step, np.array([2.0, 1.0]), np.array([2.0, 1.0]), "fp16"))
            report(done.steps[-1].to_text())
        return done

    monkeypatch.setattr("rlx_mil.llm.package.verify_stateful", comparison)
    for name in progress_module._CI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress_module, "REFRESH_SECONDS", 0.05)
    master, stream = _terminal()
    try:
        monkeypatch.setattr(sys, "stdout", stream)
        monkeypatch.setattr(sys, "stderr", stream)
        assert verify_stateful_command("ckpt", "llm.mlpackage", "fp16", {}) == 0
        monkeypatch.undo()
        text = _screen(master)
    finally:
        stream.close()
        os.close(master)
    frames = _frames(text)
    assert any(re.fullmatch(r"  verify: opening the package on the executor: 00:00", f) for f in frames), frames
    steps = [int(m.group(1)) for f in frames if (m := re.search(r"verify: greedy steps: *\d+%.*\| *(\d)/8 \[.*step \d: token 0", f))]
    assert steps == sorted(steps) and len(set(steps)) >= 4, frames
    assert not any(f.startswith("verify: step") for f in frames), frames
    assert any(f.startswith("  verify: greedy steps: 8 steps (") for f in frames), frames
    assert frames[-1].startswith("verify: compared 8 greedy steps") and frames[-1].endswith(": ok"), frames
