"""A Core AI asset whose program was rewritten together with its SHA-256 (so the hash check
passes): Apple's runtime would end the process reading it (an abort or a segmentation fault),
so it is loaded first in a child process and refused with one typed error. Were the check
missing, these tests would end the test process itself."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

import rlx_mil
from rlx_mil.cli import main
from rlx_mil.coreai import program_check
from rlx_mil.ir.graph import Graph


@pytest.fixture(scope="module")
def asset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = Graph("tiny")
    x = g.input("x", [2, 4])
    g.set_outputs([g.matmul(x, g.param("w", [4, 4]), name="y")])
    folder = tmp_path_factory.mktemp("asset")
    np.savez(folder / "in.npz", x=np.ones((2, 4), np.float32))
    return rlx_mil.save(rlx_mil.convert(g, {"w": np.eye(4, dtype=np.float32)}, precision="fp32"), folder / "tiny.aimodel")


def _rewritten(asset: Path, folder: Path, program: bytes) -> Path:
    """A copy of `asset` with `program` as its program and that program's SHA-256 as its hash."""
    out = folder / "rewritten.aimodel"
    shutil.copytree(asset, out)
    (out / "main.mlirb").write_bytes(program)
    (out / "main.hash").write_bytes(hashlib.sha256(program).digest())
    return out


def _one_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 1, argv
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rlx-mil {argv[0]}: error: "), lines
    return lines[0]


@pytest.mark.parametrize("edit", ["an unknown op", "bytes that are not Core AI bytecode", "the weights cut off"])
def test_a_program_rewritten_with_its_hash_is_refused(asset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      edit: str) -> None:
    program = (asset / "main.mlirb").read_bytes()
    if edit == "an unknown op":
        assert program.count(b"primitive.batch_matmul_v1") == 1
        program = program.replace(b"primitive.batch_matmul_v1", b"primitive.batch_matmux_v1")
    elif edit == "the weights cut off":  # the weight blobs (last in the file) end past its end
        program = program[: len(program) - 200]
    else:
        program = program[:16] + os.urandom(len(program) - 16)  # the header kept
    bad = _rewritten(asset, tmp_path, program)
    line = _one_error(capsys, ["run", str(bad), "--inputs", str(asset.parent / "in.npz")])
    assert f"{bad / 'main.mlirb'}: Apple's Core AI runtime cannot read this program" in line, line


def test_entry_points_that_disagree_with_the_program_are_refused(asset: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = _rewritten(asset, tmp_path, (asset / "main.mlirb").read_bytes())
    entries = json.loads((bad / "rlx_mil_entries.json").read_text())
    function = entries["default"]
    (name, spec), = entries["entries"][function]["inputs"].items()
    entries["entries"][function]["inputs"] = {"other": spec}
    (bad / "rlx_mil_entries.json").write_text(json.dumps(entries))
    line = _one_error(capsys, ["run", str(bad), "--inputs", str(asset.parent / "in.npz")])
    assert f"entry point {function!r} has inputs [{name!r}], the asset's entry points say ['other']" in line, line


def test_a_huge_declared_shape_is_refused_before_any_allocation(asset: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    bad = _rewritten(asset, tmp_path, (asset / "main.mlirb").read_bytes())
    entries = json.loads((bad / "rlx_mil_entries.json").read_text())
    function = entries["default"]
    for spec in entries["entries"][function]["inputs"].values():
        spec["shape"] = [100000, 100000, 100000]
    (bad / "rlx_mil_entries.json").write_text(json.dumps(entries))
    line = _one_error(capsys, ["run", str(bad), "--inputs", str(asset.parent / "in.npz")])
    assert "rlx_mil_entries.json" in line and "[100000, 100000, 100000]" in line, line


def test_an_intact_program_is_checked_once(asset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil.coreai.asset import AssetProgram

    calls = []
    real = program_check.subprocess.run

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(program_check.subprocess, "run", counted)
    monkeypatch.setattr(program_check, "_PASSED", set())
    monkeypatch.setenv(program_check.CACHE_ENV, str(tmp_path / "checked"))
    for _ in range(2):
        with AssetProgram(asset) as program:
            y = program.run({"x": np.ones((2, 4), np.float32)})
        np.testing.assert_allclose(next(iter(y.values())), np.ones((2, 4)))
    assert len(calls) == 1
    # remembered across processes by the program's SHA-256 and its entry points
    with AssetProgram(asset) as program:
        key = program_check.check_key(program_check.program_digest(asset), program.entries)
    assert [p.name for p in (tmp_path / "checked").iterdir()] == [key]


def _tiny_asset(out: Path, scale: float = 2.0) -> Path:
    g = Graph("tiny")
    x = g.input("x", [2, 4])
    g.set_outputs([g.matmul(x, g.param("w", [4, 4]), name="y")])
    return rlx_mil.save(rlx_mil.convert(g, {"w": scale * np.eye(4, dtype=np.float32)}, precision="fp32"), out)


def test_an_asset_written_here_is_trusted_until_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """An asset rlx_mil has just written needs no child load (its key is recorded once it is in
    place, in the same cache); the same asset with its program, or its entry points, rewritten
    consistently is checked in the child again."""
    from rlx_mil.coreai.asset import AssetProgram

    monkeypatch.setattr(program_check, "_PASSED", set())
    monkeypatch.setenv(program_check.CACHE_ENV, str(tmp_path / "checked"))
    written = _tiny_asset(tmp_path / "written.aimodel")
    assert len(list((tmp_path / "checked").iterdir())) == 1
    real = program_check.subprocess.run
    calls: list[object] = []

    def no_child(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(program_check.subprocess, "run", no_child)
    with AssetProgram(written) as program:
        y = program.run({"x": np.ones((2, 4), np.float32)})
    np.testing.assert_allclose(next(iter(y.values())), 2 * np.ones((2, 4)))
    assert calls == []
    # the program rewritten with its hash: another SHA-256, so the child loads it (and refuses it)
    program_bytes = (written / "main.mlirb").read_bytes()
    bad = _rewritten(written, tmp_path, program_bytes.replace(b"primitive.batch_matmul_v1", b"primitive.batch_matmux_v1"))
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32))
    line = _one_error(capsys, ["run", str(bad), "--inputs", str(tmp_path / "in.npz")])
    assert "Apple's Core AI runtime cannot read this program" in line and len(calls) == 2  # killed twice
    # the same program with edited entry points: checked too
    shutil.rmtree(bad)
    bad = _rewritten(written, tmp_path, program_bytes)
    entries = json.loads((bad / "rlx_mil_entries.json").read_text())
    function = entries["default"]
    (_name, spec), = entries["entries"][function]["inputs"].items()
    entries["entries"][function]["inputs"] = {"other": spec}
    (bad / "rlx_mil_entries.json").write_text(json.dumps(entries))
    line = _one_error(capsys, ["run", str(bad), "--inputs", str(tmp_path / "in.npz")])
    assert "the asset's entry points say ['other']" in line and len(calls) == 3


def test_a_failed_write_trusts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil.coreai import asset as asset_module

    monkeypatch.setattr(program_check, "_PASSED", set())
    monkeypatch.setenv(program_check.CACHE_ENV, str(tmp_path / "checked"))

    def fails(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(asset_module.os, "replace", fails)
    with pytest.raises(OSError, match="disk full"):
        _tiny_asset(tmp_path / "never.aimodel", scale=3.0)
    assert not (tmp_path / "never.aimodel").exists() and program_check._PASSED == set()
    assert not (tmp_path / "checked").exists() or not list((tmp_path / "checked").iterdir())


def test_a_child_killed_once_is_tried_again(asset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An intact program whose first child dies by a signal (a transient abort) is loaded again
    and passes; a program that kills every child is refused after the second."""
    import subprocess

    from rlx_mil.coreai.asset import AssetProgram

    real = program_check.subprocess.run
    calls: list[int] = []

    def aborts_first(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            return subprocess.CompletedProcess(args[0], -6, "", "")
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(program_check, "_PASSED", set())
    monkeypatch.setenv(program_check.CACHE_ENV, str(tmp_path / "checked"))
    monkeypatch.setattr(program_check.subprocess, "run", aborts_first)
    with AssetProgram(asset):
        pass
    assert len(calls) == 2

    calls.clear()
    monkeypatch.setattr(program_check, "_PASSED", set())
    monkeypatch.setenv(program_check.CACHE_ENV, str(tmp_path / "checked-again"))
    monkeypatch.setattr(program_check.subprocess, "run",
                        lambda *a, **k: calls.append(1) or subprocess.CompletedProcess(a[0], -6, "", ""))
    with pytest.raises(rlx_mil.errors.RlxMilError, match="ended the process by SIGABRT"):
        AssetProgram(asset).__enter__()
    assert len(calls) == 2
