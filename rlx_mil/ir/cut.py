"""Cutting a graph into consecutive subgraphs at layer boundaries (chunked packages,
docs/deploying.md).

The cut is structural, for any decoder graph, whatever its family:

* The *data* nodes are the ones that depend on a data Input (the token ids and the per-layer
  state Inputs the caller names); every other node (Params, Constants, RoPE tables gathered
  at the positions, masks built from position Inputs, transposed weights) is *context*: it is
  copied into every piece that uses it, so no piece ever receives it from another.
* A Param belongs to a *layer* by its name: the prefix up to the first numeric path segment
  (`model.layers.3.mlp.up_proj.weight` -> `model.layers.3`); Params without one (embeddings,
  final norm, LM head, RoPE tables) belong to no layer.
* A *layer boundary* is a point in the order of the data nodes with a layer wholly before it,
  a layer wholly after it and no layer's data nodes on both sides; between two layers the
  point where the fewest data values cross is taken (the residual stream alone, in a
  transformer).
* A piece is the data nodes between two chosen boundaries, the context they need and one
  Input per data value an earlier piece computes (named after the node); the values later
  pieces read become outputs after the piece's own graph outputs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from itertools import pairwise

from rlx_mil.errors import GraphError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.naming import mil_identifiers
from rlx_mil.ir.ops import Constant, Input, Param

#: The layer a Param belongs to: its name up to the first numeric path segment.
LAYER_KEY = re.compile(r"^(.*?(?:^|\.)\d+)\.")


def constant_key(node_id: int) -> str:
    """How a Constant node stands among a segment's Params (it is stored in the package too)."""
    return f"%{node_id}"


def layer_of(param_name: str) -> str | None:
    """`model.layers.3.mlp.up_proj.weight` -> `model.layers.3`; None for names without a layer."""
    match = LAYER_KEY.match(param_name)
    return match.group(1) if match else None


@dataclass(frozen=True)
class Segment:
    """Data nodes between two consecutive layer boundaries (the first segment also holds what
    comes before the first layer, the last one what comes after the last)."""

    #: Layer keys of the segment's Params, in graph order.
    layers: tuple[str, ...]
    #: Its data nodes (ids, graph order; data Inputs not included).
    nodes: tuple[int, ...]
    #: Every Param its nodes read (directly or through context nodes), and its Constants as
    #: `constant_key(id)`.
    params: frozenset[str]

    @property
    def label(self) -> str:
        return ", ".join(self.layers) if self.layers else "(no layer)"


@dataclass(frozen=True)
class Piece:
    """One subgraph of a cut and how it connects to the others."""

    graph: Graph
    #: Inputs carrying values an earlier piece computes: name -> index of the producing piece.
    received: dict[str, int]
    #: Outputs later pieces read (after the graph's own outputs).
    passed: tuple[str, ...]
    #: The Params it reads.
    params: frozenset[str]


@dataclass
class _Analysis:
    data: list[bool]
    order: list[int]  # data nodes (not Inputs), graph order
    own_params: dict[int, frozenset[str]]  # data node -> Params it reads through context nodes


def _analyse(graph: Graph, data_inputs: Collection[str]) -> _Analysis:
    nodes = graph.nodes
    names = {n.op.name for n in nodes if isinstance(n.op, Input)}
    missing = sorted(set(data_inputs) - names)
    if missing:
        raise GraphError(f"graph {graph.name!r} has no Input named {', '.join(map(repr, missing))} to cut along")
    data = [False] * len(nodes)
    context_params: list[frozenset[str]] = [frozenset()] * len(nodes)
    own: dict[int, frozenset[str]] = {}
    for node in nodes:
        if isinstance(node.op, Input):
            data[node.id] = node.op.name in data_inputs
            continue
        if isinstance(node.op, Param):
            context_params[node.id] = frozenset({node.op.name})
            continue
        if isinstance(node.op, Constant):
            context_params[node.id] = frozenset({constant_key(node.id)})
            continue
        if any(data[i] for i in node.inputs):
            data[node.id] = True
            own[node.id] = frozenset().union(*(context_params[i] for i in node.inputs if not data[i]))
        elif node.inputs:
            context_params[node.id] = frozenset().union(*(context_params[i] for i in node.inputs))
    order = [n.id for n in nodes if data[n.id] and not isinstance(n.op, Input)]
    return _Analysis(data, order, own)


def _crossings(graph: Graph, analysis: _Analysis) -> list[int]:
    """crossing[j]: data values (and data Inputs) used on both sides of the cut before order[j]."""
    pos = {node_id: k for k, node_id in enumerate(analysis.order)}
    m = len(analysis.order)
    diff = [0] * (m + 2)
    users = graph.consumers()
    for node in graph:
        if not analysis.data[node.id]:
            continue
        used = [pos[u] for u in users[node.id] if u in pos]
        if not used:
            continue
        first = pos[node.id] if node.id in pos else min(used)
        last = max(used)
        if last > first:  # crosses every cut j with first < j <= last
            diff[first + 1] += 1
            diff[last + 1] -= 1
    crossing, running = [0] * (m + 1), 0
    for j in range(m + 1):
        running += diff[j]
        crossing[j] = running
    return crossing


def layer_segments(graph: Graph, data_inputs: Collection[str]) -> list[Segment]:
    """The graph's data nodes split at every layer boundary (see the module docstring); one
    segment when the graph has fewer than two layers."""
    analysis = _analyse(graph, data_inputs)
    order = analysis.order
    spans: dict[str, list[int]] = {}
    for k, node_id in enumerate(order):
        for key in filter(None, map(layer_of, analysis.own_params[node_id])):
            span = spans.setdefault(key, [k, k])
            span[1] = k
    crossing = _crossings(graph, analysis)
    inside = [0] * (len(order) + 2)
    for first, last in spans.values():
        inside[first + 1] += 1
        inside[last + 1] -= 1
    ends = sorted(last for _first, last in spans.values())
    starts = sorted(first for first, _last in spans.values())
    best: dict[int, int] = {}  # layers wholly before the cut -> best cut
    running = 0
    for j in range(1, len(order)):
        running += inside[j]
        before = sum(1 for e in ends if e < j)
        after = sum(1 for s in starts if s >= j)
        if running or not before or not after:
            continue
        if before not in best or crossing[j] <= crossing[best[before]]:
            best[before] = j
    cuts = [0, *sorted(best.values()), len(order)]
    segments = []
    for a, b in pairwise(cuts):
        ids = tuple(order[a:b])
        params = frozenset().union(*(analysis.own_params[i] for i in ids))
        keys = dict.fromkeys(key for i in ids for key in sorted(filter(None, map(layer_of, analysis.own_params[i]))))
        segments.append(Segment(tuple(keys), ids, params))
    return segments


def cut_graph(
    graph: Graph, data_inputs: Collection[str], groups: Sequence[int], *, shared_inputs: Collection[str] = (),
) -> list[Piece]:
    """`graph` cut into `len(groups)` pieces, piece i holding the next `groups[i]` segments of
    `layer_segments(graph, data_inputs)`. A data Input used by two pieces is an error unless it
    is in `shared_inputs` (the token ids may be read by every piece; a state may not)."""
    segments = layer_segments(graph, data_inputs)
    if sum(groups) != len(segments) or any(g < 1 for g in groups):
        raise GraphError(
            f"graph {graph.name!r}: {len(segments)} layer segments cannot be grouped as {list(groups)}"
        )
    analysis = _analyse(graph, data_inputs)
    piece_of: dict[int, int] = {}
    at = 0
    for p, count in enumerate(groups):
        for segment in segments[at:at + count]:
            piece_of.update(dict.fromkeys(segment.nodes, p))
        at += count
    users = graph.consumers()
    outputs = list(graph.outputs)
    for out in outputs:
        if out not in piece_of and analysis.data[out]:
            raise GraphError(f"graph {graph.name!r}: output %{out} is a data Input; a cut graph cannot pass it through",
                             node=out)
    # Names of the values passed between pieces (unique, legal, clear of the graph's Inputs).
    taken = {n.op.name for n in graph if isinstance(n.op, Input)}
    crossing = sorted({i for n, p in piece_of.items() for i in graph.node(n).inputs
                       if i in piece_of and piece_of[i] != p})
    names = mil_identifiers([graph.node(i).name or f"value_{i}" for i in crossing], taken)
    passed_name = {i: names[graph.node(i).name or f"value_{i}"] for i in crossing}
    last = len(groups) - 1
    pieces = []
    for p in range(len(groups)):
        mine = [n for n, q in piece_of.items() if q == p]
        received = sorted({i for n in mine for i in graph.node(n).inputs if i in piece_of and piece_of[i] != p})
        own_outputs = [o for o in outputs if piece_of.get(o, last) == p]
        needed: set[int] = set()
        stack = [*mine, *own_outputs]
        while stack:
            node_id = stack.pop()
            if node_id in needed:
                continue
            needed.add(node_id)
            if node_id in piece_of and piece_of[node_id] != p:
                continue  # received as an Input
            stack.extend(graph.node(node_id).inputs)
        for node in graph:
            if node.id in needed and isinstance(node.op, Input) and analysis.data[node.id] \
                    and node.op.name not in shared_inputs:
                readers = {piece_of[u] for u in users[node.id] if u in piece_of}
                if len(readers) > 1:
                    raise GraphError(
                        f"graph {graph.name!r}: Input {node.op.name!r} is read on both sides of a layer boundary"
                        f" (pieces {sorted(readers)}), so no cut can keep it in one piece",
                        node=node.id, op="Input", name=node.op.name,
                    )
        later = {i for n, q in piece_of.items() if q > p for i in graph.node(n).inputs}
        passed = [n for n in mine if n in passed_name and n in later]
        sub = Graph(f"{graph.name}_part{p}")
        new_id: dict[int, int] = {}
        for i in received:
            new_id[i] = sub.add_node(Input(passed_name[i]), [], graph.node(i).shape, name=passed_name[i])
        for node in graph:
            if node.id not in needed or node.id in new_id:
                continue
            name = passed_name.get(node.id, node.name)
            new_id[node.id] = sub.add_node(node.op, [new_id[i] for i in node.inputs], node.shape, name=name,
                                           origin=node.origin)
        sub.set_outputs([new_id[o] for o in own_outputs] + [new_id[n] for n in passed])
        params = frozenset(graph.node(n).op.name for n in needed  # type: ignore[attr-defined]
                           if isinstance(graph.node(n).op, Param))
        pieces.append(Piece(sub, {passed_name[i]: piece_of[i] for i in received},
                            tuple(passed_name[n] for n in passed), params))
    return pieces
