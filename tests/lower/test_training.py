"""Losses and training pieces: the reference against independent NumPy forms (finite
differences, explicit loops), and every ActivationBackward kind converted and run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import AttributeValueError, EvaluationError, ShapeError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind
from rlx_mil.reference.elementwise import activation
from rlx_mil.reference.training import activation_derivative
from rlx_mil.testing import Tolerance, compare

#: Points away from every kink (0, +-3) and inside every domain (Log/Sqrt/Rsqrt need x > 0).
POINTS = np.array([0.3, 0.7, 1.3, 2.2, 3.6, 0.05, 1.9], np.float64)
#: Kinds whose derivative is a convention, not the slope of the activation.
CONVENTIONS = {ActivationKind.ROUND: 1.0}


@pytest.mark.parametrize("kind", list(ActivationKind), ids=lambda k: k.value)
def test_derivative_is_the_slope_of_the_activation(kind: ActivationKind) -> None:
    for x in (POINTS, -POINTS):
        if kind in (ActivationKind.LOG, ActivationKind.SQRT, ActivationKind.RSQRT) and x[0] < 0:
            continue
        got = activation_derivative(kind, x)
        if kind in CONVENTIONS:
            np.testing.assert_array_equal(got, CONVENTIONS[kind])
            continue
        h = 1e-6
        slope = (activation(kind, x + h) - activation(kind, x - h)) / (2 * h)
        np.testing.assert_allclose(got, slope, rtol=1e-5, atol=1e-6, err_msg=kind.value)


def test_every_activation_backward_kind_converts_and_matches(tmp_path: object) -> None:
    g = Graph("activation_backward_all")
    x, dy = g.input("x", [2, 7]), g.input("dy", [2, 7])
    g.set_outputs([g.activation_backward(x, dy, kind, name=kind.value) for kind in ActivationKind])
    rng = np.random.default_rng(3)
    xs = np.stack([POINTS, POINTS * 1.7]).astype(np.float32)
    inputs = {"x": xs, "dy": rng.standard_normal((2, 7)).astype(np.float32)}
    want = reference.evaluate(g, inputs)
    got = milexec.run(rlx_mil.convert(g, {}, target="iOS18", precision="fp32"), inputs)
    problems = []
    for name, value in want.items():
        ok, _, detail = compare(got[name], value, Tolerance(1e-6, 1e-5))
        if not ok:
            problems.append(f"{name}: {detail}")
    assert not problems, problems


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 4), cols=st.integers(1, 5), n=st.integers(1, 6), axis=st.integers(0, 1),
    seed=st.integers(0, 2**16),
)
def test_gather_backward_adds_each_row_at_its_index(rows: int, cols: int, n: int, axis: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = (rows, cols)
    idx = rng.integers(0, table[axis], size=n)
    dy_shape = (n, cols) if axis == 0 else (rows, n)
    dy = rng.standard_normal(dy_shape).astype(np.float32)
    g = Graph("gb")
    y = g.gather_backward(g.input("dy", list(dy_shape)), g.constant(idx.astype(np.int32)), list(table), axis)
    g.set_outputs([y])
    want = np.zeros(table, np.float64)
    for j, i in enumerate(idx):
        if axis == 0:
            want[i, :] += dy[j, :]
        else:
            want[:, i] += dy[:, j]
    np.testing.assert_allclose(reference.evaluate(g, {"dy": dy})[g.node(y).name or "gather_backward_2"], want,
                               rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 7), exclusive=st.booleans(), seed=st.integers(0, 2**16))
def test_cumsum_backward_is_the_transposed_jacobian(n: int, exclusive: bool, seed: int) -> None:
    dy = np.random.default_rng(seed).standard_normal((2, n)).astype(np.float32)
    # Cumsum is x @ J with J[i, j] = 1 where i <= j (i < j when exclusive); its gradient is dy @ J^T.
    jac = np.triu(np.ones((n, n)), k=1 if exclusive else 0)
    g = Graph("cb")
    g.set_outputs([g.cumsum_backward(g.input("dy", [2, n]), 1, exclusive, name="dx")])
    np.testing.assert_allclose(reference.evaluate(g, {"dy": dy})["dx"], dy @ jac.T, rtol=1e-5, atol=1e-5)


def test_hostile_attributes_and_values_are_typed_errors() -> None:
    g = Graph("bad")
    x = g.input("x", [2, 3])
    with pytest.raises(AttributeValueError, match="bits"):
        g.fake_quantize_lsq(x, g.input("s", [1]), bits=5)
    with pytest.raises(ShapeError, match="scale"):
        g.fake_quantize_lsq(x, g.input("s2", [2]), axis=1)
    with pytest.raises(ShapeError, match="dy"):
        g.gather_backward(x, g.input("i", [4]), [7, 3])
    with pytest.raises(ShapeError, match="labels"):
        g.softmax_cross_entropy_with_logits(x, g.input("l", [3]))
    g = Graph("labels")
    labels = g.softmax_cross_entropy_with_logits(g.input("x", [2, 3]), g.input("labels", [2]), name="loss")
    g.set_outputs([labels])
    with pytest.raises(EvaluationError, match="out of range"):
        reference.evaluate(g, {"x": np.zeros((2, 3), np.float32), "labels": np.array([0, 3], np.float32)})


def test_relu_sqrt_rsqrt_gradients_are_exactly_zero_off_their_domain() -> None:
    g = Graph("masked")
    x, dy = g.input("x", [4]), g.input("dy", [4])
    g.set_outputs([g.activation_backward(x, dy, kind, name=kind) for kind in ("Relu", "Sqrt", "Rsqrt")])
    feeds = {"x": np.array([-1.0, 0.0, 4.0, np.nan], np.float32), "dy": np.array([np.inf, 2.0, 2.0, 1.0], np.float32)}
    want = reference.evaluate(g, feeds)
    np.testing.assert_array_equal(want["Relu"], [0, 0, 2, 0])
    np.testing.assert_array_equal(want["Sqrt"], [0, 0, 0.5, 0])
    np.testing.assert_array_equal(want["Rsqrt"], [0, 0, -0.125, 0])
    got = milexec.run(rlx_mil.convert(g, {}, target="iOS18", precision="fp32"), feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
