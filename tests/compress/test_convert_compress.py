"""convert(compress=...): every scheme x target x precision through the executor, selection
rules, the report and the typed errors."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_mil
import rlx_mil.compress
from rlx_mil.compress import report_of
from rlx_mil.errors import CompressionError, InvalidOptionError
from tests.compress.helpers import convert_and_verify, op_types
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

CONFIG = TinyLM(layers=1)
GRAPH = tiny_lm(CONFIG)
PARAMS = tiny_lm_params(GRAPH, CONFIG)
INPUTS = tiny_lm_inputs(CONFIG)
MATRICES = sorted(n for n, a in PARAMS.items() if a.ndim == 2 and not n.startswith("rope"))

IOS18_LINEAR = ["int8", "int4", "uint8-asym-block16", "int8-asym-tensor", "uint4-sym-channel", "uint4-float", "uint8-float-channel"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("spec", IOS18_LINEAR)
def test_ios18_linear_schemes(spec: str, precision: str) -> None:
    model, report = convert_and_verify(GRAPH, PARAMS, INPUTS, spec, target="iOS18", precision=precision,
                                       roundtrip=spec in ("int8", "int4"))
    assert sorted(w.name for w in report.weights) == MATRICES
    assert op_types(model).count("constexpr_blockwise_shift_scale") == len(MATRICES)
    # Norm scales, biases and RoPE tables are never compressed unless asked.
    assert {"rope.cos", "rope.sin", "norm.weight", "layers.0.input_layernorm.weight"} <= set(report.kept)
    itemsize = 2 if precision == "fp16" else 4
    for w in report.weights:
        assert w.bytes_before == int(np.prod(w.shape)) * itemsize
        assert 0 < w.relative_error < (0.02 if "8" in spec else 0.2)
    scheme = rlx_mil.compress.parse_compress(spec).default  # type: ignore[union-attr]
    for w in report.weights:
        # A matmul weight [K, N] is stored as the [N, K] `linear` weight; an embedding as is.
        n, k = (w.shape[1], w.shape[0]) if w.layout == "kn" else (w.shape[0], w.shape[1])
        assert (w.layout == "dense") == (w.name == "embed_tokens.weight")
        tables = {"per_tensor": 1, "per_channel": n, "per_block": n * k // scheme.block_size}[scheme.granularity]
        offsets = (tables * scheme.bits + 7) // 8 if scheme.has_offset else 0
        if scheme.float_offset:
            offsets = tables * itemsize
        assert w.bytes_after == (n * k * scheme.bits + 7) // 8 + tables * itemsize + offsets


@pytest.mark.parametrize(("spec", "target"), [("int8", "iOS16"), ("uint8", "iOS17"), ("int8-tensor", "iOS17")])
def test_ios16_17_affine_int8(spec: str, target: str) -> None:
    for precision in ("fp32", "fp16"):
        model, report = convert_and_verify(GRAPH, PARAMS, INPUTS, spec, target=target, precision=precision, roundtrip=False)
        assert op_types(model).count("constexpr_affine_dequantize") == len(MATRICES)
        assert len(report.weights) == len(MATRICES)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("spec", "target"), [
    ("lut2", "iOS18"), ("lut3-group32", "iOS18"), ("lut4", "iOS18"), ("lut6-group16", "iOS18"),
    ("lut8", "iOS17"), ("lut4", "iOS16"),
])
def test_palettized_schemes(spec: str, target: str, precision: str) -> None:
    model, report = convert_and_verify(GRAPH, PARAMS, INPUTS, spec, target=target, precision=precision,
                                       roundtrip=spec == "lut4")
    assert sorted(w.name for w in report.weights) == MATRICES
    assert op_types(model).count("constexpr_lut_to_dense") == len(MATRICES)
    scheme = rlx_mil.compress.parse_scheme(spec)
    assert isinstance(scheme, rlx_mil.compress.PaletteScheme)
    itemsize = 2 if precision == "fp16" else 4
    for w in report.weights:
        # A bare lutN is grouped on iOS18 and held per tensor below.
        assert w.scheme == (scheme.label if target == "iOS18" or scheme.explicit else f"lut{scheme.bits}-tensor")
        scheme = rlx_mil.compress.parse_scheme(w.scheme)
        assert isinstance(scheme, rlx_mil.compress.PaletteScheme)
        n = w.shape[1] if w.layout == "kn" else w.shape[0]
        groups = n // scheme.group_size if scheme.granularity == "per_grouped_channel" else 1
        count = int(np.prod(w.shape))
        assert w.bytes_after == (count * scheme.bits + 7) // 8 + groups * (1 << scheme.bits) * itemsize
        assert w.relative_error < {2: 0.45, 3: 0.25, 4: 0.13, 6: 0.06, 8: 0.02}[scheme.bits]


def test_package_bytes_shrink_and_report_is_in_metadata(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from rlx_mil.coreml.package_info import package_info

    plain = rlx_mil.save(rlx_mil.convert(GRAPH, PARAMS), tmp_path / "fp16.mlpackage")
    packed = rlx_mil.save(rlx_mil.convert(GRAPH, PARAMS, compress="int4"), tmp_path / "int4.mlpackage")
    # int4 + one fp16 scale per 32 weights is 4.5/16 = 0.281 of fp16; on this very small
    # model the blob headers and the float norms/RoPE tables add a little (see test_done_when).
    ratio = package_info(packed).weight_bytes / package_info(plain).weight_bytes
    assert 0.28 < ratio <= 0.32
    info = package_info(packed)
    report = report_of(info.metadata)
    assert report is not None and report.config.startswith("int4-sym-block32")
    assert "compression: int4-sym-block32" in info.to_text()
    assert "layers.0.mlp.down_proj.weight" in info.to_text()


def test_selection_rules_min_size_embeddings_and_head() -> None:
    spec = "int4;embeddings=int8;lm_head=none;re:\\.v_proj\\.=uint8;glob:*.down_proj.*=none;glob:norm.weight=int8-tensor;min_size=5000"
    _, report = convert_and_verify(GRAPH, PARAMS, INPUTS, spec, target="iOS18", precision="fp32", roundtrip=False)
    schemes = {w.name: w.scheme for w in report.weights}
    assert schemes["embed_tokens.weight"] == "int8-sym-channel"
    assert "head.weight" not in schemes and report.kept["head.weight"] == "config"
    assert schemes["layers.0.self_attn.v_proj.weight"] == "uint8-asym-channel"
    assert "layers.0.mlp.down_proj.weight" not in schemes
    assert report.kept["layers.0.mlp.down_proj.weight"].startswith("rule glob:")
    # A rule asks for the norm scale: the norm takes it as the compressed op, not folded in.
    assert schemes["norm.weight"] == "int8-sym-tensor" and "norm.weight" not in report.kept
    # 64 x 64 = 4096 < min_size: q/o projections stay float; 64 x 128 gate/up are compressed.
    assert "layers.0.self_attn.q_proj.weight" not in schemes
    assert report.kept["layers.0.self_attn.q_proj.weight"] == "below min_size 5000"
    assert schemes["layers.0.mlp.gate_proj.weight"] == "int4-sym-block32"
    assert {w.role for w in report.weights if w.name == "embed_tokens.weight"} == {"embedding"}


def test_rules_can_compress_protected_and_small_weights() -> None:
    from rlx_mil.ir.graph import Graph

    g = Graph("bias_add")
    x = g.input("x", [2, 64])
    y = g.add(g.matmul(x, g.param("proj.weight", [64, 64])), g.param("proj.bias", [64]), name="y")
    g.set_outputs([y])
    rng = np.random.default_rng(5)
    params = {"proj.weight": rng.standard_normal((64, 64)).astype(np.float32) / 8,
              "proj.bias": rng.standard_normal(64).astype(np.float32)}
    inputs = {"x": rng.standard_normal((2, 64)).astype(np.float32)}
    _, plain = convert_and_verify(g, params, inputs, "int8", precision="fp32", roundtrip=False)
    assert plain.kept["proj.bias"] == "bias/vector"
    _, asked = convert_and_verify(g, params, inputs, "int8;glob:*.bias=int8-tensor", precision="fp32", roundtrip=False)
    assert {w.name: w.scheme for w in asked.weights} == {"proj.weight": "int8-sym-channel", "proj.bias": "int8-sym-tensor"}


def test_mapping_form_and_schemes_objects() -> None:
    from rlx_mil.compress import LinearScheme

    spec = {"default": LinearScheme(bits=8, granularity="per_tensor"), "lm_head": "int4-block64", "rules": [("*embed*", None)]}
    _, report = convert_and_verify(GRAPH, PARAMS, INPUTS, spec, target="iOS18", precision="fp16", roundtrip=False)
    schemes = {w.name: w.scheme for w in report.weights}
    assert schemes["head.weight"] == "int4-sym-block64"
    assert "embed_tokens.weight" not in schemes
    assert schemes["layers.0.mlp.up_proj.weight"] == "int8-sym-tensor"


@pytest.mark.parametrize(
    ("spec", "target", "match"),
    [
        ("int4", "iOS17", r"4-bit linear quantization needs iOS18"),
        ("int8-block32", "iOS16", r"per-block scales need iOS18"),
        ("int8", "iOS15", r"iOS15 has none"),
        ("lut3", "iOS16", r"3-bit palettization has no constexpr_lut_to_dense form on iOS16"),
        ("lut4-group16", "iOS17", r"per-grouped-channel LUTs need iOS18"),
    ],
)
def test_target_cannot_express_is_a_typed_error_naming_weight_and_target(spec: str, target: str, match: str) -> None:
    with pytest.raises(CompressionError, match=match) as info:
        rlx_mil.convert(GRAPH, PARAMS, target=target, compress=spec)
    assert "layers.0.self_attn.q_proj.weight" in str(info.value) and target in str(info.value)


@pytest.mark.parametrize(("spec", "fitted", "note"), [
    ("int4-block48", "int4-sym-block64", "block 48 does not divide the input dimension 64: block 64"),
    ("lut4-group48", "lut4-group64", "group 48 does not divide the 64 output channels: group 64"),
    ("lut4-group24", "lut4-group32", "group 24 does not divide the 64 output channels: group 32"),
])
def test_sizes_that_do_not_divide_a_weight_are_fitted_and_reported(spec: str, fitted: str, note: str) -> None:
    _, report = convert_and_verify(GRAPH, PARAMS, INPUTS, spec, roundtrip=False)
    q = next(w for w in report.weights if w.name == "layers.0.self_attn.q_proj.weight")
    assert (q.scheme, q.note) == (fitted, note)
    assert note in report.to_text()


def test_bare_lut_is_grouped_on_ios18_and_per_tensor_below() -> None:
    _, report = convert_and_verify(GRAPH, PARAMS, INPUTS, "lut4", target="iOS18", roundtrip=False)
    assert {w.scheme for w in report.weights} == {"lut4-group16"}
    _, report = convert_and_verify(GRAPH, PARAMS, INPUTS, "lut4", target="iOS17", roundtrip=False)
    assert {w.scheme for w in report.weights} == {"lut4-tensor"}
    assert {w.note for w in report.weights} == {"iOS17 has no grouped tables: one table"}


def test_non_finite_weight_is_a_typed_error() -> None:
    params = dict(PARAMS)
    bad = params["layers.0.mlp.up_proj.weight"].copy()
    bad[3, 7] = np.nan
    params["layers.0.mlp.up_proj.weight"] = bad
    with pytest.raises(CompressionError, match=r"'layers\.0\.mlp\.up_proj\.weight'.*non-finite"):
        rlx_mil.convert(GRAPH, params, compress="int8")
    # Excluding it by a rule converts fine.
    model = rlx_mil.convert(GRAPH, params, compress="int8;glob:layers.0.mlp.up_proj.weight=none")
    report = report_of(model)
    assert report is not None and "layers.0.mlp.up_proj.weight" in report.kept


@pytest.mark.parametrize("spec", ["int5", "lut5", "int8-wide", "int4;min_size=-1", "re:([=int8", "int8;int4", 3])
def test_bad_specs_are_option_errors(spec: object) -> None:
    with pytest.raises(InvalidOptionError):
        rlx_mil.convert(GRAPH, PARAMS, compress=spec)


def test_half_width_params_compress_like_their_float32_values() -> None:
    half = {k: (v.astype(np.float16) if v.ndim == 2 and not k.startswith("rope") else v) for k, v in PARAMS.items()}
    widened = {k: np.asarray(v, np.float32) for k, v in half.items()}
    for spec in ("int4", "lut4"):
        a = report_of(rlx_mil.convert(GRAPH, half, compress=spec))
        b = report_of(rlx_mil.convert(GRAPH, widened, compress=spec))
        assert a is not None and b is not None
        assert [(w.name, w.bytes_after, round(w.relative_error, 9)) for w in a.weights] == [
            (w.name, w.bytes_after, round(w.relative_error, 9)) for w in b.weights
        ]


def test_uncompressed_conversion_is_unchanged() -> None:
    model = rlx_mil.convert(GRAPH, PARAMS)
    assert report_of(model) is None
    assert not any(t.startswith("constexpr") for t in op_types(model))


def test_checkpoint_style_out_in_weights_behind_a_transpose() -> None:
    """[out, in] weights reaching MatMul through Transpose (how Hugging Face checkpoints are
    laid out) are compressed per output channel of the checkpoint tensor."""
    from rlx_mil.ir.graph import Graph

    g = Graph("out_in")
    x = g.input("x", [1, 4, 64])
    h = g.matmul(x, g.transpose(g.param("up.weight", [128, 64]), [1, 0]), name="up")
    y = g.matmul(g.silu(h), g.transpose(g.param("down.weight", [64, 128]), [1, 0]), name="y")
    g.set_outputs([y])
    rng = np.random.default_rng(9)
    params = {"up.weight": (rng.standard_normal((128, 64)) / 8).astype(np.float32),
              "down.weight": (rng.standard_normal((64, 128)) / 11).astype(np.float32)}
    inputs = {"x": rng.standard_normal((1, 4, 64)).astype(np.float32)}
    for spec in ("int4", "lut4-group16"):
        _, report = convert_and_verify(g, params, inputs, spec, precision="fp32", roundtrip=False)
        assert {w.name: (w.role, w.shape) for w in report.weights} == {
            "up.weight": ("weight", [128, 64]), "down.weight": ("lm_head", [64, 128])}
        assert all(w.layout == "dense" for w in report.weights)


def test_no_float_copy_of_a_compressed_weight_stays_in_the_program() -> None:
    model = rlx_mil.convert(GRAPH, PARAMS, compress="int4")
    big_float_consts = [
        op.name for op in model._mil_program.functions["main"].operations
        if op.op_type == "const" and op.outputs[0].val is not None and np.asarray(op.outputs[0].val).dtype.kind == "f"
        and np.asarray(op.outputs[0].val).size >= 2048
    ]
    assert big_float_consts == []
