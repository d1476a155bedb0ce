"""End-to-end: If / While / Scan with their bodies (MIL `cond` / `while_loop`) and
ElementwiseRegion (expanded into plain ops), each against a plain-Python loop or NumPy steps
written here, through the converted program in fp32 and fp16, and loaded from JSON."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, e2e_settings, fp16_tolerance, normal, rng_for, seeds, uniform, verify
from rlx_mil import convert
from rlx_mil.errors import ShapeError, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind, BinaryOp, ChainOperand, ChainSource, ChainStep, CmpOp
from rlx_mil.reference import evaluate


def _mil_ops(graph: Graph, params: dict[str, np.ndarray] | None = None) -> list[str]:
    model = convert(graph, params or {}, target="iOS18")
    return re.findall(r"= (\w+)\(", str(model._mil_program.functions["main"]))


def _branch(name: str, dims: list[int], negate: bool) -> Graph:
    body = Graph(name)
    a, b = body.input("a", dims), body.input("b", dims)
    if negate:
        body.set_outputs([body.sub(a, body.mul(b, b))])
    else:
        body.set_outputs([body.relu(body.add(a, b))])
    return body


@e2e_settings(4)
@given(dims=st.lists(st.integers(1, 4), min_size=1, max_size=3), truth=st.booleans(),
       pred_dtype=st.sampled_from(["bool", "f32", "i32"]), elementwise=st.booleans(), seed=seeds)
def test_if(dims: list[int], truth: bool, pred_dtype: str, elementwise: bool, seed: int) -> None:
    """A one-element pred picks a branch (MIL `cond`); an element-wise pred selects per element."""
    rng = rng_for(seed)
    f = Feeds("if")
    av, bv = normal(rng, dims), normal(rng, dims)
    if elementwise:
        pred_v = (rng.random(dims) < 0.5).astype(np.float32)
    else:
        pred_v = np.array([1.0 if truth else 0.0], np.float32)
    pred = f.input("pred", pred_v, pred_dtype)
    y = f.graph.if_(pred, _branch("then", dims, False), _branch("else", dims, True),
                    [f.input("a", av), f.input("b", bv)], name="y")
    f.graph.set_outputs([y])
    then_v, else_v = np.maximum(av + bv, 0), av - bv * bv
    want = np.where(pred_v != 0, then_v, else_v)
    np.testing.assert_allclose(evaluate(f.graph, f.inputs)["y"], want, rtol=1e-6)
    f.verify([y])
    assert ("cond" in _mil_ops(f.graph)) is not elementwise


def _grow_loop(n: int, limit: float) -> tuple[Graph, Graph]:
    cond = Graph("cond")
    x, count = cond.input("x", [n]), cond.input("count", [1])
    cond.set_outputs([cond.lt_(cond.sum(x, [0]), cond.constant(np.array(limit, np.float32)))])
    body = Graph("body")
    x, count = body.input("x", [n]), body.input("count", [1])
    grown = body.add(body.mul(x, body.constant(np.array(1.5, np.float32))), body.constant(np.array(0.25, np.float32)))
    body.set_outputs([grown, body.add(count, body.constant(np.array([1.0], np.float32)))])
    return cond, body


@e2e_settings(4)
@given(n=st.integers(1, 5), limit=st.floats(-2.0, 40.0), max_iterations=st.integers(0, 7), count_first=st.booleans(),
       seed=seeds)
def test_while(n: int, limit: float, max_iterations: int, count_first: bool, seed: int) -> None:
    """`while it < N and sum(x) < limit: x = 1.5 x + 0.25; count += 1`; the result is c[0]."""
    rng = rng_for(seed)
    xv = uniform(rng, (n,), 0.0, 1.0)
    cond, body = _grow_loop(n, limit)
    f = Feeds("while")
    x, count = f.input("x", xv), f.input("count", np.zeros(1, np.float32))
    if count_first:
        # The same loop with the counter carried first: its result is the iteration count.
        cond2, body2 = Graph("cond"), Graph("body")
        c2, x2 = cond2.input("count", [1]), cond2.input("x", [n])
        cond2.set_outputs([cond2.lt_(cond2.sum(x2, [0]), cond2.constant(np.array(limit, np.float32)))])
        c2, x2 = body2.input("count", [1]), body2.input("x", [n])
        body2.set_outputs([body2.add(c2, body2.constant(np.array([1.0], np.float32))),
                           body2.add(body2.mul(x2, body2.constant(np.array(1.5, np.float32))),
                                     body2.constant(np.array(0.25, np.float32)))])
        y = f.graph.while_(cond2, body2, [count, x], max_iterations, name="y")
    else:
        y = f.graph.while_(cond, body, [x, count], max_iterations, name="y")
    f.graph.set_outputs([y])
    loop_x, loop_count = xv.astype(np.float64), 0
    while loop_count < max_iterations and loop_x.sum() < limit:
        loop_x, loop_count = loop_x * 1.5 + 0.25, loop_count + 1
    want = np.array([loop_count], np.float32) if count_first else loop_x
    np.testing.assert_allclose(evaluate(f.graph, f.inputs)["y"], want, rtol=1e-5)
    if abs(float(np.asarray(evaluate(f.graph, f.inputs)["y"]).sum()) - limit) < 0.1 * max(1.0, abs(limit)):
        return  # a sum this close to the limit may compare the other way after fp16 rounding
    f.verify([y], tolerances=fp16_tolerance(0.05, 0.01))


def _scan_body(d: int, bcast: bool, xs: int) -> Graph:
    body = Graph("step")
    carry = body.input("carry", [d])
    scale = body.input("scale", [d]) if bcast else None
    rows = [body.input(f"row{i}", [d]) for i in range(xs)]
    value = carry if scale is None else body.mul(carry, scale)
    for row in rows:
        value = body.add(value, row)
    body.set_outputs([body.tanh(value)])
    return body


@e2e_settings(4)
@given(d=st.integers(1, 4), length=st.integers(0, 6), bcast=st.booleans(), xs=st.integers(0, 2),
       save_trajectory=st.booleans(), seed=seeds)
def test_scan(d: int, length: int, bcast: bool, xs: int, save_trajectory: bool, seed: int) -> None:
    """`carry = tanh(carry * scale + x_t...)` over `length` rows; final carry or the trajectory."""
    if save_trajectory and length == 0:
        length = 1  # an empty trajectory is a zero-size tensor (refused on Core ML; tested below)
    rng = rng_for(seed)
    f = Feeds("scan")
    init_v, scale_v = normal(rng, (d,)), uniform(rng, (d,), 0.5, 1.5)
    xs_v = [normal(rng, (length, d)) for _ in range(xs)]
    init = f.input("init", init_v)
    scale = [f.input("scale", scale_v)] if bcast else []
    rows = [f.input(f"xs{i}", v) for i, v in enumerate(xs_v)]
    y = f.graph.scan(_scan_body(d, bcast, xs), init, rows, length, scale, save_trajectory, name="y")
    f.graph.set_outputs([y])
    carry, trajectory = init_v.astype(np.float64), []
    for t in range(length):
        value = carry * scale_v if bcast else carry
        carry = np.tanh(value + sum((x[t] for x in xs_v), np.zeros(d)))
        trajectory.append(carry)
    want = np.stack(trajectory) if save_trajectory else carry
    np.testing.assert_allclose(evaluate(f.graph, f.inputs)["y"], want, rtol=1e-5, atol=1e-6)
    f.verify([y])


def test_loop_programs_do_not_grow_with_the_step_count() -> None:
    def scan_graph(length: int) -> Graph:
        g = Graph("scan_len")
        y = g.scan(_scan_body(4, True, 1), g.input("init", [4]), [g.input("xs", [length, 4])], length,
                   [g.input("scale", [4])], True, name="y")
        g.set_outputs([y])
        return g

    def while_graph(steps: int) -> Graph:
        g = Graph("while_len")
        cond, body = _grow_loop(3, 1e4)
        g.set_outputs([g.while_(cond, body, [g.input("x", [3]), g.input("count", [1])], steps, name="y")])
        return g

    assert len(_mil_ops(scan_graph(4))) == len(_mil_ops(scan_graph(2048)))
    assert len(_mil_ops(while_graph(3))) == len(_mil_ops(while_graph(100_000)))


def test_loop_bounds_beyond_int32_and_empty_trajectories_are_refused() -> None:
    g = Graph("huge")
    cond, body = _grow_loop(2, 1.0)
    g.set_outputs([g.while_(cond, body, [g.input("x", [2]), g.input("count", [1])], 1 << 40, name="y")])
    with pytest.raises(UnsupportedOpError, match="max_iterations 1099511627776 exceeds the int32 loop counter"):
        convert(g, {}, target="iOS18")
    g2 = Graph("empty")
    y = g2.scan(_scan_body(2, False, 1), g2.input("init", [2]), [g2.input("xs", [0, 2])], 0, save_trajectory=True)
    g2.set_outputs([y])
    with pytest.raises(UnsupportedOpError, match="empty trajectory"):
        convert(g2, {}, target="iOS18")


def test_nested_control_flow() -> None:
    """An If inside a Scan body: each step takes a branch by the row's first value."""
    inner_then, inner_else = _branch("then", [3], False), _branch("else", [3], True)
    body = Graph("step")
    carry, row = body.input("carry", [3]), body.input("row", [3])
    pred = body.gt_(body.reshape(body.narrow(row, 0, 0, 1), [1]), body.constant(np.array([0.0], np.float32)))
    body.set_outputs([body.tanh(body.if_(pred, inner_then, inner_else, [carry, row]))])
    rng = rng_for(11)
    f = Feeds("nested")
    init_v, xs_v = normal(rng, (3,)), normal(rng, (5, 3))
    y = f.graph.scan(body, f.input("init", init_v), [f.input("xs", xs_v)], 5, name="y")
    f.graph.set_outputs([y])
    c = init_v.astype(np.float64)
    for r in xs_v:
        c = np.tanh(np.maximum(c + r, 0) if r[0] > 0 else c - r * r)
    np.testing.assert_allclose(evaluate(f.graph, f.inputs)["y"], c, rtol=1e-5, atol=1e-6)
    f.verify([y])


# ----------------------------------------------------------------------------- regions

_ACTIVATIONS = {ActivationKind.RELU: lambda v: np.maximum(v, 0), ActivationKind.TANH: np.tanh,
                ActivationKind.NEG: np.negative, ActivationKind.SILU: lambda v: v / (1 + np.exp(-v))}
_BINARIES = {BinaryOp.ADD: np.add, BinaryOp.MUL: np.multiply, BinaryOp.SUB: np.subtract, BinaryOp.MAX: np.maximum}


@st.composite
def chains(draw: st.DrawFn, inputs: int) -> list[ChainStep]:
    """Random float chains over `inputs` region inputs; a Compare only ever feeds a Where."""
    steps: list[ChainStep] = []

    def operand() -> ChainOperand:
        floats = [j for j, step in enumerate(steps) if step.kind != "Compare"]
        if floats and draw(st.booleans()):
            return ChainOperand(ChainSource.STEP, draw(st.sampled_from(floats)))
        return ChainOperand(ChainSource.INPUT, draw(st.integers(0, inputs - 1)))

    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["Activation", "Binary", "Where"]))
        if kind == "Activation":
            steps.append(ChainStep(kind, draw(st.sampled_from(list(_ACTIVATIONS))), (operand(),)))
        elif kind == "Binary":
            steps.append(ChainStep(kind, draw(st.sampled_from(list(_BINARIES))), (operand(), operand())))
        else:
            steps.append(ChainStep("Compare", CmpOp.GT, (operand(), operand())))
            flag = ChainOperand(ChainSource.STEP, len(steps) - 1)
            steps.append(ChainStep("Where", None, (flag, operand(), operand())))
    # Only float steps may end the chain (a Compare is always followed by its Where).
    return steps


def _run_chain(chain: list[ChainStep], values: list[np.ndarray]) -> np.ndarray:
    results: list[np.ndarray] = []
    for step in chain:
        args = [values[o.index] if o.source is ChainSource.INPUT else results[o.index] for o in step.operands]
        if step.kind == "Activation":
            results.append(_ACTIVATIONS[step.attr](args[0]))  # type: ignore[index]
        elif step.kind == "Binary":
            results.append(_BINARIES[step.attr](args[0], args[1]))  # type: ignore[index]
        elif step.kind == "Compare":
            results.append(args[0] > args[1])
        else:
            results.append(np.where(args[0], args[1], args[2]))
    return results[-1]


@e2e_settings(5)
@given(data=st.data(), inputs=st.integers(1, 3), cast_f16=st.booleans(), seed=seeds)
def test_elementwise_region(data: st.DataObject, inputs: int, cast_f16: bool, seed: int) -> None:
    """Inputs of shapes [2, 3], [3] or [1] broadcast onto [2, 3]; optionally a final Cast to F16."""
    chain = data.draw(chains(inputs))
    shapes = [data.draw(st.sampled_from([(2, 3), (3,), (1,)])) for _ in range(inputs)]
    shapes[0] = (2, 3)
    rng = rng_for(seed)
    f = Feeds("region")
    values = [normal(rng, s) for s in shapes]
    ids = [f.input(f"in{i}", v) for i, v in enumerate(values)]
    if cast_f16:
        chain = [*chain, ChainStep("Cast", DType.F16, (ChainOperand(ChainSource.STEP, len(chain) - 1),))]
    y = f.graph.elementwise_region(ids, chain, [2, 3], "f16" if cast_f16 else "f32", name="y")
    f.graph.set_outputs([y])
    want = np.broadcast_to(_run_chain(chain if not cast_f16 else chain[:-1], values), (2, 3))
    got = evaluate(f.graph, f.inputs)["y"]
    if cast_f16:
        np.testing.assert_array_equal(got, want.astype(np.float16))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    f.verify([y])
    assert "ElementwiseRegion" not in " ".join(_mil_ops(f.graph))


def test_region_with_resize_prologue_from_json() -> None:
    """Newest JSON: input 1 is half resolution and upsampled 2x before the chain."""
    chain = [ChainStep("Binary", BinaryOp.ADD, (ChainOperand(ChainSource.INPUT, 0), ChainOperand(ChainSource.INPUT, 1))),
             ChainStep("Activation", ActivationKind.RELU, (ChainOperand(ChainSource.STEP, 0),))]
    g = Graph("prologue")
    full, half = g.input("full", [1, 2, 4, 4]), g.input("half", [1, 2, 2, 2])
    region = g.elementwise_region([full, half], chain, [1, 2, 4, 4])
    g.set_outputs([region])
    text = g.to_json(version="newest").replace('"prologue":"None","prologue_input":0', '"prologue":"ResizeNearest2x","prologue_input":1')
    loaded = Graph.from_json(text)
    assert loaded.json_version == "newest"
    rng = rng_for(5)
    feeds = {"full": normal(rng, (1, 2, 4, 4)), "half": normal(rng, (1, 2, 2, 2))}
    up = feeds["half"].repeat(2, axis=2).repeat(2, axis=3)
    np.testing.assert_allclose(next(iter(evaluate(loaded, feeds).values())), np.maximum(feeds["full"] + up, 0))
    verify(loaded, feeds)


def test_regions_that_do_not_expand_name_the_node() -> None:
    """A chain ending in a Bool under an F32 declaration, and a chain whose value cannot take the
    declared shape: typed errors naming the region node, in the reference and in conversion."""
    compare = [ChainStep("Compare", CmpOp.GT, (ChainOperand(ChainSource.INPUT, 0), ChainOperand(ChainSource.INPUT, 1)))]
    add = [ChainStep("Binary", BinaryOp.ADD, (ChainOperand(ChainSource.INPUT, 0), ChainOperand(ChainSource.INPUT, 1)))]
    for chain, dims, message in ((compare, [3], "ends in a Bool value"), (add, [5], "does not broadcast")):
        g = Graph("bad_region")
        a, b = g.input("a", [3]), g.input("b", [3])
        g.set_outputs([g.elementwise_region([a, b], chain, dims, name="region")])
        feeds = {"a": np.ones(3, np.float32), "b": np.zeros(3, np.float32)}
        with pytest.raises(ShapeError, match=message) as err:
            evaluate(g, feeds)
        assert err.value.node == 2
        with pytest.raises(ShapeError, match=rf"node %2 'region'.*{message}"):
            convert(g, {}, target="iOS18")
