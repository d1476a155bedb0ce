"""JSON interchange with upstream RLX (spec section 2).

Upstream serialises `rlx_ir::Graph` with serde's derived form and `serde_json`: externally
tagged enums, `Option` as value-or-null, `Vec<u8>` as an array of byte values and `f32` in
ryu's shortest round-trip spelling. `rlx_mil.ir.serde` reads and writes exactly that form, so
a graph loaded from an upstream file is written back byte for byte.

Reading treats the text as untrusted: every defect raises
:class:`~rlx_mil.errors.GraphFormatError` whose message starts with the JSON path at fault,
and sizes are checked against :class:`JsonLimits` before anything proportional to them is
built.
"""

from __future__ import annotations

import os

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.serde.f32 import format_f32, parse_f32
from rlx_mil.ir.serde.forms import OP_FORMS
from rlx_mil.ir.serde.reader import DEFAULT_LIMITS, JsonLimits, decode_graph, decode_graph_file
from rlx_mil.ir.serde.versions import NEWEST, V0_2_2, VERSIONS

__all__ = [
    "DEFAULT_LIMITS",
    "NEWEST",
    "OP_FORMS",
    "V0_2_2",
    "VERSIONS",
    "JsonLimits",
    "format_f32",
    "graph_from_json",
    "graph_from_json_file",
    "graph_to_json",
    "graph_to_json_file",
    "parse_f32",
]


def graph_from_json(text: str | bytes, *, limits: JsonLimits = DEFAULT_LIMITS) -> Graph:
    """Load a graph from upstream RLX's serde JSON (compact or pretty).

    Every node goes through :meth:`Graph.add_node`, so the IR checks apply. Any defect
    raises :class:`GraphFormatError` naming the JSON path at fault.
    """
    return decode_graph(text, Graph, limits)


def graph_from_json_file(path: str | os.PathLike[str], *, limits: JsonLimits = DEFAULT_LIMITS) -> Graph:
    """Load a graph from a JSON file (regular files only, read through a bounded reader)."""
    return decode_graph_file(path, Graph, limits)


def graph_to_json(graph: Graph, *, indent: int | None = None, version: str | None = None) -> str:
    """Serialize exactly as upstream's serde_json would.

    `indent=None` gives `serde_json::to_string`'s compact form; an int gives
    `to_string_pretty`'s layout with that many spaces (upstream uses 2). Values upstream
    cannot represent (non-finite floats, out-of-range integers, payloads not matching their
    shape) raise GraphFormatError naming the node and field. `version` ("0.2.2" or "newest")
    as for :meth:`Graph.to_json`.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"expected a Graph, got {type(graph).__name__}")
    return graph.to_json(indent=indent, version=version)


def graph_to_json_file(
    graph: Graph, path: str | os.PathLike[str], *, indent: int | None = None, version: str | None = None
) -> None:
    """Write `graph_to_json(graph, indent=indent, version=version)` as UTF-8 with a final newline."""
    if not isinstance(graph, Graph):
        raise TypeError(f"expected a Graph, got {type(graph).__name__}")
    graph.to_json_file(path, indent=indent, version=version)
