"""Lowering of Quantize, Dequantize and DequantMatMul (spec 5.4-5.6).

Structural checks: quantized weights known at conversion time stay `constexpr_*` on iOS16+
(no float const as large as the weight survives Core ML's passes, and the saved weight.bin is
about the compressed size); iOS15 gets decoded fp weights. Numerical checks compare the
converted program, evaluated on Linux, against decoders written here from the spec text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx_mil
from rlx_mil.errors import ParamError, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import QuantKind, QuantScheme
from rlx_mil.ir.ops.quant import GGUF_BLOCKS
from rlx_mil.reference.interpreter import evaluate
from rlx_mil.reference.quant import GGUF_FORMATS, gguf_dequantize

from .conftest import convert_and_cleanup, emitted_ops, ops_outside_opset, run_model

TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18")
PRECISIONS = ("fp32", "fp16")
#: Relative (to the largest reference magnitude) error allowed per compute precision.
TOLERANCE = {"fp32": 2e-5, "fp16": 1.5e-2}

# -------------------------------------------------------------------------- spec decoders


def spec_e4m3(codes: np.ndarray, nan_value: float = np.nan) -> np.ndarray:
    """OCP E4M3FN: bias 7, subnormal m*2^-9, only S.1111.111 is NaN."""
    b = np.asarray(codes).astype(np.int64) & 0xFF
    e, m = (b >> 3) & 0xF, (b & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7.0))
    mag = np.where((e == 15) & (m == 7), nan_value, mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


def spec_e5m2(codes: np.ndarray) -> np.ndarray:
    """IEEE-style E5M2: bias 15, subnormal m*2^-16, exponent 31 is inf/NaN."""
    b = np.asarray(codes).astype(np.int64) & 0xFF
    e, m = (b >> 2) & 0x1F, (b & 3).astype(np.float64)
    with np.errstate(over="ignore"):
        mag = np.where(e == 0, m * 2.0**-16, (1 + m / 4) * np.exp2(e - 15.0))
    mag = np.where(e == 31, np.where(m == 0, np.inf, np.nan), mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def pack(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes per byte over the flat index, even index in the low nibble."""
    flat = np.asarray(codes).reshape(-1).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def block_rows(table: np.ndarray, block: int, k: int) -> np.ndarray:
    return np.repeat(np.asarray(table, dtype=np.float32), block, axis=0)[:k]


def spec_weight(kind: QuantKind, codes: np.ndarray, scale: np.ndarray, zp: np.ndarray, block: int) -> np.ndarray:
    k = codes.shape[0]
    w = codes.astype(np.float32)
    if kind is QuantKind.INT8_BLOCK_ASYM:
        w = w - block_rows(zp, block, k)
    return w * block_rows(scale, block, k)


def spec_quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    v = x.astype(np.float32) * (np.float32(1) / scale.astype(np.float32))
    r = np.sign(v) * np.floor(np.abs(v.astype(np.float64)) + 0.5)
    return np.clip(r + zp, -128, 127).astype(np.int64)


# -------------------------------------------------------------------------- helpers


def non_const_ops(model: Any) -> list[str]:
    return [t for t in emitted_ops(model) if t != "const"]


def float_const_sizes(model: Any) -> list[int]:
    """Element counts of the float consts left in the converted program."""
    sizes = []
    for op in model._mil_program.functions["main"].operations:
        if op.op_type != "const":
            continue
        val = op.outputs[0].val
        if isinstance(val, np.ndarray) and val.dtype.kind == "f":
            sizes.append(int(val.size))
    return sizes


def max_rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(ref))), 1e-6)
    return float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64)))) / scale


def only_output(values: dict[str, np.ndarray]) -> np.ndarray:
    assert len(values) == 1
    return next(iter(values.values()))


def matmul_graph(
    scheme: QuantScheme, m: int, k: int, n: int, w_shape: tuple[int, ...], w_dtype: str,
    scale_shape: tuple[int, ...], zp_shape: tuple[int, ...], runtime: tuple[str, ...] = (),
) -> Graph:
    """x [m, K] @ dequant(w, scale, zp) -> [m, N]; names in `runtime` become Inputs, the rest Params."""
    g = Graph("dequant_matmul")
    x = g.input("x", [m, k])

    def leaf(name: str, shape: tuple[int, ...], dtype: str) -> int:
        return g.input(name, list(shape), dtype) if name in runtime else g.param(name, list(shape), dtype)

    w = leaf("w", w_shape, w_dtype)
    s = leaf("scale", scale_shape, "u8" if scheme.kind is QuantKind.NVFP4_BLOCK else "f32")
    z = leaf("zp", zp_shape, "f32")
    y = g.dequant_matmul(x, w, s, z, scheme=scheme, out_shape=[m, n], name="y")
    g.set_outputs([y])
    return g


def int_block_case(
    kind: QuantKind, k: int, n: int, block: int, rng: np.random.Generator, *, packed_int4: bool = True
) -> tuple[QuantScheme, dict[str, np.ndarray], np.ndarray]:
    """Scheme, params and the spec-decoded weight of an integer block scheme."""
    scheme = QuantScheme(kind, block)
    groups = -(-k // block)
    scale = rng.uniform(0.01, 0.2, (groups, n)).astype(np.float32)
    zp = rng.uniform(-3, 3, (groups, n)).astype(np.float32)
    if kind is QuantKind.INT4_BLOCK:
        codes = rng.integers(0, 16, (k, n))
        w = pack(codes) if packed_int4 else codes.astype(np.int8)
    else:
        codes = rng.integers(-128, 128, (k, n))
        w = codes.astype(np.int8)
    params = {"w": w, "scale": scale, "zp": zp}
    return scheme, params, spec_weight(kind, codes, scale, zp, block)


INT_KINDS = (QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK)

# -------------------------------------------------------------------------- integer block schemes

EXPECTED_WEIGHT_OPS = {
    # (kind, target, one block spans K) -> compressed-weight op
    "iOS18": {k: "constexpr_blockwise_shift_scale" for k in INT_KINDS},
    "iOS16": {QuantKind.INT8_BLOCK: "constexpr_affine_dequantize",
              QuantKind.INT8_BLOCK_ASYM: "constexpr_affine_dequantize",
              QuantKind.INT4_BLOCK: "constexpr_lut_to_dense"},
}


def expected_weight_op(kind: QuantKind, target: str) -> str | None:
    if target == "iOS15":
        return None
    return EXPECTED_WEIGHT_OPS["iOS18" if target == "iOS18" else "iOS16"][kind]


@pytest.mark.parametrize("kind", INT_KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_int_block_const_weights_stay_compressed(kind: QuantKind, target: str, precision: str) -> None:
    k, n, block, m = 24, 16, 8, 3  # 3 blocks per column: per-block scales, not per-channel
    rng = np.random.default_rng(7)
    scheme, params, weight = int_block_case(kind, k, n, block, rng)
    g = matmul_graph(scheme, m, k, n, tuple(params["w"].shape), "i8", (3, n), (3, n))
    model = convert_and_cleanup(g, params, target=target, precision=precision)
    assert ops_outside_opset(model, target) == []
    ops = non_const_ops(model)
    want = expected_weight_op(kind, target)
    constexpr_ops = [t for t in ops if t.startswith("constexpr_")]
    if want is None:
        assert constexpr_ops == [] and "linear" in ops
        assert max(float_const_sizes(model)) == k * n  # the decoded weight, uncompressed
    else:
        assert constexpr_ops == [want]
        # Only the per-block tables remain as float consts: nothing as large as the weight.
        assert max(float_const_sizes(model), default=0) <= 3 * n < k * n
    if target == "iOS18":
        assert "linear" in ops
    x = rng.normal(size=(m, k)).astype(np.float32)
    out = only_output(run_model(model, {"x": x}))
    assert max_rel_error(out, x @ weight) <= TOLERANCE[precision]


@pytest.mark.parametrize("target", ("iOS16", "iOS17", "iOS18"))
@pytest.mark.parametrize("kind", (QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM))
def test_int8_one_block_over_k_is_per_channel_linear(kind: QuantKind, target: str) -> None:
    k, n = 12, 5
    rng = np.random.default_rng(3)
    scheme, params, weight = int_block_case(kind, k, n, 32, rng)  # block 32 >= K: one block
    if kind is QuantKind.INT8_BLOCK_ASYM:
        params["zp"] = np.round(params["zp"])  # whole zero points fit the int8 offset forms
        weight = spec_weight(kind, params["w"].astype(np.int64), params["scale"], params["zp"], 32)
    g = matmul_graph(scheme, 2, k, n, (k, n), "i8", (1, n), (1, n))
    model = convert_and_cleanup(g, params, target=target, precision="fp32")
    ops = non_const_ops(model)
    assert "linear" in ops and "matmul" not in ops and "pad" not in ops
    assert [t for t in ops if t.startswith("constexpr_")] == [expected_weight_op(kind, target)]
    x = rng.normal(size=(2, k)).astype(np.float32)
    assert max_rel_error(only_output(run_model(model, {"x": x})), x @ weight) <= TOLERANCE["fp32"]


@given(
    kind=st.sampled_from(INT_KINDS),
    k=st.integers(1, 20),
    n=st.integers(1, 7),
    block=st.integers(1, 24),
    lead=st.sampled_from([(), (3,), (2, 3), (2, 1, 2, 2)]),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    packed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int_block_matches_spec_decode(
    kind: QuantKind, k: int, n: int, block: int, lead: tuple[int, ...], target: str, precision: str,
    packed: bool, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    scheme, params, weight = int_block_case(kind, k, n, block, rng, packed_int4=packed)
    groups = -(-k // block)
    g = Graph("dequant_matmul")
    x = g.input("x", [*lead, k])
    w = g.param("w", [k, n], "i8")  # 4-bit weights are declared logically and may come packed
    s, z = g.param("scale", [groups, n]), g.param("zp", [groups, n])
    g.set_outputs([g.dequant_matmul(x, w, s, z, scheme=scheme, name="y")])
    model = convert_and_cleanup(g, params, target=target, precision=precision)
    if target != "iOS15":
        assert any(t.startswith("constexpr_") for t in non_const_ops(model))
    xv = rng.normal(size=(*lead, k)).astype(np.float32)
    out = only_output(run_model(model, {"x": xv}))
    assert out.shape == (*lead, n)
    assert max_rel_error(out, xv @ weight) <= TOLERANCE[precision]


@given(
    kind=st.sampled_from(INT_KINDS),
    k=st.integers(1, 12),
    n=st.integers(1, 5),
    block=st.integers(1, 8),
    runtime=st.sampled_from([("w",), ("scale",), ("w", "scale", "zp")]),
    int4_packed_input=st.booleans(),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    seed=st.integers(0, 2**16),
)
def test_int_block_runtime_operands(
    kind: QuantKind, k: int, n: int, block: int, runtime: tuple[str, ...], int4_packed_input: bool,
    target: str, precision: str, seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    packed = kind is QuantKind.INT4_BLOCK and ("w" not in runtime or int4_packed_input)
    scheme, params, weight = int_block_case(kind, k, n, block, rng, packed_int4=packed)
    groups = -(-k // block)
    w_shape = tuple(params["w"].shape) if "w" in runtime else (k, n)
    g = matmul_graph(scheme, 2, k, n, w_shape, "i8", (groups, n), (groups, n), runtime=runtime)
    given_params = {name: v for name, v in params.items() if name not in runtime}
    model = convert_and_cleanup(g, given_params, target=target, precision=precision)
    ops = non_const_ops(model)
    assert "matmul" in ops and not any(t.startswith("constexpr_") for t in ops)
    feeds = {"x": rng.normal(size=(2, k)).astype(np.float32)}
    feeds.update({name: params[name] for name in runtime})
    out = only_output(run_model(model, feeds))
    assert max_rel_error(out, feeds["x"] @ weight) <= TOLERANCE[precision]


def test_int4_param_accepts_codes_and_packed_bytes_alike() -> None:
    k, n, block = 9, 5, 4  # K*N odd: the last packed byte has one code
    rng = np.random.default_rng(11)
    scheme, params, weight = int_block_case(QuantKind.INT4_BLOCK, k, n, block, rng, packed_int4=True)
    codes = np.stack([params["w"] & 15, params["w"] >> 4], axis=1).reshape(-1)[: k * n].reshape(k, n)
    g = matmul_graph(scheme, 2, k, n, (k, n), "i8", (3, n), (3, n))
    x = rng.normal(size=(2, k)).astype(np.float32)
    ref = only_output(evaluate(g, {"x": x}, params))  # upstream's form: packed bytes
    for w in (params["w"], params["w"].view(np.int8), codes.astype(np.int8), codes.astype(np.float32)):
        model = convert_and_cleanup(g, {**params, "w": w}, target="iOS18", precision="fp32")
        out = only_output(run_model(model, {"x": x}))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out, x @ weight, rtol=1e-5, atol=1e-5)


def test_int4_bad_weight_layouts_are_param_errors() -> None:
    k, n = 8, 6
    rng = np.random.default_rng(0)
    scheme, params, _ = int_block_case(QuantKind.INT4_BLOCK, k, n, 4, rng)
    g = matmul_graph(scheme, 2, k, n, (k, n), "i8", (2, n), (2, n))
    with pytest.raises(ParamError, match="'w'"):
        rlx_mil.lower(g, {**params, "w": params["w"][:-1]}, target="iOS18")  # one byte short
    with pytest.raises(ParamError, match="codes outside"):
        rlx_mil.lower(g, {**params, "w": np.full((k, n), 16, np.int8)}, target="iOS18")
    with pytest.raises(ParamError, match="'scale'"):
        rlx_mil.lower(g, {**params, "scale": params["scale"][:1]}, target="iOS18")


def test_int8_codes_outside_int8_are_param_errors() -> None:
    rng = np.random.default_rng(0)
    scheme, params, _ = int_block_case(QuantKind.INT8_BLOCK, 4, 3, 2, rng)
    g = matmul_graph(scheme, 1, 4, 3, (4, 3), "i8", (2, 3), (2, 3))
    with pytest.raises(ParamError, match=r"param 'w': holds values outside the I8 range \[-128, 127\]"):
        rlx_mil.lower(g, {**params, "w": np.full((4, 3), 300, np.int32)}, target="iOS16")


@pytest.mark.parametrize(
    ("target", "kind", "codes_bytes"),
    [("iOS18", QuantKind.INT4_BLOCK, 0.5), ("iOS18", QuantKind.INT8_BLOCK, 1.0),
     ("iOS16", QuantKind.INT4_BLOCK, 0.5), ("iOS16", QuantKind.INT8_BLOCK, 1.0)],
)
def test_saved_package_holds_compressed_weights(tmp_path: Path, target: str, kind: QuantKind, codes_bytes: float) -> None:
    k, n, block = 256, 64, 32
    rng = np.random.default_rng(5)
    scheme, params, _ = int_block_case(kind, k, n, block, rng)
    g = matmul_graph(scheme, 1, k, n, tuple(params["w"].shape), "i8", (k // block, n), (k // block, n))
    model = convert_and_cleanup(g, params, target=target, precision="fp16")
    path = rlx_mil.save(model, tmp_path / "q.mlpackage")
    weight_bin = path / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    size = weight_bin.stat().st_size
    compressed = k * n * codes_bytes + (k // block) * n * 2  # codes + fp16 scale table
    assert size <= 1.1 * compressed + 1024
    assert size < 0.6 * k * n * 2  # well under the fp16 weight


# -------------------------------------------------------------------------- FP8 / NVFP4


def fp8_codes(kind: QuantKind, rng: np.random.Generator, shape: tuple[int, ...], precision: str) -> np.ndarray:
    """Finite codes (NaN/inf excluded); fp16 runs keep E5M2 magnitudes small enough not to overflow."""
    codes = rng.integers(0, 256, shape)
    if kind is QuantKind.FP8_E4M3:
        codes[(codes & 0x7F) == 0x7F] = 0x7E  # 448, the largest finite E4M3
    else:
        top = 0x50 if precision == "fp16" else 0x7B
        codes = np.where((codes & 0x7F) > top, codes & 0x80 | top, codes)
    return codes.astype(np.uint8)


@given(
    kind=st.sampled_from([QuantKind.FP8_E4M3, QuantKind.FP8_E5M2]),
    k=st.integers(1, 12),
    n=st.integers(1, 6),
    scale_form=st.sampled_from(["per_column", "empty", "runtime"]),
    runtime_w=st.booleans(),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    seed=st.integers(0, 2**16),
)
def test_fp8_matches_spec_decode(
    kind: QuantKind, k: int, n: int, scale_form: str, runtime_w: bool, target: str, precision: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    codes = fp8_codes(kind, rng, (k, n), precision)
    decode = spec_e4m3 if kind is QuantKind.FP8_E4M3 else spec_e5m2
    scale_len = {"per_column": n, "empty": 0, "runtime": n}[scale_form]
    scale = rng.uniform(0.01, 0.1, scale_len).astype(np.float32)
    runtime = (("w",) if runtime_w else ()) + (("scale",) if scale_form == "runtime" else ())
    g = matmul_graph(QuantScheme(kind), 2, k, n, (k, n), "u8", (scale_len,), (1,), runtime=runtime)
    values = {"w": codes, "scale": scale, "zp": np.zeros(1, np.float32)}
    model = convert_and_cleanup(g, {name: v for name, v in values.items() if name not in runtime},
                                target=target, precision=precision)
    ops = non_const_ops(model)
    if not runtime_w and target != "iOS15":
        assert [t for t in ops if t.startswith("constexpr_")] == ["constexpr_lut_to_dense"]
        assert max(float_const_sizes(model), default=0) < k * n or k * n <= 256
    if runtime_w:
        assert "gather" in ops
    weight = decode(codes) * (scale if scale_len else np.float32(1))
    x = rng.normal(size=(2, k)).astype(np.float32)
    feeds = {"x": x, **{name: values[name] for name in runtime}}
    out = only_output(run_model(model, feeds))
    assert max_rel_error(out, x @ weight) <= TOLERANCE[precision]


def test_fp8_every_finite_code_decodes_exactly() -> None:
    """x = I picks the rows of W one by one: every finite code of both formats, exact values."""
    for kind, decode in ((QuantKind.FP8_E4M3, spec_e4m3), (QuantKind.FP8_E5M2, spec_e5m2)):
        all_codes = np.arange(256, dtype=np.uint8)
        codes = all_codes[np.isfinite(decode(all_codes))].reshape(-1, 1)
        k = codes.shape[0]
        for target in ("iOS15", "iOS16", "iOS18"):
            g = matmul_graph(QuantScheme(kind), k, k, 1, (k, 1), "u8", (0,), (1,))
            params = {"w": codes, "scale": np.zeros(0, np.float32), "zp": np.zeros(1, np.float32)}
            model = convert_and_cleanup(g, params, target=target, precision="fp32")
            out = only_output(run_model(model, {"x": np.eye(k, dtype=np.float32)}))
            np.testing.assert_array_equal(out[:, 0], decode(codes[:, 0]))


@given(
    k=st.integers(1, 40),
    n=st.integers(1, 5),
    runtime=st.sampled_from([(), ("w",), ("scale",), ("w", "scale", "zp")]),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    seed=st.integers(0, 2**16),
)
def test_nvfp4_matches_spec_decode(
    k: int, n: int, runtime: tuple[str, ...], target: str, precision: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    groups = -(-k // 16)
    codes = rng.integers(0, 16, (k, n))
    block_scale = rng.integers(0x20, 0x48, (groups, n)).astype(np.uint8)  # e4m3 0.0625 .. 4
    block_scale.flat[0] = 0x7F  # a NaN byte: the scale reads as 0
    global_scale = np.array([0.75], np.float32)
    values = {"w": pack(codes), "scale": block_scale, "zp": global_scale}
    g = matmul_graph(QuantScheme(QuantKind.NVFP4_BLOCK), 2, k, n, ((k * n + 1) // 2,), "u8", (groups, n), (1,),
                     runtime=runtime)
    model = convert_and_cleanup(g, {name: v for name, v in values.items() if name not in runtime},
                                target=target, precision=precision)
    ops = non_const_ops(model)
    if not runtime and target != "iOS15":
        assert [t for t in ops if t.startswith("constexpr_")] == ["constexpr_lut_to_dense"]
    weight = FP4[codes] * block_rows(spec_e4m3(block_scale, nan_value=0.0), 16, k) * global_scale[0]
    x = rng.normal(size=(2, k)).astype(np.float32)
    out = only_output(run_model(model, {"x": x, **{name: values[name] for name in runtime}}))
    assert max_rel_error(out, x @ weight) <= TOLERANCE[precision]


# -------------------------------------------------------------------------- GGUF


def q8_0_bytes(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random Q8_0 blocks of an [N, K] weight and the weight they hold."""
    d = rng.uniform(0.001, 0.02, (n, k // 32)).astype(np.float16)
    q = rng.integers(-128, 128, (n, k // 32, 32)).astype(np.int8)
    blocks = np.concatenate([d[..., None].view(np.uint8).reshape(n, k // 32, 2), q.view(np.uint8)], axis=2)
    return blocks.reshape(-1), (d.astype(np.float32)[..., None] * q).reshape(n, k)


def q4_0_bytes(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0: fp16 d, then 16 bytes whose low nibbles are elements 0..15 and high nibbles 16..31."""
    d = rng.uniform(0.001, 0.02, (n, k // 32)).astype(np.float16)
    q = rng.integers(0, 16, (n, k // 32, 32)).astype(np.uint8)
    qs = q[..., :16] | (q[..., 16:] << 4)
    blocks = np.concatenate([d[..., None].view(np.uint8).reshape(n, k // 32, 2), qs], axis=2)
    return blocks.reshape(-1), (d.astype(np.float32)[..., None] * (q.astype(np.float32) - 8)).reshape(n, k)


def gguf_graph(kind: QuantKind, m: int, k: int, n: int, nbytes: int, runtime: bool = False) -> Graph:
    g = Graph("gguf")
    x = g.input("x", [m, k])
    w = g.input("w", [nbytes], "u8") if runtime else g.param("w", [nbytes], "u8")
    g.set_outputs([g.dequant_matmul(x, w, scheme=QuantScheme(kind), out_shape=[m, n], name="y")])
    return g


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", [QuantKind.GGUF_Q8_0, QuantKind.GGUF_Q4_0], ids=lambda k: k.value)
def test_gguf_q8_0_and_q4_0_stay_compressed(kind: QuantKind, target: str, precision: str) -> None:
    k, n = 64, 6
    rng = np.random.default_rng(2)
    raw, weight = (q8_0_bytes if kind is QuantKind.GGUF_Q8_0 else q4_0_bytes)(rng, n, k)
    model = convert_and_cleanup(gguf_graph(kind, 3, k, n, raw.size), {"w": raw}, target=target, precision=precision)
    ops = non_const_ops(model)
    constexpr_ops = [t for t in ops if t.startswith("constexpr_")]
    if target == "iOS15":
        assert constexpr_ops == []
    elif target == "iOS18":
        assert constexpr_ops == ["constexpr_blockwise_shift_scale"] and "linear" in ops
    else:
        want = "constexpr_affine_dequantize" if kind is QuantKind.GGUF_Q8_0 else "constexpr_lut_to_dense"
        assert constexpr_ops == [want]
    if target != "iOS15":
        assert max(float_const_sizes(model), default=0) <= max((k // 32) * n, 16)  # scale table or 16-entry LUT
    x = rng.normal(size=(3, k)).astype(np.float32)
    out = only_output(run_model(model, {"x": x}))
    assert max_rel_error(out, x @ weight.T) <= TOLERANCE[precision]


@pytest.mark.parametrize(
    "kind",
    [QuantKind.GGUF_Q2K, QuantKind.GGUF_Q3K, QuantKind.GGUF_Q4K, QuantKind.GGUF_Q5K,
     QuantKind.GGUF_Q6K, QuantKind.GGUF_Q8K],
    ids=lambda k: k.value,
)
def test_gguf_k_quants_are_decoded_into_a_linear_weight(kind: QuantKind) -> None:
    """K-quant blocks have two-level scales with mins: decoded at conversion time (the same
    decoder as the reference), the [N, K] result used directly as the `linear` weight."""
    k, n = 256, 3
    nbytes = {QuantKind.GGUF_Q2K: 84, QuantKind.GGUF_Q3K: 110, QuantKind.GGUF_Q4K: 144,
              QuantKind.GGUF_Q5K: 176, QuantKind.GGUF_Q6K: 210, QuantKind.GGUF_Q8K: 292}[kind]
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, (n, nbytes)).astype(np.uint8)
    # Keep the f16/f32 super-block scales finite and small wherever the format stores them.
    small_f16 = np.array([0.01], np.float16).view(np.uint8)
    offsets = {QuantKind.GGUF_Q2K: (80, 82), QuantKind.GGUF_Q3K: (108,), QuantKind.GGUF_Q4K: (0, 2),
               QuantKind.GGUF_Q5K: (0, 2), QuantKind.GGUF_Q6K: (208,)}.get(kind, ())
    for off in offsets:
        raw[:, off : off + 2] = small_f16
    if kind is QuantKind.GGUF_Q8K:
        raw[:, 0:4] = np.array([0.01], np.float32).view(np.uint8)
    raw = raw.reshape(-1)
    weight = gguf_dequantize(kind, raw, k)
    assert np.all(np.isfinite(weight))
    model = convert_and_cleanup(gguf_graph(kind, 2, k, n, raw.size), {"w": raw}, target="iOS18", precision="fp32")
    assert "linear" in non_const_ops(model)
    x = rng.normal(size=(2, k)).astype(np.float32)
    out = only_output(run_model(model, {"x": x}))
    assert max_rel_error(out, x @ weight.T) <= TOLERANCE["fp32"]


def test_gguf_runtime_bytes_are_unsupported() -> None:
    g = gguf_graph(QuantKind.GGUF_Q8_0, 1, 32, 2, 68, runtime=True)
    with pytest.raises(UnsupportedOpError, match="GgufQ8_0"):
        rlx_mil.lower(g, {}, target="iOS18")


# -------------------------------------------------------------------------- Quantize / Dequantize


@given(
    shape=st.sampled_from([(5,), (2, 7), (3, 2, 4)]),
    per_channel=st.booleans(),
    target=st.sampled_from(TARGETS),
    precision=st.sampled_from(PRECISIONS),
    seed=st.integers(0, 2**16),
)
def test_quantize_rounds_ties_away_and_clips(
    shape: tuple[int, ...], per_channel: bool, target: str, precision: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    axis = len(shape) - 1 if per_channel else None
    channels = shape[-1] if per_channel else 1
    scales = rng.choice(np.array([0.25, 0.5, 0.125], np.float32), channels)  # powers of two: exact ties
    zps = rng.integers(-5, 6, channels)
    # Halfway points (k + 0.5) * s, negative ones too, plus values that saturate either end.
    halves = (rng.integers(-40, 40, shape) + 0.5) * scales
    x = np.where(rng.random(shape) < 0.15, rng.choice([-1e3, 1e3], shape), halves).astype(np.float32)
    g = Graph("quantize")
    xi = g.input("x", list(shape))
    q = g.quantize(xi, scales.tolist(), zps.tolist(), axis=axis, name="q")
    g.set_outputs([q])
    model = convert_and_cleanup(g, {}, target=target, precision=precision)
    out = only_output(run_model(model, {"x": x}))
    ref = spec_quantize(x, scales, zps)
    np.testing.assert_array_equal(out.astype(np.int64), ref)
    np.testing.assert_array_equal(out, only_output(evaluate(g, {"x": x})))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_quantize_random_values_match_up_to_fp16_rounding(precision: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 2, (4, 16)).astype(np.float32)
    scales, zps = [0.037, 0.11, 0.05, 0.3], [3, -7, 0, 100]
    g = Graph("quantize")
    q = g.quantize(g.input("x", [4, 16]), scales, zps, axis=0, name="q")
    g.set_outputs([q])
    model = convert_and_cleanup(g, {}, target="iOS17", precision=precision)
    out = only_output(run_model(model, {"x": x})).astype(np.int64)
    ref = spec_quantize(x, np.array(scales, np.float32)[:, None], np.array(zps)[:, None])
    diff = np.abs(out - ref)
    if precision == "fp32":
        assert diff.max() == 0
    else:
        assert diff.max() <= 1 and diff.mean() < 0.1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("zero_points", [(3, -2, 0), (200, -2, 0)], ids=["int8_zp", "wide_zp"])
def test_dequantize_const_input_stays_int8(target: str, precision: str, zero_points: tuple[int, ...]) -> None:
    rng = np.random.default_rng(6)
    q = rng.integers(-128, 128, (3, 40)).astype(np.int8)
    scales = [0.5, 0.02, 0.1]
    g = Graph("dequantize")
    qp = g.param("q", [3, 40], "i8")
    g.set_outputs([g.dequantize(qp, scales, list(zero_points), axis=0, name="x")])
    model = convert_and_cleanup(g, {"q": q}, target=target, precision=precision)
    ops = non_const_ops(model)
    if target == "iOS15":
        assert not any(t.startswith("constexpr_") for t in ops)
    else:
        assert [t for t in ops if t.startswith("constexpr_")] == ["constexpr_affine_dequantize"]
        assert max(float_const_sizes(model), default=0) <= 3
    ref = (q.astype(np.float32) - np.array(zero_points, np.float32)[:, None]) * np.array(scales, np.float32)[:, None]
    out = only_output(run_model(model, {}))
    assert max_rel_error(out, ref) <= TOLERANCE[precision]


def test_quantize_maps_nan_to_zero_and_saturates_infinities() -> None:
    g = Graph("quantize")
    g.set_outputs([g.quantize(g.input("x", [4]), [0.5], [7], name="q")])
    x = np.array([np.nan, 1.0, -np.inf, np.inf], np.float32)
    model = convert_and_cleanup(g, {}, target="iOS16", precision="fp32")
    out = only_output(run_model(model, {"x": x}))
    np.testing.assert_array_equal(out, [0, 9, -128, 127])
    np.testing.assert_array_equal(out, only_output(evaluate(g, {"x": x})))


@pytest.mark.parametrize(
    ("dtype", "values", "storage"),
    [("u8", (0, 255), "uint8"), ("i32", (-1000, 1000), None)],
)
def test_dequantize_const_codes_beyond_int8(dtype: str, values: tuple[int, int], storage: str | None) -> None:
    rng = np.random.default_rng(8)
    q = rng.integers(values[0], values[1] + 1, (2, 9))
    g = Graph("dequantize")
    g.set_outputs([g.dequantize(g.param("q", [2, 9], dtype), [0.25], [100], name="x")])
    model = convert_and_cleanup(g, {"q": q}, target="iOS17", precision="fp32")
    constexpr_ops = [op for op in model._mil_program.functions["main"].operations if op.op_type.startswith("constexpr_")]
    if storage is None:
        assert constexpr_ops == []
    else:
        assert [op.op_type for op in constexpr_ops] == ["constexpr_affine_dequantize"]
        assert constexpr_ops[0].quantized_data.val.dtype == np.dtype(storage)
    out = only_output(run_model(model, {}))
    np.testing.assert_allclose(out, (q - 100) * 0.25, rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
def test_quantize_then_dequantize_runtime_roundtrip(target: str) -> None:
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2, 8)).astype(np.float32)
    g = Graph("qdq")
    xi = g.input("x", [2, 8])
    q = g.quantize(xi, [0.05], [3], name="q")
    dq = g.dequantize(q, [0.05], [3], name="dq")
    qc = g.quantize(xi, [0.1, 0.02], [0, -1], axis=0, name="qc")
    dqc = g.dequantize(qc, [0.1, 0.02], [0, -1], axis=0, name="dqc")
    g.set_outputs([q, dq, dqc])
    model = convert_and_cleanup(g, {}, target=target, precision="fp32")
    out = run_model(model, {"x": x})
    ref = evaluate(g, {"x": x})
    assert set(out) == set(ref)
    for name in ref:
        np.testing.assert_allclose(out[name], ref[name].astype(np.float32), rtol=1e-6, atol=1e-6)


def test_upstream_quant_fixture_converts_and_matches_reference(upstream_json_dir: Path) -> None:
    g = Graph.from_json_file(upstream_json_dir / "quant_matmul.json")
    rng = np.random.default_rng(12)
    k, n, groups = 8, 6, 2
    params = {
        "w_int8": rng.integers(-128, 128, (k, n)).astype(np.int8),
        "w_int8.scale": rng.uniform(0.01, 0.1, (groups, n)).astype(np.float32),
        "w_int8.zp": np.zeros((groups, n), np.float32),
        "w_int8_asym": rng.integers(-128, 128, (k, n)).astype(np.int8),
        "w_int8_asym.scale": rng.uniform(0.01, 0.1, (groups, n)).astype(np.float32),
        "w_int8_asym.zp": rng.uniform(-4, 4, (groups, n)).astype(np.float32),
        "w_int4": pack(rng.integers(0, 16, (k, n))),  # declared [8, 6] I8, fed packed as upstream does
        "w_int4.scale": rng.uniform(0.01, 0.1, (groups, n)).astype(np.float32),
        "w_int4.zp": np.zeros((groups, n), np.float32),
    }
    x = rng.normal(size=(2, k)).astype(np.float32)
    ref = evaluate(g, {"x": x}, params)
    for target in ("iOS15", "iOS16", "iOS18"):
        model = convert_and_cleanup(g, params, target=target, precision="fp32")
        out = run_model(model, {"x": x})
        assert set(out) == set(ref)
        for name, want in ref.items():
            np.testing.assert_allclose(out[name], want.astype(np.float32), rtol=1e-5, atol=1e-5, err_msg=name)
        if target != "iOS15":
            assert sum(t.startswith("constexpr_") for t in non_const_ops(model)) == 3


def test_rule_notes_document_every_target() -> None:
    from rlx_mil.ir import ops
    from rlx_mil.lowering.registry import registered_rules

    notes = registered_rules()[ops.DequantMatMul].notes
    for word in ("iOS18", "iOS16/17", "iOS15", "constexpr_blockwise_shift_scale", "constexpr_affine_dequantize",
                 "constexpr_lut_to_dense"):
        assert word in notes


#: DequantMatMul schemes whose byte layout the spec leaves open: refused by name, never guessed.
_UNDECODED = [
    QuantScheme(kind) for kind in QuantKind
    if kind.is_gguf and kind not in GGUF_FORMATS
] + [
    QuantScheme(QuantKind.MLX_AFFINE, bits=4, group_size=32),
    QuantScheme(QuantKind.MLX_MXFP4, group_size=32),
    QuantScheme(QuantKind.MLX_MXFP8, group_size=32),
    QuantScheme(QuantKind.MXFP4X2_BLOCK, group_size=32),
]


@pytest.mark.parametrize("scheme", _UNDECODED, ids=lambda s: s.kind.value)
def test_schemes_without_a_fixed_layout_are_refused_by_name(scheme: QuantScheme) -> None:
    g = Graph("undecoded")
    x = g.input("x", [1, 256])
    if scheme.kind.is_gguf:
        elems, nbytes = GGUF_BLOCKS[scheme.kind]
        w = g.param("w", [2 * 256 // elems * nbytes], DType.U8)
        y = g.dequant_matmul(x, w, scheme=scheme, out_shape=[1, 2], name="y")
        params = {"w": np.zeros(2 * 256 // elems * nbytes, np.uint8)}
    elif scheme.kind is QuantKind.MXFP4X2_BLOCK:
        w, s = g.param("w", [256, 2], DType.U8), g.param("s", [16, 2])
        y = g.dequant_matmul(x, w, s, scheme=scheme, out_shape=[1, 2], name="y")
        params = {"w": np.zeros((256, 2), np.uint8), "s": np.ones((16, 2), np.float32)}
    else:
        w, s, z = g.param("w", [256, 2], DType.U8), g.param("s", [8, 2]), g.param("z", [8, 2])
        y = g.dequant_matmul(x, w, s, z, scheme=scheme, out_shape=[1, 2], name="y")
        params = {"w": np.zeros((256, 2), np.uint8), "s": np.ones((8, 2), np.float32), "z": np.ones((8, 2), np.float32)}
    g.set_outputs([y])
    with pytest.raises(UnsupportedOpError, match=rf"{scheme.kind.value}.*(would be a guess|does not fix)"):
        rlx_mil.convert(g, params, target="iOS18")
