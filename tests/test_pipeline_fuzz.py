"""Random builder graphs through the whole pipeline: reference vs converted model agree.

Hypothesis draws a small DAG of element-wise ops (activations, binary ops, compares, where,
casts) over inputs of every dtype the IR has (floats F32/F16/BF16, integers I8/U8/I16/I32,
Bool), with values in ranges where the semantics in docs/op-coverage.md fix one answer;
each graph is converted (fp32, iOS18) and run by the MIL executor, and every output must
match `reference.evaluate` within the fp32 tolerance (integers and bools exactly).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import DEFAULT_TOLERANCES, compare

FLOATS = (DType.F32, DType.F16, DType.BF16)
INTS = (DType.I8, DType.U8, DType.I16, DType.I32)
DTYPES = (*FLOATS, *INTS, DType.BOOL)
UNARY = ("neg", "abs", "relu", "round", "tanh", "sigmoid")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
COMPARE = ("eq_", "ne_", "lt_", "le_", "gt_", "ge_")
SHAPES = ((3,), (2, 3), (1, 3), (2, 1))


@dataclass
class Built:
    graph: Graph
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


def _values(draw: Any, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    if dtype is DType.BOOL:
        return np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), bool).reshape(shape)
    if dtype.is_int:
        lo, hi = {DType.U8: (0, 255), DType.I8: (-128, 127)}.get(dtype, (-300, 300))
        values = draw(st.lists(st.integers(lo, hi), min_size=count, max_size=count))
        return np.array(values, dtype=dtype.numpy).reshape(shape)
    # Quarters: exact in every float type, and Round sees real ties.
    values = draw(st.lists(st.integers(-40, 40), min_size=count, max_size=count))
    return (np.array(values, np.float32) / 4).reshape(shape)


@st.composite
def graphs(draw: Any) -> Built:
    g = Graph("fuzz")
    built = Built(g)
    nodes: list[int] = []
    for index in range(draw(st.integers(1, 3))):
        dtype, shape = draw(st.sampled_from(DTYPES)), draw(st.sampled_from(SHAPES))
        name = f"in{index}"
        nodes.append(g.input(name, list(shape), dtype))
        built.inputs[name] = _values(draw, dtype, shape)
    for step in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(("unary", "binary", "compare", "where", "cast")))
        a = draw(st.sampled_from(nodes))
        b = draw(st.sampled_from(nodes))
        try:
            if kind == "unary":
                node = getattr(g, draw(st.sampled_from(UNARY)))(a, name=f"n{step}")
            elif kind == "binary":
                node = getattr(g, draw(st.sampled_from(BINARY)))(a, b, name=f"n{step}")
            elif kind == "compare":
                node = getattr(g, draw(st.sampled_from(COMPARE)))(a, b, name=f"n{step}")
            elif kind == "where":
                node = g.where_(draw(st.sampled_from(nodes)), a, b, name=f"n{step}")
            else:
                node = g.cast(a, draw(st.sampled_from(DTYPES)), name=f"n{step}")
        except rlx_mil.errors.RlxMilError:
            continue  # shapes that do not broadcast: the builder refuses them, try another op
        nodes.append(node)
    g.set_outputs(nodes[len(built.inputs):] or nodes[-1:])
    return built


def _run(built: Built) -> None:
    want = reference.evaluate(built.graph, built.inputs)
    model = rlx_mil.convert(built.graph, precision="fp32")
    try:
        got = milexec.run(model, built.inputs)
    finally:
        shutil.rmtree(model.package_path, ignore_errors=True)
    tolerance = DEFAULT_TOLERANCES[Precision.FP32]
    for key, ref in want.items():
        exact = ref.dtype.kind in "biu"
        ok, _, detail = compare(got[key], ref, tolerance) if not exact else (
            np.array_equal(got[key].astype(np.int64), ref.astype(np.int64)), 0.0, "")
        assert ok, (
            f"output {key!r} ({ref.dtype}): converted {got[key].tolist()} vs reference {ref.tolist()}"
            f" {detail}\n{built.graph}\ninputs {({k: v.tolist() for k, v in built.inputs.items()})}"
        )


@settings(
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # Each example converts a model; shrinking would convert hundreds more. The unshrunk
    # failing graph is printed in full.
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(built=graphs())
def test_random_elementwise_graphs_agree(built: Built) -> None:
    _run(built)


def _graph_of(dtype: str, build: Any, *values: np.ndarray) -> Built:
    g = Graph("regression")
    names = [f"in{i}" for i in range(len(values))]
    ids = [g.input(name, list(v.shape), dtype) for name, v in zip(names, values, strict=True)]
    g.set_outputs([build(g, *ids)])
    return Built(g, dict(zip(names, values, strict=True)))


def test_the_issue_cases_agree() -> None:
    """U8 neg, integer division (signs, by zero, overflow wrap) and a BF16 result: reference
    and converted model give the documented answers."""
    cases = [
        (_graph_of("u8", lambda g, x: g.neg(x, name="y"), np.array([0, 1, 2], np.uint8)), [0, 255, 254]),
        (_graph_of("i32", lambda g, a, b: g.div(a, b, name="y"), np.array([-7, 7, 5, -4], np.int32),
                   np.array([2, -2, 0, 3], np.int32)), [-3, -3, 0, -1]),
        (_graph_of("i8", lambda g, a, b: g.add(a, b, name="y"), np.array([127, -128], np.int8),
                   np.array([1, -1], np.int8)), [-128, 127]),
        (_graph_of("bf16", lambda g, a, b: g.mul(a, b, name="y"), np.array([1.5, 3.0], np.float32),
                   np.array([1.3359375, 1.0078125], np.float32)), [2.0, 3.03125]),  # a tie: to even
    ]
    for built, expected in cases:
        np.testing.assert_array_equal(reference.evaluate(built.graph, built.inputs)["y"].astype(np.float64), expected)
        _run(built)
