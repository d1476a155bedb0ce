"""`deploy=` / `--deploy`: parsing, typed refusals, the form in the metadata, and the plain
form being exactly the program rlx_mil always built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import UPSTREAM_JSON_DIR
from graph_data import leaf_values

import rlx_mil
from rlx_mil.cli import main
from rlx_mil.coreml import metadata
from rlx_mil.coreml.deploy import DeployForm
from rlx_mil.coreml.pipeline import program_structure
from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir.graph import Graph

LLAMA_LAYER = UPSTREAM_JSON_DIR / "llama_layer.json"
needs_fixture = pytest.mark.skipif(not LLAMA_LAYER.is_file(), reason="upstream JSON fixtures absent")


def _small_graph() -> Graph:
    g = Graph("deploy_small")
    x = g.input("x", [1, 3, 8])
    w = g.param("w.weight", [8, 4])
    g.set_outputs([g.relu(g.matmul(x, w), name="y")])
    return g


def _params(graph: Graph) -> dict[str, np.ndarray]:
    return leaf_values(graph, seed=3)[1]


@pytest.mark.parametrize("value", ["cpu", "", "ANE2", 3, None])
def test_bad_deploy_value_is_a_typed_error_naming_the_option(value: object) -> None:
    graph = _small_graph()
    with pytest.raises(InvalidOptionError, match="deploy must be one of 'plain', 'gpu', 'ane'"):
        rlx_mil.lower(graph, _params(graph), deploy=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="deploy must be one of"):
        rlx_mil.convert(graph, _params(graph), deploy=value)  # type: ignore[arg-type]


def test_parse_accepts_forms_and_their_names() -> None:
    assert DeployForm.parse("ANE") is DeployForm.ANE
    assert DeployForm.parse(" gpu ") is DeployForm.GPU
    assert DeployForm.parse(DeployForm.PLAIN) is DeployForm.PLAIN


def test_gpu_form_needs_ios18_and_fused_attention() -> None:
    graph = _small_graph()
    with pytest.raises(InvalidOptionError, match=r"deploy='gpu'.*target is iOS17"):
        rlx_mil.lower(graph, _params(graph), deploy="gpu", target="iOS17")
    with pytest.raises(InvalidOptionError, match=r"attention='decomposed' \(--attention\) contradicts"):
        rlx_mil.lower(graph, _params(graph), deploy="gpu", attention="decomposed")
    with pytest.raises(InvalidOptionError, match=r"deploy='ane'.*attention='fused' \(--attention\) contradicts"):
        rlx_mil.lower(graph, _params(graph), deploy="ane", attention="fused")


@needs_fixture
def test_plain_is_the_program_without_the_option() -> None:
    graph = Graph.from_json_file(LLAMA_LAYER)
    params = leaf_values(graph)[1]
    assert program_structure(rlx_mil.lower(graph, params, deploy="plain")) == program_structure(rlx_mil.lower(graph, params))


@needs_fixture
def test_gpu_form_fuses_every_attention() -> None:
    graph = Graph.from_json_file(LLAMA_LAYER)
    params = leaf_values(graph)[1]
    ops = [op.op_type for op in rlx_mil.lower(graph, params, deploy="gpu").functions["main"].operations]
    assert "scaled_dot_product_attention" in ops and "softmax" not in ops


def test_form_is_recorded_in_the_metadata() -> None:
    graph = _small_graph()
    plain = rlx_mil.convert(graph, _params(graph), precision="fp32")
    assert metadata.DEPLOY not in plain.user_defined_metadata
    assert metadata.read_deploy(plain.user_defined_metadata) is DeployForm.PLAIN
    gpu = rlx_mil.convert(graph, _params(graph), precision="fp32", deploy="gpu")
    assert gpu.user_defined_metadata[metadata.DEPLOY] == "gpu"
    assert metadata.read_deploy(gpu.user_defined_metadata) is DeployForm.GPU


def test_unknown_form_in_a_package_is_a_metadata_error() -> None:
    with pytest.raises(metadata.PackageMetadataError, match=r"rlx_mil\.deploy.*'tpu'"):
        metadata.read_deploy({metadata.DEPLOY: "tpu"})
    with pytest.raises(metadata.PackageMetadataError, match=r"rlx_mil\.deploy"):
        metadata.read_deploy({metadata.DEPLOY: 7})


def test_convert_functions_share_the_form() -> None:
    graph = _small_graph()
    model = rlx_mil.convert_functions({"a": graph, "b": graph}, _params(graph), precision="fp32", deploy="gpu")
    assert metadata.read_deploy(model.user_defined_metadata) is DeployForm.GPU


def test_cli_deploy_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = _small_graph()
    graph.to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", **_params(graph))  # type: ignore[arg-type]
    out = tmp_path / "m.mlpackage"
    argv = ["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "-o", str(out), "--precision", "fp32"]
    assert main([*argv, "--deploy", "gpu"]) == 0
    from rlx_mil.coreml.package_info import package_info

    assert metadata.read_deploy(package_info(out).metadata) is DeployForm.GPU
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--overwrite", "--deploy", "tpu"])
    assert exc.value.code == 2
    assert "--deploy: invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.parametrize("form", ["plain", "gpu", "ane"])
def test_convert_hf_passes_deploy_to_the_conversion(form: str, tmp_path: Path) -> None:
    from rlx_mil.cli.convert_hf import convert_kwargs
    from rlx_mil.cli.main import _parser

    args = _parser().parse_args(["convert-hf", str(tmp_path), "-o", str(tmp_path / "m.mlpackage"), "--deploy", form])
    assert convert_kwargs(args)["deploy"] == form
    assert convert_kwargs(_parser().parse_args(["convert-hf", str(tmp_path), "-o", "m.mlpackage"]))["deploy"] == "plain"
