"""A graph run computed on demand, node by node, reading each float weight at its use.

`StepwiseRun(graph, inputs, params, targets).value(node_id)` computes the ancestors of one
target node that are not yet computed, in graph order, and returns its value. Between two calls
the caller may change what `params` gives for a weight no computed node has read yet: the next
nodes read the new value. That is what fitting each weight to the activations of the
already-encoded weights before it needs (GPTQ's order, `rlx_mil.compress.sequential`): ask for
the input of the first matmul, encode its weights, ask for the next input, and so on; one pass
over the graph in all, never a second run of what is already computed.

Only the targets' ancestors run (a decoder's logits, whose head feeds no target, are never
computed), and a value is let go once every node of the run that uses it has run and it is not
a target still to be asked for. `params` should tell shapes and dtypes without reading
(`rlx_mil.reference.overlay.OverlaidParams` does): its float weights are then read at each use
and never held, and the value read is the one it gives at that moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from rlx_mil.errors import EvaluationError
from rlx_mil.ir.graph import Graph
from rlx_mil.reference.interpreter import _bind_feeds, _check_arguments, _needed, _read_param, _run_node


class StepwiseRun:
    """`graph` run on `inputs` / `params` as far as the `targets` (node ids) need, on demand."""

    def __init__(self, graph: Graph, inputs: Mapping[str, Any], params: Mapping[str, Any], targets: Iterable[int]) -> None:
        _check_arguments(graph, inputs, params)
        self._graph = graph
        self._params = params
        self._targets = set(targets)
        self._deferred: dict[int, str] = {}
        self._feeds, self._bindings = _bind_feeds(graph, inputs, params, self._deferred)
        needed = _needed(graph, self._targets)
        self._position = {node.id: k for k, node in enumerate(n for n in graph if n.id in needed)}
        #: Uses still to run of each value, counted over the nodes the targets need.
        self._pending: dict[int, int] = {}
        for node_id in needed:
            for i in graph.node(node_id).inputs:
                self._pending[i] = self._pending.get(i, 0) + 1
        self._values: dict[int, np.ndarray] = {}
        self._computed: set[int] = set()
        self._taken: set[int] = set()

    def value(self, target: int) -> np.ndarray:
        """The value of node `target` (one of the targets), computing what it needs and is not
        computed yet. A target asked for after a node that uses it ran (asked out of graph
        order) is an error: its value was computed with the params of that time."""
        if target not in self._targets:
            raise EvaluationError(f"node %{target} is not a target of this run")
        if target in self._computed and target not in self._values:
            raise EvaluationError(f"node %{target} was let go: targets are asked for in graph order")
        todo: set[int] = set()
        stack = [target]
        while stack:
            node_id = stack.pop()
            if node_id in todo or node_id in self._computed:
                continue
            todo.add(node_id)
            stack.extend(self._graph.node(node_id).inputs)
        for node_id in sorted(todo, key=self._position.__getitem__):
            self._run(node_id)
        self._taken.add(target)
        out = self._values[target]
        if self._pending.get(target, 0) == 0:
            del self._values[target]
        return out

    def _run(self, node_id: int) -> None:
        node = self._graph.node(node_id)
        self._computed.add(node_id)
        if node_id in self._deferred:  # a float weight: read at each use instead
            return
        if node_id in self._feeds:
            self._values[node_id] = self._feeds.pop(node_id)
            return
        read = {i: _read_param(self._graph.node(i), self._deferred[i], self._params) for i in node.inputs if i in self._deferred}
        self._values[node_id] = _run_node(node, [read[i] if i in read else self._values[i] for i in node.inputs], self._bindings)
        del read
        for i in node.inputs:
            self._pending[i] -= 1
            if self._pending[i] == 0 and (i not in self._targets or i in self._taken):
                self._values.pop(i, None)
