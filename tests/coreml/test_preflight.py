"""`rlx_mil.preflight` / `rlx-mil preflight`: each rule fires on a tiny package that breaks it
(built by rlx_mil.convert, or by coremltools' MIL builder for what rlx_mil never emits), and
stays quiet on one that does not."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import get_new_symbol, types

import rlx_mil
from rlx_mil.cli.main import main
from rlx_mil.coreml.preflight import Finding, is_finding
from rlx_mil.coreml.preflight_rules import RULES, rule_table
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.ir.graph import Graph

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deploying.md"


def _rules(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}


def _dense(width_in: int, width_out: int, **options: Any) -> Any:
    g = Graph("dense")
    x = g.input("x", [1, width_in])
    g.set_outputs([g.matmul(x, g.param("w", [width_in, width_out]), name="y")])
    rng = np.random.default_rng(0)
    return rlx_mil.convert(g, {"w": rng.standard_normal((width_in, width_out)).astype(np.float32)}, **options)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Any], Path]:
    folder = tmp_path_factory.mktemp("preflight")

    def save(name: str, model: Any) -> Path:
        path = folder / f"{name}.mlpackage"
        if not path.exists():
            model.save(str(path))
        return path

    return save


@pytest.fixture(scope="module")
def clean() -> Any:
    return _dense(64, 64)


@pytest.fixture(scope="module")
def wide() -> Any:
    """An embedding gather (exempt), a 16,385-wide output, a rank-5 tensor and a gather of an input."""
    g = Graph("wide")
    ids = g.input("ids", [1, 4], dtype="int32")
    emb = g.gather(g.param("emb", [20_000, 8]), ids, axis=0)
    logits = g.matmul(emb, g.param("w", [8, 16_385]), name="logits")
    five = g.relu(g.input("x", [1, 2, 2, 2, 2]), name="five")
    picked = g.gather(g.input("table", [6, 8]), ids, axis=0, name="picked")
    g.set_outputs([logits, five, picked])
    params = {"emb": np.zeros((20_000, 8), np.float32), "w": np.zeros((8, 16_385), np.float32)}
    return rlx_mil.convert(g, params)


def _stateful(shape: tuple[int, ...], flexible: bool = False, weight: bool = False) -> Any:
    rows: Any = get_new_symbol() if flexible else 1
    specs = [mb.TensorSpec((rows, shape[-1]), dtype=types.fp16), mb.StateTensorSpec(shape, dtype=types.fp16)]

    @mb.program(input_specs=specs, opset_version=ct.target.iOS18)
    def prog(x: Any, state: Any) -> Any:
        if weight:
            w = np.random.default_rng(0).standard_normal((shape[-1], shape[-1])).astype(np.float16)
            x = mb.linear(x=x, weight=w)
        axes = list(range(len(shape) - 1))
        y = mb.add(x=x, y=mb.reduce_mean(x=mb.read_state(input=state), axes=axes, keep_dims=False))
        mean = mb.reshape(x=mb.reduce_mean(x=y, axes=[0], keep_dims=False), shape=[1] * (len(shape) - 1) + [shape[-1]])
        mb.coreml_update_state(state=state, value=mb.tile(x=mean, reps=[*shape[:-1], 1]))
        return y

    return ct.convert(prog, minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT16)


def _lut_then_scale(target: Any) -> Any:
    """A stateful program whose weight is uint3 indices into the integers -4..3, then a scale per
    16 weights (the iOS26 form of Q3_K codes)."""
    specs = [mb.TensorSpec((1, 32), dtype=types.fp16), mb.StateTensorSpec((1, 2, 32, 32), dtype=types.fp16)]
    rng = np.random.default_rng(1)
    indices = rng.integers(0, 8, (32, 32)).astype(types.np_uint3_dtype)
    scale = (rng.random((32, 2)) * 0.1 + 0.01).astype(np.float16)

    @mb.program(input_specs=specs, opset_version=target)
    def prog(x: Any, state: Any) -> Any:
        codes = mb.constexpr_lut_to_dense(indices=indices, lut=(np.arange(8) - 4).astype(np.int8).reshape(1, 1, 8, 1))
        y = mb.linear(x=x, weight=mb.constexpr_blockwise_shift_scale(data=codes, scale=scale))
        y = mb.add(x=y, y=mb.reduce_mean(x=mb.read_state(input=state), axes=[0, 1, 2], keep_dims=False))
        mb.coreml_update_state(state=state, value=mb.tile(x=mb.reshape(x=y, shape=[1, 1, 1, 32]), reps=[1, 2, 32, 1]))
        return y

    return ct.convert(prog, minimum_deployment_target=target, compute_precision=ct.precision.FLOAT16,
                      skip_model_load=True)


def test_lut_then_scale_weights_with_states_get_a_note() -> None:
    """iOS26 keeps the integer table before the block scale: not the float palettes #2716 reports
    (a note) — but a per-block int weight on the Neural Engine; iOS18 re-orders it into a table
    per block of integers scaled per block (the grouped note only)."""
    for target, rule, ane_rules in (
        (ct.target.iOS26, "lut-scale-state-coremltools-9.0", {"lut-scale-state-coremltools-9.0", "ane-per-block-int"}),
        (ct.target.iOS18, "lut4-grouped-state-coremltools-9.0", {"lut4-grouped-state-coremltools-9.0"}),
    ):
        model = _lut_then_scale(target)
        assert model.get_spec().specificationVersion == (10 if target == ct.target.iOS26 else 9)
        gpu = rlx_mil.preflight(model, device="gpu")
        assert [(f.rule, f.severity) for f in gpu] == [(rule, "note")]
        assert _rules(rlx_mil.preflight(model, device="ane")) == ane_rules


def test_a_plain_fp16_package_has_no_findings(clean: Any, saved: Callable[[str, Any], Path]) -> None:
    assert rlx_mil.preflight(clean, device="ane") == []
    assert rlx_mil.preflight(saved("clean", clean), device="gpu") == []


def test_rank_width_and_gather_rules(wide: Any) -> None:
    findings = rlx_mil.preflight(wide, device="ane")
    by_rule = {r: [f for f in findings if f.rule == r] for r in _rules(findings)}
    assert set(by_rule) == {"rank-over-4", "dim-over-16384", "embedding-gather", "ane-unsupported-op"}
    assert {f.var for f in by_rule["rank-over-4"]} >= {"x", "five"}
    assert "logits" in {f.var for f in by_rule["dim-over-16384"]}
    assert all("16,385" in f.why for f in by_rule["dim-over-16384"])
    # the 20,000-row embedding table is exempt, and said to be
    [note] = by_rule["embedding-gather"]
    assert note.severity == "note" and not is_finding(note) and "20000" in note.why
    assert not any(f.var == "emb" for f in findings if is_finding(f))
    [gather] = by_rule["ane-unsupported-op"]
    assert gather.op.startswith("gather ") and "computed" in gather.why
    for f in findings:
        assert f.source == RULES[f.rule].source and f.fix == RULES[f.rule].fix and f.why
    # none of these is a GPU rule
    assert [f.rule for f in rlx_mil.preflight(wide, device="gpu")] == ["embedding-gather"]


def test_the_plain_llm_head_over_65536_fires_on_both_devices() -> None:
    head = _dense(8, 128_256)  # a Llama 3 vocabulary, tiny hidden size
    for device in ("ane", "gpu"):
        findings = rlx_mil.preflight(head, device=device)
        assert "dim-over-65536" in _rules(findings)
        assert "dim-over-16384" not in _rules(findings)  # the stronger rule only
        assert any(f.var == "y" and "128,256" in f.why for f in findings)


def test_fp32_compute_is_a_neural_engine_finding() -> None:
    model = _dense(64, 64, precision="fp32")
    [finding] = rlx_mil.preflight(model, device="ane")
    assert finding.rule == "ane-fp32-compute" and "ops compute in fp32 (first: linear" in finding.why
    assert rlx_mil.preflight(model, device="gpu") == []


def test_per_block_int_weights_are_a_neural_engine_finding_per_channel_ones_are_not() -> None:
    [finding] = rlx_mil.preflight(_dense(64, 64, compress="int4"), device="ane")
    assert finding.rule == "ane-per-block-int" and "blocks of 32 along axis 1" in finding.why
    assert finding.op.startswith("constexpr_blockwise_shift_scale")
    assert rlx_mil.preflight(_dense(64, 64, compress="int4"), device="gpu") == []
    assert rlx_mil.preflight(_dense(64, 64, compress="int4-channel"), device="ane") == []


def test_state_dims_not_a_multiple_of_32() -> None:
    findings = rlx_mil.preflight(_stateful((1, 2, 48, 16)), device="ane")  # head_dim 16, 48 slots
    [finding] = findings
    assert finding.rule == "state-dim-32" and finding.var.startswith("state")
    assert "fp16[1, 2, 48, 16]: dim 2 = 48, dim 3 = 16 not a multiple of 32" in finding.why
    assert "dim 3 = 16 not" in rlx_mil.preflight(_stateful((1, 2, 64, 16)), device="ane")[0].why
    assert rlx_mil.preflight(_stateful((1, 2, 64, 32)), device="ane") == []
    assert rlx_mil.preflight(_stateful((1, 2, 48, 16)), device="gpu") == []


def test_flexible_shapes_with_states() -> None:
    model = _stateful((1, 2, 32, 32), flexible=True)
    for device in ("ane", "gpu"):
        [finding] = rlx_mil.preflight(model, device=device)
        assert finding.rule == "flexible-shape-state" and "'x'" in finding.why


def test_enumerated_input_shapes_with_states() -> None:
    model = _stateful((1, 2, 32, 32))
    spec = model.get_spec()
    shapes = spec.description.input[0].type.multiArrayType.enumeratedShapes.shapes
    for rows in (1, 4):
        shapes.add().shape.extend([rows, 32])
    flexible = ct.models.MLModel(spec, weights_dir=model.weights_dir, skip_model_load=True)
    [finding] = rlx_mil.preflight(flexible, device="gpu")
    assert finding.rule == "flexible-shape-state" and "['x']" in finding.why
    assert rlx_mil.preflight(model, device="gpu") == []


def test_four_bit_palettes_with_states_built_by_coremltools_9_0() -> None:
    plain = _stateful((1, 2, 32, 32), weight=True)
    config = ct.optimize.coreml.OptimizationConfig(
        global_config=ct.optimize.coreml.OpPalettizerConfig(nbits=4, mode="uniform", weight_threshold=1))
    lut4 = ct.optimize.coreml.palettize_weights(plain, config)
    version = lut4.get_spec().description.metadata.userDefined["com.github.apple.coremltools.version"]
    expected = ["lut4-state-coremltools-9.0"] if version.startswith("9.0") else []
    assert [f.rule for f in rlx_mil.preflight(lut4, device="gpu")] == expected
    assert rlx_mil.preflight(plain, device="gpu") == []
    # without the version key: unknown, unless rlx_mil built it (rlx_mil requires coremltools 9.0)
    spec = lut4.get_spec()
    del spec.description.metadata.userDefined["com.github.apple.coremltools.version"]
    assert rlx_mil.preflight(ct.models.MLModel(spec, weights_dir=lut4.weights_dir, skip_model_load=True)) == []
    spec.description.metadata.userDefined["rlx_mil.version"] = "0.1.0"
    [ours] = rlx_mil.preflight(ct.models.MLModel(spec, weights_dir=lut4.weights_dir, skip_model_load=True))
    assert ours.rule == "lut4-state-coremltools-9.0" and "rlx_mil requires it" in ours.why
    config6 = ct.optimize.coreml.OptimizationConfig(
        global_config=ct.optimize.coreml.OpPalettizerConfig(nbits=6, mode="uniform", weight_threshold=1))
    assert rlx_mil.preflight(ct.optimize.coreml.palettize_weights(plain, config6), device="gpu") == []
    # a table per group of channels: not the configuration #2716 reports, a note only
    grouped_config = ct.optimize.coreml.OptimizationConfig(global_config=ct.optimize.coreml.OpPalettizerConfig(
        nbits=4, mode="uniform", granularity="per_grouped_channel", group_size=16, weight_threshold=1))
    grouped = ct.optimize.coreml.palettize_weights(plain, grouped_config)
    findings = rlx_mil.preflight(grouped, device="gpu")
    if version.startswith("9.0"):
        [note] = findings
        assert note.rule == "lut4-grouped-state-coremltools-9.0" and note.severity == "note"
        assert "a table per group of channels" in note.why
    else:
        assert findings == []


def test_the_1_mib_dma_notch() -> None:
    # 1024 output channels over 16 cores, 8192 inputs, fp16: 64 * 8192 * 2 = exactly 1 MiB per core
    @mb.program(input_specs=[mb.TensorSpec((1, 8192), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x: Any) -> Any:
        return mb.linear(x=x, weight=np.zeros((1024, 8192), np.float16))

    model = ct.convert(prog, minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT16)
    [finding] = rlx_mil.preflight(model, device="ane")
    assert finding.rule == "ane-dma-notch" and "1,048,576 bytes per core" in finding.why
    assert rlx_mil.preflight(model, device="gpu") == []

    # a matmul with a constant operand: [D, N], or [N, D] with transpose_y. Within 16 KiB of the
    # notch (D = 8184: 1 KiB short of it) is flagged, 64 KiB short of it (D = 7680) is not.
    @mb.program(input_specs=[mb.TensorSpec((1, 8192), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog2(x: Any) -> Any:
        def first(d: int) -> Any:
            return mb.slice_by_size(x=x, begin=[0, 0], size=[1, d])

        return (mb.matmul(x=x, y=np.ones((8192, 1024), np.float16), name="kn"),
                mb.matmul(x=x, y=np.ones((1024, 8192), np.float16), transpose_y=True, name="nk"),
                mb.matmul(x=first(8184), y=np.ones((8184, 1024), np.float16), name="near"),
                mb.matmul(x=first(7680), y=np.ones((7680, 1024), np.float16), name="clear"),
                mb.matmul(x=x, y=np.ones((8192, 1024), np.float16), transpose_y=False, name="kn2"))

    model = ct.convert(prog2, minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT16,
                       pass_pipeline=ct.PassPipeline.EMPTY)
    notch = rlx_mil.preflight(model, device="ane")
    assert {f.rule for f in notch} == {"ane-dma-notch"}
    assert sorted(f.op for f in notch) == ["matmul kn", "matmul kn2", "matmul near", "matmul nk"]
    assert [f.why for f in notch if f.op == "matmul near"] == ["weight [N, D, k...] = [1024, 8184]: 1,047,552 bytes per core"
                                                               " (0.999 MiB)"]


@pytest.mark.parametrize(("size", "rule"), [(10**9 + 1, "weight-file-over-1GB"), (2 * 10**9 + 1, "weight-file-over-2GB")])
def test_weight_files_over_the_ios_and_macos_limits(
    clean: Any, saved: Callable[[str, Any], Path], tmp_path: Path, size: int, rule: str
) -> None:
    import shutil

    package = tmp_path / "big.mlpackage"
    shutil.copytree(saved("clean", clean), package)
    weight = package / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    os.truncate(weight, size)  # sparse: no disk used
    for device in ("ane", "gpu"):
        [finding] = rlx_mil.preflight(package, device=device)
        assert finding.rule == rule and finding.var == "weight.bin" and f"{size:,}" in finding.why


def test_bad_input_is_a_typed_error(clean: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="device must be one of ane, gpu"):
        rlx_mil.preflight(clean, device="cpu")
    with pytest.raises(RlxMilError, match="no such package"):
        rlx_mil.preflight(tmp_path / "missing.mlpackage")
    (tmp_path / "graph.json").write_text("{}")
    with pytest.raises(RlxMilError, match="not a readable Core ML package"):
        rlx_mil.preflight(tmp_path / "graph.json")
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

    builder = NeuralNetworkBuilder([("x", datatypes.Array(4))], [("y", datatypes.Array(4))])
    builder.add_activation("relu", "RELU", "x", "y")
    with pytest.raises(RlxMilError, match=r"not an ML Program \(model type neuralNetwork\)"):
        rlx_mil.preflight(ct.models.MLModel(builder.spec, skip_model_load=True))


def test_cli_exit_codes_and_json(
    clean: Any, wide: Any, saved: Callable[[str, Any], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["preflight", str(saved("clean", clean))]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(": no known rule of the Neural Engine broken")
    wide_path = str(saved("wide", wide))
    assert main(["preflight", wide_path, "--json"]) == 1
    listed = json.loads(capsys.readouterr().out)
    assert listed == [f.to_dict() for f in rlx_mil.preflight(wide_path)]
    assert {"rule", "severity", "function", "op", "var", "why", "source", "fix"} == set(listed[0])
    assert main(["preflight", wide_path]) == 1
    text = capsys.readouterr().out
    lines = text.splitlines()
    # the verdict first, then each rule once: its count, examples, one fix
    assert lines[0] == (f"{wide_path}: breaks 3 rules of the Neural Engine (10 findings: rank-over-4 5,"
                        " dim-over-16384 4, ane-unsupported-op 1); 1 note")
    assert "rank-over-4 " in lines[0] and "error: [rank-over-4] " in text
    assert "  ... and 2 more (--verbose lists them)" in lines
    assert main(["preflight", wide_path, "--verbose"]) == 1
    every = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("  main: select five_1 -> five_1: rank 5 tensor fp16[1, 2, 2, 2, 2]") for ln in every)
    headers = [line for line in lines if line.split(":")[0] in ("error", "warning", "note")]
    assert len(headers) == 4 and sum(line.startswith("  fix: ") for line in lines) == 4
    assert main(["preflight", wide_path, "--device", "gpu"]) == 0  # only the embedding note
    assert capsys.readouterr().out.splitlines()[0].endswith("no known rule of the GPU broken; 1 note")
    assert main(["preflight", str(tmp_path / "missing.mlpackage")]) == 1
    assert capsys.readouterr().err.startswith("rlx-mil preflight: error: ")
    with pytest.raises(SystemExit) as usage:
        main(["preflight", wide_path, "--device", "cpu"])
    assert usage.value.code == 2


def test_a_package_from_coremltools_pytorch_path_gets_its_findings() -> None:
    torch = pytest.importorskip("torch")

    class Recurrent(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 32, batch_first=True)

        def forward(self, x: Any) -> Any:
            return self.lstm(x)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on the LSTM's Python-side checks
        traced = torch.jit.trace(Recurrent().eval(), torch.zeros(1, 4, 8))
        model = ct.convert(traced, inputs=[ct.TensorType(shape=(1, 4, 8))], minimum_deployment_target=ct.target.iOS18)
    [finding] = rlx_mil.preflight(model, device="ane")
    assert finding.rule == "ane-unsupported-op" and finding.op.startswith("lstm ")
    assert rlx_mil.preflight(model, device="gpu") == []


def test_the_docs_list_every_rule() -> None:
    assert rule_table() in DOCS.read_text(encoding="utf-8")


def test_the_report_groups_findings_by_rule() -> None:
    from rlx_mil.cli.preflight import report_text
    from rlx_mil.coreml.preflight import Finding

    many = [Finding("rank-over-4", "error", "main", f"select s{i}", f"s{i}", f"rank 5 tensor #{i}", "src", "keep rank <= 4")
            for i in range(7)]
    note = Finding("embed-note", "note", "", "", "", "an embedding", "src2", "none")
    text = report_text(Path("m.mlpackage"), "ane", [*many, note])
    lines = text.splitlines()
    assert lines[0] == "m.mlpackage: breaks 1 rule of the Neural Engine (7 findings: rank-over-4 7); 1 note"
    assert lines.count("  fix: keep rank <= 4") == 1 and "error: [rank-over-4] 7 findings" in lines
    assert [ln for ln in lines if "rank 5 tensor" in ln] == [f"  main: select s{i} -> s{i}: rank 5 tensor #{i}" for i in range(3)]
    assert "  ... and 4 more (--verbose lists them)" in lines
    assert lines.index("note: [embed-note] 1 finding") > lines.index("error: [rank-over-4] 7 findings")
    verbose = report_text(Path("m.mlpackage"), "ane", many, verbose=True).splitlines()
    assert sum("rank 5 tensor" in ln for ln in verbose) == 7 and not any("more (--verbose" in ln for ln in verbose)
