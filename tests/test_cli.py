"""The rlx-mil command: convert, inspect, run, demo, and one-line errors on bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli import main
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Param


def _params_for(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        n.op.name: (rng.standard_normal(n.shape.sizes()) * 0.2).astype(n.shape.dtype.numpy)
        for n in graph if isinstance(n.op, Param)
    }


def _small_graph() -> Graph:
    g = Graph("cli_small")
    x = g.input("x", [2, 8])
    w = g.param("w.weight", [8, 4])
    y = g.relu(g.matmul(x, w), name="y")
    g.set_outputs([y])
    return g


def test_convert_inspect_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = _small_graph()
    graph.to_json_file(tmp_path / "g.json")
    params = _params_for(graph)
    np.savez(tmp_path / "w.npz", **params)  # type: ignore[arg-type]
    out = tmp_path / "m.mlpackage"
    assert main(["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "-o", str(out),
                 "--target", "iOS17", "--precision", "fp32"]) == 0
    assert out.is_dir()
    wrote = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(rf"wrote {re.escape(str(out))} \(4 ops, \d+\.\d KiB\) in \d+\.\d\d s", wrote), wrote
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["target"] == "iOS17"
    assert [i["name"] for i in info["inputs"]] == ["x"]
    assert [o["name"] for o in info["outputs"]] == ["y"]
    assert info["op_histogram"].get("linear") == 1
    assert info["weight_bytes"] > 0
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["run", str(out), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    printed = capsys.readouterr().out
    assert "engine:" in printed
    with np.load(tmp_path / "out.npz") as got:
        np.testing.assert_allclose(got["y"], np.maximum(x @ params["w.weight"], 0), rtol=1e-5, atol=1e-5)


def test_convert_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = _small_graph()
    graph.to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", **_params_for(graph))  # type: ignore[arg-type]
    out = tmp_path / "m.mlpackage"
    out.mkdir()
    code = main(["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "-o", str(out)])
    assert code == 1
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    "setup, expect",
    [
        ("bad_json", "rlx-mil convert: error:"),
        ("missing_param", "param 'w.weight': missing"),
        ("wrong_shape", "param 'w.weight': shape (3, 4)"),
        ("bad_weights", "not a readable .npz"),
    ],
)
def test_convert_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], setup: str, expect: str) -> None:
    graph = _small_graph()
    graph.to_json_file(tmp_path / "g.json")
    params = _params_for(graph)
    if setup == "bad_json":
        (tmp_path / "g.json").write_text('{"name": "x", "nodes": [{"id": 0}]')
    elif setup == "missing_param":
        params = {}
    elif setup == "wrong_shape":
        params["w.weight"] = np.zeros((3, 4), np.float32)
    np.savez(tmp_path / "w.npz", **params)  # type: ignore[arg-type]
    if setup == "bad_weights":
        (tmp_path / "w.npz").write_bytes(b"not a zip")
    out = tmp_path / "m.mlpackage"
    code = main(["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert expect in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert not any(p.name.startswith(".m.mlpackage") for p in tmp_path.iterdir())


def test_inspect_rejects_a_non_package(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "nothing.mlpackage")]) == 1
    assert "no such package" in capsys.readouterr().err


def test_demo_builds_converts_and_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo.mlpackage"
    assert main(["demo", "-o", str(out), "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                 "--seq", "16"]) == 0
    printed = capsys.readouterr().out
    assert out.is_dir()
    # the command's own name, and no path of the temporary checkpoint it deletes
    first = printed.splitlines()[0]
    assert first.startswith("rlx-mil demo: random llama checkpoint") and "a temporary folder" in first
    assert "rlx_mil_demo_" not in printed
    assert "scaled_dot_product_attention" in printed or "softmax" in printed
    line = next(ln for ln in printed.splitlines() if "check logits" in ln)
    relative = float(line.split("relative ")[1].split(")")[0])
    assert relative < 5e-2 and line.endswith("ok")
    assert "random llama checkpoint" in printed
    assert not list(tmp_path.glob("rlx_mil_demo_*"))  # the temporary checkpoint is gone
