"""`evaluate` / `evaluate_all`: feed validation, dynamic dims, dtypes at the boundary, names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
from refgraph import shape

from rlx_mil.errors import EvaluationError, ShapeError, UnsupportedOpError
from rlx_mil.ir import DType, Dynamic, Graph, QuantScheme
from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    DequantMatMul,
    Gather,
    Input,
    MatMul,
    Op,
    Param,
    Reshape,
)
from rlx_mil.reference import evaluate, evaluate_all, kernel_for


def _linear() -> Graph:
    g = Graph("linear")
    x = g.add_node(Input("x"), [], shape([2, 3]), name="x")
    w = g.add_node(Param("w"), [], shape([3, 4]), name="w")
    b = g.add_node(Param("b"), [], shape([4]), name="b")
    m = g.add_node(MatMul(), [x, w], shape([2, 4]))
    y = g.add_node(Binary(BinaryOp.ADD), [m, b], shape([2, 4]), name="y")
    g.set_outputs([y, m])
    return g


def test_evaluate_keys_outputs_by_name_in_order() -> None:
    g = _linear()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.ones((3, 4), np.float32)
    b = np.arange(4, dtype=np.float32)
    out = evaluate(g, {"x": x}, {"w": w, "b": b})
    assert list(out) == ["y", "mat_mul_3"]
    np.testing.assert_array_equal(out["mat_mul_3"], x @ w)
    np.testing.assert_array_equal(out["y"], x @ w + b)
    g.set_outputs([4, 4])
    assert list(evaluate(g, {"x": x}, {"w": w, "b": b})) == ["y", "y_1"]


def test_every_feed_problem_is_listed() -> None:
    g = _linear()
    with pytest.raises(EvaluationError) as info:
        evaluate(g, {"w": np.ones((3, 4), np.float32), "z": np.ones(1)}, {"b": np.ones((5,), np.float32)})
    problems = info.value.problems
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "unexpected input 'w'" in text and "it is a param, pass it in params=" in text
    assert "unexpected input 'z'" in text
    assert "input 'x' is missing" in text
    assert "param 'w' is missing" in text
    assert "param 'b': shape [5]" in text
    assert all(p in str(info.value) for p in problems)


def test_non_convertible_and_wrong_rank_feeds() -> None:
    g = _linear()
    with pytest.raises(EvaluationError) as info:
        evaluate(g, {"x": np.array([["a", "b", "c"]] * 2)}, {"w": np.ones((3, 4, 1), np.float32), "b": object()})
    text = "\n".join(info.value.problems)
    assert "input 'x' has dtype <U1" in text
    assert "param 'w': shape [3, 4, 1] has rank 3" in text
    assert "param 'b' has dtype object" in text
    with pytest.raises(EvaluationError, match="param 'w' is missing"):
        evaluate(g, {"x": np.ones((2, 3), np.float32)})


def _dynamic_add() -> Graph:
    g = Graph("dyn")
    x = g.add_node(Input("x"), [], shape([Dynamic(0), Dynamic(1), 4]), name="x")
    y = g.add_node(Input("y"), [], shape([Dynamic(0), Dynamic(1), 4]), name="y")
    s = g.add_node(Binary(BinaryOp.ADD), [x, y], shape([Dynamic(0), Dynamic(1), 4]), name="sum")
    r = g.add_node(Reshape((-1, 4)), [s], shape([Dynamic(2), 4]), name="rows")
    g.set_outputs([s, r])
    return g


def test_dynamic_dims_bind_consistently() -> None:
    g = _dynamic_add()
    x = np.ones((2, 3, 4), np.float32)
    out = evaluate(g, {"x": x, "y": 2 * x})
    assert out["sum"].shape == (2, 3, 4) and out["rows"].shape == (6, 4)
    assert evaluate(g, {"x": x[:1, :1], "y": x[:1, :1]})["rows"].shape == (1, 4)
    with pytest.raises(EvaluationError) as info:
        evaluate(g, {"x": x, "y": np.ones((2, 5, 4), np.float32)})
    assert info.value.problems == ["input 'y': dim 1 (?1) is 5, but ?1 is 3 from input 'x'"]


def test_declared_symbol_contradicting_the_result_is_a_shape_error() -> None:
    # Upstream inference names the -1 of [?1, 4] -> [-1] after ?1, which only holds when the
    # other dims are 1; with ?1 = 3 the result (12 values) contradicts the declaration.
    g = Graph("flat")
    x = g.add_node(Input("x"), [], shape([Dynamic(1), 4]), name="x")
    r = g.add_node(Reshape((-1,)), [x], shape([Dynamic(1)]), name="flat")
    g.set_outputs([r])
    with pytest.raises(ShapeError, match=r"result has shape \[12\].*\?1=3") as info:
        evaluate(g, {"x": np.ones((3, 4), np.float32)})
    assert info.value.node == 1


def test_runtime_shape_errors_name_the_node() -> None:
    g = Graph("reshape")
    x = g.add_node(Input("x"), [], shape([Dynamic(0), 4]), name="x")
    r = g.add_node(Reshape((2, 4)), [x], shape([2, 4]), name="fixed")
    g.set_outputs([r])
    assert evaluate(g, {"x": np.ones((2, 4), np.float32)})["fixed"].shape == (2, 4)
    with pytest.raises(ShapeError) as info:
        evaluate(g, {"x": np.ones((3, 4), np.float32)})
    assert info.value.node == 1 and info.value.op == "Reshape" and info.value.name == "fixed"


def test_boundary_dtypes() -> None:
    g = Graph("gather")
    table = g.add_node(Param("table"), [], shape([4, 2], DType.F16), name="table")
    ids = g.add_node(Input("ids"), [], shape([3], DType.I64), name="ids")
    flag = g.add_node(Input("flag"), [], shape([3], DType.BOOL), name="flag")
    small = g.add_node(Input("small"), [], shape([2], DType.I8), name="small")
    out = g.add_node(Gather(0), [table, ids], shape([3, 2], DType.F16), name="rows")
    g.set_outputs([out, flag, small])
    t = np.arange(8, dtype=np.float32).reshape(4, 2) + np.float32(1 / 3)
    got = evaluate(
        g, {"ids": np.array([3.0, 0.0, 1.0], np.float32), "flag": np.array([0.0, 2.0, 1.0], np.float32),
            "small": np.array([-128.0, 127.0], np.float32)}, {"table": t},
    )
    assert got["rows"].dtype == np.float16
    np.testing.assert_array_equal(got["rows"], t.astype(np.float16)[[3, 0, 1]])
    assert got["flag"].tolist() == [False, True, True]
    assert got["small"].dtype == np.int8 and got["small"].tolist() == [-128, 127]
    with pytest.raises(EvaluationError) as info:
        evaluate(
            g, {"ids": np.array([0.5, 0.0, 1.0], np.float32), "flag": np.zeros(3, np.float32),
                "small": np.array([0, 300], np.int64)}, {"table": t},
        )
    text = "\n".join(info.value.problems)
    assert "input 'ids' holds non-integer values" in text
    assert "input 'small' holds values outside the I8 range" in text


def test_scalar_feeds_and_outputs_do_not_alias_inputs() -> None:
    g = Graph("scalar")
    a = g.add_node(Input("a"), [], shape([1]), name="a")
    b = g.add_node(Input("b"), [], shape([]), name="b")
    n = g.add_node(Activation(ActivationKind.NEG), [a], shape([1]), name="neg")
    g.set_outputs([n, a, b])
    fed = np.array([2.0], np.float32)
    out = evaluate(g, {"a": fed, "b": np.array([5.0], np.float32)})
    assert out["neg"].tolist() == [-2.0] and out["b"].shape == ()
    out["a"][0] = 99.0
    assert fed[0] == 2.0


def test_evaluate_skips_dead_nodes_but_evaluate_all_runs_them() -> None:
    g = Graph("dead")
    t = g.add_node(Input("t"), [], shape([2, 2]), name="t")
    i = g.add_node(Input("i"), [], shape([1], DType.I64), name="i")
    dead = g.add_node(Gather(0), [t, i], shape([1, 2]), name="dead")
    live = g.add_node(Activation(ActivationKind.EXP), [t], shape([2, 2]), name="live")
    g.set_outputs([live])
    feeds = {"t": np.zeros((2, 2), np.float32), "i": np.array([7], np.int64)}
    assert evaluate(g, feeds)["live"].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    with pytest.raises(EvaluationError, match="node %2 'dead' \\(Gather\\)"):
        evaluate_all(g, feeds)
    feeds["i"] = np.array([1], np.int64)
    values = evaluate_all(g, feeds)
    assert sorted(values) == [t, i, dead, live]


def test_packed_int4_feed_validation() -> None:
    g = Graph("int4")
    x = g.add_node(Input("x"), [], shape([1, 2]), name="x")
    w = g.add_node(Param("w"), [], shape([2, 3], DType.I8), name="w")
    s = g.add_node(Param("s"), [], shape([1, 3]), name="s")
    z = g.add_node(Param("z"), [], shape([1, 3]), name="z")
    y = g.add_node(DequantMatMul(QuantScheme.int4_block(2)), [x, w, s, z], shape([1, 3]), name="y")
    g.set_outputs([y])
    params = {"w": np.array([0x21, 0x43, 0xF5], np.uint8), "s": np.ones((1, 3), np.float32), "z": np.zeros((1, 3), np.float32)}
    assert evaluate(g, {"x": np.array([[1.0, 10.0]], np.float32)}, params)["y"].tolist() == [[41.0, 52.0, 153.0]]
    params["w"] = np.array([300, 0, 1])
    with pytest.raises(EvaluationError, match="packed 4-bit bytes"):
        evaluate(g, {"x": np.array([[1.0, 10.0]], np.float32)}, params)


@dataclass(frozen=True)
class _Unknown(Op):
    type_name: ClassVar[str] = "Unknown"

    def arity(self) -> int | None:
        return 0


def test_unregistered_op_is_unsupported() -> None:
    with pytest.raises(UnsupportedOpError, match="Unknown"):
        kernel_for(_Unknown())


def test_evaluate_never_binds_or_returns_the_callers_arrays() -> None:
    """Results of the declared dtype are not copied node by node any more: the fed arrays are
    still copied once, so an output that is an input (or a param) is not the caller's array."""
    from rlx_mil.ir import Graph
    from rlx_mil.reference import evaluate

    g = Graph("alias")
    x = g.input("x", [2, 3])
    w = g.param("w", [2, 3])
    g.set_outputs([g.reshape(x, [2, 3], name="same_x"), g.add(x, w, name="sum")])
    xs, ws = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    out = evaluate(g, {"x": xs}, {"w": ws})
    first, second = out.values()
    assert not np.shares_memory(first, xs) and not np.shares_memory(second, ws)
    first += 5  # the caller may write into what it got back
    assert float(xs[0, 0]) == 1.0 and float(second[0, 0]) == 3.0
