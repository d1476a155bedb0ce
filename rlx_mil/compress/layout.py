"""How a weight Param is held by the lowering: the uses of a Param (looking through the
Transpose that feeds an [out, in] checkpoint weight to a MatMul) and the storage layout the
compressor plans for it ("kn": a [K, N] matmul weight held as the [N, K] `linear` weight)."""

from __future__ import annotations

from collections.abc import Mapping

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Param

_MATMUL_WEIGHT = {"MatMul": (1,), "FusedMatMulBiasAct": (1,), "LoraMatMul": (1, 2, 3)}


def _is_axis_swap(graph: Graph, node_id: int) -> bool:
    node = graph.node(node_id)
    return node.op.type_name == "Transpose" and tuple(getattr(node.op, "perm", ())) == (1, 0)


def _uses(graph: Graph, node_id: int, users: Mapping[int, list[int]]) -> list[tuple[int, int, bool]]:
    """(user node, input position, through a 2-D transpose) for each use of a Param node; a
    Transpose swapping a matrix's axes (how [out, in] checkpoint weights feed MatMul) is looked
    through."""
    out = []
    for user_id in users.get(node_id, []):
        if _is_axis_swap(graph, user_id):
            out += [(u, p, True) for u in users.get(user_id, []) for p, i in enumerate(graph.node(u).inputs) if i == user_id]
            continue
        out += [(user_id, p, False) for p, i in enumerate(graph.node(user_id).inputs) if i == node_id]
    return out


def _matmul_weight_only(graph: Graph, name: str, users: Mapping[int, list[int]]) -> bool:
    """Whether every use of the Param `name` is the weight of a matmul (through a transpose or not)."""
    uses = [u for n in graph if isinstance(n.op, Param) and n.op.name == name for u in _uses(graph, n.id, users)]
    return bool(uses) and all(p in _MATMUL_WEIGHT.get(graph.node(u).op.type_name, ()) for u, p, _ in uses)


def _user_map(graph: Graph) -> dict[int, list[int]]:
    users: dict[int, list[int]] = {}
    for node in graph:
        for i in dict.fromkeys(node.inputs):
            users.setdefault(i, []).append(node.id)
    return users


def _predicted_layout(graph: Graph, name: str, users: Mapping[int, list[int]]) -> str:
    """"kn" when the Param is stored transposed: every use is a matmul weight ([K, N] held as
    the [N, K] `linear` weight), none through a Transpose (which makes it [N, K] already)."""
    uses = [u for n in graph if isinstance(n.op, Param) and n.op.name == name for u in _uses(graph, n.id, users)]
    weights = [(p in _MATMUL_WEIGHT.get(graph.node(u).op.type_name, ()), swapped) for u, p, swapped in uses]
    return "kn" if weights and all(w and not swapped for w, swapped in weights) else "dense"


def storage_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    return (shape[-1], shape[-2]) if layout == "kn" else shape
