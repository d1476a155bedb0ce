"""Lowering of Rope (NeoX rotate-half, spec 8.7): layouts, partial rotation, table rows and
broadcast, tables as Params or graph Inputs, every target and precision."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.shape import Shape

from .conftest import convert_and_cleanup, emitted_ops
from .test_norm import PRECISIONS, TARGETS, TOL, as_program_input, run_model


def ref_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int) -> np.ndarray:
    """Spec 8.7, in float64; a 1-row table serves every position."""
    h = n_rot // 2
    seq = x.shape[2] if x.ndim == 4 else x.shape[-2]
    c = cos.reshape(-1, cos.shape[-1])[:, :h]
    s = sin.reshape(-1, sin.shape[-1])[:, :h]
    if c.shape[0] == 1:
        c, s = np.repeat(c, seq, 0), np.repeat(s, seq, 0)
    c, s = c[:seq], s[:seq]
    if x.ndim == 4:
        heads, c, s = x, c[None, None], s[None, None]
    else:
        heads, c, s = x.reshape((*x.shape[:-1], -1, head_dim)), c[:, None, :], s[:, None, :]
    out = heads.copy()
    x1, x2 = heads[..., :h], heads[..., h : 2 * h]
    out[..., :h] = x1 * c - x2 * s
    out[..., h : 2 * h] = x2 * c + x1 * s
    return out.reshape(x.shape)


def build_rope(
    x_shape: tuple[int, ...], head_dim: int, n_rot: int, table_shape: tuple[int, ...], tables_as_params: bool
) -> Graph:
    g = Graph("rope")
    x = g.add_node(ops.Input("x"), [], Shape.of(x_shape), name="x")
    leaf = ops.Param if tables_as_params else ops.Input
    cos = g.add_node(leaf("cos"), [], Shape.of(table_shape), name="cos")
    sin = g.add_node(leaf("sin"), [], Shape.of(table_shape), name="sin")
    y = g.add_node(ops.Rope(head_dim, n_rot), [x, cos, sin], Shape.of(x_shape), name="y")
    g.set_outputs([y])
    return g


def rope_tables(positions: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """The usual tables: cos/sin(p * base^(-2i/head_dim)), [P, head_dim/2]."""
    inv = base ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    angles = np.arange(positions)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def convert_run_rope(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int, tables_as_params: bool,
    target: str, precision: str,
) -> tuple[np.ndarray, list[str]]:
    graph = build_rope(x.shape, head_dim, n_rot, cos.shape, tables_as_params)
    tables = {"cos": cos, "sin": sin}
    params = tables if tables_as_params else {}
    feeds = {"x": x} if tables_as_params else {"x": x, **tables}
    model = convert_and_cleanup(graph, params, target=target, precision=precision)
    return run_model(model, feeds)["y"], emitted_ops(model)


def check_rope(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int, tables_as_params: bool,
    target: str, precision: str,
) -> tuple[np.ndarray, list[str]]:
    y, emitted = convert_run_rope(x, cos, sin, head_dim, n_rot, tables_as_params, target, precision)
    want = ref_rope(*(as_program_input(a, precision) for a in (x, cos, sin)), head_dim, n_rot)
    assert y.shape == x.shape
    np.testing.assert_allclose(y, want, **TOL[precision])
    return y, emitted


LAYOUTS = {
    "rank2": ((5, 12), 4),  # [S, H*D]
    "rank3": ((2, 5, 12), 4),  # [B, S, H*D]
    "rank4": ((2, 3, 5, 4), 4),  # [B, H, S, D]
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rope_every_layout_target_precision(layout: str, target: str, precision: str) -> None:
    shape, head_dim = LAYOUTS[layout]
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    cos, sin = rope_tables(9, head_dim)  # P = 9 > S = 5: rows 0..4 are used
    _, emitted = check_rope(x, cos, sin, head_dim, head_dim, True, target, precision)
    assert "split" in emitted and "concat" in emitted
    # Param tables are sliced at conversion: no runtime slicing
    assert "slice_by_index" not in emitted


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rope_tables_as_graph_inputs_are_sliced_at_run_time(precision: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 4, 16)).astype(np.float32)
    cos, sin = rope_tables(10, 8)
    _, emitted = check_rope(x, cos, sin, 8, 8, False, "iOS16", precision)
    assert emitted.count("slice_by_index") == 2


@pytest.mark.parametrize("tables_as_params", [True, False], ids=["param", "input"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rope_partial_rotation_copies_the_tail(layout: str, tables_as_params: bool) -> None:
    shape, _ = LAYOUTS[layout]
    head_dim = 8 if layout == "rank4" else 6
    shape = (*shape[:-1], 8) if layout == "rank4" else (*shape[:-1], 12)
    rng = np.random.default_rng(2)
    x = rng.normal(size=shape).astype(np.float32)
    cos, sin = rope_tables(5, head_dim)
    n_rot = 4
    y, _ = check_rope(x, cos, sin, head_dim, n_rot, tables_as_params, "iOS17", "fp32")
    heads = y if layout == "rank4" else y.reshape((*shape[:-1], -1, head_dim))
    src = x if layout == "rank4" else x.reshape((*shape[:-1], -1, head_dim))
    np.testing.assert_array_equal(heads[..., n_rot:], src[..., n_rot:])


@pytest.mark.parametrize("tables_as_params", [True, False], ids=["param", "input"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rope_single_row_table_broadcasts(layout: str, tables_as_params: bool) -> None:
    """Decode passes the current position's row only ([1, D/2]); it applies to every token."""
    shape, head_dim = LAYOUTS[layout]
    rng = np.random.default_rng(3)
    x = rng.normal(size=shape).astype(np.float32)
    cos, sin = rope_tables(40, head_dim)
    row_cos, row_sin = cos[37:38], sin[37:38]
    check_rope(x, row_cos, row_sin, head_dim, head_dim, tables_as_params, "iOS18", "fp16")


def test_rope_identity_when_nothing_rotates() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    cos, sin = rope_tables(3, 4)
    y, emitted = convert_run_rope(x, cos, sin, 4, 0, True, "iOS15", "fp32")
    np.testing.assert_array_equal(y, x)
    assert "mul" not in emitted


@given(
    layout=st.sampled_from(["rank2", "rank3", "rank4"]),
    batch=st.integers(1, 2),
    heads=st.integers(1, 3),
    seq=st.integers(1, 5),
    half_dim=st.integers(1, 4),
    rot_frac=st.integers(0, 4),
    extra_rows=st.sampled_from([0, 3, "single"]),
    tables_as_params=st.booleans(),
    precision=st.sampled_from(PRECISIONS),
    target=st.sampled_from(TARGETS),
    seed=st.integers(0, 2**16),
)
def test_rope_matches_spec(
    layout: str, batch: int, heads: int, seq: int, half_dim: int, rot_frac: int, extra_rows: int | str,
    tables_as_params: bool, precision: str, target: str, seed: int,
) -> None:
    head_dim = 2 * half_dim
    n_rot = 2 * max(1, (half_dim * rot_frac + 3) // 4)
    shape = {
        "rank2": (seq, heads * head_dim),
        "rank3": (batch, seq, heads * head_dim),
        "rank4": (batch, heads, seq, head_dim),
    }[layout]
    rows = 1 if extra_rows == "single" else seq + int(extra_rows)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32)
    cos = rng.uniform(-1, 1, (rows, half_dim)).astype(np.float32)
    sin = rng.uniform(-1, 1, (rows, half_dim)).astype(np.float32)
    check_rope(x, cos, sin, head_dim, n_rot, tables_as_params, target, precision)


# ---------------------------------------------------------------------------------- rejected graphs


def _rope_graph_with(op: ops.Rope, x_shape: tuple[int, ...], table_shape: tuple[int, ...]) -> Graph:
    """A Rope node whose attributes/inputs bypass the builder's checks (swapped in afterwards),
    so the lowering's own checks are what is exercised."""
    g = Graph("bad")
    x = g.add_node(ops.Input("x"), [], Shape.of(x_shape), name="x")
    cos = g.add_node(ops.Input("cos"), [], Shape.of(table_shape), name="cos")
    sin = g.add_node(ops.Input("sin"), [], Shape.of(table_shape), name="sin")
    y = g.add_node(ops.Reshape(x_shape), [x], Shape.of(x_shape), name="y")
    g._nodes[y] = dataclasses.replace(g.node(y), op=op, inputs=(x, cos, sin))
    g.set_outputs([y])
    return g


@pytest.mark.parametrize(
    ("op", "x_shape", "table_shape", "error", "match"),
    [
        (ops.Rope(4, 3), (2, 8), (2, 2), AttributeValueError, "n_rot"),
        (ops.Rope(4, 6), (2, 8), (2, 2), AttributeValueError, "n_rot"),
        (ops.Rope(3, 2), (2, 8), (2, 1), ShapeError, "multiple of head_dim"),
        (ops.Rope(4, 4), (1, 2, 3, 8), (3, 2), ShapeError, "rank-4"),
        (ops.Rope(4, 4), (4, 8), (3, 2), ShapeError, "rows"),
        (ops.Rope(4, 4), (2, 8), (2, 1), ShapeError, "n_rot/2"),
        (ops.Rope(4, 4), (8,), (2, 2), ShapeError, "rank 2, 3 or 4"),
    ],
)
def test_rope_rejects(op: ops.Rope, x_shape: tuple[int, ...], table_shape: tuple[int, ...], error: type, match: str) -> None:
    graph = _rope_graph_with(op, x_shape, table_shape)
    with pytest.raises(error, match=match) as info:
        convert_and_cleanup(graph, {}, target="iOS17", precision="fp32")
    assert info.value.node is not None and info.value.op == "Rope"
