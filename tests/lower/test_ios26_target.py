"""The iOS26 target (Core ML specification 10): parsing, the package it writes, and a
representative set of what converts on iOS18 converting the same on iOS26 through the executor
against the NumPy reference — ops of every family (the op catalogue checks every op type's
numbers on iOS26 too, tests/lower/test_op_catalogue.py), compression schemes, the deploy forms
and a stateful multifunction decoder."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from graph_data import leaf_values

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.cli import main
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.coreml.package_info import package_info
from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Target
from rlx_mil.testing import Tolerance, compare

FP16 = Tolerance(2e-2, 2e-2)


def _block() -> Graph:
    g = Graph("ios26_block")
    x = g.input("x", [1, 8, 64])
    w = g.param("w.weight", [64, 64])
    gamma, beta = g.param("norm.weight", [64]), g.param("norm.bias", [64])
    y = g.rms_norm(g.gelu(g.matmul(x, w)), gamma, beta, name="y")
    g.set_outputs([y])
    return g


def test_target_parses_and_maps_onto_coremltools_ios26() -> None:
    import coremltools as ct

    for spelling in ("iOS26", "ios26", "IOS26", "26", 26, Target.IOS26):
        assert Target.parse(spelling) is Target.IOS26
    assert Target.IOS26.label == "iOS26" and Target.IOS26.ct_target == ct.target.iOS26
    assert Target.IOS18 < Target.IOS26 and max(Target) is Target.IOS26
    with pytest.raises(InvalidOptionError, match="iOS15, iOS16, iOS17, iOS18, iOS26"):
        Target.parse("iOS19")


def test_package_is_spec_10_and_runs_like_ios18(tmp_path: Path) -> None:
    graph = _block()
    inputs, params = leaf_values(graph, seed=4)
    want = reference.evaluate(graph, inputs, params)["y"]
    got = {}
    for target in ("iOS18", "iOS26"):
        model = rlx_mil.convert(graph, params, target=target, precision="fp16")
        path = rlx_mil.save(model, tmp_path / f"{target}.mlpackage")
        info = package_info(path)
        assert (info.target, info.spec_version) == ((target, 10) if target == "iOS26" else (target, 9))
        got[target] = milexec.run(path, inputs)["y"]
        ok, _, detail = compare(got[target], want, FP16)
        assert ok, f"{target}: {detail}"
    np.testing.assert_array_equal(got["iOS26"], got["iOS18"])  # the same program, the same numbers


@pytest.mark.parametrize("scheme", ["int8", "int4", "uint4-float", "lut4", "lut6-group4", "int8;w.weight=lut3"])
def test_compression_schemes_on_ios26(scheme: str) -> None:
    graph = _block()
    inputs, params = leaf_values(graph, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = rlx_mil.convert(graph, params, target="iOS26", precision="fp32", compress=scheme + ";min_size=64")
    report = report_of(model)
    assert report is not None and report.target == "iOS26" and report.weights
    ops = {op.op_type for op in model._mil_program.functions["main"].operations}
    assert ops & {"constexpr_blockwise_shift_scale", "constexpr_lut_to_dense"}
    want = reference.evaluate(graph, inputs, dequantized_params(params, model))["y"]
    got = milexec.run(model, inputs)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_cli_convert_takes_target_ios26(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = _block()
    _, params = leaf_values(graph, seed=6)
    graph.to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", **params)
    out = tmp_path / "m.mlpackage"
    assert main(["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "-o", str(out),
                 "--target", "iOS26", "-q"]) == 0
    assert package_info(out).target == "iOS26"
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    assert "iOS26 (spec version 10)" in capsys.readouterr().out
    assert main(["preflight", str(out), "--device", "gpu"]) == 0
