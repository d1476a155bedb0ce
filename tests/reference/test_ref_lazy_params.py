"""`evaluate` with a lazy params mapping (one that tells shapes and dtypes without reading,
like `ModelParams` or a package's `PackageParams`): each float weight is read when a node uses
it and let go after, so a model's weights are never all held at once; the numbers are those of
a plain dict, and every problem is still raised before anything is read."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from refgraph import shape

from rlx_mil.errors import EvaluationError
from rlx_mil.ir import DType, Graph
from rlx_mil.ir.ops import Gather, Input, MatMul, Param, Transpose
from rlx_mil.reference import evaluate, evaluate_all

LAYERS, WIDTH, VOCAB = 6, 8, 11


class CountingParams(Mapping[str, np.ndarray]):
    """Arrays read on access (a new copy each time, in `dtype`), counting the reads and the
    copies still alive when each read happens."""

    def __init__(self, arrays: Mapping[str, np.ndarray], dtype: Any = np.float32, shapes: Mapping[str, Any] | None = None):
        self.arrays = dict(arrays)
        self.dtype = np.dtype(dtype)
        self.shapes = dict(shapes or {})
        self.reads: list[str] = []
        self.alive: list[weakref.ref[np.ndarray]] = []
        self.most_alive = 0

    def __getitem__(self, name: str) -> np.ndarray:
        self.reads.append(name)
        value = self.arrays[name].astype(self.dtype)
        self.alive = [r for r in self.alive if r() is not None]
        self.most_alive = max(self.most_alive, len(self.alive) + 1)
        self.alive.append(weakref.ref(value))
        return value

    def __contains__(self, name: object) -> bool:  # without reading (Mapping's would)
        return name in self.arrays

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(self.shapes.get(name, self.arrays[name].shape))

    def dtype_of(self, name: str) -> np.dtype[Any]:
        return self.dtype


def _tied_chain() -> Graph:
    """ids -> embedding gather -> LAYERS matmuls -> the embedding transposed as the head."""
    g = Graph("tied_chain")
    ids = g.add_node(Input("ids"), [], shape([3], DType.I32), name="ids")
    table = g.add_node(Param("embed"), [], shape([VOCAB, WIDTH]), name="embed")
    x = g.add_node(Gather(0), [table, ids], shape([3, WIDTH]))
    for i in range(LAYERS):
        w = g.add_node(Param(f"w{i}"), [], shape([WIDTH, WIDTH]), name=f"w{i}")
        x = g.add_node(MatMul(), [x, w], shape([3, WIDTH]))
    head = g.add_node(Transpose([1, 0]), [table], shape([WIDTH, VOCAB]))
    logits = g.add_node(MatMul(), [x, head], shape([3, VOCAB]), name="logits")
    g.set_outputs([logits])
    return g


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {f"w{i}": (rng.standard_normal((WIDTH, WIDTH)) / WIDTH**0.5).astype(np.float32) for i in range(LAYERS)}
    out["embed"] = rng.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    return out


def _numpy_forward(weights: Mapping[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    x = weights["embed"][ids].astype(np.float64)
    for i in range(LAYERS):
        x = x @ weights[f"w{i}"]
    return x @ weights["embed"].T.astype(np.float64)


def test_lazy_params_give_a_plain_dicts_numbers_holding_one_weight_at_a_time() -> None:
    g, weights, ids = _tied_chain(), _weights(), np.array([1, 7, 3], np.int32)
    lazy = CountingParams(weights)
    got = evaluate(g, {"ids": ids}, lazy)["logits"]
    np.testing.assert_array_equal(got, evaluate(g, {"ids": ids}, weights)["logits"])
    np.testing.assert_allclose(got, _numpy_forward(weights, ids), rtol=1e-5, atol=1e-5)
    # Every weight read where it is used (the tied table twice), never two held at once.
    assert lazy.reads == ["embed", *(f"w{i}" for i in range(LAYERS)), "embed"]
    assert lazy.most_alive == 1


def test_evaluate_all_and_non_float_params_still_read_everything_up_front() -> None:
    g, weights, ids = _tied_chain(), _weights(), np.array([0, 1, 2], np.int32)
    lazy = CountingParams(weights)
    values = evaluate_all(g, {"ids": ids}, lazy)
    assert sorted(lazy.reads) == sorted(weights)  # read once each, before the run
    assert len(values) == len(list(g))
    np.testing.assert_allclose(values[g.outputs[0]], _numpy_forward(weights, ids), rtol=1e-5, atol=1e-5)


def test_lazy_params_problems_are_raised_before_any_read() -> None:
    g, weights = _tied_chain(), _weights()
    wrong = CountingParams(weights, shapes={"w2": (WIDTH, WIDTH + 1), "w4": (2,)})
    with pytest.raises(EvaluationError) as info:
        evaluate(g, {"ids": np.array([0, 1, 2], np.int32)}, wrong)
    text = "\n".join(info.value.problems)
    assert "param 'w2'" in text and "param 'w4'" in text and len(info.value.problems) == 2
    assert wrong.reads == []
    ints = CountingParams(weights, dtype=np.int32)  # integer values where float is declared
    with pytest.raises(EvaluationError, match=r"param .w3. has dtype int32 where F32 \(float\) is declared"):
        evaluate(g, {"ids": np.array([0, 1, 2], np.int32)}, ints)
    assert ints.reads == []


def test_a_lazy_mapping_whose_values_differ_from_its_shapes_is_an_error() -> None:
    g, weights = _tied_chain(), _weights()
    lying = CountingParams(weights)
    lying.arrays["w3"] = np.ones((WIDTH, 2), np.float32)  # shape_of says the stored value's shape...
    lying.shapes["w3"] = (WIDTH, WIDTH)  # ...but it declares the graph's
    with pytest.raises(EvaluationError) as info:
        evaluate(g, {"ids": np.array([0, 1, 2], np.int32)}, lying)
    assert "param 'w3' has shape [8, 2], not the [8, 8] its params declared" in info.value.problems


def test_a_lazy_param_that_is_an_output_is_returned() -> None:
    g = Graph("param_out")
    w = g.add_node(Param("w"), [], shape([2, 2]), name="w")
    x = g.add_node(Input("x"), [], shape([2, 2]), name="x")
    y = g.add_node(MatMul(), [x, w], shape([2, 2]), name="y")
    g.set_outputs([y, w])
    weights = {"w": np.array([[1, 2], [3, 4]], np.float32)}
    out = evaluate(g, {"x": np.eye(2, dtype=np.float32)}, CountingParams(weights))
    np.testing.assert_array_equal(out["w"], weights["w"])
    np.testing.assert_array_equal(out["y"], weights["w"])
