"""`--verify`'s fidelity judges the codes the package stores, never weights encoded again from the
report: a package whose codes differ from what re-encoding gives (as a calibration-fitted
encoder's do) passes, and a package whose program is broken still fails."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_mil.cli import main
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.compress.linear import LinearCodes
from rlx_mil.compress.plan import WeightCompressor
from rlx_mil.coreml.package_info import package_info
from rlx_mil.ir.graph import Graph
from rlx_mil.models.verify import example_inputs, verify_package


def _mlp() -> Graph:
    g = Graph("mlp")
    x = g.input("x", [4, 64], "f32")
    h = g.silu(g.matmul(x, g.param("up.weight", [64, 128]), name="up"), name="act")
    g.set_outputs([g.matmul(h, g.param("down.weight", [128, 64]), name="down")])
    return g


def _files(tmp_path: Path) -> tuple[Graph, dict[str, np.ndarray], Path, Path]:
    graph = _mlp()
    rng = np.random.default_rng(0)
    params = {"up.weight": rng.standard_normal((64, 128)).astype(np.float32) / 8,
              "down.weight": rng.standard_normal((128, 64)).astype(np.float32) / 11}
    graph.to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", **params)  # type: ignore[arg-type]
    return graph, params, tmp_path / "g.json", tmp_path / "w.npz"


def refitted(codes: Any) -> Any:
    """`codes` as another rounding would leave them: the first code of every row one step
    toward zero (what an encoder fitted on calibration data does: other codes than encoding
    the weight again gives, for the same scheme)."""
    if not isinstance(codes, LinearCodes):
        return codes
    data = np.array(codes.data)
    first = data[..., :1]
    data[..., :1] = first - np.sign(first).astype(data.dtype)
    return dataclasses.replace(codes, data=data)


@pytest.fixture
def fitted_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    emit = WeightCompressor._emit

    def emit_refitted(self: WeightCompressor, key: Any, codes: Any, entry: Any, op_name: Any) -> Any:
        return emit(self, key, refitted(codes), entry, op_name)

    monkeypatch.setattr(WeightCompressor, "_emit", emit_refitted)


@pytest.mark.usefixtures("fitted_encoder")
def test_fidelity_judges_the_codes_the_package_stores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, params, graph_file, weights = _files(tmp_path)
    out = tmp_path / "m.mlpackage"
    assert main(["convert", str(graph_file), "--params", str(weights), "-o", str(out), "--compress", "int4",
                 "--precision", "fp32", "--verify", "--allow-quality-loss"]) == 0
    printed = capsys.readouterr().out
    assert "vs the NumPy reference on the weights the package stores (decoded from its own codes): fidelity" in printed
    assert "MISMATCH" not in printed and "check down:" in printed
    # Encoding the weights again from the report (what --verify did) judges other weights than
    # the package holds: the same package "fails".
    report = report_of(package_info(out).metadata)
    assert report is not None
    inputs = example_inputs(graph, 2)
    again = verify_package(graph, dequantized_params(params, report), out, inputs, "fp32")
    assert not all(check.ok for check in again)


def test_fidelity_fails_a_broken_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The package computes sigmoid where the graph says silu: its own weights do not hide it."""
    from coremltools.converters.mil import Builder as mb

    _, _, graph_file, weights = _files(tmp_path)
    monkeypatch.setattr(mb, "silu", mb.sigmoid)
    out = tmp_path / "m.mlpackage"
    assert main(["convert", str(graph_file), "--params", str(weights), "-o", str(out), "--compress", "int4",
                 "--precision", "fp32", "--verify", "--allow-quality-loss"]) == 1
    printed = capsys.readouterr().out
    assert "fidelity" in printed and "MISMATCH" in printed


@pytest.mark.usefixtures("fitted_encoder")
def test_the_stateful_check_computes_with_the_stored_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The greedy steps and the quality check of a stateful package read its stored codes; the
    package's logits are the reference's on those, not on the weights encoded again."""
    from rlx_mil.llm.generate import Session
    from rlx_mil.llm.package import reference_logits
    from rlx_mil.milexec.stored_weights import StoredWeights
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    folder = write_random_checkpoint(tmp_path / "qwen3", TINY_CONFIGS["qwen3"])
    out = tmp_path / "m.mlpackage"
    assert main(["convert-hf", str(folder), "--stateful", "--max-context", "16", "--prefill", "4", "--quiet",
                 "--precision", "fp32", "-o", str(out), "--verify", "--compress", "int4;min_size=0",
                 "--allow-quality-loss"]) == 0
    printed = capsys.readouterr().out
    assert "on the weights the package stores (decoded from its own codes) (fidelity)" in printed and "FAIL" not in printed
    report = report_of(package_info(out).metadata)
    assert report is not None
    tokens = [3, 17, 42, 5]
    got = Session(out, engine="milexec", precision_model="float32").feed(tokens)
    stored = reference_logits(folder, tokens, report, stored=StoredWeights(out, report.weights))
    encoded_again = reference_logits(folder, tokens, report)
    scale = float(np.abs(stored).max())
    assert float(np.abs(got - stored).max()) < 1e-4 * scale
    assert float(np.abs(got - encoded_again).max()) > 1e-3 * scale
