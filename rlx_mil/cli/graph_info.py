"""Summaries of RLX graphs (what `rlx-mil inspect graph.json` prints): inputs, outputs,
params and the op histogram."""

from __future__ import annotations

import enum
import json
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from rlx_mil.errors import GraphFormatError
from rlx_mil.ir import Constant, Graph, Input, Param
from rlx_mil.ir.naming import output_names, state_outputs

#: Params listed one by one in the text summary; the rest are counted.
LISTED_PARAMS = 24


@dataclass
class GraphTensor:
    name: str
    shape: str


@dataclass
class GraphInfo:
    path: str | None
    name: str
    num_nodes: int
    inputs: list[GraphTensor]
    outputs: list[GraphTensor]
    params: list[GraphTensor]
    param_elements: int
    constants: int
    op_histogram: dict[str, int]

    def to_text(self) -> str:
        lines = [f"graph:    {self.name}" + (f" ({self.path})" if self.path else ""), f"nodes:    {self.num_nodes}", "inputs:"]
        lines += [f"  {t.name}: {t.shape}" for t in self.inputs]
        lines.append("outputs:")
        lines += [f"  {t.name}: {t.shape}" for t in self.outputs]
        lines.append(f"params:   {len(self.params)} ({self.param_elements:,} elements)")
        lines += [f"  {t.name}: {t.shape}" for t in self.params[:LISTED_PARAMS]]
        if len(self.params) > LISTED_PARAMS:
            lines.append(f"  ... and {len(self.params) - LISTED_PARAMS} more (--json lists all)")
        ops = sum(self.op_histogram.values())
        lines.append(f"ops:      {ops} (plus {self.constants} constants)")
        for op, n in sorted(self.op_histogram.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {op:<36} {n}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def graph_info(graph_or_path: Graph | str | os.PathLike[str]) -> GraphInfo:
    """The summary of a Graph, or of a graph JSON file (upstream RLX or rlx_mil)."""
    path: str | None = None
    if isinstance(graph_or_path, Graph):
        graph = graph_or_path
    else:
        p = Path(graph_or_path)
        if not p.is_file():
            raise GraphFormatError(f"{p}: no such graph JSON file")
        graph = Graph.from_json_file(p)
        path = str(p)
    histogram: Counter[str] = Counter()
    inputs, params = [], []
    constants = 0
    elements = 0
    seen_params: set[str] = set()
    seen_inputs: set[str] = set()
    for node in graph:
        op = node.op
        if isinstance(op, Input):
            if op.name not in seen_inputs:
                seen_inputs.add(op.name)
                inputs.append(GraphTensor(op.name, str(node.shape)))
        elif isinstance(op, Param):
            if op.name not in seen_params:
                seen_params.add(op.name)
                params.append(GraphTensor(op.name, str(node.shape)))
                elements += math.prod(d if isinstance(d, int) else 0 for d in _sizes(node.shape))
        elif isinstance(op, Constant):
            constants += 1
        else:
            histogram[op_label(op)] += 1
    outputs = [GraphTensor(name, str(graph.node(i).shape)) for name, i in zip(output_names(graph), graph.outputs, strict=True)]
    # Carried states are published as outputs too (see rlx_mil.ir.naming.state_outputs).
    outputs += [GraphTensor(s.name, str(graph.node(s.source).shape)) for s in state_outputs(graph)]
    return GraphInfo(path, graph.name, len(graph), inputs, outputs, params, elements, constants, dict(histogram))


def op_label(op: object) -> str:
    """`Binary(Add)`, `Activation(Silu)`, `Reduce(Sum)`...: the type name plus the kind for
    ops whose type covers several operations."""
    name = str(getattr(op, "type_name", type(op).__name__))
    kind = getattr(op, "kind", None) if name == "Activation" else getattr(op, "op", None)
    return f"{name}({kind.value})" if isinstance(kind, enum.Enum) else name


def _sizes(shape: object) -> tuple[int, ...]:
    try:
        return tuple(shape.sizes())  # type: ignore[attr-defined]
    except ValueError:
        return (0,)  # dynamic dims: size unknown
