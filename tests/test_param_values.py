"""Integer params are checked against their declared dtype by one rule, in `convert` and in
`reference.evaluate` alike (never wrapped); bfloat16 arrays are accepted as float params."""

from __future__ import annotations

import shutil

import ml_dtypes
import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import EvaluationError, ParamError
from rlx_mil.ir.graph import Graph


def _int_graph(dtype: str) -> Graph:
    g = Graph(f"int_param_{dtype}")
    x = g.input("x", [3], dtype)
    g.set_outputs([g.add(x, g.param("p", [3], dtype), name="y")])
    return g


WRAPPING_CASES = [
    ("i32", np.array([2**40, 0, 0], np.int64), "outside the I32 range"),
    ("i8", np.array([300, 0, 0], np.int64), "outside the I8 range"),
    ("u8", np.array([256, 0, 0], np.int64), "outside the U8 range"),
    ("u32", np.array([-1, 0, 0], np.int64), "outside the U32 range"),
    ("i32", np.array([np.inf, 0, 0], np.float32), "non-integer values"),
    ("i32", np.array([np.nan, 0, 0], np.float32), "non-integer values"),
    ("i16", np.array([0.5, 0, 0], np.float64), "non-integer values"),
]


@pytest.mark.parametrize("dtype, value, message", WRAPPING_CASES)
def test_out_of_range_integer_params_are_refused_by_both(dtype: str, value: np.ndarray, message: str) -> None:
    g = _int_graph(dtype)
    with pytest.raises(ParamError) as converting:
        rlx_mil.convert(g, {"p": value}, precision="fp32")
    with pytest.raises(EvaluationError) as evaluating:
        reference.evaluate(g, {"x": np.zeros(3, np.int32)}, {"p": value})
    (convert_problem,) = converting.value.problems
    (evaluate_problem,) = evaluating.value.problems
    assert message in convert_problem and message in evaluate_problem
    # One rule: the same words after the label each caller puts in front.
    assert convert_problem.split("'p': ", 1)[1] == evaluate_problem.split("'p' ", 1)[1]


def test_wide_integer_params_must_fit_core_ml_int32() -> None:
    g = _int_graph("u32")
    value = np.array([2**32 - 1, 0, 0], np.uint32)
    assert reference.evaluate(g, {"x": np.zeros(3, np.uint32)}, {"p": value})["y"][0] == 2**32 - 1
    with pytest.raises(ParamError, match="Core ML holds U32 tensors as int32"):
        rlx_mil.convert(g, {"p": value}, precision="fp32")


def test_in_range_integer_params_convert_and_agree(tmp_path: object) -> None:
    g = _int_graph("i8")
    p = np.array([-128, 5, 127], np.int8)
    x = np.array([0, 1, 0], np.int8)
    model = rlx_mil.convert(g, {"p": p.astype(np.float32)}, precision="fp32")  # integral floats are fine
    try:
        got = milexec.run(model, {"x": x})["y"]
    finally:
        shutil.rmtree(model.package_path, ignore_errors=True)
    np.testing.assert_array_equal(got, reference.evaluate(g, {"x": x}, {"p": p})["y"])


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_bfloat16_params_convert_and_evaluate(precision: str) -> None:
    g = Graph("bf16_param")
    x = g.input("x", [2, 4])
    g.set_outputs([g.matmul(x, g.param("w", [4, 3]), name="y")])
    w = (np.arange(12, dtype=np.float32).reshape(4, 3) / 8).astype(ml_dtypes.bfloat16)
    x_value = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    want = reference.evaluate(g, {"x": x_value}, {"w": w})["y"]
    np.testing.assert_allclose(want, x_value @ w.astype(np.float32), rtol=1e-6)
    model = rlx_mil.convert(g, {"w": w}, precision=precision)
    try:
        got = milexec.run(model, {"x": x_value})["y"]
    finally:
        shutil.rmtree(model.package_path, ignore_errors=True)
    np.testing.assert_allclose(got, want, rtol=2e-3 if precision == "fp16" else 1e-6, atol=2e-3)
