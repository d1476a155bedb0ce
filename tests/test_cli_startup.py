"""The `rlx-mil` command starts without PyTorch and transformers: coremltools imports both
whenever they are installed, and no subcommand uses them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


_HEAVY = ("numpy", "ml_dtypes", "coremltools", "rlx_mil.ir", "rlx_mil.api", "rlx_mil.models", "tqdm")


def _modules_after(argv: list[str], tmp_path: Path) -> tuple[set[str], str]:
    script = (
        "import sys\n"
        "from rlx_mil.cli.main import entry\n"
        f"sys.argv = ['rlx-mil', *{argv!r}]\n"
        "try:\n    entry()\nexcept SystemExit:\n    pass\n"
        f"print(' '.join(m for m in {_HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    return set(done.stdout.splitlines()[-1].split()) if done.stdout.strip() else set(), done.stderr


def test_help_version_and_usage_errors_import_nothing_heavy(tmp_path: Path) -> None:
    """They answer in tens of milliseconds (benchmarks/cli_startup.py times them): NumPy, the IR
    and coremltools (1.3 s alone) load only when a command does its work."""
    for argv in (["--help"], ["--version"], ["convert-hf", "--help"], ["convert-gguf", "--help"], ["generate", "--help"],
                 ["preflight", "--help"], ["generate", "x.mlpackage", "--temperature", "-1"],
                 ["generate", "x.mlpackage", "--prompt", "hi", "--top-p", "2"], ["nosuchcommand"],
                 ["convert-hf", "m", "-o", "x.mlpackage", "--nosuchflag"]):
        loaded, err = _modules_after(argv, tmp_path)
        assert loaded == set(), (argv, loaded, err)


def test_the_cli_mirrors_its_owners_tables() -> None:
    from rlx_mil.cli.arguments import DEPLOY_FORMS, TARGETS
    from rlx_mil.cli.convert_gguf import COMPRESS
    from rlx_mil.cli.convert_hf import VARIANTS
    from rlx_mil.coreml.deploy import DEPLOY_FORMS as OWN_FORMS
    from rlx_mil.llm.convert_hf import VARIANTS as OWN_VARIANTS
    from rlx_mil.lowering.target import Target
    from rlx_mil.models.gguf.requantize import COMPRESS as OWN_COMPRESS

    assert TARGETS == tuple(t.label for t in Target)
    assert DEPLOY_FORMS == tuple(OWN_FORMS) and VARIANTS == tuple(OWN_VARIANTS) and COMPRESS == OWN_COMPRESS


def test_every_argument_of_every_command_says_what_it_takes() -> None:
    """`rlx-mil generate --help` listed `package` with no line at all (argparse prints none for
    an argument without help): every positional and option has one."""
    import argparse

    from rlx_mil.cli.main import _parser

    parser = _parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    bare = [f"{name} {action.dest}" for name, sub in commands.choices.items() for action in sub._actions
            if not action.help and not isinstance(action, argparse._HelpAction)]
    assert bare == [], bare


@pytest.mark.parametrize(("flag", "value", "low"), [("--seq-len", "0", 1), ("--cache-len", "-1", 0),
                                                    ("--max-context", "1", 2), ("--batch-size", "0", 1)])
def test_a_size_out_of_range_names_its_flag(flag: str, value: str, low: int, capsys: pytest.CaptureFixture[str]) -> None:
    """They said "seq_len must be an integer >= 1" (the Python parameter) after the checkpoint was
    read; now a usage error naming the flag, before anything is opened."""
    from rlx_mil.cli import main

    with pytest.raises(SystemExit) as usage:
        main(["convert-hf", "no-such-folder", "-o", "m.mlpackage", flag, value])
    assert usage.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"rlx-mil convert-hf: error: argument {flag}: expected an integer >= {low}, got '{value}'", err
