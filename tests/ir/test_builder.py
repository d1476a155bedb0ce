"""The pyrlx-style Graph builder: every method's op and shape, string spellings, constant
encoding, the printer, rebuilding upstream fixtures, and error messages that name the node,
op and operand."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import ALL_DTYPES, dims

from rlx_mil.errors import (
    ArityError,
    AttributeValueError,
    DTypeError,
    GraphError,
    ShapeError,
    UnknownNodeError,
)
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import (
    ActivationKind,
    AttentionBwdWrt,
    BinaryOp,
    CmpOp,
    MaskKind,
    QuantKind,
    QuantScheme,
    ReduceOp,
)
from rlx_mil.ir.serde.versions import NEWEST_ONLY_MEMBERS
from rlx_mil.ir.shape import SEQ, Dynamic, Shape

F32 = DType.F32


def S(*d: int | Dynamic, dtype: DType = F32) -> Shape:
    return Shape.of(d, dtype)


def last(g: Graph) -> ops.Op:
    return g.nodes[-1].op


# ------------------------------------------------------------------------------ leaves


@given(dims(0, 3), st.sampled_from(ALL_DTYPES))
def test_input_and_param_declare_shape_dtype_and_name(d: tuple[int, ...], dtype: DType) -> None:
    g = Graph()
    x = g.input("x", d, dtype.value)
    w = g.param("w.weight", list(d), dtype)
    assert (x, w) == (0, 1)
    assert g.shape_of(x) == Shape.of(d, dtype) == g.shape_of(w)
    assert g.node(x).op == ops.Input("x") and g.node(x).name == "x"
    assert g.node(w).op == ops.Param("w.weight") and g.node(w).name == "w.weight"


@pytest.mark.parametrize(
    ("text", "dtype"),
    [("f32", DType.F32), ("Float", DType.F32), ("half", DType.F16), ("BFLOAT16", DType.BF16),
     ("double", DType.F64), ("int8", DType.I8), ("u8", DType.U8), ("i64", DType.I64), ("bool", DType.BOOL)],
)
def test_dtype_spellings(text: str, dtype: DType) -> None:
    g = Graph()
    g.input("x", [2], text)
    assert g.shape_of(0).dtype is dtype


def test_dynamic_dims_and_bad_shapes() -> None:
    g = Graph()
    x = g.input("x", [Dynamic(SEQ), 4])
    assert g.shape_of(x) == S(Dynamic(SEQ), 4)
    with pytest.raises(ShapeError, match="bad shape"):
        g.input("y", [2, -3])
    with pytest.raises(DTypeError, match="unknown dtype"):
        g.param("w", [2], "float8")
    assert len(g) == 1


@given(hnp.arrays(st.sampled_from([np.float32, np.float16, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_]),
                  hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)))
def test_constant_stores_little_endian_bytes_of_its_dtype(values: np.ndarray) -> None:
    g = Graph()
    c = g.constant(values, name="c")
    node = g.node(c)
    dtype = DType.parse(values.dtype)
    assert node.shape == Shape.of(values.shape, dtype)
    assert node.name == "c"
    decoded = np.frombuffer(node.op.data, dtype=dtype.numpy.newbyteorder("<")).reshape(values.shape)
    np.testing.assert_array_equal(decoded, values)


def test_constant_dtype_defaults_and_conversion() -> None:
    g = Graph()
    floats = g.constant([1.0, -2.5, 0.5, 3.0])  # plain Python floats become F32, as pyrlx
    assert g.shape_of(floats) == S(4)
    assert g.node(floats).op.data == struct.pack("<4f", 1.0, -2.5, 0.5, 3.0)
    ints = g.constant([[1, 2]], dtype="i32")
    assert g.shape_of(ints) == S(1, 2, dtype=DType.I32)
    assert g.node(ints).op.data == struct.pack("<2i", 1, 2)
    scalar = g.constant(np.float64(2.0), dtype="f16")
    assert g.shape_of(scalar) == S(dtype=DType.F16)
    assert g.node(scalar).op.data == struct.pack("<e", 2.0)
    flags = g.constant([0.0, 2.0], dtype="bool")
    assert g.node(flags).op.data == bytes([0, 1])
    with pytest.raises(AttributeValueError, match="fit I8") as err:
        g.constant([300], dtype="i8")
    assert err.value.node == len(g) and err.value.operand == "data"
    with pytest.raises(AttributeValueError, match="fit I32"):
        g.constant([1.5], dtype="i32")


_BF16_SAFE = float(np.float32(3e38))  # beyond bf16's max finite + half an ulp, IEEE rounds to inf


@given(hnp.arrays(np.float32, st.integers(1, 8), elements=st.floats(-_BF16_SAFE, _BF16_SAFE, width=32)))
def test_bf16_constants_round_to_the_nearest_bf16(values: np.ndarray) -> None:
    g = Graph()
    data = g.node(g.constant(values, dtype="bf16")).op.data
    halves = np.frombuffer(data, "<u2").astype(np.uint32)
    decoded = (halves << 16).view(np.float32)
    bits = values.view(np.uint32)
    below = (bits & 0xFFFF0000).view(np.float32)  # the two bf16 neighbours of each value
    above = ((bits & 0xFFFF0000) + 0x10000).view(np.float32)
    assert np.all((decoded == below) | (decoded == above))
    error = np.abs(decoded.astype(np.float64) - values.astype(np.float64))
    best = np.minimum(np.abs(below.astype(np.float64) - values), np.abs(above.astype(np.float64) - values))
    assert np.all(error <= best)


# ------------------------------------------------------------------------------ element-wise


@pytest.mark.parametrize("kind", list(ActivationKind))
def test_activation_kinds_by_member_snake_case_and_variant_name(kind: ActivationKind) -> None:
    g = Graph()
    x = g.input("x", [2, 3])
    for spelling in (kind, kind.name.lower(), kind.name.upper(), kind.value):
        g.activation(spelling, x)
        assert last(g) == ops.Activation(kind)
    shortcut = getattr(g, kind.name.lower())
    y = shortcut(x, name="y")
    assert last(g) == ops.Activation(kind) and g.node(y).name == "y"
    assert g.shape_of(y) == S(2, 3)


@pytest.mark.parametrize(
    ("spelling", "op"),
    [("add", BinaryOp.ADD), ("+", BinaryOp.ADD), ("SUB", BinaryOp.SUB), ("-", BinaryOp.SUB), ("*", BinaryOp.MUL),
     ("/", BinaryOp.DIV), ("div", BinaryOp.DIV), ("max", BinaryOp.MAX), ("minimum", BinaryOp.MIN), ("Pow", BinaryOp.POW)],
)
def test_binary_spellings(spelling: str, op: BinaryOp) -> None:
    g = Graph()
    a, b = g.input("a", [2, 3]), g.input("b", [3])
    out = g.binary(spelling, a, b)
    assert last(g) == ops.Binary(op) and g.shape_of(out) == S(2, 3)


def test_binary_shortcuts() -> None:
    g = Graph()
    a, b = g.input("a", [2, 1]), g.input("b", [1, 4])
    methods = {g.add: BinaryOp.ADD, g.sub: BinaryOp.SUB, g.mul: BinaryOp.MUL, g.div: BinaryOp.DIV,
               g.maximum: BinaryOp.MAX, g.minimum: BinaryOp.MIN, g.pow: BinaryOp.POW}
    for method, op in methods.items():
        out = method(a, b)
        assert last(g) == ops.Binary(op) and g.shape_of(out) == S(2, 4)


@pytest.mark.parametrize(
    ("spelling", "op"),
    [("eq", CmpOp.EQ), ("==", CmpOp.EQ), ("!=", CmpOp.NE), ("<", CmpOp.LT), ("LE", CmpOp.LE), ("<=", CmpOp.LE),
     (">", CmpOp.GT), ("ge", CmpOp.GE), (">=", CmpOp.GE)],
)
def test_compare_spellings(spelling: str, op: CmpOp) -> None:
    g = Graph()
    a = g.input("a", [2, 3])
    out = g.compare(spelling, a, a)
    assert last(g) == ops.Compare(op) and g.shape_of(out) == S(2, 3, dtype=DType.BOOL)


def test_compare_shortcuts_where_and_cast() -> None:
    g = Graph()
    a, b = g.input("a", [2, 3]), g.input("b", [2, 3])
    for method, op in {g.eq_: CmpOp.EQ, g.ne_: CmpOp.NE, g.lt_: CmpOp.LT, g.le_: CmpOp.LE,
                       g.gt_: CmpOp.GT, g.ge_: CmpOp.GE}.items():
        method(a, b)
        assert last(g) == ops.Compare(op)
    cond = g.gt_(a, b)
    w = g.where_(cond, a, g.input("zero", [1]))
    assert last(g) == ops.Where() and g.shape_of(w) == S(2, 3)
    c = g.cast(a, "f16")
    assert last(g) == ops.Cast(DType.F16) and g.shape_of(c) == S(2, 3, dtype=DType.F16)


# ------------------------------------------------------------------------------ linear algebra, quant


def test_matmul_family() -> None:
    g = Graph()
    x, w = g.input("x", [2, 5, 8]), g.param("w", [8, 6])
    assert g.shape_of(g.matmul(x, w)) == S(2, 5, 6)
    la, lb = g.param("a", [8, 2]), g.param("b", [2, 6])
    y = g.lora_matmul(x, w, la, lb, 0.25)
    assert last(g) == ops.LoraMatMul(0.25) and g.shape_of(y) == S(2, 5, 6)
    bias = g.param("bias", [6])
    g.fused_matmul_bias_act(x, w, bias)
    assert last(g) == ops.FusedMatMulBiasAct(None)
    z = g.fused_matmul_bias_act(x, w, bias, "gelu_approx")
    assert last(g) == ops.FusedMatMulBiasAct(ActivationKind.GELU_APPROX) and g.shape_of(z) == S(2, 5, 6)


def test_quantize_dequantize_builders() -> None:
    g = Graph()
    x = g.input("x", [2, 8])
    q = g.quantize(x, 0.05, 3)
    assert last(g) == ops.Quantize(None, [0.05], [3]) and g.shape_of(q) == S(2, 8, dtype=DType.I8)
    g.dequantize(q, [0.1, 0.02], [0, -1], axis=-2)
    assert last(g) == ops.Dequantize(0, [0.1, 0.02], [0, -1])
    assert g.shape_of(len(g) - 1) == S(2, 8)


def test_dequant_matmul_builder() -> None:
    g = Graph()
    x = g.input("x", [3, 8])
    w, scale, zp = g.param("w", [8, 6], "i8"), g.param("s", [2, 6]), g.param("zp", [2, 6])
    for scheme, expected in [
        (QuantScheme.int8_block(4), QuantScheme.int8_block(4)),
        ("int8_block:4", QuantScheme.int8_block(4)),
        ("Int8BlockAsym(4)", QuantScheme.int8_block_asym(4)),
        ("int4-block:4", QuantScheme.int4_block(4)),
    ]:
        y = g.dequant_matmul(x, w, scale, zp, scheme)
        assert last(g) == ops.DequantMatMul(expected) and g.shape_of(y) == S(3, 6)
    packed = g.param("packed", [5 * 8 * 144], "u8")  # N=5 rows, K=2048 = 8 Q4_K blocks
    xk = g.input("xk", [3, 2048])
    y = g.dequant_matmul(xk, packed, scheme="gguf_q4_k", out_shape=5)
    assert last(g) == ops.DequantMatMul(QuantScheme(QuantKind.GGUF_Q4K)) and g.shape_of(y) == S(3, 5)
    y = g.dequant_matmul(xk, packed, scheme=QuantScheme(QuantKind.GGUF_Q4K), out_shape=[3, 5])
    assert g.shape_of(y) == S(3, 5)
    with pytest.raises(AttributeValueError, match="unknown quantization scheme"):
        g.dequant_matmul(x, w, scale, zp, "int3_block:4")
    with pytest.raises(AttributeValueError, match="block_size"):
        g.dequant_matmul(x, w, scale, zp, "int8_block")
    with pytest.raises(AttributeValueError, match="scheme is required"):
        g.dequant_matmul(x, w, scale, zp)
    with pytest.raises(ArityError, match="4 \\(x, w_q, scale, zp\\)"):
        g.dequant_matmul(x, w, scale, scheme="int8_block:4")


# ------------------------------------------------------------------------------ norms, reductions


def test_norm_builders() -> None:
    g = Graph()
    x, gamma, beta = g.input("x", [2, 5, 8]), g.param("g", [8]), g.param("b", [8])
    g.layer_norm(x, gamma, beta)
    assert last(g) == ops.LayerNorm(-1, 1e-5)
    g.rms_norm(x, gamma, beta, eps=1e-6)
    assert last(g) == ops.RmsNorm(-1, 1e-6)
    res = g.input("res", [2, 5, 8])
    out = g.fused_residual_ln(x, res, gamma, beta)
    assert last(g) == ops.FusedResidualLN(False, 1e-5) and g.node(out).inputs == (x, res, gamma, beta)
    out = g.fused_residual_rms_norm(x, res, gamma, beta, bias=beta, eps=1e-6)
    assert last(g) == ops.FusedResidualRmsNorm(True, 1e-6) and g.node(out).inputs == (x, res, beta, gamma, beta)
    img, c = g.input("img", [1, 6, 4, 4]), g.param("c", [6])
    out = g.group_norm(img, c, c, 3)
    assert last(g) == ops.GroupNorm(3, 1e-5) and g.shape_of(out) == S(1, 6, 4, 4)


def test_reduction_builders_normalize_negative_axes() -> None:
    g = Graph()
    x = g.input("x", [2, 3, 4])
    methods = {g.sum: ReduceOp.SUM, g.mean: ReduceOp.MEAN, g.max: ReduceOp.MAX, g.min: ReduceOp.MIN,
               g.prod: ReduceOp.PROD, g.reduce_sum: ReduceOp.SUM, g.reduce_mean: ReduceOp.MEAN,
               g.reduce_max: ReduceOp.MAX, g.reduce_min: ReduceOp.MIN, g.reduce_prod: ReduceOp.PROD}
    for method, op in methods.items():
        out = method(x, [-1, 0])
        assert last(g) == ops.Reduce(op, (2, 0), False) and g.shape_of(out) == S(3)
    out = g.reduce(x, "mean", -2, keep_dim=True)
    assert last(g) == ops.Reduce(ReduceOp.MEAN, (1,), True) and g.shape_of(out) == S(2, 1, 4)
    g.softmax(x)
    assert last(g) == ops.Softmax(-1)
    g.cumsum(x, -1, exclusive=True)
    assert last(g) == ops.Cumsum(-1, True)
    idx = g.topk(x, 2)
    assert last(g) == ops.TopK(2) and g.shape_of(idx) == S(2, 3, 2)
    idx = g.topk(x, 3, dtype="i32")
    assert g.shape_of(idx) == S(2, 3, 3, dtype=DType.I32)


def test_data_movement_builders() -> None:
    g = Graph()
    x = g.input("x", [2, 3, 4])
    assert g.shape_of(g.reshape(x, [4, -1])) == S(4, 6)
    assert g.shape_of(g.transpose(x, [2, 0, 1])) == S(4, 2, 3)
    n = g.narrow(x, -1, 1, 2)
    assert last(g) == ops.Narrow(2, 1, 2) and g.shape_of(n) == S(2, 3, 2)
    cat = g.concat([x, x, n], -1)
    assert last(g) == ops.Concat(2) and g.shape_of(cat) == S(2, 3, 10)
    e = g.expand(g.param("s", [3, 1]), [2, 3, 4])
    assert g.shape_of(e) == S(2, 3, 4)
    table, ids = g.param("table", [10, 4]), g.input("ids", [2, 3], "i64")
    assert g.shape_of(g.gather(table, ids)) == S(2, 3, 4)
    assert g.shape_of(g.gather(x, ids, axis=-1)) == S(2, 3, 2, 3)
    cos = g.input("cos", [3, 2])
    r = g.rope(g.input("h", [2, 3, 8]), cos, cos, 4)
    assert last(g) == ops.Rope(4, 4) and g.shape_of(r) == S(2, 3, 8)
    g.rope(r, cos, cos, 4, n_rot=2)
    assert last(g) == ops.Rope(4, 2)


# ------------------------------------------------------------------------------ attention, fused


def test_attention_builders() -> None:
    g = Graph()
    q, k, v = (g.input(n, [1, 4, 8, 16]) for n in "qkv")
    mask = g.input("mask", [1, 8])
    g.attention(q, k, v, mask, 4, 16, score_scale=0.2)
    assert last(g) == ops.Attention(4, 16, MaskKind.CUSTOM, 0.2, None)
    g.attention_kind(q, k, v, 4, 16)
    assert last(g) == ops.Attention(4, 16, MaskKind.CAUSAL)
    g.attention_kind(q, k, v, 4, 16, "Sliding:3", softcap=30.0)
    assert last(g) == ops.Attention(4, 16, MaskKind.sliding_window(3), None, 30.0)
    g.attention_kind(q, k, v, 4, 16, MaskKind.NONE)
    assert last(g) == ops.Attention(4, 16, MaskKind.NONE)
    bias = g.input("bias", [1, 4, 8, 8])
    out = g.attention_bias(q, k, v, bias, 4, 16)
    assert last(g) == ops.Attention(4, 16, MaskKind.BIAS) and g.shape_of(out) == S(1, 4, 8, 16)
    with pytest.raises(AttributeValueError, match="needs a mask tensor"):
        g.attention_kind(q, k, v, 4, 16, "custom")
    with pytest.raises(AttributeValueError, match="unknown mask kind"):
        g.attention_kind(q, k, v, 4, 16, "diagonal")
    dy = g.input("dy", [1, 4, 8, 16])
    dk = g.attention_backward(q, k, v, dy, 4, 16, "custom", "k", mask=mask)
    assert last(g) == ops.AttentionBackward(4, 16, MaskKind.CUSTOM, AttentionBwdWrt.KEY)
    assert g.node(dk).inputs == (q, k, v, dy, mask)
    grads = g.attention_backward_all(q, k, v, dy, 4, 16, "causal", names=("dq", "dk", "dv"))
    assert [g.node(i).op.wrt for i in grads] == list(AttentionBwdWrt)
    assert [g.node(i).name for i in grads] == ["dq", "dk", "dv"]


def test_fused_block_builders() -> None:
    g = Graph()
    x = g.input("x", [2, 5, 12])
    out = g.fused_swiglu(x, cast_to="f16", gate_first=True)
    assert last(g) == ops.FusedSwiGLU(DType.F16, True) and g.shape_of(out) == S(2, 5, 6, dtype=DType.F16)
    b, s, e, h, d, f = 2, 4, 16, 2, 8, 32
    hidden, mask = g.input("hidden", [b, s, e]), g.input("mask", [b, s])
    qkv_w, out_w = g.param("qkv_w", [e, 3 * h * d]), g.param("out_w", [h * d, e])
    qkv_b, vec_e = g.param("qkv_b", [3 * h * d]), g.param("vec_e", [e])
    cos = g.input("cos", [s, d // 2])
    g.fused_attention_block(hidden, qkv_w, out_w, mask, h, d)
    assert last(g) == ops.FusedAttentionBlock(h, d, False, False)
    blk = g.fused_attention_block(hidden, qkv_w, out_w, mask, h, d, qkv_b=qkv_b, out_b=vec_e, cos=cos, sin=cos)
    assert last(g) == ops.FusedAttentionBlock(h, d, True, True)
    assert g.node(blk).inputs == (hidden, qkv_w, out_w, mask, qkv_b, vec_e, cos, cos)
    with pytest.raises(AttributeValueError, match="together"):
        g.fused_attention_block(hidden, qkv_w, out_w, mask, h, d, qkv_b=qkv_b)
    fc1_w, fc1_b, fc2_w = g.param("fc1_w", [e, f]), g.param("fc1_b", [f]), g.param("fc2_w", [f, e])
    weights = {"qkv_w": qkv_w, "out_w": out_w, "ln1_gamma": vec_e, "fc1_w": fc1_w, "fc2_w": fc2_w,
               "ln2_gamma": vec_e, "num_heads": h, "head_dim": d}
    eight = g.fused_transformer_layer(hidden, mask, **weights)
    assert last(g) == ops.FusedTransformerLayer(h, d, f, 1e-12, 1e-12, ActivationKind.GELU, False)
    assert len(g.node(eight).inputs) == 8 and g.shape_of(eight) == S(b, s, e)
    ten = g.fused_transformer_layer(hidden, mask, ln1_beta=vec_e, ln2_beta=vec_e, activation="relu", eps1=1e-5, **weights)
    assert last(g) == ops.FusedTransformerLayer(h, d, f, 1e-5, 1e-12, ActivationKind.RELU, False)
    assert g.node(ten).inputs[4] == vec_e and len(g.node(ten).inputs) == 10
    full = g.fused_transformer_layer(
        hidden, mask, ln1_beta=vec_e, ln2_beta=vec_e, qkv_b=qkv_b, out_b=vec_e, fc1_b=fc1_b, fc2_b=vec_e, **weights
    )
    assert g.node(full).inputs == (hidden, qkv_w, qkv_b, out_w, vec_e, vec_e, vec_e, fc1_w, fc1_b,
                                   fc2_w, vec_e, vec_e, vec_e, mask)
    with pytest.raises(AttributeValueError, match="together"):
        g.fused_transformer_layer(hidden, mask, qkv_b=qkv_b, ln1_beta=vec_e, ln2_beta=vec_e, **weights)
    with pytest.raises(AttributeValueError, match="needs ln1_beta"):
        g.fused_transformer_layer(hidden, mask, qkv_b=qkv_b, out_b=vec_e, fc1_b=fc1_b, fc2_b=vec_e, **weights)


def test_conv_and_pool_builders() -> None:
    g = Graph()
    x, w = g.input("x", [1, 4, 9, 9]), g.param("w", [6, 2, 3, 3])
    y = g.conv(x, w, stride=2, padding=[1, 0], groups=2)
    assert last(g) == ops.Conv((3, 3), (2, 2), (1, 0), (1, 1), 2) and g.shape_of(y) == S(1, 6, 5, 4)
    p = g.pool(x, "max", 3)
    assert last(g) == ops.Pool(ReduceOp.MAX, (3, 3), (3, 3), (0, 0)) and g.shape_of(p) == S(1, 4, 3, 3)
    p = g.pool(x, "avg", [2, 3], stride=1, padding=1)
    assert last(g) == ops.Pool(ReduceOp.MEAN, (2, 3), (1, 1), (1, 1)) and g.shape_of(p) == S(1, 4, 10, 9)
    with pytest.raises(AttributeValueError, match="unknown pool kind"):
        g.pool(x, "median", 2)


# ------------------------------------------------------------------------------ upstream fixtures


def _structure(g: Graph) -> list[tuple[ops.Op, tuple[int, ...], Shape]]:
    return [(n.op, n.inputs, n.shape) for n in g]


def test_builder_rebuilds_the_llama_fixture(upstream_json_dir: Path) -> None:
    g = Graph("llama_layer")
    hidden = g.input("hidden", [1, 8, 32])
    cos, sin = g.input("rope_cos", [8, 4]), g.input("rope_sin", [8, 4])
    p = {n: g.param(n, s) for n, s in [
        ("input_layernorm.weight", [32]), ("input_layernorm.bias", [32]),
        ("self_attn.q_proj.weight", [32, 32]), ("self_attn.k_proj.weight", [32, 32]),
        ("self_attn.v_proj.weight", [32, 32]), ("self_attn.o_proj.weight", [32, 32]),
        ("post_attention_layernorm.weight", [32]), ("post_attention_layernorm.bias", [32]),
        ("mlp.gate_proj.weight", [32, 64]), ("mlp.up_proj.weight", [32, 64]), ("mlp.down_proj.weight", [64, 32]),
    ]}
    h = g.rms_norm(hidden, p["input_layernorm.weight"], p["input_layernorm.bias"], name="input_rms_norm")
    q, k, v = (g.matmul(h, p[f"self_attn.{n}_proj.weight"], name=f"{n}_proj") for n in "qkv")
    q, k = g.rope(q, cos, sin, 8, name="q_rope"), g.rope(k, cos, sin, 8, name="k_rope")
    a = g.attention_kind(q, k, v, 4, 8, "causal", name="self_attention_causal")
    res = g.add(hidden, g.matmul(a, p["self_attn.o_proj.weight"], name="o_proj"), name="attn_residual")
    h = g.rms_norm(res, p["post_attention_layernorm.weight"], p["post_attention_layernorm.bias"], name="post_attn_rms_norm")
    gate = g.matmul(h, p["mlp.gate_proj.weight"], name="gate_proj")
    up = g.matmul(h, p["mlp.up_proj.weight"], name="up_proj")
    act = g.mul(g.silu(gate, name="gate_silu"), up, name="swiglu")
    out = g.add(res, g.matmul(act, p["mlp.down_proj.weight"], name="down_proj"), name="mlp_residual")
    g.set_outputs([out])
    upstream = Graph.from_json_file(upstream_json_dir / "llama_layer.json")
    assert _structure(g) == _structure(upstream)
    assert [n.name for n in g] == [n.name for n in upstream]
    assert g.outputs == upstream.outputs
    assert str(g) == str(upstream)


def test_builder_rebuilds_the_elementwise_zoo_fixture(upstream_json_dir: Path) -> None:
    g = Graph("elementwise_zoo")
    x, y = g.input("x", [2, 3, 4]), g.input("y", [2, 3, 4])
    row_bias, ids = g.input("row_bias", [4]), g.input("ids", [2, 3], "i64")
    table, col_scale = g.param("embed_table", [10, 4]), g.param("col_scale", [1, 3, 1])
    # The fixture is 0.2.2 JSON: the kinds the newest upstream added are not in it.
    kinds_022 = [k for k in ActivationKind if k not in NEWEST_ONLY_MEMBERS]
    upstream_order = [k for k in kinds_022 if k is not ActivationKind.ROUND] + [ActivationKind.ROUND]
    outs = [g.activation(kind.name.lower(), x) for kind in upstream_order]
    outs += [g.binary(op.value.lower(), x, y) for op in BinaryOp if op not in NEWEST_ONLY_MEMBERS] + [g.add(x, row_bias)]
    cmps = [g.compare(op.value.lower(), x, y) for op in CmpOp]
    outs += [*cmps, g.where_(cmps[4], x, y), g.cast(x, "f16")]
    outs += [g.sum(x, [2]), g.sum(x, [2], keep_dim=True), g.mean(x, [1], keep_dim=True), g.mean(x, [0, 2]),
             g.max(x, [0, 2]), g.max(x, [1, 2], keep_dim=True), g.softmax(x, 1), g.cumsum(x, 2),
             g.cumsum(x, -1, exclusive=True), g.narrow(x, 2, 1, 2), g.concat([x, y], 1),
             g.expand(col_scale, [2, 3, 4]), g.gather(table, ids, 0), g.transpose(x, [0, 2, 1]), g.reshape(x, [2, -1])]
    const = g.constant(np.array([1.0, -2.5, 0.5, 3.0], np.float32), name="const_f32_4")
    outs.append(g.mul(x, const))
    g.set_outputs(outs)
    upstream = Graph.from_json_file(upstream_json_dir / "elementwise_zoo.json")
    assert _structure(g) == _structure(upstream)
    assert g.outputs == upstream.outputs


def test_builder_rebuilds_the_quant_and_backward_fixtures(upstream_json_dir: Path) -> None:
    g = Graph("quant_matmul")
    x = g.input("x", [2, 8])
    outs = []
    for stem, scheme in [("w_int8", "int8_block:4"), ("w_int8_asym", "int8_block_asym:4"), ("w_int4", "int4_block:4")]:
        w = g.param(stem, [8, 6], "i8")
        scale, zp = g.param(f"{stem}.scale", [2, 6]), g.param(f"{stem}.zp", [2, 6])
        outs.append(g.dequant_matmul(x, w, scale, zp, scheme))
    q = g.quantize(x, 0.05, 3)
    outs += [q, g.dequantize(q, 0.05, 3)]
    q = g.quantize(x, [0.1, 0.02], [0, -1], axis=0)
    outs += [q, g.dequantize(q, [0.1, 0.02], [0, -1], axis=0)]
    g.set_outputs(outs)
    assert _structure(g) == _structure(Graph.from_json_file(upstream_json_dir / "quant_matmul.json"))

    g = Graph("attn_backward")
    q, k, v, dy = (g.input(n, [1, 4, 8, 16]) for n in ("q", "k", "v", "dy"))
    fwd = g.attention_kind(q, k, v, 4, 16, "causal", name="attn_fwd_causal")
    g.set_outputs([fwd, *g.attention_backward_all(q, k, v, dy, 4, 16, "causal")])
    upstream = Graph.from_json_file(upstream_json_dir / "attn_backward.json")
    assert _structure(g) == _structure(upstream)
    assert str(g) == str(upstream)


# ------------------------------------------------------------------------------ printer


def test_str_prints_one_line_per_node_and_the_outputs() -> None:
    g = Graph("demo")
    q, k, v = (g.input(n, [1, 4, 8, 16]) for n in "qkv")
    a = g.attention_kind(q, k, v, 4, 16, "causal", score_scale=0.2, name="attn_causal")
    n = g.layer_norm(a, g.param("gamma", [16]), g.param("beta", [16]))
    g.set_outputs([a, n])
    assert str(g) == "\n".join([
        "graph demo {",
        "  %0 = Input(name='q') : F32[1, 4, 8, 16]  # q",
        "  %1 = Input(name='k') : F32[1, 4, 8, 16]  # k",
        "  %2 = Input(name='v') : F32[1, 4, 8, 16]  # v",
        "  %3 = Attention(num_heads=4, head_dim=16, mask_kind=Causal, score_scale=0.2, attn_logit_softcap=None)"
        " (%0, %1, %2) : F32[1, 4, 8, 16]  # attn_causal",
        "  %4 = Param(name='gamma') : F32[16]  # gamma",
        "  %5 = Param(name='beta') : F32[16]  # beta",
        "  %6 = LayerNorm(axis=-1, eps=1e-05) (%3, %4, %5) : F32[1, 4, 8, 16]",
        "  outputs: %3 (attn_causal), %6",
        "}",
    ])
    assert repr(g) == "<Graph 'demo': 7 nodes, outputs [3, 6]>"


def test_op_str_prints_float32_attributes_in_shortest_form() -> None:
    assert str(ops.Quantize(0, [0.1, 0.02], [0, -1])) == "Quantize(axis=0, scales=[0.1, 0.02], zero_points=[0, -1])"
    assert str(ops.LoraMatMul(1 / 3)) == "LoraMatMul(scale=0.33333334)"
    assert "eps1=1e-12" in str(ops.FusedTransformerLayer(2, 8, 32, 1e-12, 1e-5, ActivationKind.GELU, True))
    assert str(ops.DequantMatMul(QuantScheme.int4_block(32))) == "DequantMatMul(scheme=Int4Block(32))"
    assert str(ops.Reshape((2, -1))) == "Reshape(new_shape=[2, -1])"


# ------------------------------------------------------------------------------ error paths


def _assert_names(err: GraphError, node: int, op: str, operand: str | None) -> None:
    """The message names the node id, op and operand (and the attributes are set)."""
    text = str(err)
    assert err.node == node and f"%{node}" in text
    assert err.op == op and f"({op})" in text
    if operand is not None:
        assert err.operand == operand
        assert re.search(rf"\boperand {re.escape(operand)}\b", text), text


@pytest.fixture
def g() -> Graph:
    graph = Graph()
    graph.input("x", [2, 3, 4])  # %0
    graph.input("q", [1, 6, 64])  # %1
    graph.input("mask", [1, 6])  # %2
    return graph


def test_error_shape_mismatch(g: Graph) -> None:
    w = g.param("w", [5, 6])
    with pytest.raises(ShapeError, match="contraction dims differ") as err:
        g.matmul(0, w, name="proj")
    _assert_names(err.value, 4, "MatMul", "rhs")
    assert "'proj'" in str(err.value)
    with pytest.raises(ShapeError, match=r"must be \[H\] = \[4\]") as err:
        g.layer_norm(0, g.param("g2", [2, 4]), g.param("b2", [4]))
    _assert_names(err.value, 6, "LayerNorm", "gamma")


def test_error_bad_axis(g: Graph) -> None:
    with pytest.raises(AttributeValueError, match="axis 3 is out of range for rank 3") as err:
        g.softmax(0, axis=3)
    _assert_names(err.value, 3, "Softmax", "x")
    with pytest.raises(AttributeValueError, match="out of range") as err:
        g.sum(0, [5])
    _assert_names(err.value, 3, "Reduce", "x")
    with pytest.raises(AttributeValueError, match="out of range") as err:
        g.narrow(0, -4, 0, 1)
    _assert_names(err.value, 3, "Narrow", "x")


def test_error_non_divisible_heads(g: Graph) -> None:
    with pytest.raises(AttributeValueError, match="num_heads=3") as err:
        g.attention_kind(1, 1, 1, 3, 16, "causal")
    _assert_names(err.value, 3, "Attention", "q")
    with pytest.raises(ShapeError, match="not a multiple of head_dim") as err:
        g.attention_kind(1, 1, 1, 5, 10)
    _assert_names(err.value, 3, "Attention", "q")
    kv = g.input("kv", [1, 6, 48])  # 3 kv heads of 16 cannot serve 4 query heads
    with pytest.raises(AttributeValueError, match="not a multiple") as err:
        g.attention_kind(1, kv, kv, 4, 16)
    _assert_names(err.value, 4, "Attention", "k")


def test_error_wrong_input_count(g: Graph) -> None:
    with pytest.raises(ArityError, match=r"expects 2 \(lhs, rhs\) inputs, got 1") as err:
        g.add_node(ops.MatMul(), [0])
    _assert_names(err.value, 3, "MatMul", None)
    with pytest.raises(ArityError, match=r"expects 5 \(q, k, v, dy, mask\) inputs, got 4") as err:
        g.attention_backward(1, 1, 1, 1, 4, 16, "custom", "q")
    _assert_names(err.value, 3, "AttentionBackward", None)
    with pytest.raises(ArityError, match=r"expects 10 \(hidden, .*\) or 8 \(hidden, .*\) inputs, got 9") as err:
        g.add_node(ops.FusedTransformerLayer(4, 16, 64, 1e-5, 1e-5, ActivationKind.GELU, False), [0] * 9)
    with pytest.raises(ArityError, match="at least 1"):
        g.concat([], 0)


def test_error_unknown_node_id(g: Graph) -> None:
    with pytest.raises(UnknownNodeError, match="rhs refers to unknown node id 42") as err:
        g.add(0, 42)
    _assert_names(err.value, 3, "Binary", "rhs")
    with pytest.raises(UnknownNodeError, match="unknown node id 3") as err:
        g.attention(1, 1, 1, 3, 4, 16)  # a node may not consume itself
    _assert_names(err.value, 3, "Attention", "mask")
    with pytest.raises(UnknownNodeError) as err:
        g.where_(True, 0, 0)
    _assert_names(err.value, 3, "Where", "cond")
    with pytest.raises(UnknownNodeError, match="output 1 refers to unknown node id 7") as err:
        g.set_outputs([0, 7])
    assert err.value.operand == "outputs[1]"
    with pytest.raises(UnknownNodeError, match="-1"):
        g.shape_of(-1)
    assert g.outputs == ()


def test_error_bad_perm(g: Graph) -> None:
    with pytest.raises(AttributeValueError, match="not a permutation") as err:
        g.transpose(0, [0, 2, 2], name="t")
    _assert_names(err.value, 3, "Transpose", "x")


def test_error_bad_reshape(g: Graph) -> None:
    with pytest.raises(ShapeError, match="24 elements") as err:
        g.reshape(0, [5, 5])
    _assert_names(err.value, 3, "Reshape", "x")
    with pytest.raises(AttributeValueError, match="at most one -1") as err:
        g.reshape(0, [-1, -1])
    _assert_names(err.value, 3, "Reshape", "x")


def test_error_mask_shape(g: Graph) -> None:
    bad_mask = g.input("bad_mask", [1, 5])
    with pytest.raises(ShapeError, match="B\\*Sk") as err:
        g.attention(1, 1, 1, bad_mask, 4, 16)
    _assert_names(err.value, 4, "Attention", "mask")
    q4 = g.input("q4", [1, 4, 6, 16])
    bias = g.input("bias", [1, 4, 6, 5])
    with pytest.raises(ShapeError, match="does not broadcast") as err:
        g.attention_bias(q4, q4, q4, bias, 4, 16)
    _assert_names(err.value, 6, "Attention", "mask")


def test_error_declared_shape_mismatch_and_parse_errors(g: Graph) -> None:
    with pytest.raises(ShapeError, match="differs from the inferred F32\\[2, 3, 4\\]") as err:
        g.add_node(ops.Activation(ActivationKind.RELU), [0], S(2, 3, 5), name="r")
    _assert_names(err.value, 3, "Activation", None)
    for call, op in [
        (lambda: g.activation("swish2", 0), "Activation"),
        (lambda: g.binary("modulo", 0, 0), "Binary"),
        (lambda: g.compare("~", 0, 0), "Compare"),
        (lambda: g.reduce(0, "median", 0), "Reduce"),
        (lambda: g.attention_backward(1, 1, 1, 1, 4, 16, "causal", "grad"), "AttentionBackward"),
    ]:
        with pytest.raises(AttributeValueError, match="unknown") as perr:
            call()
        _assert_names(perr.value, 3, op, None)
    assert len(g) == 3  # failed calls add nothing
