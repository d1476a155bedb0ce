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
from pathlib import Path

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


def test_a_conversion_counts_its_ops_on_a_terminal(tmp_path: Path) -> None:
    """The lowering's op loop and coremltools' pass names reach the bar of the running stage."""
    import rlx_mil
    from rlx_mil import Graph

    g = Graph("block")
    x = g.input("x", [1, 4, 8])
    h = x
    for i in range(6):
        h = g.gelu(g.matmul(h, g.param(f"w{i}", [8, 8])), name=f"h{i}")
    g.set_outputs([h])
    params = {f"w{i}": np.eye(8, dtype=np.float32) for i in range(6)}
    master, stream = _terminal()
    try:
        progress = Progress(stream=stream)
        progress.begin("converting function main (1/1)", unit=" ops")
        rlx_mil.convert(g, params)
        progress.end()
        text = _screen(master)
    finally:
        stream.close()
        os.close(master)
    frames = _frames(text)
    assert any(re.search(r"12/12 \[", f) for f in frames), frames  # 6 matmuls and 6 gelus
    assert any("Core ML pass " in f for f in frames), frames
