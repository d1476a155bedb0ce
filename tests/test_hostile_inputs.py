"""Bad input to the public API gets a typed rlx_mil error naming what is at fault, raised
before coremltools (or NumPy, deep in a kernel) sees it, and leaves no package behind."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
import rlx_mil.milexec as milexec
import rlx_mil.reference as reference
from rlx_mil.cli import main
from rlx_mil.errors import (
    AttributeValueError,
    DTypeError,
    EvaluationError,
    GraphError,
    InvalidOptionError,
    MilExecError,
    ParamError,
    ShapeError,
)
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Attention,
    Binary,
    BinaryOp,
    CmpOp,
    Expand,
    FusedSwiGLU,
    Input,
    LoraMatMul,
    MaskKind,
    Pool,
    QuantScheme,
    Reduce,
    ReduceOp,
    Transpose,
)
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS, Dynamic, Shape, Static
from rlx_mil.reference import registry as reference_registry


@pytest.fixture
def converted() -> Iterator[Callable[..., Any]]:
    """`rlx_mil.convert`, removing each model's temporary package at the end of the test."""
    models: list[Any] = []

    def convert(graph: Graph, params: dict[str, np.ndarray] | None = None, **kwargs: Any) -> Any:
        model = rlx_mil.convert(graph, params or {}, precision="fp32", **kwargs)
        models.append(model)
        return model

    yield convert
    for model in models:
        shutil.rmtree(model.package_path, ignore_errors=True)


def _matmul_graph() -> Graph:
    g = Graph("hostile")
    x = g.input("x", [2, 4])
    w = g.param("w", [4, 3])
    g.set_outputs([g.matmul(x, w, name="y")])
    return g


X = {"x": np.ones((2, 4), np.float32)}
W = {"w": np.ones((4, 3), np.float32)}


# ------------------------------------------------------------------------- arguments of the API


@pytest.mark.parametrize("entry", [rlx_mil.convert, rlx_mil.lower])
def test_params_that_are_not_a_mapping(entry: Callable[..., Any]) -> None:
    with pytest.raises(ParamError, match="params must map Param names to arrays, got list"):
        entry(_matmul_graph(), [("w", W["w"])])


@pytest.mark.parametrize(
    "value, kind",
    [(None, "NoneType value of dtype object"), ("abc", "str value of dtype <U3"),
     (np.array([[object()] * 3] * 4), "ndarray value of dtype object")],
    ids=["none", "string", "object-array"],
)
def test_non_numeric_param_values_name_the_param(value: object, kind: str) -> None:
    with pytest.raises(ParamError) as err:
        rlx_mil.lower(_matmul_graph(), {"w": value})
    assert err.value.problems == [f"param 'w': {kind} is not a numeric array"]


def test_params_keyed_by_mixed_types_are_listed_not_sorted_into_a_type_error() -> None:
    with pytest.raises(ParamError) as err:
        rlx_mil.lower(_matmul_graph(), {**W, 1: W["w"], "z": W["w"]})  # type: ignore[dict-item]
    assert err.value.problems == [
        "param 'z': not a Param of graph 'hostile'", "param 1: not a Param of graph 'hostile'",
    ]


@pytest.mark.parametrize("graph", [None, "graph.json", 5])
def test_a_graph_argument_that_is_not_a_graph(graph: object) -> None:
    name = type(graph).__name__
    for entry in (rlx_mil.convert, rlx_mil.lower):
        with pytest.raises(GraphError, match=f"expected an rlx_mil Graph, got {name}"):
            entry(graph, {})  # type: ignore[arg-type]
    with pytest.raises(GraphError, match=f"expected an rlx_mil Graph, got {name}"):
        reference.evaluate(graph, {})  # type: ignore[arg-type]
    if isinstance(graph, str):
        with pytest.raises(GraphError, match=r"Graph\.from_json_file"):
            rlx_mil.convert(graph)  # type: ignore[arg-type]


def test_evaluate_feed_containers() -> None:
    g = _matmul_graph()
    with pytest.raises(EvaluationError, match="params must map names to arrays, got list"):
        reference.evaluate(g, X, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(EvaluationError, match="inputs must map names to arrays, got tuple"):
        reference.evaluate(g, (1,), W)  # type: ignore[arg-type]
    with pytest.raises(EvaluationError) as err:
        reference.evaluate(g, None, W)  # type: ignore[arg-type]
    assert err.value.problems == ["input 'x' is missing (declared F32[2, 4])"]


def test_milexec_inputs_that_are_not_a_mapping(converted: Callable[..., Any]) -> None:
    model = converted(_matmul_graph(), W)
    for inputs in (None, [X["x"]]):
        with pytest.raises(MilExecError, match=f"inputs must map input names to arrays, got {type(inputs).__name__}"):
            milexec.run(model, inputs)  # type: ignore[call-overload]


def test_integer_targets_outside_the_range_are_option_errors() -> None:
    for target in (14, 19):
        with pytest.raises(InvalidOptionError, match=f"unknown target {target}; choose one of iOS15"):
            rlx_mil.lower(_matmul_graph(), W, target=target)  # type: ignore[arg-type]


def test_save_rejects_what_is_not_a_model_or_a_path(tmp_path: Path, converted: Callable[..., Any]) -> None:
    for model in (None, "model.mlpackage"):
        with pytest.raises(InvalidOptionError, match=f"takes the MLModel .* got {type(model).__name__}"):
            rlx_mil.save(model, tmp_path / "m.mlpackage")
    with pytest.raises(InvalidOptionError, match=r"path must be a str or os\.PathLike"):
        rlx_mil.save(converted(_matmul_graph(), W), None)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- names at the boundary


def test_ir_names_equal_to_another_inputs_interface_name(converted: Callable[..., Any]) -> None:
    # "a.b" becomes the interface name "a_b", so the input named "a_b" becomes "a_b_1".
    g = Graph("collide")
    a, b = g.input("a.b", [2]), g.input("a_b", [2])
    g.set_outputs([g.sub(a, b, name="d")])
    model = converted(g)
    feeds = {"a.b": np.array([5.0, 7.0], np.float32), "a_b": np.array([1.0, 2.0], np.float32)}
    want = reference.evaluate(g, feeds)["d"]
    np.testing.assert_array_equal(want, [4.0, 5.0])
    np.testing.assert_array_equal(milexec.run(model, feeds)["d"], want)
    by_interface_name = {"a_b": feeds["a.b"], "a_b_1": feeds["a_b"]}
    np.testing.assert_array_equal(milexec.run(model, by_interface_name)["d"], want)


def test_same_named_inputs_are_one_feed(converted: Callable[..., Any]) -> None:
    g = Graph("twice")
    first, second = g.input("x", [3]), g.input("x", [3])
    g.set_outputs([g.mul(first, second, name="sq")])
    feeds = {"x": np.array([1.0, -2.0, 3.0], np.float32)}
    want = reference.evaluate(g, feeds)["sq"]
    np.testing.assert_array_equal(want, [1.0, 4.0, 9.0])
    np.testing.assert_array_equal(milexec.run(converted(g), feeds)["sq"], want)


def test_same_named_inputs_or_params_with_different_shapes() -> None:
    g = Graph("clash")
    g.set_outputs([g.input("x", [2]), g.input("x", [3])])
    with pytest.raises(ShapeError, match=r"input 'x' is declared twice with different shapes \(node %0 F32\[2\], node %1 F32\[3\]\)") as err:
        rlx_mil.lower(g)
    assert err.value.node == 1 and err.value.op == "Input"
    g = Graph("clash")
    g.set_outputs([g.param("w", [2]), g.param("w", [3])])
    with pytest.raises(ParamError) as perr:
        rlx_mil.lower(g, {"w": np.ones(2, np.float32)})
    assert "param 'w': declared twice with different shapes (node %0 F32[2], node %1 F32[3])" in perr.value.problems


# ------------------------------------------------------------------------- sizes


def _expanded(sizes: tuple[int, ...]) -> Graph:
    g = Graph("huge")
    one = g.constant(np.zeros((1, 1), np.float32))
    g.set_outputs([g.add_node(Expand(sizes), [one], name="big")])
    return g


@pytest.mark.parametrize("sizes", [(2**20, 2**20), (2**31,), (2**62, 4)])
def test_huge_static_shapes_fail_fast(sizes: tuple[int, ...]) -> None:
    g = Graph("huge")
    g.set_outputs([g.relu(g.input("x", list(sizes)), name="y")])
    start = time.perf_counter()
    with pytest.raises(ShapeError, match=rf"holds {np.prod(sizes, dtype=object)} elements, more than the {MAX_TENSOR_ELEMENTS}") as err:
        rlx_mil.convert(g)
    assert (err.value.node, err.value.op, err.value.name) == (0, "Input", "x")
    assert time.perf_counter() - start < 5


def test_huge_results_of_small_inputs_fail_before_allocating() -> None:
    # coremltools would constant-fold this Expand (allocating 2**60 elements) and NumPy would
    # try to materialise it; both must be refused from the declared shape.
    g = _expanded((2**30, 2**30))
    start = time.perf_counter()
    with pytest.raises(ShapeError) as conv:
        rlx_mil.convert(g)
    with pytest.raises(ShapeError) as ref:
        reference.evaluate(g, {})
    for err in (conv.value, ref.value):
        assert (err.node, err.op, err.name) == (1, "Expand", "big")
        assert str(2**60) in str(err)
    assert time.perf_counter() - start < 5


def test_dynamic_dims_bound_to_huge_sizes() -> None:
    g = Graph("dyn")
    g.set_outputs([g.relu(g.input("x", [Dynamic(1), 4]), name="y")])
    with pytest.raises(ShapeError, match=r"'x' \(Input\): declared shape F32\[1099511627776, 4\]"):
        rlx_mil.convert(g, dims={1: 2**40})


def test_dims_for_symbols_the_graph_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = Graph("dyn")
    g.set_outputs([g.relu(g.input("x", [Dynamic(1), 4]), name="y")])
    with pytest.raises(ShapeError, match=r"graph 'dyn' has no dynamic symbol 7 \(its dynamic symbols: \[1\]\)"):
        rlx_mil.convert(g, dims={1: 3, 7: 2})
    with pytest.raises(ShapeError, match="sizes must map dynamic symbols to sizes, got \\[3\\]"):
        rlx_mil.convert(g, dims=[3])  # type: ignore[arg-type]
    _matmul_graph().to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", **W)  # type: ignore[arg-type]
    out = tmp_path / "m.mlpackage"
    code = main(["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "-o", str(out), "--dim", "7=1"])
    assert code == 1
    assert "graph 'hostile' has no dynamic symbol 7 (its dynamic symbols: none)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "w.npz"]


def test_empty_results_evaluate_without_running_the_kernel() -> None:
    g = Graph("empty")
    g.set_outputs([g.softmax(g.input("x", [2, 0]), -1, name="p")])
    got = reference.evaluate(g, {"x": np.zeros((2, 0), np.float32)})["p"]
    assert got.shape == (2, 0) and got.dtype == np.float32


def test_a_reference_kernel_failure_names_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(op: ops.Op, args: list[np.ndarray], out: Shape) -> np.ndarray:
        raise KeyError("internal")

    monkeypatch.setitem(reference_registry._KERNELS, ops.MatMul, broken)
    with pytest.raises(EvaluationError, match=r"node %2 'y' \(MatMul\): the reference kernel failed: KeyError"):
        reference.evaluate(_matmul_graph(), X, W)


# ------------------------------------------------------------------------- graphs built by hand


@pytest.mark.parametrize(
    "shape, error, message",
    [
        (Shape((Static(-5),), DType.F32), ShapeError, r"declared dim 0 must be Static\(size >= 0\) or Dynamic\(symbol >= 0\), got Static\(size=-5\)"),
        (Shape((Static(2.5),), DType.F32), ShapeError, r"got Static\(size=2.5\)"),  # type: ignore[arg-type]
        (Shape((2,), DType.F32), ShapeError, "declared dim 0 must be .* got 2"),  # type: ignore[arg-type]
        (Shape((Dynamic(-1),), DType.F32), ShapeError, r"got Dynamic\(symbol=-1\)"),
        (Shape((Static(2),), "F32"), DTypeError, "the declared dtype must be a DType, got 'F32'"),  # type: ignore[arg-type]
        ([2], ShapeError, r"the declared shape must be a Shape, got \[2\]"),
    ],
    ids=["negative", "fractional", "plain-int", "negative-symbol", "dtype-text", "not-a-shape"],
)
def test_hand_built_declared_shapes(shape: Any, error: type[GraphError], message: str) -> None:
    g = Graph("by_hand")
    g.input("a", [1])
    with pytest.raises(error, match=message) as err:
        g.add_node(Input("x"), [], shape, name="x")
    assert (err.value.node, err.value.op, err.value.name) == (1, "Input", "x")
    assert len(g) == 1


@pytest.mark.parametrize(
    "op, operands, message",
    [
        (Activation("Relu"), 1, "attribute kind must be an ActivationKind, got 'Relu'"),  # type: ignore[arg-type]
        (Binary(CmpOp.EQ), 2, "attribute op must be a BinaryOp, got <CmpOp.EQ: 'Eq'>"),  # type: ignore[arg-type]
        (Reduce(ReduceOp.SUM, 1, False), 1, "attribute axes must be a sequence of integers, got 1"),  # type: ignore[arg-type]
        (Reduce(ReduceOp.SUM, (1,), "yes"), 1, "attribute keep_dim must be a bool, got 'yes'"),  # type: ignore[arg-type]
        (Transpose(None), 1, "attribute perm must be a sequence of integers, got None"),  # type: ignore[arg-type]
        (Attention(2, 2, "causal"), 3, "attribute mask_kind must be a MaskKind, got 'causal'"),  # type: ignore[arg-type]
        (LoraMatMul(None), 4, "attribute scale must be a number, got None"),  # type: ignore[arg-type]
        (FusedSwiGLU("f16"), 1, "attribute cast_to must be a DType or None, got 'f16'"),  # type: ignore[arg-type]
        (Pool(BinaryOp.MAX, (2,), (2,), (0,)), 1, "attribute kind must be a ReduceOp"),  # type: ignore[arg-type]
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None,
)
def test_mistyped_attributes_of_ops_built_directly(op: ops.Op, operands: int, message: str) -> None:
    g = Graph("direct")
    ids = [g.input(f"i{k}", [1, 2, 4]) for k in range(operands)]
    with pytest.raises(AttributeValueError, match=message) as err:
        g.add_node(op, ids, name="bad")
    assert (err.value.node, err.value.op, err.value.name) == (operands, op.type_name, "bad")


@pytest.mark.parametrize("op", [None, ops.MatMul, "MatMul"], ids=["none", "class", "text"])
def test_add_node_takes_op_instances_only(op: object) -> None:
    with pytest.raises(GraphError, match=r"expected an op from rlx_mil\.ir\.ops") as err:
        Graph("g").add_node(op, [])  # type: ignore[arg-type]
    assert err.value.node == 0


def test_names_must_be_strings() -> None:
    g = Graph("names")
    with pytest.raises(AttributeValueError, match="attribute name must be a string, got None") as err:
        g.add_node(Input(None), [], Shape.of([2]))  # type: ignore[arg-type]
    assert (err.value.node, err.value.op) == (0, "Input")
    with pytest.raises(AttributeValueError, match="a node name must be a string, got 5"):
        g.add_node(Input("x"), [], Shape.of([2]), name=5)  # type: ignore[arg-type]
    x = g.input("x", [2])
    with pytest.raises(AttributeValueError, match="a node name must be a string, got 5"):
        g.set_name(x, 5)  # type: ignore[arg-type]
    with pytest.raises(GraphError, match="a graph name must be a string, got 5"):
        Graph(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: MaskKind.sliding_window(-1), "SlidingWindow needs a window >= 0, got -1"),
        (lambda: MaskKind.parse("sliding:x"), "the sliding window must be an integer >= 0"),
        (lambda: MaskKind.parse(None), "a mask kind is a MaskKind or text"),  # type: ignore[arg-type]
        (lambda: QuantScheme.int8_block(0), "Int8Block needs block_size >= 1, got 0"),
        (lambda: ops.LayerNorm(1, "abc"), "eps must be a number, got 'abc'"),  # type: ignore[arg-type]
        (lambda: ops.Quantize(None, None, None), "scales must be a sequence, got None"),  # type: ignore[arg-type]
        (lambda: ops.Quantize(None, (1.0,), (0.5,)), r"zero_points must be integers, got \[0.5\]"),  # type: ignore[arg-type]
        (lambda: ops.Constant("abc"), "data must be bytes"),  # type: ignore[arg-type]
    ],
    ids=["window", "window-text", "mask-none", "block-size", "eps", "scales", "zero-points", "constant"],
)
def test_op_constructors_raise_typed_errors(build: Callable[[], object], message: str) -> None:
    with pytest.raises(AttributeValueError, match=message) as err:
        build()
    assert isinstance(err.value, ValueError)  # still caught by `except ValueError`


@pytest.mark.parametrize(
    "build, op, message",
    [
        (lambda g, x: g.reshape(x, None), "Reshape", "new_shape must be a sequence, got None"),
        (lambda g, x: g.transpose(x, None), "Transpose", "perm must be a sequence, got None"),
        (lambda g, x: g.expand(x, None), "Expand", "target_shape must be a sequence, got None"),
        (lambda g, x: g.sum(x, None), "Reduce", "axes must be a sequence, got None"),
        (lambda g, x: g.concat(None, 0), "Concat", "ids must be a sequence, got None"),
        (lambda g, x: g.quantize(x, "a", "b"), "Quantize", "scales must be numbers and zero_points integers"),
        (lambda g, x: g.activation(5, x), "Activation", "an activation is an ActivationKind or text"),
        (lambda g, x: g.attention_kind(x, x, x, 2, 2, "sliding:x"), "Attention", "sliding window must be an integer"),
        (lambda g, x: g.dequant_matmul(x, x, x, x, scheme=5), "DequantMatMul", "a scheme is a QuantScheme or text"),
    ],
    ids=["reshape", "transpose", "expand", "sum", "concat", "quantize", "activation", "mask", "scheme"],
)
def test_builder_arguments_of_the_wrong_kind(build: Callable[[Graph, int], int], op: str, message: str) -> None:
    g = Graph("builder")
    x = g.input("x", [2, 4])
    with pytest.raises(AttributeValueError, match=message) as err:
        build(g, x)
    assert (err.value.node, err.value.op) == (1, op)


def test_unary_activation_kinds_still_build() -> None:
    g = Graph("ok")
    x = g.input("x", [2])
    assert g.shape_of(g.add_node(Activation(ActivationKind.RELU), [x])) == Shape.of([2])
    assert g.shape_of(g.add_node(Reduce(ReduceOp.SUM, (0,), True), [x])) == Shape.of([1])


# ------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--heads", "0"], "heads must be an integer >= 1, got 0"),
        (["--layers", "-1"], "layers must be an integer >= 1, got -1"),
        (["--seq", "0"], "seq must be an integer >= 1, got 0"),
        (["--hidden", "24", "--heads", "8"], "head_dim = hidden / heads = 3 must be even for RoPE"),
    ],
    ids=["heads", "layers", "seq", "odd-head-dim"],
)
def test_demo_rejects_bad_sizes_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "demo.mlpackage"
    assert main(["demo", "-o", str(out), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlx-mil demo: error: ") and message in err
    assert list(tmp_path.iterdir()) == []


def test_failed_cli_conversion_leaves_no_package(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _matmul_graph().to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", w=np.ones((4, 3), np.int32))
    code = main(["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "-o", str(tmp_path / "m.mlpackage")])
    assert code == 1
    assert "param 'w': has dtype int32 where F32 (float) is declared" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "w.npz"]

