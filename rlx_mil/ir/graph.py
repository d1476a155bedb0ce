"""Nodes and the append-only SSA graph (spec section 1.1), with a shape-checking builder."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rlx_mil.errors import ArityError, GraphError, ShapeError, UnknownNodeError
from rlx_mil.ir.ops import Op
from rlx_mil.ir.shape import Shape


@dataclass(frozen=True)
class NodeOrigin:
    """Debug provenance carried through from upstream; no semantics."""

    hir: int | None = None
    label: str | None = None
    pass_name: str | None = None


@dataclass(frozen=True)
class Node:
    id: int
    op: Op
    inputs: tuple[int, ...]
    shape: Shape
    name: str | None = None
    origin: NodeOrigin | None = None

    @property
    def display_name(self) -> str:
        return self.name if self.name else f"%{self.id}"


class Graph:
    """Append-only DAG of nodes in topological order; a node's id is its index.

    Builder methods return node ids (ints), like upstream's pyrlx. Every node added is
    checked: input ids must exist, the input count must match the op, and the output shape
    is inferred from the inputs (a declared shape must agree with the inferred one).
    """

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self._nodes: list[Node] = []
        self._outputs: list[int] = []

    # ---------------------------------------------------------------- core container
    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    @property
    def outputs(self) -> tuple[int, ...]:
        return tuple(self._outputs)

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes)

    def node(self, node_id: int) -> Node:
        if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id < len(self._nodes):
            raise UnknownNodeError(f"unknown node id {node_id!r} (graph has {len(self._nodes)} nodes)")
        return self._nodes[node_id]

    def shape_of(self, node_id: int) -> Shape:
        return self.node(node_id).shape

    def add_node(
        self,
        op: Op,
        inputs: Sequence[int],
        shape: Shape | None = None,
        *,
        name: str | None = None,
        origin: NodeOrigin | None = None,
    ) -> int:
        """Append a node and return its id.

        With `shape=None` the shape is inferred; a given shape is checked against inference
        where the op has an inference rule (the declared shape is kept, as upstream).
        """
        from rlx_mil.ir.infer import infer_shape

        node_id = len(self._nodes)
        inputs = tuple(inputs)
        for pos, inp in enumerate(inputs):
            if isinstance(inp, bool) or not isinstance(inp, int) or not 0 <= inp < node_id:
                raise UnknownNodeError(
                    f"input {pos} refers to unknown node id {inp!r}"
                    f" (ids 0..{node_id - 1} exist before this node)",
                    node=node_id, op=op.type_name, name=name, operand=str(pos),
                )
        accepted = op.accepted_arities()
        if accepted and len(inputs) not in accepted:
            want = " or ".join(str(a) for a in accepted)
            raise ArityError(
                f"expects {want} inputs, got {len(inputs)}", node=node_id, op=op.type_name, name=name
            )
        if not accepted and op.arity() is None and len(inputs) == 0:
            raise ArityError("expects at least 1 input, got 0", node=node_id, op=op.type_name, name=name)
        input_shapes = [self._nodes[i].shape for i in inputs]
        try:
            inferred = infer_shape(op, input_shapes, declared=shape)
        except GraphError as err:
            raise type(err)(err.detail, node=node_id, op=op.type_name, name=name, operand=err.operand) from None
        if shape is None:
            if inferred is None:
                raise ShapeError(
                    "cannot infer the output shape; pass shape=", node=node_id, op=op.type_name, name=name
                )
            shape = inferred
        elif inferred is not None and not shape.same_elements_as(inferred):
            raise ShapeError(
                f"declared shape {shape} differs from the inferred {inferred}",
                node=node_id, op=op.type_name, name=name,
            )
        self._nodes.append(Node(node_id, op, inputs, shape, name, origin))
        return node_id

    def set_outputs(self, ids: Sequence[int]) -> None:
        ids = list(ids)
        for i in ids:
            self.node(i)
        self._outputs = ids

    def set_name(self, node_id: int, name: str | None) -> None:
        node = self.node(node_id)
        self._nodes[node_id] = Node(node.id, node.op, node.inputs, node.shape, name, node.origin)

    def consumers(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {n.id: [] for n in self._nodes}
        for n in self._nodes:
            for i in n.inputs:
                users[i].append(n.id)
        return users

    # ---------------------------------------------------------------- JSON interchange
    @staticmethod
    def from_json(text: str | bytes) -> Graph:
        """Load a graph from upstream RLX's serde JSON form (spec section 2)."""
        from rlx_mil.ir.json_io import graph_from_json

        return graph_from_json(text)

    def to_json(self, *, indent: int | None = None) -> str:
        """Serialize in upstream RLX's serde JSON form."""
        from rlx_mil.ir.json_io import graph_to_json

        return graph_to_json(self, indent=indent)

    @staticmethod
    def from_json_file(path: str | os.PathLike[str]) -> Graph:
        from rlx_mil.ir.json_io import graph_from_json_file

        return graph_from_json_file(path)

    def to_json_file(self, path: str | os.PathLike[str], *, indent: int | None = None) -> None:
        from rlx_mil.ir.json_io import graph_to_json_file

        graph_to_json_file(self, path, indent=indent)
