"""Calibration inputs: activation statistics for activation-aware choices, and the measured
output error of the compressed weights.

`activation_importance` runs the float graph once with the NumPy reference on the calibration
inputs and, for every matmul weight, averages the square of each input feature of the
activation it multiplies, ``E[x_j^2]`` over all positions (AWQ's per-channel importance).
Weighting the weight error of input column j by it gives the expected relative error of the
layer's output: a weight whose error sits on outlier features counts as it will matter.
`output_errors` compares the reference on the dequantized weights (what the package computes
with) against the float weights on the same inputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import CompressionError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Param

#: matmul-like op -> (activation input, weight input).
_MATMULS = {"MatMul": (0, 1), "FusedMatMulBiasAct": (0, 1)}


def load_calibration(path: str | Path, graph: Graph) -> dict[str, np.ndarray]:
    """Calibration inputs from an .npz of the graph's inputs (token ids for a decoder)."""
    from rlx_mil.ir.ops import Input

    names = [n.op.name for n in graph if isinstance(n.op, Input)]
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            found = {k: np.asarray(data[k]) for k in data.files}
    except (OSError, ValueError) as err:
        raise CompressionError(f"calibration file {str(path)!r} is not a readable .npz ({err})") from None
    missing = [n for n in names if n not in found]
    if missing:
        raise CompressionError(f"calibration file {str(path)!r} lacks the graph's inputs {missing} (it has {sorted(found)})")
    return {n: found[n] for n in names}


def _weight_param(graph: Graph, node_id: int) -> str | None:
    node = graph.node(node_id)
    if isinstance(node.op, Param):
        return node.op.name
    if node.op.type_name == "Transpose" and tuple(getattr(node.op, "perm", ())) == (1, 0):
        inner = graph.node(node.inputs[0])
        return inner.op.name if isinstance(inner.op, Param) else None
    return None


def matmul_inputs(graph: Graph) -> Iterator[tuple[str, int]]:
    """(weight param name, activation node id) for every matmul of a weight in `graph`, in
    graph order."""
    for node in graph:
        ports = _MATMULS.get(node.op.type_name)
        if ports is None or len(node.inputs) <= ports[1]:
            continue
        name = _weight_param(graph, node.inputs[ports[1]])
        if name is not None:
            yield name, node.inputs[ports[0]]


def _matmul_activations(graph: Graph, values: Mapping[int, Any]) -> Iterator[tuple[str, int, np.ndarray]]:
    """(weight param name, activation node id, activation) for every matmul of a weight in
    `graph`, from one reference run's `values`."""
    for name, source in matmul_inputs(graph):
        act = values.get(source)
        if act is not None and act.ndim >= 1:
            yield name, source, act


def activation_importance(graph: Graph, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Param name -> E[x_j^2] of the activation each input column j of that matmul weight
    multiplies (averaged over its uses); float64 vectors of the weight's input width. Each
    activation is reduced as the run computes it (`rlx_mil.reference.evaluate_visiting`): the
    run never holds every value, nor the weights in float32 at once."""
    from rlx_mil.reference import evaluate_visiting

    readers: dict[int, list[str]] = {}
    for name, source in matmul_inputs(graph):
        readers.setdefault(source, []).append(name)
    sums: dict[str, np.ndarray] = {}
    uses: dict[str, int] = {}

    def visit(source: int, act: np.ndarray) -> None:
        if np.ndim(act) < 1:
            return
        x = np.asarray(act, np.float64).reshape(-1, act.shape[-1])
        stat = np.mean(x * x, axis=0)
        for name in readers[source]:
            if name in sums and sums[name].shape != stat.shape:
                continue
            sums[name] = sums.get(name, 0.0) + stat
            uses[name] = uses.get(name, 0) + 1

    evaluate_visiting(graph, inputs, params, readers, visit)
    return {n: s / uses[n] for n, s in sums.items()}


def input_activations(graph: Graph, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Param name -> the activation rows its matmul multiplies ([positions, input width],
    float32; a weight used by several matmuls of that width gets all their rows), from one
    float run of the reference on the calibration inputs. Weights that share an input share
    the array (q/k/v projections: one), so this holds about one model's activations, not one
    per weight: what error-compensating fits build their Hessians from."""
    from rlx_mil.reference import evaluate_all

    values = evaluate_all(graph, inputs, params)
    rows: dict[int, np.ndarray] = {}
    found: dict[str, list[np.ndarray]] = {}
    for name, source, act in _matmul_activations(graph, values):
        if source not in rows:
            rows[source] = np.asarray(act, np.float32).reshape(-1, act.shape[-1])
        x = rows[source]
        if found.get(name) and found[name][0].shape[1] != x.shape[1]:
            continue
        found.setdefault(name, []).append(x)
    del values
    return {n: xs[0] if len(xs) == 1 else np.concatenate(xs) for n, xs in found.items()}


#: Token positions of the generated check inputs when an input's sequence length is not fixed.
CHECK_TOKENS = 16


def example_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs the compression check generates for a graph when the user gave none: token ids
    drawn uniformly from the tables they index (deterministic, `seed`), an all-ones attention
    mask, zero token types, positions 0.., standard-normal floats (caches, pixels). Nothing is
    read or fetched: the check compares the model with itself."""
    from rlx_mil.input_contract import graph_input_ranges
    from rlx_mil.ir.ops import Input
    from rlx_mil.ir.shape import Static

    rng = np.random.default_rng(seed)
    ranges = graph_input_ranges(graph)
    feeds: dict[str, np.ndarray] = {}
    for node in graph:
        if not isinstance(node.op, Input):
            continue
        name = node.op.name
        shape = tuple(d.size if isinstance(d, Static) else CHECK_TOKENS for d in node.shape.dims)
        dtype = np.float32 if node.shape.dtype.is_float else np.int32
        if name in ranges:
            lo, hi = ranges[name]
            feeds[name] = rng.integers(lo, hi + 1, shape).astype(dtype)
        elif "mask" in name:
            feeds[name] = np.ones(shape, dtype)
        elif "position" in name and shape:
            feeds[name] = np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        elif node.shape.dtype.is_float:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[name] = np.zeros(shape, dtype)
    return feeds


def output_errors(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per output: max |error| and relative L2 error of `got` against `want`."""
    out = {}
    for key, ref in want.items():
        a = np.asarray(got[key], np.float64)
        b = np.asarray(ref, np.float64)
        diff = a - b
        norm = float(np.linalg.norm(b))
        out[key] = {
            "max_abs": float(np.max(np.abs(diff))) if diff.size else 0.0,
            "relative_l2": float(np.linalg.norm(diff) / norm) if norm > 0 else float(np.linalg.norm(diff)),
        }
    return out
