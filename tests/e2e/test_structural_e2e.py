"""End-to-end: the structural ops of spec part 2, section 3 (StopGradient, Fma, Clamp, Pad, Slice,
Tile, Trilu, Reverse, CumProd, CumMax, ArgMax, ArgMin, Sort, ArgSort), reference vs. the
converted model through the executor in fp32 and fp16 on every target, and the section 9 edge
cases (Q16-Q22).

Values are small integers or halves (exact in fp16) wherever the op selects or orders, so ties
are real ties in both precisions and every difference is a real one.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rlx_mil
from e2e.factory import Feeds, e2e_settings, integers, rng_for, seeds, uniform
from rlx_mil.errors import AttributeValueError, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.reference import evaluate

shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)
matrices = hnp.array_shapes(min_dims=2, max_dims=4, min_side=1, max_side=5)
data_dtypes = st.sampled_from((DType.F32, DType.F16, DType.I32))


def halves(rng: np.random.Generator, dims: tuple[int, ...], dtype: DType, low: int = -8, high: int = 8) -> np.ndarray:
    v = integers(rng, dims, low, high)
    return v if not dtype.is_float else v * np.float32(0.5)


def sprinkle(rng: np.random.Generator, v: np.ndarray, *specials: float, share: float = 0.2) -> np.ndarray:
    """Some elements replaced by the given special values (NaN, +-inf)."""
    out = v.copy()
    for special in specials:
        out = np.where(rng.random(v.shape) < share, np.float32(special), out).astype(np.float32)
    return out


# ------------------------------------------------------------------ StopGradient / Fma / Clamp


@e2e_settings(4)
@given(dims=shapes, dtype=data_dtypes, drop=st.integers(0, 2), seed=seeds)
def test_fma_and_stop_gradient(dims: tuple[int, ...], dtype: DType, drop: int, seed: int) -> None:
    """a*b + c with one operand broadcast from fewer axes; integers wrap as Mul/Add do."""
    rng = rng_for(seed)
    f = Feeds("fma")
    a = f.input("a", halves(rng, dims, dtype), dtype)
    b = f.input("b", halves(rng, dims[drop % len(dims):], dtype), dtype)
    c = f.input("c", halves(rng, dims, dtype), dtype)
    f.verify([f.graph.stop_gradient(f.graph.fma(a, b, c), name="out")])


@e2e_settings(5)
@given(dims=shapes, dtype=data_dtypes, lo=st.integers(-6, 4), width=st.integers(-2, 6), seed=seeds)
def test_clamp(dims: tuple[int, ...], dtype: DType, lo: int, width: int, seed: int) -> None:
    """Bounds with fractions (truncated for integer data), min > max included; NaN -> fmin(min, max)."""
    rng = rng_for(seed)
    low, high = lo + 0.25, lo + width + 0.75
    v = halves(rng, dims, dtype)
    if dtype is DType.F32:
        v = sprinkle(rng, v, np.nan, np.inf, -np.inf, share=0.1)
    f = Feeds("clamp")
    x = f.input("x", v, dtype)
    f.verify([f.graph.clamp(x, low, high, name="out")])


def test_clamp_nan_and_inverted_bounds_section9_q16() -> None:
    g = Graph("clamp_q16")
    x = g.input("x", [4], DType.F32)
    g.set_outputs([g.clamp(x, -1.0, 1.0, name="a"), g.clamp(x, 2.0, -3.0, name="b")])
    v = np.array([np.nan, -5.0, 0.5, 7.0], np.float32)
    ref = evaluate(g, {"x": v})
    np.testing.assert_array_equal(ref["a"], [-1.0, -1.0, 0.5, 1.0])
    np.testing.assert_array_equal(ref["b"], [-3.0, -3.0, -3.0, -3.0])
    f = Feeds("clamp_q16")
    xi = f.input("x", v)
    f.verify([f.graph.clamp(xi, -1.0, 1.0, name="a"), f.graph.clamp(xi, 2.0, -3.0, name="b")])


# ------------------------------------------------------------------ Pad / Slice / Tile / Trilu / Reverse


@st.composite
def pad_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], str, list[list[int]]]:
    dims = draw(shapes)
    mode = draw(st.sampled_from(("constant", "reflect", "replicate", "circular")))
    pads = []
    for n in dims:
        limit = {"reflect": n - 1, "circular": n}.get(mode, 3)
        pads.append([draw(st.integers(0, min(limit, 3))), draw(st.integers(0, min(limit, 3)))])
    return dims, mode, pads


@e2e_settings(8)
@given(case=pad_cases(), dtype=st.sampled_from((DType.F32, DType.F16, DType.I32, DType.BOOL)),
       value=st.sampled_from((0.0, -2.5, 7.0)), seed=seeds)
def test_pad(case: tuple[tuple[int, ...], str, list[list[int]]], dtype: DType, value: float, seed: int) -> None:
    dims, mode, pads = case
    rng = rng_for(seed)
    f = Feeds("pad")
    x = f.input("x", halves(rng, dims, dtype), dtype)
    f.verify([f.graph.pad(x, pads, value if mode == "constant" else mode, name="out")])


@st.composite
def slice_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int, int, int]:
    dims = draw(shapes)
    axis = draw(st.integers(0, len(dims) - 1))
    n = dims[axis]
    step = draw(st.sampled_from((1, 2, 3, -1, -2, -3)))
    start = draw(st.integers(0, n - 1))
    room = (n - 1 - start) // step if step > 0 else start // -step
    length = draw(st.integers(1, room + 1))
    return dims, axis, start, length, step


@e2e_settings(8)
@given(case=slice_cases(), dtype=st.sampled_from((DType.F32, DType.I32, DType.BOOL)), seed=seeds)
def test_slice(case: tuple[tuple[int, ...], int, int, int, int], dtype: DType, seed: int) -> None:
    """Positive and negative steps (then start is the highest index read)."""
    dims, axis, start, length, step = case
    rng = rng_for(seed)
    f = Feeds("slice")
    x = f.input("x", halves(rng, dims, dtype), dtype)
    f.verify([f.graph.slice(x, axis, start, length, step, name="out")])


@e2e_settings(5)
@given(dims=shapes, reps=st.lists(st.integers(1, 3), min_size=3, max_size=3),
       axes=st.lists(st.integers(0, 2), max_size=3, unique=True), dtype=data_dtypes, seed=seeds)
def test_tile_then_reverse(dims: tuple[int, ...], reps: list[int], axes: list[int], dtype: DType, seed: int) -> None:
    rng = rng_for(seed)
    f = Feeds("tile_reverse")
    x = f.input("x", halves(rng, dims, dtype), dtype)
    tiled = f.graph.tile(x, reps[: len(dims)])
    f.verify([f.graph.reverse(tiled, [a for a in axes if a < len(dims)], name="out")])


@e2e_settings(6)
@given(dims=matrices, upper=st.booleans(), diagonal=st.integers(-5, 5), dtype=st.sampled_from((DType.F32, DType.F16, DType.BOOL)),
       seed=seeds)
def test_trilu(dims: tuple[int, ...], upper: bool, diagonal: int, dtype: DType, seed: int) -> None:
    """Select semantics: NaN/inf in the dropped triangle give 0 (section 9 Q17)."""
    rng = rng_for(seed)
    v = halves(rng, dims, dtype)
    if dtype is DType.F32:
        v = sprinkle(rng, v, np.nan, np.inf)
    f = Feeds("trilu")
    x = f.input("x", v, dtype)
    f.verify([f.graph.trilu(x, upper=upper, diagonal=diagonal, name="out")])


def test_trilu_zeroes_nan_in_the_dropped_triangle_section9_q17() -> None:
    g = Graph("trilu_q17")
    x = g.input("x", [2, 2], DType.F32)
    g.set_outputs([g.trilu(x, upper=True, diagonal=0, name="y")])
    v = np.array([[1.0, np.nan], [np.inf, 2.0]], np.float32)
    np.testing.assert_array_equal(evaluate(g, {"x": v})["y"], [[1.0, np.nan], [0.0, 2.0]])
    f = Feeds("trilu_q17")
    f.verify([f.graph.trilu(f.input("x", v), upper=True, diagonal=0, name="y")])


def test_structural_attributes_are_checked_section9_q18_q19() -> None:
    """Reflect needs pad < n, Circular pad <= n, Slice reads stay in range, Tile reps >= 1."""
    g = Graph("bad")
    x = g.input("x", [3, 4], DType.F32)
    with pytest.raises(AttributeValueError, match="Reflect padding of axis 0"):
        g.pad(x, [[3, 0], [0, 0]], "reflect")
    with pytest.raises(AttributeValueError, match="Circular padding of axis 1"):
        g.pad(x, [[0, 0], [0, 5]], "circular")
    with pytest.raises(AttributeValueError, match="leave dim 1"):
        g.slice(x, 1, 2, 3, -2)
    with pytest.raises(AttributeValueError, match="reps"):
        g.tile(x, [1, 0])


# ------------------------------------------------------------------ CumProd / CumMax


@e2e_settings(6)
@given(dims=shapes, axis_pick=st.integers(-3, 2), exclusive=st.booleans(), dtype=data_dtypes, seed=seeds)
def test_cumprod(dims: tuple[int, ...], axis_pick: int, exclusive: bool, dtype: DType, seed: int) -> None:
    """Zeros and negatives along any axis (a log/exp form would get them wrong)."""
    rng = rng_for(seed)
    axis = axis_pick % len(dims) - (len(dims) if axis_pick < 0 else 0)
    factors = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], np.float32)
    v = rng.choice(factors, size=dims).astype(np.float32)
    if not dtype.is_float:
        v = rng.choice(np.array([-2, -1, 0, 1, 2, 3], np.float32), size=dims)
    f = Feeds("cumprod")
    x = f.input("x", v, dtype)
    f.verify([f.graph.cumprod(x, axis, exclusive, name="out")])


@e2e_settings(6)
@given(dims=shapes, axis_pick=st.integers(-3, 2), exclusive=st.booleans(), dtype=data_dtypes, seed=seeds)
def test_cummax(dims: tuple[int, ...], axis_pick: int, exclusive: bool, dtype: DType, seed: int) -> None:
    """NaN-ignoring (NaN only while every element so far is NaN), -inf kept exact."""
    rng = rng_for(seed)
    axis = axis_pick % len(dims) - (len(dims) if axis_pick < 0 else 0)
    v = halves(rng, dims, dtype)
    if dtype is DType.F32:
        v = sprinkle(rng, v, np.nan, -np.inf, share=0.25)
    f = Feeds("cummax")
    x = f.input("x", v, dtype)
    f.verify([f.graph.cummax(x, axis, exclusive, name="out")])


def test_cumulative_edge_cases_section9_q20() -> None:
    """Any axis; exclusive CumMax starts at -inf exactly (not -3e38); inf survives CumProd."""
    g = Graph("cum_q20")
    x = g.input("x", [2, 3], DType.F32)
    g.set_outputs([g.cummax(x, 0, exclusive=True, name="m"), g.cumprod(x, 0, name="p")])
    v = np.array([[np.nan, np.inf, 2.0], [1.0, 2.0, np.nan]], np.float32)
    ref = evaluate(g, {"x": v})
    np.testing.assert_array_equal(ref["m"], [[-np.inf, -np.inf, -np.inf], [np.nan, np.inf, 2.0]])
    np.testing.assert_array_equal(ref["p"], [[np.nan, np.inf, 2.0], [np.nan, np.inf, np.nan]])
    f = Feeds("cum_q20")
    xi = f.input("x", v)
    f.verify([f.graph.cummax(xi, 0, exclusive=True, name="m"), f.graph.cumprod(xi, 0, name="p")])


# ------------------------------------------------------------------ ArgMax / ArgMin


@e2e_settings(6)
@given(dims=shapes, axis_pick=st.integers(0, 2), keep=st.booleans(), largest=st.booleans(), dtype=data_dtypes,
       nan=st.booleans(), seed=seeds)
def test_arg_extremes(dims: tuple[int, ...], axis_pick: int, keep: bool, largest: bool, dtype: DType,
                      nan: bool, seed: int) -> None:
    """Values from a handful of integers: many ties, which go to the smallest index."""
    rng = rng_for(seed)
    axis = axis_pick % len(dims)
    v = halves(rng, dims, dtype, -2, 2)
    if nan and dtype is DType.F32:
        v = sprinkle(rng, v, np.nan, share=0.3)
    f = Feeds("arg")
    x = f.input("x", v, dtype)
    build = f.graph.argmax if largest else f.graph.argmin
    f.verify([build(x, axis, keep_dim=keep, name="out")])


def test_arg_extremes_ties_and_nan_section9_q21() -> None:
    """Ties -> smallest index; NaN skipped; a NaN element 0 gives 0."""
    g = Graph("arg_q21")
    x = g.input("x", [3, 4], DType.F32)
    g.set_outputs([g.argmax(x, 1, name="hi"), g.argmin(x, 1, name="lo")])
    v = np.array([[1.0, 3.0, 3.0, -1.0], [2.0, np.nan, 5.0, -4.0], [np.nan, 9.0, -9.0, 0.0]], np.float32)
    ref = evaluate(g, {"x": v})
    np.testing.assert_array_equal(ref["hi"], [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(ref["lo"], [3.0, 3.0, 0.0])
    f = Feeds("arg_q21")
    xi = f.input("x", v)
    f.verify([f.graph.argmax(xi, 1, name="hi"), f.graph.argmin(xi, 1, name="lo")])


# ------------------------------------------------------------------ Sort / ArgSort


@e2e_settings(6)
@given(dims=shapes, axis_pick=st.integers(0, 2), descending=st.booleans(), dtype=data_dtypes,
       nan=st.booleans(), seed=seeds)
def test_sort_and_argsort(dims: tuple[int, ...], axis_pick: int, descending: bool, dtype: DType, nan: bool,
                          seed: int) -> None:
    """Stable in both directions with many ties; NaN last."""
    rng = rng_for(seed)
    axis = axis_pick % len(dims)
    v = halves(rng, dims, dtype, -3, 3)
    if nan and dtype is DType.F32:
        v = sprinkle(rng, v, np.nan, np.inf, -np.inf, share=0.15)
    f = Feeds("sort")
    x = f.input("x", v, dtype)
    f.verify([f.graph.sort(x, axis, descending, name="values"), f.graph.argsort(x, axis, descending, name="order")])


def test_sort_is_stable_and_sorts_nan_last_section9_q22() -> None:
    g = Graph("sort_q22")
    x = g.input("x", [6], DType.F32)
    g.set_outputs([g.argsort(x, 0, descending=True, name="down"), g.argsort(x, 0, name="up")])
    v = np.array([2.0, np.nan, 1.0, 2.0, -np.inf, 1.0], np.float32)
    ref = evaluate(g, {"x": v})
    np.testing.assert_array_equal(ref["down"], [0, 3, 2, 5, 4, 1])
    np.testing.assert_array_equal(ref["up"], [4, 2, 5, 0, 3, 1])
    f = Feeds("sort_q22")
    xi = f.input("x", v)
    f.verify([f.graph.argsort(xi, 0, descending=True, name="down"), f.graph.argsort(xi, 0, name="up")])


def test_sort_refuses_lines_too_long_for_exact_tie_keys() -> None:
    g = Graph("long_sort")
    x = g.input("x", [1, 50000], DType.F32)
    g.set_outputs([g.argsort(x, 1, name="order")])
    with pytest.raises(UnsupportedOpError, match=r"ArgSort.*beyond 2\^31"):
        rlx_mil.convert(g, {}, target="iOS18")


def test_prefix_scan_covers_long_axes() -> None:
    """A 37-long axis takes 6 log-steps; the scan still equals the sequential one."""
    rng = rng_for(3)
    f = Feeds("long_scan")
    x = f.input("x", uniform(rng, (2, 37), 0.9, 1.1))
    f.verify([f.graph.cumprod(x, 1, name="p"), f.graph.cummax(x, 1, exclusive=True, name="m")])
