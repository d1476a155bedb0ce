"""Params given to a conversion checked against the graph's Param nodes, before any is read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_mil.errors import ParamError, UnsupportedOpError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.ops import Param
from rlx_mil.ir.shape import Shape
from rlx_mil.ir.values import BFLOAT16, numeric_kind, value_problem
from rlx_mil.lowering.registry import PARAM_LAYOUT_HOOKS


def static_sizes(shape: Shape, what: str) -> tuple[int, ...]:
    try:
        return shape.sizes()
    except ValueError:
        raise UnsupportedOpError(
            f"{what} has dynamic shape {shape}; bind every dynamic dim to a size before converting"
            " (convert(..., dims={symbol: size}) or Graph.bind)"
        ) from None


def _alternative_layout(graph: Graph, node: Node, arr: np.ndarray) -> bool:
    return any(hook(graph, node, arr) for hook in PARAM_LAYOUT_HOOKS)


#: Float dtypes as safetensors headers name them.
_STORED_FLOAT_DTYPES: dict[object, Any] = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": BFLOAT16}


def _param_metadata(params: Mapping[str, Any], name: str) -> tuple[tuple[int, ...], np.dtype[Any]] | None:
    """Shape and dtype of `params[name]` without reading its data, when the mapping can say
    (lazy checkpoint mappings offer `shape_of` / `dtype_of`); None when it cannot."""
    shape_of, dtype_of = getattr(params, "shape_of", None), getattr(params, "dtype_of", None)
    if not (callable(shape_of) and callable(dtype_of)):
        return None
    try:
        dtype = dtype_of(name)
        return tuple(int(s) for s in shape_of(name)), np.dtype(_STORED_FLOAT_DTYPES.get(dtype, dtype))
    except Exception:  # metadata in a form NumPy does not name: read the tensor instead
        return None


def check_params(graph: Graph, params: Mapping[str, Any], live: set[int]) -> Mapping[str, Any]:
    """Every Param the outputs need must be given with its declared shape and a compatible
    dtype; extra names are errors too. Every problem is listed at once. Returns `params`: the
    float tensors of a lazy mapping are checked from its metadata and read later, one at a
    time, as the lowering turns each into a const."""
    if not isinstance(params, Mapping):
        raise ParamError(f"params must map Param names to arrays, got {type(params).__name__}")
    wanted: dict[str, Node] = {}
    problems: list[str] = []
    for n in graph:
        if not isinstance(n.op, Param):
            continue
        first = wanted.setdefault(n.op.name, n)
        if first.shape != n.shape:
            # Same-named Params are one weight: both nodes get the same array.
            problems.append(
                f"param {n.op.name!r}: declared twice with different shapes (node %{first.id} {first.shape},"
                f" node %{n.id} {n.shape})"
            )
    for name in sorted(set(params) - set(wanted), key=repr):
        problems.append(f"param {name!r}: not a Param of graph {graph.name!r}")
    for name, node in wanted.items():
        if name not in params:
            if node.id in live:
                problems.append(f"param {name!r}: missing (node %{node.id}, shape {node.shape})")
            continue
        declared = node.shape.dtype
        meta = _param_metadata(params, name) if declared.is_float else None
        if meta is None:
            try:
                arr = np.asarray(params[name])
            except Exception as err:  # any array-like failure is the caller's input problem
                problems.append(f"param {name!r}: not convertible to an array ({err})")
                continue
        else:  # a float tensor's dtype is all the checks below need of it
            arr = np.empty((0,), dtype=meta[1])
        shape = arr.shape if meta is None else meta[0]
        if numeric_kind(arr.dtype) is None:
            problems.append(f"param {name!r}: {type(params[name]).__name__} value of dtype {arr.dtype} is not a numeric array")
            continue
        want = static_sizes(node.shape, f"param {name!r}")
        if shape != want:
            if _alternative_layout(graph, node, arr if meta is None else np.asarray(params[name])):
                continue
            problems.append(f"param {name!r}: shape {shape} does not match the declared {list(want)}")
            continue
        problem = value_problem(arr, declared)
        if problem is None and declared in (DType.I64, DType.U32):
            narrowed = value_problem(arr, DType.I32)
            if narrowed is not None:
                problem = f"{narrowed}: Core ML holds {declared.value} tensors as int32"
        if problem is not None and not _alternative_layout(graph, node, arr):
            problems.append(f"param {name!r}: {problem}")
            continue
    if problems:
        raise ParamError(f"params do not match graph {graph.name!r}", problems)
    return params
