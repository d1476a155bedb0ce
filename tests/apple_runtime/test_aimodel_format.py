"""`format=` on the conversion API and `--format` / `--verify --engine coreai` on the convert
commands: a model converted with `format="aimodel"` saves as a Core AI asset (a path without a
suffix gets `.aimodel`); a format contradicting the path's suffix is a typed error naming both;
`--verify --engine coreai` checks the package through Apple's runtime against the NumPy
reference (and fails when the runtime's numbers are off), also for a GGUF file's stateful
package; without the extra, the error names the option that asked for Core AI."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")

import rlx_mil
from rlx_mil.cli import main
from rlx_mil.coreai.asset import AssetProgram
from rlx_mil.errors import CoreAIUnavailableError, InvalidOptionError
from rlx_mil.ir.graph import Graph

ROWS, SIDE = 4, 8


def _graph(name: str = "g", rows: int = ROWS) -> Graph:
    g = Graph(name)
    x = g.input("x", [rows, SIDE])
    g.set_outputs([g.relu(g.matmul(x, g.param("w", [SIDE, SIDE])), name="y")])
    return g


@pytest.fixture(scope="module")
def params() -> dict[str, np.ndarray]:
    return {"w": np.random.default_rng(1).standard_normal((SIDE, SIDE)).astype(np.float32)}


@pytest.fixture(scope="module")
def model(params: dict[str, np.ndarray]) -> object:
    return rlx_mil.convert(_graph(), params, precision="fp32", format="aimodel")


def test_a_model_converted_for_core_ai_saves_as_an_asset(model: object, params: dict[str, np.ndarray],
                                                        tmp_path: Path) -> None:
    asset = rlx_mil.save(model, tmp_path / "plain")  # type: ignore[arg-type]
    assert asset == tmp_path / "plain.aimodel" and asset.is_dir()
    x = np.random.default_rng(2).standard_normal((ROWS, SIDE)).astype(np.float32)
    with AssetProgram(asset) as program:
        got = program.run({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(x @ params["w"], 0), rtol=1e-5, atol=1e-5)
    # The remembered format against the other suffix: typed, naming both; an explicit format wins.
    with pytest.raises(InvalidOptionError, match=r"format='aimodel'.*other\.mlpackage"):
        rlx_mil.save(model, tmp_path / "other.mlpackage")  # type: ignore[arg-type]
    assert not (tmp_path / "other.mlpackage").exists()
    assert rlx_mil.save(model, tmp_path / "other.mlpackage", format="mlpackage").is_dir()  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match=r"format='mlpackage'.*'\.aimodel'"):
        rlx_mil.save(model, tmp_path / "x.aimodel", format="mlpackage")  # type: ignore[arg-type]


def test_bad_formats_are_refused_before_converting(params: dict[str, np.ndarray], tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="format must be one of"):
        rlx_mil.convert(_graph(), params, format="onnx")
    with pytest.raises(InvalidOptionError, match=r"format='aimodel'.*'\.mlpackage'"):
        rlx_mil.convert_functions({"a": _graph("a")}, params, path=tmp_path / "f.mlpackage", format="aimodel")
    assert not list(tmp_path.iterdir())


def test_convert_functions_writes_one_asset_per_format(params: dict[str, np.ndarray], tmp_path: Path) -> None:
    rlx_mil.convert_functions({"a": _graph("a"), "b": _graph("b", rows=2)}, params, precision="fp32",
                              path=tmp_path / "two", format="aimodel")
    x = np.ones((2, SIDE), np.float32)
    with AssetProgram(tmp_path / "two.aimodel") as program:
        assert set(program.entries) == {"a", "b"}
        np.testing.assert_allclose(program.run({"x": x}, function_name="b")["y"], np.maximum(x @ params["w"], 0),
                                   rtol=1e-5, atol=1e-5)


def test_missing_extra_names_what_asked_for_it(monkeypatch: pytest.MonkeyPatch, params: dict[str, np.ndarray],
                                               tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_mil.coreai import adapter

    monkeypatch.setattr(adapter, "available", lambda: False)
    with pytest.raises(CoreAIUnavailableError, match=r"format='aimodel' needs Apple's Core AI.*pip install"):
        rlx_mil.convert(_graph(), params, format="aimodel")
    graph = tmp_path / "g.json"
    _graph().to_json_file(graph)
    capsys.readouterr()
    assert main(["convert", str(graph), "-o", str(tmp_path / "g.mlpackage"), "--verify", "--engine", "coreai"]) == 1
    err = capsys.readouterr().err
    assert "--verify --engine coreai needs Apple's Core AI" in err and 'pip install -e ".[coreai]"' in err
    assert not (tmp_path / "g.mlpackage").exists()  # refused before converting


@pytest.fixture(scope="module")
def graph_files(tmp_path_factory: pytest.TempPathFactory, params: dict[str, np.ndarray]) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("graph")
    _graph().to_json_file(folder / "g.json")
    np.savez(folder / "w.npz", **params)  # type: ignore[arg-type]
    return folder / "g.json", folder / "w.npz"


def test_cli_verify_engine_coreai(graph_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    graph, weights = graph_files
    argv = ["convert", str(graph), "--params", str(weights), "--precision", "fp32", "--verify", "--engine", "coreai"]
    capsys.readouterr()
    assert main([*argv, "-o", str(tmp_path / "a.mlpackage")]) == 0
    out = capsys.readouterr().out
    assert "the package on Apple's Core AI runtime (fp32 compute) vs the NumPy reference" in out
    assert "check y:" in out and " ok" in out
    # The check compares real numbers: a runtime answering wrongly fails it.
    import rlx_mil.coreai.engine as engine

    real = engine.run
    monkeypatch.setattr(engine, "run", lambda *a, **k: {n: v + 1.0 for n, v in real(*a, **k).items()})
    assert main([*argv, "-o", str(tmp_path / "b.mlpackage")]) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "message"), [
    (["-o", "{d}/x.mlpackage", "--format", "aimodel"], r"--format='aimodel' contradicts the output's suffix"),
    (["-o", "{d}/x.aimodel", "--format", "mlpackage"], r"--format='mlpackage' contradicts the output's suffix"),
    (["-o", "{d}/x.mlpackage", "--engine", "coreai"], r"--engine coreai says what runs --verify's checks"),
    (["-o", "{d}/x.mlpackage", "--compute", "fp16"], r"--compute says what a Core AI asset computes in: add --format"),
    (["-o", "{d}/x.aimodel", "--precision", "fp32", "--compute", "fp16"], r"--compute fp16 needs --precision fp16"),
])
def test_cli_refuses_contradictions_up_front(graph_files: tuple[Path, Path], tmp_path: Path, extra: list[str],
                                             message: str, capsys: pytest.CaptureFixture[str]) -> None:
    graph, weights = graph_files
    capsys.readouterr()
    argv = [a.format(d=tmp_path) for a in extra]
    assert main(["convert", str(graph), "--params", str(weights), *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlx-mil convert: error:")
    import re

    assert re.search(message, err), err
    assert not list(tmp_path.iterdir())


def test_cli_format_aimodel_without_suffix_verifies_the_asset(graph_files: tuple[Path, Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    graph, weights = graph_files
    capsys.readouterr()
    assert main(["convert", str(graph), "--params", str(weights), "-o", str(tmp_path / "m"), "--format", "aimodel",
                 "--verify"]) == 0  # fp16 package: the asset (fp32 compute) is held to the fp16 tolerance
    out = capsys.readouterr().out
    assert "the asset on Apple's Core AI runtime (fp32 compute) against the package on the MIL executor" in out
    assert "fp16 package; ok" in out
    assert [p.name for p in tmp_path.iterdir()] == ["m.aimodel"]
    # the one "wrote" line names the asset, not the package staged beside it and removed
    (wrote,) = [line for line in out.splitlines() if line.startswith("wrote ")]
    assert wrote.split(" (")[0] == f"wrote {tmp_path / 'm.aimodel'}"
    assert re.fullmatch(r".*\(Core AI asset, \d+(\.\d)? (B|KiB); fp32 compute\)", wrote), wrote  # not "148001 bytes"


def test_convert_gguf_verifies_on_core_ai_and_writes_an_asset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The GGUF path: its Q8_0 codes kept as Core AI compression ops, the package verified through
    Apple's runtime against the reference on the same codes, then the asset against the package."""
    from models.gguf.gguf_files import tiny_chat_gguf

    gguf = tiny_chat_gguf(tmp_path / "chat.gguf", layers=1, seed=4)
    capsys.readouterr()
    assert main(["convert-gguf", str(gguf), "-o", str(tmp_path / "chat"), "--format", "aimodel", "--stateful",
                 "--max-context", "32", "--prefill", "8", "--verify", "--engine", "coreai", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "greedy steps, the package on Apple's Core AI runtime (fp32 compute) against the NumPy reference" in out
    assert "Apple's Core AI runtime, fp32 compute) after prompt" in out
    assert "the asset on Apple's Core AI runtime (fp32 compute) against the package on the MIL executor: same tokens" in out
    written = {p.name for p in tmp_path.iterdir()} - {"chat.gguf", "chat.hf"}  # (the helper's own files)
    assert written == {"chat.aimodel"}  # the staged package is gone


def test_cli_verify_feeds_integer_inputs_as_indices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`convert --verify` draws an int input as valid indices (0 or 1), not as floats."""
    g = Graph("rows")
    g.set_outputs([g.gather(g.param("table", [4, SIDE]), g.input("idx", [3], "i32"), name="y")])
    g.to_json_file(tmp_path / "rows.json")
    np.savez(tmp_path / "t.npz", table=np.arange(4 * SIDE, dtype=np.float32).reshape(4, SIDE))
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "rows.json"), "--params", str(tmp_path / "t.npz"), "--precision", "fp32",
                 "-o", str(tmp_path / "rows.mlpackage"), "--verify", "--engine", "coreai"]) == 0
    out = capsys.readouterr().out
    assert "check y: max |converted - reference| = 0 " in out and " ok" in out


def test_an_fp16_packages_dense_weights_keep_two_bytes_in_the_asset(tmp_path: Path) -> None:
    """fp16 weights are stored as their bit pattern's two bytes and rebuilt exactly in float32
    (a cast of an fp16 constant would be folded into fp32 ones: twice the bytes)."""
    g = Graph("dense")
    g.set_outputs([g.matmul(g.input("x", [4, 64]), g.param("w", [64, 64]), name="y")])
    w = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32) * 3
    w[0, :5] = [0.0, -0.0, 6e-8, -65504.0, 1e-5]  # zeros, a subnormal, the largest, a small normal
    asset = rlx_mil.save(rlx_mil.convert(g, {"w": w}, precision="fp16", format="aimodel"), tmp_path / "dense")
    assert (asset / "main.mlirb").stat().st_size < 64 * 64 * 2 + 6_000  # fp16's bytes (fp32's: 16,384)
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    with AssetProgram(asset) as program:
        got = program.run({"x": x})["y"]
    # The package rounds x and w to fp16; the asset then computes in float32.
    exact = x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-6 * float(np.max(np.abs(exact))))


def test_cli_compute_fp16_writes_an_fp16_compute_asset(graph_files: tuple[Path, Path], params: dict[str, np.ndarray],
                                                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--compute fp16` (with the default --precision fp16): the asset computes in fp16 (its
    inputs and outputs are fp16, its metadata and `inspect` say so), verified on Apple's Linux
    runtime (which accumulates fp16 in fp16) against the package with the fp16 tolerance;
    without `--compute` the asset of the same package computes in fp32."""
    from rlx_mil.coreai.asset import asset_summary

    graph, weights = graph_files
    capsys.readouterr()
    assert main(["convert", str(graph), "--params", str(weights), "-o", str(tmp_path / "half.aimodel"), "--compute",
                 "fp16", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "Core AI asset" in out and "; fp16 compute)" in out
    assert "the asset on Apple's Core AI runtime (fp16 compute) against the package" in out and "; ok" in out
    assert main(["convert", str(graph), "--params", str(weights), "-o", str(tmp_path / "full.aimodel")]) == 0
    half, full = asset_summary(tmp_path / "half.aimodel"), asset_summary(tmp_path / "full.aimodel")
    assert (half["compute"], full["compute"]) == ("fp16", "fp32")
    assert half["package_precision"] == full["package_precision"] == "fp16"
    assert half["functions"]["main"]["inputs"][0]["dtype"] == "float16"
    assert full["functions"]["main"]["inputs"][0]["dtype"] == "float32"
    assert main(["inspect", str(tmp_path / "half.aimodel")]) == 0
    assert "fp16 compute of an fp16 package" in capsys.readouterr().out
    x = np.random.default_rng(5).standard_normal((ROWS, SIDE)).astype(np.float32)
    with AssetProgram(tmp_path / "half.aimodel") as program:
        got = program.run({"x": x})["y"]
    assert got.dtype == np.float16
    want = np.maximum(x @ params["w"], 0)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=2e-2 * float(np.max(np.abs(want))))


def test_fp16_compute_of_an_fp32_package_is_refused(model: object, tmp_path: Path) -> None:
    from rlx_mil.coreai.asset import save_aimodel

    with pytest.raises(InvalidOptionError, match="fp16 compute needs an fp16 package"):
        save_aimodel(model, tmp_path / "x.aimodel", precision="fp16")
    assert not (tmp_path / "x.aimodel").exists()
