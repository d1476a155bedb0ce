"""Small helpers for building test graphs with explicit declared shapes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlx_mil.ir import DType, Graph, Shape
from rlx_mil.ir.ops import Input, Op, Param
from rlx_mil.ir.shape import DimLike
from rlx_mil.reference import evaluate, kernel_for


def shape(dims: Sequence[DimLike], dtype: DType | str = DType.F32) -> Shape:
    return Shape.of(dims, dtype)


def dtype_of(a: np.ndarray) -> DType:
    return DType.parse(a.dtype)


def run_op(
    op: Op,
    arrays: Sequence[np.ndarray],
    out_dims: Sequence[DimLike],
    out_dtype: DType | str = DType.F32,
    dtypes: Sequence[DType | str | None] | None = None,
) -> np.ndarray:
    """Evaluate one op through a whole graph: every operand is an Input named i0, i1, ..."""
    g = Graph("one_op")
    ids = []
    feeds: dict[str, np.ndarray] = {}
    for pos, a in enumerate(arrays):
        dt = (dtypes[pos] if dtypes is not None else None) or dtype_of(np.asarray(a))
        name = f"i{pos}"
        ids.append(g.add_node(Input(name), [], shape(np.shape(a), dt), name=name))
        feeds[name] = np.asarray(a)
    out = g.add_node(op, ids, shape(out_dims, out_dtype), name="out")
    g.set_outputs([out])
    return evaluate(g, feeds)["out"]


def run_kernel(op: Op, arrays: Sequence[np.ndarray], out_dims: Sequence[DimLike], out_dtype: DType | str = DType.F32) -> np.ndarray:
    """Call the registered kernel directly (bypasses graph-level shape inference)."""
    return kernel_for(op)(op, [np.asarray(a) for a in arrays], shape(out_dims, out_dtype))


def graph_with_params(
    op: Op,
    inputs: Mapping[str, np.ndarray],
    params: Mapping[str, np.ndarray],
    order: Sequence[str],
    out_dims: Sequence[DimLike],
    out_dtype: DType | str = DType.F32,
) -> np.ndarray:
    """Evaluate one op whose operands (in `order`) are Inputs or Params by name."""
    g = Graph("one_op")
    ids = []
    for name in order:
        arr = np.asarray(inputs[name] if name in inputs else params[name])
        leaf: Op = Input(name) if name in inputs else Param(name)
        ids.append(g.add_node(leaf, [], shape(arr.shape, dtype_of(arr)), name=name))
    out = g.add_node(op, ids, shape(out_dims, out_dtype), name="out")
    g.set_outputs([out])
    return evaluate(g, inputs, params)["out"]


def assert_product_close(y: np.ndarray, x: np.ndarray, w: np.ndarray, rel: float = 1e-5) -> None:
    """`y` equals `x @ w` (float64) within `rel` of the summed term magnitudes, the error bound
    of a float32 dot product with cancellation."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    want = x64 @ w64
    bound = rel * (np.abs(x64) @ np.abs(w64) + 1e-30)
    excess = np.abs(np.asarray(y, np.float64) - want) - bound
    assert np.all(excess <= 0), f"max excess {excess.max()} at {np.unravel_index(excess.argmax(), excess.shape)}"
