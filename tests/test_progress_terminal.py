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


class _Drained:
    """What a pseudo-terminal shows, read while it is written (a conversion's bars would fill
    the terminal's buffer and block the writer)."""

    def __init__(self) -> None:
        import threading

        self.master, self.stream = _terminal()
        os.set_blocking(self.master, True)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the terminal closed
                return
            if not data:
                return
            self._chunks.append(data)

    def frames(self) -> list[str]:
        self.stream.close()
        self._reader.join(5)
        os.close(self.master)
        return _frames(b"".join(self._chunks).decode("utf-8", "replace"))


def _weights_graph(n: int = 4, width: int = 256) -> tuple[object, dict[str, np.ndarray]]:
    from rlx_mil import Graph

    g = Graph("block")
    h = g.input("x", [1, 2, width])
    for i in range(n):
        h = g.matmul(h, g.param(f"w{i}", [width, width]), name=f"h{i}")
    g.set_outputs([h])
    rng = np.random.default_rng(0)
    return g, {f"w{i}": rng.standard_normal((width, width)).astype(np.float32) for i in range(n)}


def _byte_counts(frames: list[str], stage: str) -> list[tuple[float, float]]:
    """(written, total) in KiB of each frame of `stage` whose bar counts bytes."""
    scale = {"": 1 / 1024, "k": 1.0, "M": 1024.0}
    found = []
    for f in frames:
        m = re.search(rf"{stage}.*\| *([\d.]+)([kM]?)/([\d.]+)([kM]?) \[.*B/s", f)
        if m:
            found.append((float(m.group(1)) * scale[m.group(2)], float(m.group(3)) * scale[m.group(4)]))
    return found


def test_writing_the_weights_counts_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight file's bytes on the bar of the stage writing it, against their total: a
    joined package's stage, and a one-function conversion's (its serialisation stage)."""
    import rlx_mil
    from rlx_mil.coreml import weight_writes
    from rlx_mil.coreml.patches import passes_shown_on

    g, params = _weights_graph()
    real = weight_writes.blob_bytes

    def slowly(var: object) -> int:  # a weight a frame: the bar draws between the writes
        time.sleep(0.08)
        return real(var)

    monkeypatch.setattr(weight_writes, "blob_bytes", slowly)
    monkeypatch.setattr(progress_module, "REFRESH_SECONDS", 0.02)
    terminal = _Drained()
    progress = Progress(stream=terminal.stream)
    try:
        rlx_mil.convert_functions({"a": g, "b": g}, params, progress=progress)
        with passes_shown_on(progress):
            rlx_mil.convert(g, params)
        progress.end()
    finally:
        frames = terminal.frames()
    weights = 4 * 256 * 256 * 2 / 1024  # KiB of fp16 weights, each written once however many functions use it
    for stage in ("joining 2 functions", "Core ML conversion"):
        counts = _byte_counts(frames, stage)
        assert counts and all(total == pytest.approx(weights, rel=0.02) for _, total in counts), (stage, frames)
        written = [w for w, _ in counts]
        assert written == sorted(written) and len(set(written)) >= 3 and written[-1] == pytest.approx(weights), (stage, frames)


def test_a_save_that_copies_the_weights_counts_their_bytes(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """A package saved across file systems (no hard link): the copy's bytes on the save's bar."""
    from pathlib import Path

    import rlx_mil
    from rlx_mil.coreml import saving

    g, params = _weights_graph(n=2, width=512)
    model = rlx_mil.convert(g, params)

    def no_link(src: object, dst: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    real_tick = saving.tick

    def slow_tick(unit: str, n: int = 1) -> None:
        time.sleep(0.1)
        real_tick(unit, n)

    monkeypatch.setattr(saving.os, "link", no_link)
    monkeypatch.setattr(saving, "tick", slow_tick)
    monkeypatch.setattr(progress_module, "REFRESH_SECONDS", 0.02)
    terminal = _Drained()
    progress = Progress(stream=terminal.stream)
    try:
        progress.begin("writing the package")
        out = rlx_mil.save(model, Path(str(tmp_path)) / "m.mlpackage")
        progress.end()
    finally:
        frames = terminal.frames()
    counts = _byte_counts(frames, "writing the package")
    weights = sum(f.stat().st_size for f in (out / "Data" / "com.apple.CoreML" / "weights").iterdir()) / 1024
    assert counts and all(total == pytest.approx(weights, rel=0.02) for _, total in counts), frames
    assert counts[-1][0] == pytest.approx(weights, rel=0.02) and len({w for w, _ in counts}) >= 2, frames


def test_graph_verify_counts_the_executors_ops(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """`convert --verify` of a graph: the executor's run over the package counts its ops."""
    from pathlib import Path

    import rlx_mil
    from rlx_mil.milexec import executor
    from rlx_mil.models.verify import example_inputs, verify_package

    g, params = _weights_graph(n=6, width=32)
    out = Path(str(tmp_path)) / "m.mlpackage"
    rlx_mil.save(rlx_mil.convert(g, params, precision="fp32"), out)
    real = executor._Interpreter._execute

    def slowly(self: object, op: object) -> None:
        time.sleep(0.05)
        real(self, op)  # type: ignore[arg-type]

    monkeypatch.setattr(executor._Interpreter, "_execute", slowly)
    monkeypatch.setattr(progress_module, "REFRESH_SECONDS", 0.02)
    terminal = _Drained()
    try:
        checks = verify_package(g, params, out, example_inputs(g, 2), "fp32", progress=Progress(stream=terminal.stream))
    finally:
        frames = terminal.frames()
    assert all(c.ok for c in checks)
    found = [m.groups() for f in frames if (m := re.search(r"verify: the package on the executor: .*\| *(\d+)/(\d+) \[.*ops/s", f))]
    counts = [int(n) for n, _ in found]
    # six linears and the output's identity, each counted as it runs
    assert {int(total) for _, total in found} == {7}, frames
    assert counts == sorted(counts) and len(set(counts)) >= 3 and counts[-1] == 7, frames


def test_a_failed_commands_line_is_not_drawn_over(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C (or an error) while a stage's bar runs: the command's last line stays last; the
    bar is not redrawn over it."""
    import sys

    from rlx_mil.cli import main as cli_main

    monkeypatch.setattr(progress_module, "REFRESH_SECONDS", 0.02)
    terminal = _Drained()

    def interrupted(args: object) -> int:
        Progress(stream=terminal.stream).begin("scoring", total=10, unit=" tokens")
        tick(" tokens", 3)
        time.sleep(0.1)
        raise KeyboardInterrupt

    monkeypatch.setattr(sys.modules["rlx_mil.cli.main"], "_demo", interrupted)
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    try:
        assert cli_main(["demo", "-q"]) == 130
        time.sleep(0.3)  # redraws would come now
    finally:
        monkeypatch.undo()
        frames = terminal.frames()
    assert frames[-1] == "rlx-mil demo: interrupted" and any("3/10" in f for f in frames), frames
