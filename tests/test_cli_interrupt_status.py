"""Ctrl-C ends a command with status 130 even when the interrupt passed through code that an
extension ran with `PyRun_String` (pybind11's `py::exec`): that sets CPython's "unhandled
KeyboardInterrupt" flag, with which the interpreter would end by killing itself with SIGINT
(status -2) after the command had handled the interrupt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_INTERRUPT_THROUGH_PYRUN = """\
import ctypes, sys
import rlx_mil.cli.main
cli = sys.modules["rlx_mil.cli.main"]

def interrupted(args):
    ctypes.pythonapi.PyRun_SimpleString(b"raise KeyboardInterrupt")  # what an extension's py::exec leaves
    raise KeyboardInterrupt

cli._demo = interrupted
sys.exit(cli.main(["demo", "-q"]))
"""


def test_an_interrupt_through_pyrun_string_still_exits_130(tmp_path: Path) -> None:
    # run as `python -m`, as the rlx-mil command runs (`python -c` would end through other code)
    (tmp_path / "interrupt_probe.py").write_text(_INTERRUPT_THROUGH_PYRUN)
    done = subprocess.run([sys.executable, "-m", "interrupt_probe"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "rlx-mil demo: interrupted"
