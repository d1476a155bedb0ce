"""fp16's range on the compression check's inputs: the reference run the check makes anyway
also shows where a graph converted with precision='fp16' would leave fp16's range."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_mil.errors import Fp16OverflowWarning
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.naming import output_names, state_outputs
from rlx_mil.ir.ops import Input, Param
from rlx_mil.lowering.context import FP16_MAX
from rlx_mil.lowering.target import Precision


def reference_outputs(graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any], precision: Precision,
                      where: str) -> dict[str, np.ndarray]:
    """`rlx_mil.reference.evaluate(graph, inputs, params)`; for an fp16 conversion (of a graph
    without carried states) from one run of every node, warning (`warn_fp16_overflow`) where a
    value passes fp16's range."""
    from rlx_mil.reference import evaluate, evaluate_all

    if precision is not Precision.FP16 or state_outputs(graph):
        return evaluate(graph, inputs, params)
    values = evaluate_all(graph, inputs, params)
    warn_fp16_overflow(graph, values, where)
    return {name: values[i] for name, i in zip(output_names(graph), graph.outputs, strict=True)}


def warn_fp16_overflow(graph: Graph, values: Mapping[int, np.ndarray], where: str) -> str | None:
    """An `Fp16OverflowWarning` naming the first node (in graph order, weights and inputs aside)
    whose float value holds a finite magnitude above 65,504; returns its name (None: none)."""
    for node in graph:
        if isinstance(node.op, (Input, Param)):
            continue
        value = values.get(node.id)
        if value is None or value.dtype.kind != "f" or not value.size:
            continue
        finite = np.abs(value[np.isfinite(value)])
        peak = float(finite.max()) if finite.size else 0.0
        if peak > FP16_MAX:
            name = node.display_name
            warnings.warn(Fp16OverflowWarning(
                f"node {name!r} ({node.op.type_name}) reaches {peak:.4g} on {where}, past fp16's"
                f" {FP16_MAX:,.0f}: under precision='fp16' it becomes inf (likely NaN outputs); use precision='fp32'",
                op=name,
            ), stacklevel=4)
            return name
    return None
