"""End-to-end: QMatMul, QConv2d, FakeQuantize.

The integer accumulation is exact on every target and precision, so fp32 results equal the
reference exactly; under fp16 the requantization multiply is fp16 math and may land one step
away where `acc * mult` is within fp16 rounding of a .5 tie (tolerance: one I8 step).
FakeQuantize inputs are built from a power-of-two scale and off-tie multiples of it, so the
rounding is unambiguous in fp16 too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, clear_fractions, e2e_settings, rng_for, seeds
from rlx_mil import reference
from rlx_mil.errors import ArityError, AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import Tolerance

ONE_STEP = {Precision.FP32: Tolerance(0.0, 0.0), Precision.FP16: Tolerance(1.0, 0.0)}
zero_points = st.integers(-20, 20)
mults = st.sampled_from((0.0123, 0.002, 0.05, 1.0 / 256))


def codes(rng: np.random.Generator, dims: tuple[int, ...]) -> np.ndarray:
    return rng.integers(-128, 128, size=dims).astype(np.float32)


@e2e_settings(5)
@given(m=st.integers(1, 4), k=st.integers(1, 9), n=st.integers(1, 5), x_zp=zero_points, w_zp=zero_points,
       out_zp=zero_points, mult=mults, weight_kind=st.sampled_from(("param", "input")), seed=seeds)
def test_qmatmul(m: int, k: int, n: int, x_zp: int, w_zp: int, out_zp: int, mult: float, weight_kind: str,
                 seed: int) -> None:
    rng = rng_for(seed)
    f = Feeds("qmatmul")
    x = f.input("x", codes(rng, (m, k)), DType.I8)
    w = f.leaf(weight_kind, "w", codes(rng, (k, n)), DType.I8)
    bias = f.leaf(weight_kind, "bias", rng.integers(-5000, 5000, n).astype(np.float32), DType.I32)
    f.verify([f.graph.qmatmul(x, w, bias, x_zp=x_zp, w_zp=w_zp, out_zp=out_zp, mult=mult, name="y")],
             tolerances=ONE_STEP)


@st.composite
def conv_cases(draw: st.DrawFn) -> dict[str, object]:
    groups = draw(st.integers(1, 2))
    c_in = groups * draw(st.integers(1, 2))
    c_out = groups * draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 6))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 6))
    return {"groups": groups, "x": (draw(st.integers(1, 2)), c_in, h, w), "w": (c_out, c_in // groups, kh, kw),
            "stride": (draw(st.integers(1, 2)), draw(st.integers(1, 2))), "padding": (ph, pw), "dilation": (dh, dw)}


@e2e_settings(5)
@given(case=conv_cases(), x_zp=zero_points, w_zp=zero_points, out_zp=zero_points, mult=mults, seed=seeds)
def test_qconv2d(case: dict[str, object], x_zp: int, w_zp: int, out_zp: int, mult: float, seed: int) -> None:
    """Padded cells hold x_zp (add nothing); groups, strides and dilations."""
    rng = rng_for(seed)
    f = Feeds("qconv2d")
    x = f.input("x", codes(rng, case["x"]), DType.I8)  # type: ignore[arg-type]
    w = f.param("w", codes(rng, case["w"]), DType.I8)  # type: ignore[arg-type]
    c_out = case["w"][0]  # type: ignore[index]
    bias = f.param("bias", rng.integers(-3000, 3000, c_out).astype(np.float32), DType.I32)
    y = f.graph.qconv2d(x, w, bias, stride=case["stride"], padding=case["padding"], dilation=case["dilation"],  # type: ignore[arg-type]
                        groups=case["groups"], x_zp=x_zp, w_zp=w_zp, out_zp=out_zp, mult=mult, name="y")  # type: ignore[arg-type]
    f.verify([y], tolerances=ONE_STEP)


def off_tie_values(rng: np.random.Generator, dims: tuple[int, ...], q: int, scale: float, axis: int | None) -> np.ndarray:
    """Multiples (k + f) * scale with f clear of .5, and one exact +-q * scale per channel, so
    the PerBatch scale is exactly `scale`."""
    v = clear_fractions(rng, dims, -q, q) * np.float32(scale)
    lines = v.reshape(1, -1) if axis is None else np.moveaxis(v, axis, 0).reshape(dims[axis], -1)
    lines[:, 0] = np.float32(q * scale) * np.where(rng.random(lines.shape[0]) < 0.5, -1, 1)
    return (lines.reshape(dims) if axis is None else np.moveaxis(lines.reshape(np.moveaxis(v, axis, 0).shape), 0, axis)).astype(np.float32)


@e2e_settings(6)
@given(dims=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), bits=st.sampled_from((8, 4, 2)),
       axis_pick=st.integers(-1, 2), mode=st.sampled_from(("PerBatch", "Fixed", "EMA")), seed=seeds)
def test_fake_quantize(dims: tuple[int, ...], bits: int, axis_pick: int, mode: str, seed: int) -> None:
    rng = rng_for(seed)
    axis = None if axis_pick < 0 else axis_pick % len(dims)
    q = {8: 127, 4: 7, 2: 1}[bits]
    scale = 2.0 ** -int(rng.integers(0, 4))
    f = Feeds("fake_quantize")
    x = f.input("x", off_tie_values(rng, dims, q, scale, axis))
    channels = 1 if axis is None else dims[axis]
    state = None
    decay = None
    if mode == "Fixed":
        state = f.input("state", np.full(channels, scale, np.float32))
    elif mode == "EMA":
        # state <= 0 takes the batch scale; a positive state equal to it blends to itself.
        state = f.input("state", np.where(rng.random(channels) < 0.5, 0.0, scale).astype(np.float32))
        decay = 0.75
    f.verify([f.graph.fake_quantize(x, bits, axis, state=state, scale_mode=mode, decay=decay, name="y")])


def test_fake_quantize_ties_round_away_from_zero_and_zero_channels_stay_zero() -> None:
    f = Feeds("ties")
    x = f.input("x", np.array([[2.5, -2.5, 0.5, 7.0], [0.0, 0.0, 0.0, 0.0]], np.float32))
    f.verify([f.graph.fake_quantize(x, 4, 0, name="y")])
    got = reference.evaluate(f.graph, f.inputs)["y"]
    np.testing.assert_array_equal(got, [[3.0, -3.0, 1.0, 7.0], [0.0, 0.0, 0.0, 0.0]])


def test_qmatmul_accumulator_wraps_like_i32_and_saturates() -> None:
    """K large enough to overflow i32 is not reachable with I8 codes; the wrap shows through
    the bias instead (acc = bias + products beyond 2^31)."""
    f = Feeds("wrap")
    x = f.input("x", np.array([[-128, -128]], np.float32), DType.I8)
    w = f.param("w", np.array([[-128], [-128]], np.float32), DType.I8)
    bias = f.param("bias", np.array([2**31 - 20000], np.float64), DType.I32)
    f.verify([f.graph.qmatmul(x, w, bias, mult=1e-9, name="y")], tolerances=ONE_STEP)
    got = reference.evaluate(f.graph, f.inputs, f.params)["y"]
    acc = (2**31 - 20000 + 2 * 128 * 128) - 2**32
    assert int(got[0, 0]) == int(np.clip(np.round(np.float32(acc) * np.float32(1e-9)), -128, 127))
    g = Feeds("saturate")
    x2 = g.input("x", np.array([[127, 127]], np.float32), DType.I8)
    y2 = g.graph.qmatmul(x2, g.param("w", np.array([[127], [-128]], np.float32), DType.I8),
                         g.param("bias", np.array([0], np.float32), DType.I32), mult=1.0, out_zp=3, name="y")
    g.verify([y2], tolerances=ONE_STEP)
    np.testing.assert_array_equal(reference.evaluate(g.graph, g.inputs, g.params)["y"], [[-124]])


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda g: g.qmatmul(g.input("x", [2, 3]), g.input("w", [3, 2], "i8"), g.input("b", [2], "i32"), mult=0.1), DTypeError, "x must be I8"),
        (lambda g: g.qmatmul(g.input("x", [2, 3], "i8"), g.input("w", [4, 2], "i8"), g.input("b", [2], "i32"), mult=0.1), ShapeError, r"\[K, N\]"),
        (lambda g: g.qmatmul(g.input("x", [2, 3], "i8"), g.input("w", [3, 2], "i8"), g.input("b", [3], "i32"), mult=0.1), ShapeError, "bias"),
        (lambda g: g.qmatmul(g.input("x", [2, 3], "i8"), g.input("w", [3, 2], "i8"), g.input("b", [2], "i32"), mult=float("inf")), AttributeValueError, "finite"),
        (lambda g: g.qconv2d(g.input("x", [1, 3, 4, 4], "i8"), g.input("w", [2, 2, 3, 3], "i8"), g.input("b", [2], "i32"), mult=0.1), ShapeError, "C_in"),
        (lambda g: g.fake_quantize(g.input("x", [2, 3]), 3), AttributeValueError, "bits"),
        (lambda g: g.fake_quantize(g.input("x", [2, 3]), 8, 1, state=g.input("s", [2]), scale_mode="Fixed"), ShapeError, "state"),
        (lambda g: g.fake_quantize(g.input("x", [2, 3]), 8, scale_mode="EMA", decay=1.5, state=g.input("s", [1])), AttributeValueError, "decay"),
        (lambda g: g.fake_quantize(g.input("x", [2, 3]), 8, scale_mode="Fixed"), ArityError, "expects 2"),
    ],
)
def test_bad_graphs_get_typed_errors(build, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        build(Graph())


def test_json_round_trip() -> None:
    import json

    g = Graph("q")
    x = g.input("x", [2, 3], "i8")
    y = g.qmatmul(x, g.input("w", [3, 2], "i8"), g.input("b", [2], "i32"), x_zp=1, w_zp=0, out_zp=-3, mult=0.0123, name="qm")
    c = g.qconv2d(g.input("cx", [1, 2, 4, 4], "i8"), g.input("cw", [2, 1, 3, 3], "i8"), g.input("cb", [2], "i32"),
                  padding=(1, 1), groups=2, mult=0.01, name="qc")
    f = g.input("f", [2, 3])
    a = g.fake_quantize(f, 8, 0, name="fa")
    b = g.fake_quantize(f, 4, None, state=g.input("s", [1]), scale_mode="EMA", decay=0.99, ste="Tanh", name="fb")
    g.set_outputs([y, c, a, b])
    text = g.to_json()
    forms = {n["name"]: n["op"] for n in json.loads(text)["nodes"]}
    assert forms["qm"] == {"QMatMul": {"x_zp": 1, "w_zp": 0, "out_zp": -3, "mult": 0.0123}}
    assert forms["qc"] == {"QConv2d": {"kernel_size": [3, 3], "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                                       "groups": 2, "x_zp": 0, "w_zp": 0, "out_zp": 0, "mult": 0.01}}
    assert forms["fa"] == {"FakeQuantize": {"bits": 8, "axis": 0, "ste": "Identity", "scale_mode": "PerBatch"}}
    assert forms["fb"] == {"FakeQuantize": {"bits": 4, "axis": None, "ste": "Tanh", "scale_mode": {"EMA": {"decay": 0.99}}}}
    assert Graph.from_json(text).to_json() == text
