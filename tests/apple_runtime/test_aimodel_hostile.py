"""Damaged Core AI assets given to `inspect`, `run`, `generate` and `eval`: one typed
`rlx-mil CMD: error:` line each, before Apple's runtime reads the program (it aborts the
process on a program it cannot parse). The program is checked against the SHA-256 Core AI
stores beside it; the JSON side files are read bounded and parsed with typed errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

import rlx_mil
from rlx_mil.cli import main
from rlx_mil.ir.graph import Graph

SIDE_FILES = ("metadata.json", "rlx_mil_entries.json", "rlx_mil_metadata.json")


@pytest.fixture(scope="module")
def asset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = Graph("tiny")
    x = g.input("x", [2, 4])
    g.set_outputs([g.matmul(x, g.param("w", [4, 4]), name="y")])
    params = {"w": np.arange(16, dtype=np.float32).reshape(4, 4)}
    folder = tmp_path_factory.mktemp("asset")
    np.savez(folder / "in.npz", x=np.ones((2, 4), np.float32))
    return rlx_mil.save(rlx_mil.convert(g, params, precision="fp32"), folder / "tiny.aimodel")


def _damaged(asset: Path, folder: Path) -> Path:
    out = folder / "damaged.aimodel"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(asset, out)
    return out


def _one_error(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    capsys.readouterr()
    assert main(argv) == 1, argv
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rlx-mil {argv[0]}: error: ") and message in lines[0], lines


def _commands(path: Path, inputs: Path) -> list[list[str]]:
    return [["inspect", str(path), "--json"], ["run", str(path), "--inputs", str(inputs)],
            ["generate", str(path), "--prompt", "Hi", "-q"], ["eval", str(path), "-q"]]


def test_the_intact_asset_runs(asset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(asset), "--inputs", str(asset.parent / "in.npz")]) == 0
    assert main(["inspect", str(asset)]) == 0


_CAPSYS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@_CAPSYS
@given(cut=st.integers(0, 10_000), flips=st.lists(st.integers(0, 10_000), max_size=3))
def test_a_damaged_program_is_refused_before_the_runtime_reads_it(
    asset: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], cut: int,
    flips: list[int],
) -> None:
    bad = _damaged(asset, tmp_path_factory.mktemp("cut"))
    program = bad / "main.mlirb"
    data = bytearray(program.read_bytes())
    for at in {at % len(data) for at in flips}:
        data[at] ^= 0xFF
    drop = cut % len(data) or (0 if flips else 1)
    program.write_bytes(bytes(data[: len(data) - drop]))
    for argv in _commands(bad, asset.parent / "in.npz")[:2]:
        _one_error(capsys, argv, "main.mlirb: its SHA-256 differs from main.hash")


@pytest.mark.parametrize(("damage", "message"), [
    ("program missing", "main.mlirb: missing"),
    ("program a FIFO", "main.mlirb: a FIFO"),
    ("program a folder", "main.mlirb"),
    ("an empty folder", "main.mlirb: missing"),
    ("a file", "a file, not a Core AI asset"),
])
def test_missing_pieces_are_named(asset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str,
                                  message: str) -> None:
    bad = _damaged(asset, tmp_path)
    program = bad / "main.mlirb"
    if damage == "program missing":
        program.unlink()
    elif damage == "program a FIFO":
        program.unlink()
        os.mkfifo(program)
    elif damage == "program a folder":
        program.unlink()
        program.mkdir()
    elif damage == "an empty folder":
        shutil.rmtree(bad)
        bad.mkdir()
    else:
        shutil.rmtree(bad)
        bad.write_bytes(os.urandom(300))
    for argv in _commands(bad, asset.parent / "in.npz"):
        if damage == "a file" and argv[0] in ("generate", "eval"):
            message_here = "no Core AI asset at"
        else:
            message_here = message
        _one_error(capsys, argv, message_here)


@_CAPSYS
@given(file=st.sampled_from(SIDE_FILES), content=st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"[" * 5000 + b"]" * 5000, b"[]", b"{}", b'{"entries": 3}', b'"text"', b"null",
                     b'{"assetVersion": "99.0"}']),
))
def test_edited_side_files_are_typed_errors(asset: Path, tmp_path_factory: pytest.TempPathFactory,
                                            capsys: pytest.CaptureFixture[str], file: str, content: bytes) -> None:
    """metadata.json (Core AI's), the entry points and rlx_mil's metadata replaced by random
    bytes, deep nesting or JSON of the wrong shape: `run` ends in exit 0 (a file it does not
    need) or one error line naming the asset, never a traceback or a crash."""
    bad = _damaged(asset, tmp_path_factory.mktemp("side"))
    (bad / file).write_bytes(content)
    capsys.readouterr()
    code = main(["run", str(bad), "--inputs", str(asset.parent / "in.npz")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 1), (code, lines)
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("rlx-mil run: error: ") and str(bad) in lines[0], lines
