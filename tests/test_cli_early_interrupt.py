"""A Ctrl-C in the first moments of an `rlx-mil` command, while its modules are still being
imported and its arguments parsed, ends the process with status 130 and one line, never with a
traceback out of whichever import it hit.

The interrupt is sent deterministically: a `sitecustomize` on the child's path installs an
import hook that sends SIGINT to its own process when a named module starts importing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_INTERRUPT_ON_IMPORT = """\
import os, signal, sys

class _InterruptOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["INTERRUPT_ON_IMPORT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _InterruptOnImport())
"""


def _run(tmp_path: Path, module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(_INTERRUPT_ON_IMPORT)
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "PATH": "/usr/bin:/bin", "INTERRUPT_ON_IMPORT": module}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


# rlx_mil.errors: the package's own first imports; rlx_mil.cli.arguments: the command's modules;
# rlx_mil.cli.convert_hf: imported while the parser is built (main's `_parser`).
@pytest.mark.parametrize("module", ["rlx_mil.errors", "rlx_mil.cli.arguments", "rlx_mil.cli.convert_hf"])
def test_ctrl_c_while_the_command_starts_is_one_line_and_130(tmp_path: Path, module: str) -> None:
    done = _run(tmp_path, module, [sys.executable, "-m", "rlx_mil.cli", "inspect", "missing.mlpackage"])
    assert (done.returncode, done.stderr) == (130, "rlx-mil inspect: interrupted\n"), done.stderr


def test_ctrl_c_while_the_console_script_starts_is_one_line_and_130(tmp_path: Path) -> None:
    # the console script pip writes: `from rlx_mil.cli import entry; sys.exit(entry())`
    script = tmp_path / "rlx-mil"
    script.write_text("import sys\nfrom rlx_mil.cli import entry\nsys.exit(entry())\n")
    done = _run(tmp_path, "rlx_mil.errors", [sys.executable, str(script), "--help"])
    assert (done.returncode, done.stderr) == (130, "rlx-mil: interrupted\n"), done.stderr


def test_importing_the_library_leaves_sigint_alone(tmp_path: Path) -> None:
    code = "import signal, rlx_mil.cli; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.stdout.strip() == "True", done.stderr


def test_the_command_handles_ctrl_c_itself_once_it_runs(tmp_path: Path) -> None:
    # after the arguments are parsed a Ctrl-C is a KeyboardInterrupt the command cleans up after
    code = ("import signal, sys; sys.argv[0] = 'rlx-mil'\n"
            "import rlx_mil.cli.main\n"
            "cli = sys.modules['rlx_mil.cli.main']\n"
            "def handler(args):\n"
            "    handler = signal.getsignal(signal.SIGINT)\n"
            "    print(callable(handler) and handler.__name__ != '_interrupted_while_starting', file=sys.stderr)\n"
            "    raise KeyboardInterrupt\n"
            "cli._demo = handler\n"
            "sys.exit(cli.main(['demo', '-q']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stderr.splitlines()) == (130, ["True", "rlx-mil demo: interrupted"]), done.stderr
