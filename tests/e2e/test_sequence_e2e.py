"""End-to-end: KvAppend and Roll (newest-only upstream ops, spec part 2 section 1.11) against
independent NumPy formulations, through the converted program, and through JSON."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, e2e_settings, normal, rng_for, seeds
from rlx_mil.errors import AttributeValueError, DTypeError, JsonVersionError, ShapeError
from rlx_mil.ir.graph import Graph
from rlx_mil.reference import evaluate


@st.composite
def kv_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int]:
    rank = draw(st.integers(1, 4))
    dims = tuple(draw(st.integers(1, 3)) for _ in range(rank))
    axis = draw(st.integers(0, rank - 1))
    capacity = draw(st.integers(1, 6))
    cache = (*dims[:axis], capacity, *dims[axis + 1:])
    return cache, axis, draw(st.integers(0, capacity - 1))


@e2e_settings(5)
@given(case=kv_cases(), seed=seeds)
def test_kv_append(case: tuple[tuple[int, ...], int, int], seed: int) -> None:
    cache_dims, axis, pos = case
    rng = rng_for(seed)
    f = Feeds("kv_append")
    cache_v = normal(rng, cache_dims)
    row_v = normal(rng, (*cache_dims[:axis], 1, *cache_dims[axis + 1:]))
    y = f.graph.kv_append(f.input("cache", cache_v), f.input("row", row_v), axis, pos, name="y")
    f.graph.set_outputs([y])
    # Written row by row: the cache after storing `row` at index pos, cut after that row.
    want = np.moveaxis(cache_v.copy(), axis, 0)
    want[pos] = np.moveaxis(row_v, axis, 0)[0]
    want = np.moveaxis(want[:pos + 1], 0, axis)
    np.testing.assert_array_equal(evaluate(f.graph, f.inputs, f.params)["y"], want)
    f.verify([y])


@st.composite
def roll_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], list[int], list[int]]:
    rank = draw(st.integers(1, 4))
    dims = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    pairs = draw(st.integers(0, 3))
    axes = [draw(st.integers(0, rank - 1)) for _ in range(pairs)]
    return dims, [draw(st.integers(-12, 12)) for _ in range(pairs)], axes


@e2e_settings(5)
@given(case=roll_cases(), seed=seeds)
def test_roll(case: tuple[tuple[int, ...], list[int], list[int]], seed: int) -> None:
    dims, shifts, axes = case
    rng = rng_for(seed)
    f = Feeds("roll")
    xv = normal(rng, dims)
    y = f.graph.roll(f.input("x", xv), shifts, axes, name="y")
    f.graph.set_outputs([y])
    want = xv
    for shift, axis in zip(shifts, axes, strict=True):
        n = xv.shape[axis]
        index = [(i - shift) % n for i in range(n)]  # out[i] = x[(i - k) mod n]
        want = np.take(want, index, axis=axis)
    np.testing.assert_array_equal(evaluate(f.graph, f.inputs, f.params)["y"], want)
    f.verify([y])


def test_kv_append_and_roll_json_are_newest_only() -> None:
    g = Graph("kv_json")
    cache, row = g.input("cache", [1, 5, 4]), g.input("row", [1, 1, 4])
    g.set_outputs([g.roll(g.kv_append(cache, row, 1, 2), [-1], [1], name="y")])
    text = g.to_json()
    assert '"KvAppend":{"axis":1,"pos":2}' in text and '"Roll":{"shifts":[-1],"dims":[1]}' in text
    again = Graph.from_json(text)
    assert again.json_version == "newest" and again.to_json() == text
    with pytest.raises(JsonVersionError, match=r"KvAppend does not exist in 0\.2\.2"):
        g.to_json(version="0.2.2")


def test_kv_append_shape_rule_names_the_broken_operand() -> None:
    g = Graph("kv_bad")
    cache = g.input("cache", [1, 4, 8])
    with pytest.raises(AttributeValueError, match="pos 4 is past the cache's axis-1 capacity 4"):
        g.kv_append(cache, g.input("row", [1, 1, 8]), 1, 4)
    with pytest.raises(ShapeError, match="one step") as err:
        g.kv_append(cache, g.input("row2", [1, 2, 8]), 1, 0)
    assert err.value.operand == "row"
    with pytest.raises(ShapeError, match="differs from the cache"):
        g.kv_append(cache, g.input("row3", [1, 1, 7]), 1, 0)
    with pytest.raises(DTypeError, match="row is F16"):
        g.kv_append(cache, g.input("row4", [1, 1, 8], "f16"), 1, 0)
    with pytest.raises(AttributeValueError, match=r"shifts \(1\) and dims \(2\) must pair up"):
        g.roll(cache, [1], [0, 1])
