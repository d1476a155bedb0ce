"""A Ctrl-C that a library swallows (a bare `except:`, an extension clearing the error) still
stops the command at the next progress count, executor run or package commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlx_mil import interrupts, progress

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def installed() -> Iterator[None]:
    before = signal.getsignal(signal.SIGINT)
    interrupts.install()
    try:
        yield
    finally:
        interrupts.handled()
        signal.signal(signal.SIGINT, before)


def _swallowed_ctrl_c() -> None:
    """What a library with a bare `except:` does to a Ctrl-C arriving inside it."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass
    except BaseException:  # the library's mistake, reproduced
        pass


def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_check(installed: None) -> None:
    _swallowed_ctrl_c()
    assert interrupts.pending()
    with pytest.raises(KeyboardInterrupt):
        progress.tick(" ops")
    with pytest.raises(KeyboardInterrupt):  # still pending until something handles it
        interrupts.check()
    interrupts.handled()
    interrupts.check()
    progress.tick(" ops")


def test_without_install_check_is_silent() -> None:
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _swallowed_ctrl_c()
        assert not interrupts.pending()
        interrupts.check()
    finally:
        signal.signal(signal.SIGINT, before)


_LOST_IN_CONVERT = """\
import os, signal, sys
import coremltools
from rlx_mil import interrupts
import rlx_mil.cli.main
cli = sys.modules["rlx_mil.cli.main"]

real = coremltools.convert

def convert(*args, **kwargs):
    try:  # a Ctrl-C lost inside the converter
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
    except BaseException:
        pass
    return real(*args, **kwargs)

coremltools.convert = convert
interrupts.install()
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_ctrl_c_lost_in_the_converter_stops_the_conversion(tmp_path: Path) -> None:
    (tmp_path / "lost_interrupt.py").write_text(_LOST_IN_CONVERT)
    out = tmp_path / "demo.mlpackage"
    done = subprocess.run(
        [sys.executable, "-m", "lost_interrupt", "demo", "-o", str(out), "--layers", "1", "--hidden", "32",
         "--heads", "2", "--kv-heads", "1", "--seq", "8", "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"})
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "rlx-mil demo: interrupted"
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) in (["lost_interrupt.py"], ["__pycache__", "lost_interrupt.py"])
