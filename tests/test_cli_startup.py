"""The `rlx-mil` command starts without PyTorch and transformers: coremltools imports both
whenever they are installed, and no subcommand uses them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_command_goes_without_torch_and_transformers(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from rlx_mil.cli.main import entry\n"
        f"sys.argv = ['rlx-mil', 'inspect', {str(tmp_path / 'missing.mlpackage')!r}]\n"
        "code = entry()\n"
        "import coremltools._deps as deps\n"
        "print(code, sys.modules['torch'], sys.modules['transformers'], deps._HAS_TORCH, deps._HAS_HF)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.stdout.split() == ["1", "None", "None", "False", "False"], done.stderr


def test_a_process_that_imported_torch_keeps_it() -> None:
    script = (
        "import sys\n"
        "sys.modules['torch'] = object()\n"
        "from rlx_mil.cli.main import entry\n"
        "sys.argv = ['rlx-mil', '--help']\n"
        "try:\n    entry()\nexcept SystemExit:\n    pass\n"
        "print(sys.modules['torch'] is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.stdout.split()[-1] == "True", done.stderr
