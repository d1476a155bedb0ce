"""Command-line manners: a closed pipe is not an error, a subcommand's unknown option prints that
subcommand's usage, --compute-units says where it has no effect, read-only commands leave the
package's files alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def graph_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlx_mil import Graph

    g = Graph("block")
    x = g.input("x", [1, 4, 8])
    y = g.gelu(g.matmul(x, g.param("w", [8, 8])), name="y")
    g.set_outputs([y])
    path = tmp_path_factory.mktemp("g") / "block.json"
    path.write_text(g.to_json())
    return path


@pytest.mark.parametrize("command", ["inspect", "preflight"])
def test_a_reader_that_goes_away_is_not_an_error(graph_json: Path, tmp_path: Path, command: str) -> None:
    target = graph_json
    if command == "preflight":
        target = tmp_path / "m.mlpackage"
        np.savez(tmp_path / "w.npz", w=np.ones((8, 8), np.float32))
        assert main(["convert", str(graph_json), "--params", str(tmp_path / "w.npz"), "-o", str(target), "-q"]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "rlx_mil.cli", command, str(target)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # `| head -0`: nobody reads
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == "", err


def test_an_unknown_option_prints_the_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["preflight", "m.mlpackage", "--bogus"])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rlx-mil preflight ") and "rlx-mil preflight: error: unrecognized arguments: --bogus" in err


@pytest.mark.parametrize("argv, typo", [
    (["generate", "m.mlpackage", "--bogus"], "--bogus"),  # --prompt missing too: the typo is what is named
    (["convert-hf", "folder", "--stateful", "--compresss=int4"], "--compresss=int4"),
    (["eval", "m.mlpackage", "-Z"], "-Z"),
])
def test_an_unknown_option_is_named_before_a_missing_required_one(
        argv: list[str], typo: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(argv)
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"rlx-mil {argv[0]}: error: unrecognized arguments: {typo}"


@pytest.mark.parametrize("argv", [
    ["generate", "m.mlpackage", "--temp", "0", "-n5", "--prompt", "-"],  # abbreviation, joined value, stdin
    ["generate", "m.mlpackage", "--prompt-ids", "-3"],  # a negative number is a value
    ["generate", "m.mlpackage", "--prompt=--bogus"],
])
def test_known_spellings_are_not_called_unknown(argv: list[str]) -> None:
    from rlx_mil.cli.arguments import unknown_options
    from rlx_mil.cli.main import _parser, _subparser

    assert unknown_options(_subparser(_parser(), argv[0]), argv[1:]) == []


def test_compute_units_says_where_it_has_no_effect(graph_json: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    package = tmp_path / "m.mlpackage"
    np.savez(tmp_path / "w.npz", w=np.ones((8, 8), np.float32))
    np.savez(tmp_path / "in.npz", x=np.ones((1, 4, 8), np.float32))
    assert main(["convert", str(graph_json), "--params", str(tmp_path / "w.npz"), "-o", str(package), "-q"]) == 0
    before = {p: p.stat().st_mtime_ns for p in package.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["run", str(package), "--inputs", str(tmp_path / "in.npz"), "--engine", "milexec",
                 "--compute-units", "cpu_only"]) == 0  # the case of Core ML's names not needed
    err = capsys.readouterr().err
    assert "rlx-mil run: warning: --compute-units CPU_ONLY has no effect here" in err
    assert main(["run", str(package), "--inputs", str(tmp_path / "in.npz"), "--engine", "milexec"]) == 0
    assert "compute-units" not in capsys.readouterr().err
    # read-only commands leave every file of the package as it was
    for argv in (["inspect", str(package)], ["preflight", str(package)]):
        main(argv)
    assert {p: p.stat().st_mtime_ns for p in package.rglob("*") if p.is_file()} == before
