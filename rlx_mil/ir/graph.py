"""The append-only SSA graph (spec section 1.1), with a shape-checking builder.

`Graph` is the node container; its builder methods come from one mixin per op family
(`rlx_mil.ir.ops.<family>`), and mirror upstream's Python API (pyrlx, spec section 12): each
returns the new node's integer id, takes an optional `name=` and accepts case-insensitive
strings for enum attributes (`"gelu"`, `"+"`, `"<="`, `"causal"`, `"sliding:4"`, `"f16"`...).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence

from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, ShapeError, UnknownNodeError
from rlx_mil.ir import infer
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.node import Node, NodeOrigin
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.ops.attention import AttentionBuilder
from rlx_mil.ir.ops.audio import AudioBuilder
from rlx_mil.ir.ops.codebook import CodebookBuilder
from rlx_mil.ir.ops.control import ControlBuilder
from rlx_mil.ir.ops.conv import ConvBuilder
from rlx_mil.ir.ops.elementwise import ElementwiseBuilder
from rlx_mil.ir.ops.fused import FusedBuilder
from rlx_mil.ir.ops.leaf import LeafBuilder
from rlx_mil.ir.ops.linalg import LinalgBuilder
from rlx_mil.ir.ops.moe import MoeBuilder
from rlx_mil.ir.ops.norm import NormBuilder
from rlx_mil.ir.ops.qcompute import QComputeBuilder
from rlx_mil.ir.ops.quant import QuantBuilder
from rlx_mil.ir.ops.recurrent import RecurrentBuilder
from rlx_mil.ir.ops.reduce import ReduceBuilder
from rlx_mil.ir.ops.resample import ResampleBuilder
from rlx_mil.ir.ops.rng import RngBuilder
from rlx_mil.ir.ops.rope import RopeBuilder
from rlx_mil.ir.ops.scaled import ScaledBuilder
from rlx_mil.ir.ops.scatter import ScatterBuilder
from rlx_mil.ir.ops.sequence import SequenceBuilder
from rlx_mil.ir.ops.shape import ShapeBuilder
from rlx_mil.ir.ops.signal import SignalBuilder
from rlx_mil.ir.ops.training import TrainingBuilder
from rlx_mil.ir.serde import reader, writer
from rlx_mil.ir.serde.forms import oldest_version
from rlx_mil.ir.shape import Dynamic, Shape, Static

__all__ = ["Graph", "Node", "NodeOrigin"]


class Graph(
    LeafBuilder,
    ElementwiseBuilder,
    LinalgBuilder,
    QuantBuilder,
    NormBuilder,
    ReduceBuilder,
    ShapeBuilder,
    RopeBuilder,
    AttentionBuilder,
    FusedBuilder,
    ConvBuilder,
    ScatterBuilder,
    QComputeBuilder,
    RngBuilder,
    ResampleBuilder,
    AudioBuilder,
    MoeBuilder,
    RecurrentBuilder,
    ControlBuilder,
    SequenceBuilder,
    TrainingBuilder,
    CodebookBuilder,
    ScaledBuilder,
    SignalBuilder,
):
    """Append-only DAG of nodes in topological order; a node's id is its index.

    Builder methods return node ids (ints), like upstream's pyrlx. Every node added is
    checked: input ids must exist, the input count must match the op, and the output shape
    is inferred from the inputs (a declared shape must agree with the inferred one).
    """

    def __init__(self, name: str = "graph") -> None:
        if not isinstance(name, str):
            raise GraphError(f"a graph name must be a string, got {name!r}")
        self.name = name
        self._nodes: list[Node] = []
        self._outputs: list[int] = []
        #: The JSON form ("0.2.2" or "newest") the graph was read from; None when built in code.
        self.json_version: str | None = None

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
        if not self._is_node_id(node_id):
            raise UnknownNodeError(f"unknown node id {node_id!r} (graph has {len(self._nodes)} nodes)")
        return self._nodes[node_id]

    def shape_of(self, node_id: int) -> Shape:
        """The declared output shape (dims and dtype) of a node."""
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
        Violations raise a GraphError subclass naming the node id, op, node name and input.
        """
        node_id = len(self._nodes)
        op_name = op.type_name if isinstance(op, Op) else type(op).__name__
        try:
            infer.check_attributes(op)
        except GraphError as err:
            raise type(err)(err.detail, node=node_id, op=op_name, name=name) from None
        if name is not None and not isinstance(name, str):
            raise AttributeValueError(f"a node name must be a string, got {name!r}", node=node_id, op=op_name)
        if shape is not None:
            _check_declared_shape(shape, node_id, op_name, name)
        try:
            inputs = tuple(inputs)
        except TypeError:
            raise UnknownNodeError(
                f"inputs must be a sequence of node ids, got {inputs!r}", node=node_id, op=op_name, name=name
            ) from None
        roles = infer.input_roles(op, len(inputs))
        for role, inp in zip(roles, inputs, strict=True):
            if not self._is_node_id(inp):
                raise UnknownNodeError(
                    f"{role} refers to unknown node id {inp!r} (ids 0..{node_id - 1} exist before this node)",
                    node=node_id, op=op.type_name, name=name, operand=role,
                )
        input_shapes = [self._nodes[i].shape for i in inputs]
        try:
            inferred = infer.infer_shape(op, input_shapes, declared=shape)
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

    def set_outputs(self, ids: Sequence[int] | int) -> None:
        """Mark the graph outputs, in order (a single id is accepted too)."""
        ids = [ids] if isinstance(ids, int) else list(ids)
        for pos, i in enumerate(ids):
            if not self._is_node_id(i):
                raise UnknownNodeError(
                    f"output {pos} refers to unknown node id {i!r} (graph has {len(self._nodes)} nodes)",
                    operand=f"outputs[{pos}]",
                )
        self._outputs = ids

    def set_name(self, node_id: int, name: str | None) -> None:
        node = self.node(node_id)
        if name is not None and not isinstance(name, str):
            raise AttributeValueError(f"a node name must be a string, got {name!r}", node=node_id, op=node.op.type_name)
        self._nodes[node_id] = Node(node.id, node.op, node.inputs, node.shape, name, node.origin)

    def dynamic_symbols(self) -> set[int]:
        """Symbols of the Dynamic dims anywhere in the graph."""
        return {d.symbol for n in self._nodes for d in n.shape.dims if isinstance(d, Dynamic)}

    def bind(self, sizes: Mapping[int, int]) -> Graph:
        """A copy with every Dynamic(symbol) dim replaced by `sizes[symbol]`, re-checked node
        by node (so a size that contradicts an op's constraints is a typed error)."""
        if not isinstance(sizes, Mapping):
            raise ShapeError(f"graph {self.name!r}: sizes must map dynamic symbols to sizes, got {sizes!r}")
        symbols = self.dynamic_symbols()
        missing = sorted(symbols - set(sizes))
        if missing:
            raise ShapeError(f"graph {self.name!r}: no size given for dynamic symbols {missing}")
        unknown = sorted((s for s in sizes if s not in symbols), key=repr)
        if unknown:
            # A size for a symbol the graph lacks is a typo (or the wrong graph), not a no-op.
            raise ShapeError(
                f"graph {self.name!r} has no dynamic symbol {', '.join(map(repr, unknown))}"
                f" (its dynamic symbols: {sorted(symbols) or 'none'})"
            )
        for symbol, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ShapeError(f"graph {self.name!r}: size of symbol {symbol} must be an int >= 0, got {size!r}")
        bound = Graph(self.name)
        for node in self._nodes:
            dims = [Static(sizes[d.symbol]) if isinstance(d, Dynamic) else d for d in node.shape.dims]
            bound.add_node(node.op, node.inputs, node.shape.with_dims(dims), name=node.name, origin=node.origin)
        bound.set_outputs(self._outputs)
        bound.json_version = self.json_version
        return bound

    def consumers(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {n.id: [] for n in self._nodes}
        for n in self._nodes:
            for i in n.inputs:
                users[i].append(n.id)
        return users

    def __str__(self) -> str:
        lines = [f"graph {self.name} {{"]
        lines.extend(f"  {node}" for node in self._nodes)
        outs = ", ".join(
            f"%{i} ({self._nodes[i].name})" if self._nodes[i].name else f"%{i}" for i in self._outputs
        )
        lines.append(f"  outputs: {outs}" if outs else "  outputs: (none)")
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Graph {self.name!r}: {len(self._nodes)} nodes, outputs {list(self._outputs)}>"

    # ---------------------------------------------------------------- JSON interchange
    @staticmethod
    def from_json(text: str | bytes) -> Graph:
        """Load a graph from upstream RLX's serde JSON form (spec section 2)."""
        return reader.decode_graph(text, Graph)

    def to_json(self, *, indent: int | None = None, version: str | None = None) -> str:
        """Serialize in upstream RLX's serde JSON form of `version`: "0.2.2" or "newest".

        Without `version`, a graph read from JSON is written in the form it was read in (so
        upstream files round-trip byte for byte) and a graph built in code in the oldest form
        that expresses it. Writing "0.2.2" raises JsonVersionError naming the node and field
        that 0.2.2 cannot express (a GptJ Rope, an MLA Attention, a newest-only op...).
        """
        if version is None:
            version = self.json_version or oldest_version(self._nodes)
        return writer.encode_graph(self.name, self._nodes, self._outputs, indent=indent, version=version)

    @staticmethod
    def from_json_file(path: str | os.PathLike[str]) -> Graph:
        return reader.decode_graph_file(path, Graph)

    def to_json_file(
        self, path: str | os.PathLike[str], *, indent: int | None = None, version: str | None = None
    ) -> None:
        """Write `to_json(indent=indent, version=version)` as UTF-8 with a final newline, under a
        temporary name renamed into place (a failure leaves no partial file)."""
        from rlx_mil.fileio import atomic_output_file

        text = (self.to_json(indent=indent, version=version) + "\n").encode("utf-8")
        with atomic_output_file(path, overwrite=True, what="graph JSON file") as stream:
            stream.write(text)


def _check_declared_shape(shape: object, node_id: int, op: str, name: str | None) -> None:
    """A declared shape built by hand (not through `Shape.of` or the builder) must still be
    a Shape of Static/Dynamic dims with sizes >= 0 and a DType."""
    if not isinstance(shape, Shape):
        raise ShapeError(f"the declared shape must be a Shape, got {shape!r}", node=node_id, op=op, name=name)
    if not isinstance(shape.dtype, DType):
        raise DTypeError(f"the declared dtype must be a DType, got {shape.dtype!r}", node=node_id, op=op, name=name)
    if not isinstance(shape.dims, tuple):
        raise ShapeError(f"the declared dims must be a tuple, got {shape.dims!r}", node=node_id, op=op, name=name)
    for axis, dim in enumerate(shape.dims):
        value = dim.size if isinstance(dim, Static) else dim.symbol if isinstance(dim, Dynamic) else None
        if (
            value is None
            or isinstance(value, bool)
            or not isinstance(value, int)
            or value < 0
        ):
            raise ShapeError(
                f"declared dim {axis} must be Static(size >= 0) or Dynamic(symbol >= 0), got {dim!r}",
                node=node_id, op=op, name=name,
            )
