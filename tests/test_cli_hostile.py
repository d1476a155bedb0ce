"""Hostile `rlx-mil` invocations: each ends in exactly one `rlx-mil CMD: error: ...` line and
exit code 1 (never a traceback, never the internal-error code), and leaves nothing behind."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hostile_files import HOSTILE_NPZ, HOSTILE_SAFETENSORS
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.cli import EXIT_ERROR, EXIT_INTERNAL, EXIT_USAGE, main
from rlx_mil.ir.graph import Graph


def _graph_file(folder: Path) -> Path:
    g = Graph("cli_hostile")
    x = g.input("x", [2, 4])
    g.set_outputs([g.matmul(x, g.param("w", [4, 3]), name="y")])
    g.to_json_file(folder / "g.json")
    return folder / "g.json"


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str, code: int, expect: str) -> str:
    err = capsys.readouterr().err
    assert code == EXIT_ERROR, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rlx-mil {command}: error: "), err
    assert "Traceback" not in err
    assert expect in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("label, payload, message", HOSTILE_SAFETENSORS, ids=[c[0] for c in HOSTILE_SAFETENSORS])
def test_convert_with_hostile_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str, payload: bytes, message: str) -> None:
    graph = _graph_file(tmp_path)
    (tmp_path / "w.safetensors").write_bytes(payload)
    code = main(["convert", str(graph), "--params", str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "m.mlpackage")])
    _one_error_line(capsys, "convert", code, "w.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "w.safetensors"]


@pytest.mark.parametrize("label, make, message, error", HOSTILE_NPZ, ids=[c[0] for c in HOSTILE_NPZ])
def test_run_with_hostile_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str, make: Callable[[Path], Path], message: str, error: type) -> None:
    inputs = make(tmp_path)
    package = tmp_path / "m.mlpackage"
    package.mkdir()
    code = main(["run", str(package), "--inputs", str(inputs)])
    _one_error_line(capsys, "run", code, str(inputs))


def _fifo(folder: Path, name: str) -> Path:
    path = folder / name
    os.mkfifo(path)
    return path


SPECIAL_GRAPHS: list[tuple[str, Callable[[Path], str], str]] = [
    ("missing", lambda t: str(t / "nope.json"), "no such graph JSON file"),
    ("directory", lambda t: str(t), "a directory"),
    ("FIFO", lambda t: str(_fifo(t, "g.json")), "a FIFO, not a regular file"),
    ("/dev/zero", lambda t: "/dev/zero", "a character device"),
]


@pytest.mark.parametrize("label, make, message", SPECIAL_GRAPHS, ids=[c[0] for c in SPECIAL_GRAPHS])
def test_convert_refuses_special_graph_files_without_hanging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], label: str, make: Callable[[Path], str], message: str
) -> None:
    if label == "/dev/zero" and not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this system")
    graph = make(tmp_path)
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(main(["convert", graph, "-o", str(tmp_path / "m.mlpackage")])), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert result, f"rlx-mil convert {graph} did not return (it must refuse special files up front)"
    _one_error_line(capsys, "convert", result[0], message)


def test_convert_with_special_weights_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = _graph_file(tmp_path)
    for weights, message in ((_fifo(tmp_path, "w.npz"), "a FIFO"), (tmp_path / "nope.safetensors", "no such weights file")):
        code = main(["convert", str(graph), "--params", str(weights), "-o", str(tmp_path / "m.mlpackage")])
        _one_error_line(capsys, "convert", code, message)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--hidden", "65536"], "more than the tensor limit"),
        (["--layers", "100000"], "100000 layers of hidden 256 need"),
        (["--seq", "1000000"], "attention scores"),
        (["--hidden", "4096", "--heads", "32", "--layers", "200"], "weights, more than the limit"),
    ],
)
def test_demo_sizes_are_held_to_the_graph_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code = main(["demo", "-o", str(tmp_path / "d.mlpackage"), *args])
    _one_error_line(capsys, "demo", code, message)
    assert list(tmp_path.iterdir()) == []


def test_unexpected_exceptions_are_one_line_with_their_own_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rlx_mil.coreml.package_info

    def broken(path: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(rlx_mil.coreml.package_info, "package_info", broken)
    monkeypatch.delenv("RLX_MIL_TRACEBACK", raising=False)
    assert main(["inspect", str(tmp_path)]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("rlx-mil inspect: internal error") and "ZeroDivisionError: a bug" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("RLX_MIL_TRACEBACK", "1")
    assert main(["inspect", str(tmp_path)]) == EXIT_INTERNAL
    assert "Traceback" in capsys.readouterr().err


ARGUMENT = st.one_of(
    st.sampled_from(["convert", "inspect", "run", "demo", "-o", "--params", "--inputs", "--dim", "--target", "iOS18",
                     "--precision", "fp16", "--layers", "--hidden", "--heads", "--seq", "--overwrite", "--engine",
                     "/dev/zero", "/dev/null", ".", "missing.json", "x.npz", "x.safetensors", "1=0", "=", "-1", "0",
                     "99999999999999999999", "nan", "", "\x00", "é"]),
    st.text(max_size=6),
)


@given(command=st.sampled_from(["convert", "inspect", "run", "demo"]), rest=st.lists(ARGUMENT, max_size=6))
def test_fuzzed_invocations_never_crash(tmp_path_factory: pytest.TempPathFactory, command: str, rest: list[str]) -> None:
    """Random argument lists: a usage error (2), a typed error (1) or success (0); never an
    internal error and never an unhandled exception. Runs in a scratch folder."""
    argv = [command, *rest]
    folder = tmp_path_factory.mktemp("cli_fuzz")
    usage_error = _is_usage_error(argv)
    if argv[0] == "demo" and not usage_error:
        return  # a valid demo builds and converts a model: too slow here (its sizes are tested above)
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        with pytest.raises(SystemExit) if usage_error else _no_raise():
            code = main(argv)
            assert code in (0, EXIT_ERROR), f"{argv}: exit {code}"
    finally:
        os.chdir(cwd)


def _is_usage_error(argv: list[str]) -> bool:
    from rlx_mil.cli.main import _parser

    try:
        _parser().parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code in (0, EXIT_USAGE)
        return True
    return False


class _no_raise:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_empty_npz_inputs_and_weights_are_fine(tmp_path: Path) -> None:
    np.savez(tmp_path / "e.npz")
    from rlx_mil.weights import load_params

    assert dict(load_params(tmp_path / "e.npz")) == {}
