"""The 4-bit default of each deployment form (`rlx_mil.coreml.deploy.compression`): a LUT4 on
max-normalised rows with a per-channel scale on the Neural Engine, per-block int4 on the GPU (and
in the plain form)."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_mil
from rlx_mil.compress import parse_compress, parse_scheme, report_of
from rlx_mil.coreml.deploy import DeployForm
from rlx_mil.coreml.deploy.compression import form_compression, four_bit_text
from rlx_mil.ir.graph import Graph


def _graph() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("two_layers")
    x = g.input("x", [1, 2, 64])
    h = g.relu(g.matmul(x, g.param("up.weight", [64, 128])))
    g.set_outputs([g.matmul(h, g.param("down.weight", [128, 64]), name="y")])
    rng = np.random.default_rng(0)
    return g, {"up.weight": rng.standard_normal((64, 128)).astype(np.float32),
               "down.weight": rng.standard_normal((128, 64)).astype(np.float32)}


def test_four_bit_text_per_form() -> None:
    assert four_bit_text("4bit", DeployForm.ANE) == "lut4-scaled"
    assert four_bit_text("4-bit;lm_head=4bit;embeddings=int8", DeployForm.ANE) == "lut4-scaled;lm_head=lut4-scaled;embeddings=int8"
    assert four_bit_text("4bit;re:proj=4BIT", DeployForm.GPU) == "int4;re:proj=int4"
    assert four_bit_text("lut4-group8;int4", DeployForm.ANE) == "lut4-group8;int4"  # explicit schemes stay
    assert form_compression({"default": "4bit", "rules": [("up*", "4bit")]}, DeployForm.ANE) == parse_compress(
        {"default": "lut4-scaled", "rules": [("up*", "lut4-scaled")]})
    assert form_compression(None, DeployForm.ANE) is None and form_compression("int8", DeployForm.PLAIN) == "int8"


@pytest.mark.parametrize("deploy, op, scheme", [
    ("ane", "constexpr_lut_to_dense", "lut4-tensor-scaled"),
    ("gpu", "constexpr_blockwise_shift_scale", "int4-sym-block32"),
    ("plain", "constexpr_blockwise_shift_scale", "int4-sym-block32"),
])
def test_four_bit_is_the_forms_default(deploy: str, op: str, scheme: str) -> None:
    graph, params = _graph()
    model = rlx_mil.convert(graph, params, compress="4bit", deploy=deploy)
    report = report_of(model)
    assert report is not None and {w.scheme for w in report.weights} == {scheme}
    ops = [o.op_type for o in model._mil_program.functions["main"].operations]
    assert ops.count(op) == 2
    if deploy == "ane":  # iOS18 holds the scaled table per output channel: [N, 1, (1, 1,) 16, 1]
        luts = [o.inputs["lut"].shape for o in model._mil_program.functions["main"].operations if o.op_type == op]
        assert sorted((s[0], s[1], *s[-2:]) for s in luts) == [(64, 1, 16, 1), (128, 1, 16, 1)]
    preflight = [f.rule for f in rlx_mil.preflight(model, device="ane")]
    assert ("ane-per-block-int" in preflight) == (deploy != "ane")


@pytest.mark.parametrize("deploy, allowed", [("ane", ("lut", "int8")), ("gpu", ("int4", "uint4", "int8"))])
def test_auto4_chooses_among_the_forms_candidates(deploy: str, allowed: tuple[str, ...]) -> None:
    graph, params = _graph()
    model = rlx_mil.convert(graph, params, compress="auto4;budget=0.5", deploy=deploy)
    report = report_of(model)
    assert report is not None and report.weights
    assert all(w.scheme.startswith(allowed) for w in report.weights), [w.scheme for w in report.weights]
    if deploy == "ane":
        assert not any("block" in w.scheme for w in report.weights)


def test_the_neural_engine_auto4_candidates_are_per_channel_forms_it_holds() -> None:
    """`--deploy ane`'s auto4 chooses among tables per row / per 4 rows, one scaled table, lut6
    and per-channel int8 (lut3 tables narrower): every one a per-output-channel form iOS18
    holds, none with per-block ints (coremltools #2510)."""
    from rlx_mil.compress.emit import check_target
    from rlx_mil.compress.schemes import PER_BLOCK, LinearScheme, PaletteScheme
    from rlx_mil.coreml.deploy.compression import AUTO4, AUTO4_NARROWER
    from rlx_mil.lowering.target import Target

    config = form_compression("auto4", DeployForm.ANE)
    assert config is not None and config.candidates == ("lut4-group4", "lut4-group1", "lut4-scaled", "lut6",
                                                          "lut6-scaled", "int8")
    assert config.narrower == ("lut3-scaled", "lut3-group1") and config.budget == 0.40 and config.fit == "on"
    assert AUTO4[DeployForm.ANE][1] == config.candidates and AUTO4_NARROWER[DeployForm.ANE] == config.narrower
    for text in config.candidates + config.narrower:
        scheme = parse_scheme(text)
        check_target(scheme, Target.IOS18, "w")  # type: ignore[arg-type]
        if isinstance(scheme, LinearScheme):
            assert scheme.granularity != PER_BLOCK and scheme.bits == 8
        else:
            assert isinstance(scheme, PaletteScheme) and scheme.bits in (3, 4, 6)


@pytest.mark.parametrize("spec", ["lut4-group1", "lut4-group4", "lut3-group1"])
def test_tables_per_row_or_per_four_rows_pass_the_neural_engine_preflight(spec: str) -> None:
    graph, params = _graph()
    model = rlx_mil.convert(graph, params, compress=spec, deploy="ane")
    report = report_of(model)
    assert report is not None and {w.scheme for w in report.weights} == {spec}
    luts = [o.inputs["lut"].shape for o in model._mil_program.functions["main"].operations
            if o.op_type == "constexpr_lut_to_dense"]
    rows = int(spec.split("group")[1])
    assert sorted(s[0] for s in luts) == [64 // rows, 128 // rows]  # a table per group of output channels
    assert not [f.rule for f in rlx_mil.preflight(model, device="ane")]
