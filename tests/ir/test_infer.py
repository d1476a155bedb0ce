"""Shape/dtype inference: every rule against an independent NumPy formulation (the shape
NumPy produces on zero arrays), the spec's dynamic-dim rules, the strict validations, and the
upstream fixtures."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    AttentionCase,
    attention_cases,
    axis_subsets,
    broadcastable,
    dims,
    dtypes,
    factorizations,
    float_dtypes,
    permutations_of,
)

from rlx_mil.errors import ArityError, AttributeValueError, DTypeError, GraphError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.infer import broadcast_pair, has_rule, infer_shape, input_roles
from rlx_mil.ir.ops import (
    OP_TYPES,
    ActivationKind,
    AttentionBwdWrt,
    BinaryOp,
    CmpOp,
    MaskKind,
    QuantKind,
    QuantScheme,
    ReduceOp,
)
from rlx_mil.ir.shape import BATCH, ROWS, SEQ, Dynamic, Shape, Static

F32, I8, I64 = DType.F32, DType.I8, DType.I64


def S(*dims: int | Dynamic, dtype: DType = F32) -> Shape:
    return Shape.of(dims, dtype)


def out_dims(op: ops.Op, *inputs: Shape, declared: Shape | None = None) -> tuple[int, ...]:
    shape = infer_shape(op, list(inputs), declared)
    assert shape is not None
    return shape.sizes()


def zeros(dims_: tuple[int, ...]) -> np.ndarray:
    return np.zeros(dims_, np.float32)


# ------------------------------------------------------------------------------ registry


def test_every_op_type_has_a_rule() -> None:
    missing = [name for name, cls in OP_TYPES.items() if not has_rule(cls)]
    assert missing == []


@pytest.mark.parametrize("leaf", [ops.Input("x"), ops.Param("w"), ops.Constant(b"")])
def test_leaves_need_a_declared_shape(leaf: ops.Op) -> None:
    with pytest.raises(ShapeError, match=f"{leaf.type_name} nodes need a declared shape"):
        infer_shape(leaf, [])
    assert infer_shape(leaf, [], S(0)) is None


def test_constant_payload_must_match_the_declared_dtype() -> None:
    assert infer_shape(ops.Constant(bytes(12)), [], S(3)) is None
    assert infer_shape(ops.Constant(bytes(6)), [], S(3, dtype=DType.F16)) is None
    with pytest.raises(AttributeValueError, match="8 bytes") as err:
        infer_shape(ops.Constant(bytes(8)), [], S(3))
    assert err.value.operand == "data"


# ------------------------------------------------------------------------------ element-wise


@given(broadcastable(2), dtypes(), dtypes())
def test_binary_and_compare_broadcast_like_numpy(pair: tuple[tuple[int, ...], ...], lhs_dt: DType, rhs_dt: DType) -> None:
    a, b = pair
    expected = np.broadcast_shapes(a, b)
    for op in BinaryOp:
        out = infer_shape(ops.Binary(op), [S(*a, dtype=lhs_dt), S(*b, dtype=rhs_dt)])
        assert out == Shape.of(expected, lhs_dt)
    out = infer_shape(ops.Compare(CmpOp.LE), [S(*a, dtype=lhs_dt), S(*b, dtype=rhs_dt)])
    assert out == Shape.of(expected, DType.BOOL)


@given(broadcastable(3), dtypes())
def test_where_broadcasts_all_three_operands(triple: tuple[tuple[int, ...], ...], value_dt: DType) -> None:
    cond, on_true, on_false = triple
    expected = np.where(zeros(cond) != 0, zeros(on_true), zeros(on_false)).shape
    out = infer_shape(ops.Where(), [S(*cond, dtype=DType.BOOL), S(*on_true, dtype=value_dt), S(*on_false)])
    assert out == Shape.of(expected, value_dt)


@given(dims(1, 3, 2, 4), st.integers(0, 2), st.integers(2, 5))
def test_incompatible_broadcast_names_the_right_operand(base: tuple[int, ...], pos: int, bump: int) -> None:
    pos = pos % len(base)
    other = list(base)
    other[pos] = base[pos] + bump - 1  # differs and is not 1 (base sides are >= 2)
    with pytest.raises(ValueError):
        np.broadcast_shapes(base, tuple(other))
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.Binary(BinaryOp.ADD), [S(*base), S(*other)])
    assert err.value.operand == "rhs"
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.Where(), [S(*other), S(*base), S(*base)])
    assert err.value.operand == "cond"


def test_broadcast_with_dynamic_dims_follows_spec_1_4() -> None:
    b, s = Dynamic(BATCH), Dynamic(SEQ)
    assert broadcast_pair((Static(1), s), (b, Static(1))) == (b, s)  # 1 vs d -> d
    assert broadcast_pair((s,), (s,)) == (s,)  # equal symbols
    assert broadcast_pair((b,), (Static(4),)) == (b,)  # other pairing -> left
    assert broadcast_pair((Static(4),), (b,)) == (Static(4),)
    assert broadcast_pair((b,), (s,)) == (b,)
    assert broadcast_pair((), (s, Static(3))) == (s, Static(3))


@pytest.mark.parametrize("kind", list(ActivationKind))
def test_activation_keeps_shape_and_dtype(kind: ActivationKind) -> None:
    assert infer_shape(ops.Activation(kind), [S(2, 3, dtype=DType.F16)]) == S(2, 3, dtype=DType.F16)


@given(dims(0, 3), dtypes(), dtypes())
def test_cast_changes_only_the_dtype(d: tuple[int, ...], src: DType, dst: DType) -> None:
    assert infer_shape(ops.Cast(dst), [Shape.of(d, src)]) == Shape.of(d, dst)


# ------------------------------------------------------------------------------ linear algebra


@given(broadcastable(2, 0, 3, 3), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), float_dtypes())
def test_matmul_matches_numpy(batches: tuple[tuple[int, ...], ...], m: int, k: int, n: int, dt: DType) -> None:
    a = (*batches[0], m, k)
    b = (*batches[1], k, n)
    out = infer_shape(ops.MatMul(), [S(*a, dtype=dt), S(*b)])
    assert out == Shape.of(np.matmul(zeros(a), zeros(b)).shape, dt)


@given(dims(0, 2), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_matmul_k_mismatch_is_a_shape_error(batch: tuple[int, ...], m: int, k: int, n: int) -> None:
    with pytest.raises(ShapeError, match="contraction") as err:
        infer_shape(ops.MatMul(), [S(*batch, m, k), S(k + 1, n)])
    assert err.value.operand == "rhs"


def test_matmul_rank_and_dynamic_rules() -> None:
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.MatMul(), [S(4), S(4, 2)])
    assert err.value.operand == "lhs"
    b, s = Dynamic(BATCH), Dynamic(SEQ)
    assert infer_shape(ops.MatMul(), [S(b, s, 8), S(8, 3)]) == S(b, s, 3)
    assert infer_shape(ops.MatMul(), [S(2, s), S(s, 3)]) == S(2, 3)  # same symbol K
    with pytest.raises(ShapeError):
        infer_shape(ops.MatMul(), [S(2, s), S(8, 3)])  # K: symbol vs static
    assert infer_shape(ops.MatMul(), [S(1, 2, 8), S(b, 8, 3)]) == S(b, 2, 3)


def test_lora_and_fused_matmul_bias_act() -> None:
    x, w, a, b = S(2, 5, 8), S(8, 6), S(8, 2), S(2, 6)
    assert infer_shape(ops.LoraMatMul(0.5), [x, w, a, b]) == S(2, 5, 6)
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.LoraMatMul(0.5), [x, w, S(7, 2), b])
    assert err.value.operand == "a"
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.LoraMatMul(0.5), [x, w, a, S(3, 6)])
    assert err.value.operand == "b"
    fmba = ops.FusedMatMulBiasAct(ActivationKind.SILU)
    assert infer_shape(fmba, [x, w, S(6)]) == S(2, 5, 6)
    assert infer_shape(fmba, [x, w, S(1, 6)]) == S(2, 5, 6)
    with pytest.raises(ShapeError) as err:
        infer_shape(fmba, [x, w, S(5)])
    assert err.value.operand == "bias"


@given(dims(1, 3), st.data())
def test_quantize_and_dequantize(d: tuple[int, ...], data: st.DataObject) -> None:
    axis = data.draw(st.integers(0, len(d) - 1))
    n = d[axis]
    q = ops.Quantize(axis, [0.5] * n, [1] * n)
    assert infer_shape(q, [Shape.of(d, F32)]) == Shape.of(d, I8)
    dq = ops.Dequantize(axis, [0.5] * n, [1] * n)
    assert infer_shape(dq, [Shape.of(d, I8)]) == Shape.of(d, F32)
    assert infer_shape(ops.Quantize(None, [0.1], [0]), [Shape.of(d, DType.F16)]) == Shape.of(d, I8)
    with pytest.raises(AttributeValueError, match="channels"):
        infer_shape(ops.Quantize(axis, [0.5] * (n + 1), [1] * (n + 1)), [Shape.of(d, F32)])


def test_quantize_validation() -> None:
    with pytest.raises(DTypeError) as err:
        infer_shape(ops.Quantize(None, [0.1], [0]), [S(2, dtype=I8)])
    assert err.value.operand == "x"
    with pytest.raises(DTypeError) as err:
        infer_shape(ops.Dequantize(None, [0.1], [0]), [S(2)])
    assert err.value.operand == "q"
    with pytest.raises(AttributeValueError, match="one scale"):
        infer_shape(ops.Quantize(None, [0.1, 0.2], [0, 0]), [S(2)])
    with pytest.raises(AttributeValueError, match="zero points"):
        infer_shape(ops.Quantize(0, [0.1, 0.2], [0]), [S(2)])
    with pytest.raises(AttributeValueError, match="non-zero"):
        infer_shape(ops.Quantize(None, [0.0], [0]), [S(2)])
    with pytest.raises(AttributeValueError, match="out of range"):
        infer_shape(ops.Quantize(2, [0.1], [0]), [S(2, 1)])


@pytest.mark.parametrize("kind", [QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK])
@pytest.mark.parametrize(("k", "block"), [(8, 4), (10, 4), (6, 32)])
def test_block_dequant_matmul(kind: QuantKind, k: int, block: int) -> None:
    groups = math.ceil(k / block)
    op = ops.DequantMatMul(QuantScheme(kind, block))
    x, w = S(3, k), S(k, 5, dtype=I8)
    assert infer_shape(op, [x, w, S(groups, 5), S(groups, 5)]) == S(3, 5)
    assert infer_shape(op, [S(2, 3, k), w, S(groups, 5), S(groups, 5)]) == S(2, 3, 5)
    assert infer_shape(op, [S(2, 3, k), w, S(groups, 5), S(groups, 5)], S(6, 5)) == S(6, 5)  # flattened rows
    with pytest.raises(ShapeError) as err:
        infer_shape(op, [x, w, S(groups + 1, 5), S(groups, 5)])
    assert err.value.operand == "scale"
    with pytest.raises(ShapeError) as err:
        infer_shape(op, [S(3, k + 1), w, S(groups, 5), S(groups, 5)])
    assert err.value.operand == "w_q"


def test_dequant_matmul_zero_point_rules_and_packed_int4() -> None:
    bad_zp = S(1, 1)
    assert infer_shape(ops.DequantMatMul(QuantScheme.int8_block(4)), [S(2, 8), S(8, 6, dtype=I8), S(2, 6), bad_zp]) == S(2, 6)
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.DequantMatMul(QuantScheme.int8_block_asym(4)), [S(2, 8), S(8, 6, dtype=I8), S(2, 6), bad_zp])
    assert err.value.operand == "zp"
    int4 = ops.DequantMatMul(QuantScheme.int4_block(4))
    packed = S(24, dtype=DType.U8)  # ceil(8*6/2)
    assert infer_shape(int4, [S(2, 8), packed, S(2, 6), bad_zp], S(2, 6)) == S(2, 6)
    with pytest.raises(ShapeError, match="ceil"):
        infer_shape(int4, [S(2, 8), S(23, dtype=DType.U8), S(2, 6), bad_zp], S(2, 6))
    with pytest.raises(ShapeError, match="explicitly"):
        infer_shape(int4, [S(2, 8), packed, S(2, 6), bad_zp])


def test_gguf_dequant_matmul_takes_n_from_the_declaration() -> None:
    op = ops.DequantMatMul(QuantScheme(QuantKind.GGUF_Q8_0))
    packed = S(3 * 2 * 34, dtype=DType.U8)  # N=3 rows of K=64 (2 blocks of 34 bytes)
    assert infer_shape(op, [S(2, 5, 64), packed], S(2, 5, 3)) == S(2, 5, 3)
    assert infer_shape(op, [S(2, 5, 64), packed], S(10, 3)) == S(10, 3)
    with pytest.raises(ShapeError, match="explicitly"):
        infer_shape(op, [S(2, 5, 64), packed])
    with pytest.raises(ShapeError) as err:
        infer_shape(op, [S(2, 5, 64), packed], S(2, 5, 4))
    assert err.value.operand == "packed_w"
    with pytest.raises(ShapeError) as err:
        infer_shape(op, [S(2, 5, 60), packed], S(2, 5, 3))
    assert err.value.operand == "x"
    q4k = ops.DequantMatMul(QuantScheme(QuantKind.GGUF_Q4K))
    assert infer_shape(q4k, [S(1, 512), S(7 * 2 * 144, dtype=DType.U8)], S(1, 7)) == S(1, 7)


# ------------------------------------------------------------------------------ normalization


@given(dims(1, 4), float_dtypes())
def test_layer_and_rms_norm_keep_x(d: tuple[int, ...], dt: DType) -> None:
    h = d[-1]
    x = Shape.of(d, dt)
    for op in (ops.LayerNorm(-1, 1e-5), ops.RmsNorm(len(d) - 1, 1e-5)):
        assert infer_shape(op, [x, S(h), S(h)]) == x


def test_norm_validation() -> None:
    x = S(2, 3, 4)
    with pytest.raises(AttributeValueError, match="last axis") as err:
        infer_shape(ops.LayerNorm(1, 1e-5), [x, S(4), S(4)])
    assert err.value.operand == "x"
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.LayerNorm(-1, 1e-5), [x, S(3), S(4)])
    assert err.value.operand == "gamma"
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.RmsNorm(-1, 1e-5), [x, S(4), S(1, 4)])
    assert err.value.operand == "beta"
    # A fusion pass may declare RmsNorm's output with the leading dims flattened.
    assert infer_shape(ops.RmsNorm(-1, 1e-5), [x, S(4), S(4)], S(6, 4)) == S(6, 4)
    assert infer_shape(ops.RmsNorm(-1, 1e-5), [x, S(4), S(4)], S(3, 8)) == x


def test_group_norm_and_fused_residual_norms() -> None:
    x = S(2, 6, 3, 3)
    assert infer_shape(ops.GroupNorm(3, 1e-5), [x, S(6), S(6)]) == x
    with pytest.raises(AttributeValueError, match="divisible") as err:
        infer_shape(ops.GroupNorm(4, 1e-5), [x, S(6), S(6)])
    assert err.value.operand == "x"
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.GroupNorm(3, 1e-5), [x, S(6), S(3)])
    assert err.value.operand == "beta"
    h = S(2, 5, 8)
    for cls in (ops.FusedResidualLN, ops.FusedResidualRmsNorm):
        assert infer_shape(cls(False, 1e-5), [h, h, S(8), S(8)]) == h
        assert infer_shape(cls(True, 1e-5), [h, h, S(8), S(8), S(8)]) == h
        with pytest.raises(ShapeError) as err:
            infer_shape(cls(True, 1e-5), [h, h, S(7), S(8), S(8)])
        assert err.value.operand == "bias"
        with pytest.raises(ShapeError) as err:
            infer_shape(cls(False, 1e-5), [h, S(2, 4, 8), S(8), S(8)])
        assert err.value.operand == "residual"


# ------------------------------------------------------------------------------ reductions


@given(dims(1, 4), st.data(), st.booleans(), dtypes())
def test_reduce_matches_numpy(d: tuple[int, ...], data: st.DataObject, keep: bool, dt: DType) -> None:
    axes = data.draw(axis_subsets(len(d)))
    op = ops.Reduce(data.draw(st.sampled_from(list(ReduceOp))), axes, keep)
    expected = np.sum(zeros(d), axis=axes, keepdims=keep).shape
    assert infer_shape(op, [Shape.of(d, dt)]) == Shape.of(expected, dt)


@pytest.mark.parametrize(
    ("axes", "message"), [((), "empty"), ((0, 0), "unique"), ((3,), "out of range"), ((-1,), "out of range")]
)
def test_reduce_rejects_bad_axes(axes: tuple[int, ...], message: str) -> None:
    with pytest.raises(AttributeValueError, match=message) as err:
        infer_shape(ops.Reduce(ReduceOp.SUM, axes, False), [S(2, 3, 4)])
    assert err.value.operand == "x"


@given(dims(1, 4), st.data())
def test_softmax_and_cumsum_axes(d: tuple[int, ...], data: st.DataObject) -> None:
    rank = len(d)
    good = data.draw(st.integers(-rank, rank - 1))
    assert infer_shape(ops.Softmax(good), [Shape.of(d)]) == Shape.of(d)
    assert infer_shape(ops.Cumsum(good, True), [Shape.of(d)]) == Shape.of(d)
    bad = data.draw(st.one_of(st.integers(rank, rank + 3), st.integers(-rank - 3, -rank - 1)))
    with pytest.raises(np.exceptions.AxisError):
        np.cumsum(zeros(d), axis=bad)
    for op in (ops.Softmax(bad), ops.Cumsum(bad, False)):
        with pytest.raises(AttributeValueError, match="out of range") as err:
            infer_shape(op, [Shape.of(d)])
        assert err.value.operand == "x"


@given(dims(1, 3), st.data())
def test_topk(d: tuple[int, ...], data: st.DataObject) -> None:
    k = data.draw(st.integers(1, d[-1]))
    expected = np.argsort(-zeros(d), axis=-1, kind="stable")[..., :k].shape
    assert infer_shape(ops.TopK(k), [Shape.of(d)]) == Shape.of(expected, F32)
    assert infer_shape(ops.TopK(k), [Shape.of(d)], Shape.of(expected, I64)) == Shape.of(expected, I64)
    with pytest.raises(AttributeValueError, match="exceeds"):
        infer_shape(ops.TopK(d[-1] + 1), [Shape.of(d)])


# ------------------------------------------------------------------------------ data movement


@given(dims(0, 4), st.data())
def test_reshape_matches_numpy(d: tuple[int, ...], data: st.DataObject) -> None:
    total = math.prod(d)
    target = list(data.draw(factorizations(total)))
    if data.draw(st.booleans()):
        target[data.draw(st.integers(0, len(target) - 1))] = -1
    expected = zeros(d).reshape(target).shape
    assert infer_shape(ops.Reshape(tuple(target)), [Shape.of(d)]) == Shape.of(expected)


@given(dims(1, 4, 2, 4))
def test_reshape_rejects_element_count_changes(d: tuple[int, ...]) -> None:
    total = math.prod(d)
    for target in ((total + 1,), (total + 1, -1), (-1, -1)):
        with pytest.raises(ValueError):
            zeros(d).reshape(target)
        with pytest.raises(GraphError) as err:
            infer_shape(ops.Reshape(target), [Shape.of(d)])
        assert err.value.operand == "x"


def test_reshape_with_dynamic_dims_uses_the_symbol() -> None:
    s = Dynamic(SEQ)
    assert infer_shape(ops.Reshape((-1, 4)), [S(s, 2, 2)]) == S(s, 4)
    assert infer_shape(ops.Reshape((-1, 4)), [S(Dynamic(BATCH), s, 4)]) == S(Dynamic(ROWS), 4)
    with pytest.raises(AttributeValueError):
        infer_shape(ops.Reshape((2, -2)), [S(4)])


@given(dims(0, 4), st.data())
def test_transpose_matches_numpy(d: tuple[int, ...], data: st.DataObject) -> None:
    perm = data.draw(permutations_of(len(d)))
    assert infer_shape(ops.Transpose(perm), [Shape.of(d)]) == Shape.of(np.transpose(zeros(d), perm).shape)


@pytest.mark.parametrize("perm", [(0, 0, 1), (0, 1), (0, 1, 3), (1, 2, 0, 3)])
def test_transpose_rejects_non_permutations(perm: tuple[int, ...]) -> None:
    with pytest.raises(AttributeValueError, match="permutation") as err:
        infer_shape(ops.Transpose(perm), [S(2, 3, 4)])
    assert err.value.operand == "x"


@given(dims(1, 4), st.data())
def test_narrow_matches_numpy(d: tuple[int, ...], data: st.DataObject) -> None:
    axis = data.draw(st.integers(0, len(d) - 1))
    start = data.draw(st.integers(0, d[axis]))
    length = data.draw(st.integers(0, d[axis] - start))
    index = (slice(None),) * axis + (slice(start, start + length),)
    expected = zeros(d)[index].shape
    assert infer_shape(ops.Narrow(axis, start, length), [Shape.of(d)]) == Shape.of(expected)
    with pytest.raises(AttributeValueError, match="exceeds"):
        infer_shape(ops.Narrow(axis, start, d[axis] - start + 1), [Shape.of(d)])


@given(dims(1, 3), st.data())
def test_concat_matches_numpy(d: tuple[int, ...], data: st.DataObject) -> None:
    axis = data.draw(st.integers(0, len(d) - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    parts = [tuple(s if i == axis else n for i, n in enumerate(d)) for s in sizes]
    expected = np.concatenate([zeros(p) for p in parts], axis=axis).shape
    assert infer_shape(ops.Concat(axis), [Shape.of(p) for p in parts]) == Shape.of(expected)


def test_concat_validation() -> None:
    with pytest.raises(ShapeError, match="dim 0") as err:
        infer_shape(ops.Concat(1), [S(2, 3), S(3, 3)])
    assert err.value.operand == "inputs[1]"
    with pytest.raises(ShapeError, match="rank") as err:
        infer_shape(ops.Concat(0), [S(2, 3), S(3)])
    assert err.value.operand == "inputs[1]"
    with pytest.raises(DTypeError) as err:
        infer_shape(ops.Concat(0), [S(2), S(2), S(2, dtype=DType.F16)])
    assert err.value.operand == "inputs[2]"
    with pytest.raises(AttributeValueError, match="out of range"):
        infer_shape(ops.Concat(2), [S(2, 3), S(2, 3)])
    with pytest.raises(ArityError):
        infer_shape(ops.Concat(0), [])


@given(broadcastable(2, 0, 4), st.data())
def test_expand_matches_numpy(pair: tuple[tuple[int, ...], ...], data: st.DataObject) -> None:
    source = pair[0]
    target = np.broadcast_shapes(*pair)
    expected = np.broadcast_to(zeros(source), target).shape
    spec = list(target)
    # -1 keeps the input's dim (left-padded); use it where the input has that dim already.
    offset = len(target) - len(source)
    for i in range(len(source)):
        if data.draw(st.booleans()):
            spec[offset + i] = -1 if source[i] == target[offset + i] else spec[offset + i]
    assert infer_shape(ops.Expand(tuple(spec)), [Shape.of(source)]) == Shape.of(expected)


def test_expand_rejects_growing_non_unit_dims() -> None:
    with pytest.raises(ShapeError, match="only size-1") as err:
        infer_shape(ops.Expand((2, 6)), [S(2, 3)])
    assert err.value.operand == "x"
    with pytest.raises(ShapeError, match="lower rank"):
        infer_shape(ops.Expand((3,)), [S(1, 3)])


@given(dims(1, 3), dims(0, 2), st.data(), st.sampled_from([I64, F32, DType.I32]))
def test_gather_matches_numpy_take(table: tuple[int, ...], idx: tuple[int, ...], data: st.DataObject, idx_dt: DType) -> None:
    axis = data.draw(st.integers(0, len(table) - 1))
    expected = np.take(zeros(table), np.zeros(idx, np.int64), axis=axis).shape
    out = infer_shape(ops.Gather(axis), [Shape.of(table, DType.F16), Shape.of(idx, idx_dt)])
    assert out == Shape.of(expected, DType.F16)
    with pytest.raises(AttributeValueError) as err:
        infer_shape(ops.Gather(len(table)), [Shape.of(table), Shape.of(idx, I64)])
    assert err.value.operand == "table"


# ------------------------------------------------------------------------------ rope


def rope_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int) -> np.ndarray:
    """The spec's section 8.7 reference, used here for the output shape only."""
    h = n_rot // 2
    if x.ndim == 4:
        seq = x.shape[2]
        xs = x
        c, s_ = cos[:seq, :h][None, None], sin[:seq, :h][None, None]
    else:
        seq = x.shape[-2]
        xs = x.reshape((*x.shape[:-1], -1, head_dim))
        c, s_ = cos[:seq, :h][:, None, :], sin[:seq, :h][:, None, :]
    out = xs.copy()
    x1, x2 = xs[..., :h], xs[..., h : 2 * h]
    out[..., :h] = x1 * c - x2 * s_
    out[..., h : 2 * h] = x2 * c + x1 * s_
    return out.reshape(x.shape)


@given(st.sampled_from([2, 3, 4]), st.integers(1, 3), st.integers(1, 4), st.sampled_from([2, 4]), st.data())
def test_rope_keeps_x_and_matches_the_reference(rank: int, heads: int, seq: int, half: int, data: st.DataObject) -> None:
    head_dim = 2 * half
    n_rot = 2 * data.draw(st.integers(0, half))
    x = {2: (seq, heads * head_dim), 3: (2, seq, heads * head_dim), 4: (2, heads, seq, head_dim)}[rank]
    rows = data.draw(st.sampled_from([1, seq, seq + 2]))
    table = (rows, half)
    op = ops.Rope(head_dim, n_rot)
    out = infer_shape(op, [Shape.of(x), Shape.of(table), Shape.of(table)])
    if rows == 1 and seq > 1:
        expected = x  # P == 1 broadcasts (the reference would need the row repeated)
    else:
        expected = rope_reference(zeros(x), zeros(table), zeros(table), head_dim, n_rot).shape
    assert out == Shape.of(expected)


@pytest.mark.parametrize(
    ("op", "x", "table", "error", "operand"),
    [
        (ops.Rope(8, 3), (1, 4, 16), (4, 4), AttributeValueError, None),  # odd n_rot
        (ops.Rope(8, 10), (1, 4, 16), (4, 4), AttributeValueError, None),  # n_rot > head_dim
        (ops.Rope(8, 8), (1, 4, 12), (4, 4), ShapeError, "x"),  # width % head_dim
        (ops.Rope(8, 8), (1, 2, 4, 16), (4, 4), ShapeError, "x"),  # rank-4 last dim
        (ops.Rope(8, 8), (1, 4, 16), (3, 4), ShapeError, "cos"),  # P < S
        (ops.Rope(8, 8), (1, 4, 16), (4, 8), ShapeError, "cos"),  # width != head_dim/2
    ],
)
def test_rope_validation(op: ops.Rope, x: tuple[int, ...], table: tuple[int, ...], error: type[GraphError], operand: str | None) -> None:
    with pytest.raises(error) as err:
        infer_shape(op, [Shape.of(x), Shape.of(table), Shape.of(table)])
    assert err.value.operand == operand


# ------------------------------------------------------------------------------ attention


def attention_reference_shape(case: AttentionCase, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[int, ...]:
    """Output shape of the spec's section 9.5 reference (layout split, GQA repeat, merge)."""
    d = case.head_dim

    def split(t: np.ndarray) -> np.ndarray:
        if case.layout == "bhsd":
            return t
        if case.layout == "bshd":
            return t.transpose(0, 2, 1, 3)
        if case.layout == "bsx":
            return t.reshape(t.shape[0], t.shape[1], -1, d).transpose(0, 2, 1, 3)
        return t.reshape(1, t.shape[0], -1, d).transpose(0, 2, 1, 3)

    qh, kh, vh = split(q), split(k), split(v)
    group = qh.shape[1] // kh.shape[1]
    kh, vh = np.repeat(kh, group, axis=1), np.repeat(vh, group, axis=1)
    scores = np.einsum("bhqd,bhkd->bhqk", qh, kh)
    o = scores @ vh
    if case.layout == "bhsd":
        return o.shape
    if case.layout == "bshd":
        return o.transpose(0, 2, 1, 3).shape
    return o.transpose(0, 2, 1, 3).reshape(q.shape).shape


@given(attention_cases(), float_dtypes())
def test_attention_output_is_q_for_every_layout(case: AttentionCase, dt: DType) -> None:
    q, k, v = Shape.of(case.q, dt), Shape.of(case.k), Shape.of(case.v)
    expected = attention_reference_shape(case, zeros(case.q), zeros(case.k), zeros(case.v))
    assert expected == case.q
    h, d = case.num_heads, case.head_dim
    for kind in (MaskKind.NONE, MaskKind.CAUSAL, MaskKind.sliding_window(2)):
        assert infer_shape(ops.Attention(h, d, kind), [q, k, v]) == Shape.of(expected, dt)
    mask = Shape.of((case.batch, case.kv_len))
    assert infer_shape(ops.Attention(h, d, MaskKind.CUSTOM, 0.2, 30.0), [q, k, v, mask]) == q
    bias = Shape.of((case.batch, h, case.q_len, case.kv_len))
    assert infer_shape(ops.Attention(h, d, MaskKind.BIAS), [q, k, v, bias]) == q
    assert infer_shape(ops.Attention(h, d, MaskKind.BIAS), [q, k, v, Shape.of((1, 1, case.kv_len))]) == q


@given(attention_cases())
def test_attention_mask_shapes_are_checked(case: AttentionCase) -> None:
    q, k, v = Shape.of(case.q), Shape.of(case.k), Shape.of(case.v)
    h, d = case.num_heads, case.head_dim
    reshaped = Shape.of((case.batch, 1, 1, case.kv_len))  # any layout with B*Sk elements
    assert infer_shape(ops.Attention(h, d, MaskKind.CUSTOM), [q, k, v, reshaped]) == q
    with pytest.raises(ShapeError, match="B\\*Sk") as err:
        infer_shape(ops.Attention(h, d, MaskKind.CUSTOM), [q, k, v, Shape.of((case.batch, case.kv_len + 1))])
    assert err.value.operand == "mask"
    with pytest.raises(ShapeError, match="broadcast") as err:
        bad_bias = Shape.of((case.batch, h, case.q_len, case.kv_len + 1))
        infer_shape(ops.Attention(h, d, MaskKind.BIAS), [q, k, v, bad_bias])
    assert err.value.operand == "mask"


def test_attention_geometry_errors_name_the_operand() -> None:
    q = S(2, 6, 64)
    with pytest.raises(AttributeValueError) as err:
        infer_shape(ops.Attention(3, 16, MaskKind.CAUSAL), [q, q, q])  # 64/16 = 4 heads, not 3
    assert err.value.operand == "q"
    with pytest.raises(AttributeValueError) as err:
        infer_shape(ops.Attention(4, 16, MaskKind.CAUSAL), [q, S(2, 6, 48), S(2, 6, 48)])  # 3 kv heads
    assert err.value.operand == "k"
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.Attention(4, 16, MaskKind.CAUSAL), [q, q, S(2, 5, 64)])
    assert err.value.operand == "v"
    with pytest.raises(ShapeError) as err:
        infer_shape(ops.Attention(4, 16, MaskKind.CAUSAL), [S(64), q, q])
    assert err.value.operand == "q"
    with pytest.raises(ArityError):
        infer_shape(ops.Attention(4, 16, MaskKind.CUSTOM), [q, q, q])


@given(attention_cases(), st.sampled_from(list(AttentionBwdWrt)))
def test_attention_backward_returns_the_wrt_operand(case: AttentionCase, wrt: AttentionBwdWrt) -> None:
    q, k, v = Shape.of(case.q), Shape.of(case.k, DType.F16), Shape.of(case.v, DType.BF16)
    op = ops.AttentionBackward(case.num_heads, case.head_dim, MaskKind.CAUSAL, wrt)
    expected = {AttentionBwdWrt.QUERY: q, AttentionBwdWrt.KEY: k, AttentionBwdWrt.VALUE: v}[wrt]
    assert infer_shape(op, [q, k, v, q]) == expected
    custom = ops.AttentionBackward(case.num_heads, case.head_dim, MaskKind.CUSTOM, wrt)
    assert infer_shape(custom, [q, k, v, q, Shape.of((case.batch, case.kv_len))]) == expected
    with pytest.raises(ShapeError) as err:
        infer_shape(op, [q, k, v, Shape.of((*case.q[:-1], case.q[-1] + 1))])
    assert err.value.operand == "dy"


# ------------------------------------------------------------------------------ fused blocks


@given(dims(0, 3), st.integers(1, 4), st.sampled_from([None, DType.F16]), st.booleans())
def test_fused_swiglu_halves_the_last_dim(lead: tuple[int, ...], n: int, cast_to: DType | None, gate_first: bool) -> None:
    x = (*lead, 2 * n)
    up, gate = zeros(x)[..., :n], zeros(x)[..., n:]
    expected = (up * gate).shape
    out = infer_shape(ops.FusedSwiGLU(cast_to, gate_first), [Shape.of(x)])
    assert out == Shape.of(expected, cast_to or F32)
    with pytest.raises(ShapeError, match="even"):
        infer_shape(ops.FusedSwiGLU(), [Shape.of((*lead, 2 * n + 1))])


def test_fused_attention_block() -> None:
    b, s, e, h, d = 2, 5, 24, 4, 8
    hidden, qkv_w, out_w, mask = S(b, s, e), S(e, 3 * h * d), S(h * d, e), S(b, s)
    plain = ops.FusedAttentionBlock(h, d, False, False)
    assert infer_shape(plain, [hidden, qkv_w, out_w, mask]) == hidden
    full = ops.FusedAttentionBlock(h, d, True, True)
    tables = [S(s + 1, d // 2), S(s + 1, d // 2)]
    assert infer_shape(full, [hidden, qkv_w, out_w, mask, S(3 * h * d), S(e), *tables]) == hidden
    cases: list[tuple[list[Shape], str]] = [
        ([hidden, S(e, 3 * h * d + 1), out_w, mask], "qkv_w"),
        ([hidden, qkv_w, S(h * d, e + 1), mask], "out_w"),
        ([hidden, qkv_w, out_w, S(b, s + 1)], "mask"),
        ([S(b * s, e), qkv_w, out_w, mask], "hidden"),
    ]
    for inputs, operand in cases:
        with pytest.raises(ShapeError) as err:
            infer_shape(plain, inputs)
        assert err.value.operand == operand
    with pytest.raises(ShapeError) as err:
        infer_shape(full, [hidden, qkv_w, out_w, mask, S(3 * h * d), S(e + 1), *tables])
    assert err.value.operand == "out_b"
    with pytest.raises(ShapeError) as err:
        infer_shape(full, [hidden, qkv_w, out_w, mask, S(3 * h * d), S(e), S(s - 1, d // 2), tables[1]])
    assert err.value.operand == "cos"


def test_fused_transformer_layer_forms() -> None:
    b, s, e, h, d, f = 2, 4, 16, 2, 8, 32
    hidden, mask = S(b, s, e), S(b, s)
    qkv_w, out_w, fc1_w, fc2_w, vec_e = S(e, 3 * h * d), S(h * d, e), S(e, f), S(f, e), S(e)
    with_bias = [hidden, qkv_w, S(3 * h * d), out_w, vec_e, vec_e, vec_e, fc1_w, S(f), fc2_w, vec_e, vec_e, vec_e, mask]
    ten = [hidden, qkv_w, out_w, vec_e, vec_e, fc1_w, fc2_w, vec_e, vec_e, mask]
    eight = [hidden, qkv_w, out_w, vec_e, fc1_w, fc2_w, vec_e, mask]
    biased = ops.FusedTransformerLayer(h, d, f, 1e-12, 1e-12, ActivationKind.GELU, True)
    unbiased = ops.FusedTransformerLayer(h, d, f, 1e-12, 1e-12, ActivationKind.GELU, False)
    assert infer_shape(biased, with_bias) == hidden
    assert infer_shape(unbiased, ten) == hidden
    assert infer_shape(unbiased, eight) == hidden
    with pytest.raises(ArityError):
        infer_shape(unbiased, with_bias)
    bad = list(with_bias)
    bad[8] = S(f + 1)
    with pytest.raises(ShapeError) as err:
        infer_shape(biased, bad)
    assert err.value.operand == "fc1_b"
    bad = list(eight)
    bad[4] = S(e, f + 1)  # intermediate_size disagrees with fc1_w
    with pytest.raises(ShapeError) as err:
        infer_shape(unbiased, bad)
    assert err.value.operand == "fc1_w"
    assert input_roles(unbiased, 8)[3] == "ln1_gamma"
    assert input_roles(unbiased, 10)[4] == "ln1_beta"


# ------------------------------------------------------------------------------ conv / pool


def windows_numpy(x: np.ndarray, spans: list[int], strides: list[int], padding: list[int]) -> tuple[int, ...]:
    """Spatial output sizes by counting strided sliding windows over a zero-padded array."""
    spatial_axes = tuple(range(2, x.ndim))
    padded = np.pad(x, [(0, 0), (0, 0), *[(p, p) for p in padding]])
    view = np.lib.stride_tricks.sliding_window_view(padded, spans, axis=spatial_axes)
    index = (slice(None), slice(None), *[slice(None, None, s) for s in strides])
    return view[index].shape[2 : x.ndim]


@given(
    st.integers(1, 2), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3), st.data()
)
def test_conv_matches_sliding_windows(batch: int, groups: int, spatial: int, per_group: int, data: st.DataObject) -> None:
    c_in, c_out = groups * per_group, groups * data.draw(st.integers(1, 2))
    kernel = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    stride = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    dilation = [data.draw(st.integers(1, 2)) for _ in range(spatial)]
    padding = [data.draw(st.integers(0, 2)) for _ in range(spatial)]
    sizes = [data.draw(st.integers(max(1, d * (k - 1) + 1 - 2 * p), 7)) for k, d, p in zip(kernel, dilation, padding, strict=True)]
    x = (batch, c_in, *sizes)
    w = (c_out, per_group, *kernel)
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]
    expected = (batch, c_out, *windows_numpy(zeros(x), spans, stride, padding))
    op = ops.Conv(tuple(kernel), tuple(stride), tuple(padding), tuple(dilation), groups)
    assert infer_shape(op, [Shape.of(x), Shape.of(w)]) == Shape.of(expected)


def test_conv_validation_and_defaults() -> None:
    x, w = S(1, 4, 5, 5), S(6, 2, 3, 3)
    assert infer_shape(ops.Conv((3, 3), (), (), (), 2), [x, w]) == S(1, 6, 3, 3)  # missing -> 1/0/1
    with pytest.raises(ShapeError, match="C_in") as err:
        infer_shape(ops.Conv((3, 3), (1, 1), (0, 0), (1, 1), 1), [x, w])
    assert err.value.operand == "w"
    with pytest.raises(ShapeError, match="kernel_size") as err:
        infer_shape(ops.Conv((2, 3), (1, 1), (0, 0), (1, 1), 2), [x, w])
    assert err.value.operand == "w"
    with pytest.raises(AttributeValueError, match="divisible"):
        infer_shape(ops.Conv((3, 3), (1, 1), (0, 0), (1, 1), 4), [S(1, 4, 5, 5), S(6, 1, 3, 3)])
    with pytest.raises(ShapeError, match="smaller than the window"):
        infer_shape(ops.Conv((3, 3), (1, 1), (0, 0), (3, 3), 2), [x, w])


@given(st.integers(1, 2), st.integers(1, 3), st.data())
def test_pool_matches_sliding_windows(spatial: int, channels: int, data: st.DataObject) -> None:
    kernel = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    stride = [data.draw(st.integers(1, 3)) for _ in range(spatial)]
    padding = [data.draw(st.integers(0, k // 2)) for k in kernel]
    sizes = [data.draw(st.integers(max(1, k - 2 * p), 7)) for k, p in zip(kernel, padding, strict=True)]
    x = (2, channels, *sizes)
    expected = (2, channels, *windows_numpy(zeros(x), kernel, stride, padding))
    kind = data.draw(st.sampled_from(list(ReduceOp)))
    assert infer_shape(ops.Pool(kind, tuple(kernel), tuple(stride), tuple(padding)), [Shape.of(x)]) == Shape.of(expected)


def test_pool_needs_one_entry_per_spatial_dim() -> None:
    with pytest.raises(AttributeValueError, match="one per spatial dim") as err:
        infer_shape(ops.Pool(ReduceOp.MAX, (2,), (2, 2), (0, 0)), [S(1, 3, 4, 4)])
    assert err.value.operand == "x"


# ------------------------------------------------------------------------------ upstream fixtures


def test_every_upstream_fixture_reinfers_to_its_declared_shapes(upstream_json_dir: Path) -> None:
    paths = sorted(upstream_json_dir.glob("*.json"))
    assert len(paths) >= 10
    checked: set[str] = set()
    for path in paths:
        graph = Graph.from_json_file(path)  # add_node already rejects any mismatch
        for node in graph:
            inputs = [graph.shape_of(i) for i in node.inputs]
            inferred = infer_shape(node.op, inputs, node.shape)
            if inferred is not None:
                assert inferred.same_elements_as(node.shape), (path.name, str(node))
                checked.add(node.op.type_name)
    assert {"Attention", "AttentionBackward", "DequantMatMul", "Rope", "RmsNorm", "Gather", "Expand"} <= checked


def test_ambiguous_attention_layout_warns() -> None:
    import warnings

    from rlx_mil.errors import AmbiguousLayoutWarning
    from rlx_mil.ir.graph import Graph

    g = Graph("ambiguous")
    q, k, v = (g.input(n, [1, 4, 4, 8]) for n in "qkv")
    with pytest.warns(AmbiguousLayoutWarning, match="dims 1 and 2 both equal num_heads=4"):
        g.attention_kind(q, k, v, 4, 8, "none")
    g2 = Graph("clear")
    q, k, v = (g2.input(n, [1, 4, 6, 8]) for n in "qkv")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AmbiguousLayoutWarning)
        g2.attention_kind(q, k, v, 4, 8, "none")
