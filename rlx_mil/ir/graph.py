"""Nodes and the append-only SSA graph (spec section 1.1), with a shape-checking builder.

The builder methods mirror upstream's Python API (pyrlx, spec section 12): each returns the
new node's integer id, takes an optional `name=` and accepts case-insensitive strings for
enum attributes (`"gelu"`, `"+"`, `"<="`, `"causal"`, `"sliding:4"`, `"f16"`...).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

import numpy as np

from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, ShapeError, UnknownNodeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Attention,
    AttentionBackward,
    AttentionBwdWrt,
    Binary,
    BinaryOp,
    Cast,
    CmpOp,
    Compare,
    Concat,
    Constant,
    Conv,
    Cumsum,
    Dequantize,
    DequantMatMul,
    Expand,
    FusedAttentionBlock,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedSwiGLU,
    FusedTransformerLayer,
    Gather,
    GroupNorm,
    Input,
    LayerNorm,
    LoraMatMul,
    MaskKind,
    MatMul,
    Narrow,
    Op,
    Param,
    Pool,
    Quantize,
    QuantKind,
    QuantScheme,
    Reduce,
    ReduceOp,
    Reshape,
    RmsNorm,
    Rope,
    Softmax,
    TopK,
    Transpose,
    Where,
)
from rlx_mil.ir.shape import Dim, DimLike, Dynamic, Shape, Static, as_dim

EnumT = TypeVar("EnumT", bound=enum.Enum)


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

    def __str__(self) -> str:
        args = ", ".join(f"%{i}" for i in self.inputs)
        text = f"%{self.id} = {self.op}"
        if args:
            text += f" ({args})"
        text += f" : {self.shape}"
        if self.name:
            text += f"  # {self.name}"
        return text


class Graph:
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
        if not self._is_node_id(node_id):
            raise UnknownNodeError(f"unknown node id {node_id!r} (graph has {len(self._nodes)} nodes)")
        return self._nodes[node_id]

    def shape_of(self, node_id: int) -> Shape:
        """The declared output shape (dims and dtype) of a node."""
        return self.node(node_id).shape

    def _is_node_id(self, node_id: object) -> TypeGuard[int]:
        return isinstance(node_id, int) and not isinstance(node_id, bool) and 0 <= node_id < len(self._nodes)

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
        from rlx_mil.ir.infer import check_attributes, infer_shape, input_roles

        node_id = len(self._nodes)
        op_name = op.type_name if isinstance(op, Op) else type(op).__name__
        try:
            check_attributes(op)
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
        roles = input_roles(op, len(inputs))
        for role, inp in zip(roles, inputs, strict=True):
            if not self._is_node_id(inp):
                raise UnknownNodeError(
                    f"{role} refers to unknown node id {inp!r} (ids 0..{node_id - 1} exist before this node)",
                    node=node_id, op=op.type_name, name=name, operand=role,
                )
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
        return bound

    def consumers(self) -> dict[int, list[int]]:
        users: dict[int, list[int]] = {n.id: [] for n in self._nodes}
        for n in self._nodes:
            for i in n.inputs:
                users[i].append(n.id)
        return users

    # ---------------------------------------------------------------- printing
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

    # ---------------------------------------------------------------- builder helpers
    def _fail(self, error: type[GraphError], message: str, op: str, name: str | None, operand: str | None = None) -> GraphError:
        """An error about the node the builder is about to add (it would get the next id)."""
        return error(message, node=len(self._nodes), op=op, name=name, operand=operand)

    def _rank(self, node_id: object) -> int | None:
        """Rank of an existing node, or None (add_node then reports the bad id)."""
        return self._nodes[node_id].shape.rank if self._is_node_id(node_id) else None

    def _dims(self, node_id: object) -> tuple[Dim, ...] | None:
        return self._nodes[node_id].shape.dims if self._is_node_id(node_id) else None

    def _signed_to_unsigned(self, axis: int, node_id: object) -> int:
        """Builders take negative axes for usize attributes; an out-of-range axis is passed
        through unchanged so the shape rule reports it."""
        rank = self._rank(node_id)
        if rank is not None and isinstance(axis, int) and -rank <= axis < 0:
            return axis + rank
        return axis

    def _shape_arg(self, dims: Sequence[DimLike] | Shape, dtype: DType | str, op: str, name: str | None) -> Shape:
        if isinstance(dims, Shape):
            return dims
        the_dtype = self._dtype_arg(dtype, op, name)
        if isinstance(dims, (int, str, bytes)):
            raise self._fail(ShapeError, f"shape must be a sequence of dims, got {dims!r}", op, name)
        try:
            return Shape(tuple(as_dim(d) for d in dims), the_dtype)
        except (TypeError, ValueError) as err:
            raise self._fail(ShapeError, f"bad shape {dims!r}: {err}", op, name) from None

    def _sequence(self, values: object, what: str, op: str, name: str | None) -> tuple[Any, ...]:
        """A builder argument that must be a sequence, as a tuple (entries are checked by add_node)."""
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise self._fail(AttributeValueError, f"{what} must be a sequence, got {values!r}", op, name)
        return tuple(values)

    def _affine(
        self, scales: object, zero_points: object, op: str, name: str | None
    ) -> tuple[tuple[float, ...], tuple[int, ...]]:
        try:
            return _floats(scales), _ints(zero_points)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise self._fail(
                AttributeValueError,
                f"scales must be numbers and zero_points integers, got {scales!r} and {zero_points!r}", op, name,
            ) from None

    def _dtype_arg(self, dtype: DType | str | np.dtype | type, op: str, name: str | None) -> DType:
        try:
            return DType.parse(dtype)
        except (TypeError, ValueError) as err:
            raise self._fail(DTypeError, str(err), op, name) from None

    # ---------------------------------------------------------------- leaves
    def input(self, name: str, shape: Sequence[DimLike] | Shape, dtype: DType | str = "f32") -> int:
        """A tensor fed at run time (`Input`); the node is named `name`."""
        return self.add_node(Input(name), [], self._shape_arg(shape, dtype, "Input", name), name=name)

    def param(self, name: str, shape: Sequence[DimLike] | Shape, dtype: DType | str = "f32") -> int:
        """A weight bound by name before running (`Param`); the node is named `name`."""
        return self.add_node(Param(name), [], self._shape_arg(shape, dtype, "Param", name), name=name)

    def constant(self, array: object, dtype: DType | str | None = None, name: str | None = None) -> int:
        """A `Constant` holding `array` as little-endian bytes of `dtype`.

        Without `dtype`, NumPy arrays keep their dtype; plain Python data becomes F32 when it
        holds floats (pyrlx's default) and keeps NumPy's choice otherwise.
        """
        values = np.asarray(array)
        if dtype is None:
            if not isinstance(array, (np.ndarray, np.generic)) and values.dtype == np.float64:
                the_dtype = DType.F32
            else:
                the_dtype = self._dtype_arg(values.dtype, "Constant", name)
        else:
            the_dtype = self._dtype_arg(dtype, "Constant", name)
        data = self._encode(values, the_dtype, name)
        return self.add_node(Constant(data), [], Shape(tuple(Static(s) for s in values.shape), the_dtype), name=name)

    def _encode(self, values: np.ndarray, dtype: DType, name: str | None) -> bytes:
        if dtype is DType.C64:
            raise self._fail(DTypeError, "C64 constants are outside the rlx_mil IR subset", "Constant", name)
        if values.dtype.kind not in "biuf":
            raise self._fail(DTypeError, f"cannot store {values.dtype} values in a constant", "Constant", name)
        if dtype is DType.BOOL:
            return (values != 0).astype(np.uint8).tobytes()
        if dtype is DType.BF16:
            return _bf16_bytes(values.astype(np.float32))
        target = dtype.numpy.newbyteorder("<")
        if dtype.is_int:
            info = np.iinfo(target)
            with np.errstate(invalid="ignore"):
                exact = np.all(np.isfinite(values)) and np.all(values == np.trunc(values))
            if not exact or (values.size and (values.min() < info.min or values.max() > info.max)):
                raise self._fail(
                    AttributeValueError, f"values do not fit {dtype.value} exactly", "Constant", name, "data"
                )
        return np.ascontiguousarray(values.astype(target)).tobytes()

    # ---------------------------------------------------------------- element-wise
    def activation(self, kind: ActivationKind | str, x: int, *, name: str | None = None) -> int:
        """`Activation(kind)`; `kind` like `"gelu"`, `"gelu_approx"`, `"silu"`, `"rsqrt"`."""
        return self.add_node(Activation(self._activation_kind(kind, "Activation", name)), [x], name=name)

    def _activation_kind(self, kind: ActivationKind | str, op: str, name: str | None) -> ActivationKind:
        if isinstance(kind, ActivationKind):
            return kind
        if not isinstance(kind, str):
            raise self._fail(AttributeValueError, f"an activation is an ActivationKind or text such as 'gelu', got {kind!r}", op, name)
        key = _squash(kind)
        for member in ActivationKind:
            if _squash(member.value) == key:
                return member
        raise self._fail(AttributeValueError, f"unknown activation {kind!r}", op, name)

    def gelu(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.GELU, x, name=name)

    def gelu_approx(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.GELU_APPROX, x, name=name)

    def silu(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SILU, x, name=name)

    def relu(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.RELU, x, name=name)

    def sigmoid(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SIGMOID, x, name=name)

    def tanh(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.TANH, x, name=name)

    def exp(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.EXP, x, name=name)

    def log(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.LOG, x, name=name)

    def sqrt(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SQRT, x, name=name)

    def rsqrt(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.RSQRT, x, name=name)

    def neg(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.NEG, x, name=name)

    def abs(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ABS, x, name=name)

    def round(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ROUND, x, name=name)

    def sin(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SIN, x, name=name)

    def cos(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.COS, x, name=name)

    def tan(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.TAN, x, name=name)

    def atan(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ATAN, x, name=name)

    def cast(self, x: int, dtype: DType | str, *, name: str | None = None) -> int:
        return self.add_node(Cast(self._dtype_arg(dtype, "Cast", name)), [x], name=name)

    def binary(self, op: BinaryOp | str, a: int, b: int, *, name: str | None = None) -> int:
        """`Binary(op)` with NumPy broadcasting; `op` like `"add"`, `"max"`, `"pow"`, `"+"`, `"/"`."""
        the_op = _lookup(op, BinaryOp, _BINARY_ALIASES)
        if the_op is None:
            raise self._fail(AttributeValueError, f"unknown binary op {op!r}", "Binary", name)
        return self.add_node(Binary(the_op), [a, b], name=name)

    def add(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.ADD, a, b, name=name)

    def sub(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.SUB, a, b, name=name)

    def mul(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.MUL, a, b, name=name)

    def div(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.DIV, a, b, name=name)

    def maximum(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.MAX, a, b, name=name)

    def minimum(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.MIN, a, b, name=name)

    def pow(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.POW, a, b, name=name)

    def compare(self, op: CmpOp | str, a: int, b: int, *, name: str | None = None) -> int:
        """`Compare(op)` giving Bool; `op` like `"eq"`, `"ge"`, `"=="`, `"<="`."""
        the_op = _lookup(op, CmpOp, _COMPARE_ALIASES)
        if the_op is None:
            raise self._fail(AttributeValueError, f"unknown comparison {op!r}", "Compare", name)
        return self.add_node(Compare(the_op), [a, b], name=name)

    def eq_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.EQ, a, b, name=name)

    def ne_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.NE, a, b, name=name)

    def lt_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.LT, a, b, name=name)

    def le_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.LE, a, b, name=name)

    def gt_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.GT, a, b, name=name)

    def ge_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.GE, a, b, name=name)

    def where_(self, cond: int, a: int, b: int, *, name: str | None = None) -> int:
        """`Where(cond, on_true=a, on_false=b)` with 3-way broadcasting."""
        return self.add_node(Where(), [cond, a, b], name=name)

    # ---------------------------------------------------------------- linear algebra
    def matmul(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.add_node(MatMul(), [a, b], name=name)

    def lora_matmul(self, x: int, w: int, a: int, b: int, scale: float, *, name: str | None = None) -> int:
        """`x @ w + scale * ((x @ a) @ b)`; `scale` is the adapter's alpha / r."""
        return self.add_node(LoraMatMul(scale), [x, w, a, b], name=name)

    def fused_matmul_bias_act(
        self, x: int, w: int, bias: int, activation: ActivationKind | str | None = None, *, name: str | None = None
    ) -> int:
        kind = None if activation is None else self._activation_kind(activation, "FusedMatMulBiasAct", name)
        return self.add_node(FusedMatMulBiasAct(kind), [x, w, bias], name=name)

    def quantize(
        self,
        x: int,
        scales: float | Sequence[float],
        zero_points: int | Sequence[int],
        axis: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Float -> I8; per tensor (`axis=None`, one scale) or per channel along `axis`."""
        the_axis = None if axis is None else self._signed_to_unsigned(axis, x)
        op = Quantize(the_axis, *self._affine(scales, zero_points, "Quantize", name))
        return self.add_node(op, [x], name=name)

    def dequantize(
        self,
        q: int,
        scales: float | Sequence[float],
        zero_points: int | Sequence[int],
        axis: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """I8 -> F32: `(q - zp) * scale`, per tensor or per channel along `axis`."""
        the_axis = None if axis is None else self._signed_to_unsigned(axis, q)
        op = Dequantize(the_axis, *self._affine(scales, zero_points, "Dequantize", name))
        return self.add_node(op, [q], name=name)

    def dequant_matmul(
        self,
        x: int,
        w_q: int,
        scale: int | None = None,
        zp: int | None = None,
        scheme: QuantScheme | str | None = None,
        out_shape: int | Sequence[DimLike] | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """`x @ dequant(w_q)`.

        Block schemes take `(x, w_q [K, N], scale, zp)`; GGUF schemes take `(x, packed_w)`
        and need `out_shape` (`[..., N]`, or just N). `scheme` is a QuantScheme or text such
        as `"int8_block:32"`, `"Int4Block(32)"`, `"fp8_e4m3"`, `"gguf_q4_k"`.
        """
        if scheme is None:
            raise self._fail(AttributeValueError, "scheme is required", "DequantMatMul", name)
        the_scheme = self._scheme(scheme, name)
        inputs = [x, w_q] + [i for i in (scale, zp) if i is not None]
        declared = None
        if out_shape is not None:
            dtype = self._nodes[x].shape.dtype if self._is_node_id(x) else DType.F32
            if isinstance(out_shape, int):
                lead = self._dims(x)
                dims: Sequence[DimLike] = (*(lead[:-1] if lead else ()), out_shape)
            else:
                dims = out_shape
            declared = self._shape_arg(dims, dtype, "DequantMatMul", name)
        return self.add_node(DequantMatMul(the_scheme), inputs, declared, name=name)

    def _scheme(self, scheme: QuantScheme | str, name: str | None) -> QuantScheme:
        if isinstance(scheme, QuantScheme):
            return scheme
        if not isinstance(scheme, str):
            raise self._fail(
                AttributeValueError, f"a scheme is a QuantScheme or text such as 'int8_block:32', got {scheme!r}",
                "DequantMatMul", name,
            )
        match = re.fullmatch(r"\s*([A-Za-z0-9_\-]+)\s*(?:[:(]\s*(\d+)\s*\)?)?\s*", scheme)
        kind = None
        if match:
            key = _squash(match.group(1))
            kind = next((k for k in QuantKind if _squash(k.value) == key), None)
        if match is None or kind is None:
            raise self._fail(AttributeValueError, f"unknown quantization scheme {scheme!r}", "DequantMatMul", name)
        block = match.group(2)
        try:
            return QuantScheme(kind, int(block) if block is not None else None)
        except ValueError as err:
            raise self._fail(AttributeValueError, str(err), "DequantMatMul", name) from None

    # ---------------------------------------------------------------- normalization
    def layer_norm(
        self, x: int, gamma: int, beta: int, axis: int = -1, eps: float = 1e-5, *, name: str | None = None
    ) -> int:
        return self.add_node(LayerNorm(axis, eps), [x, gamma, beta], name=name)

    def rms_norm(
        self, x: int, gamma: int, beta: int, axis: int = -1, eps: float = 1e-5, *, name: str | None = None
    ) -> int:
        """`x / sqrt(mean(x^2) + eps) * gamma + beta` over the last axis (beta is added)."""
        return self.add_node(RmsNorm(axis, eps), [x, gamma, beta], name=name)

    def group_norm(
        self, x: int, gamma: int, beta: int, num_groups: int, eps: float = 1e-5, *, name: str | None = None
    ) -> int:
        return self.add_node(GroupNorm(num_groups, eps), [x, gamma, beta], name=name)

    def fused_residual_ln(
        self,
        x: int,
        residual: int,
        gamma: int,
        beta: int,
        bias: int | None = None,
        eps: float = 1e-5,
        *,
        name: str | None = None,
    ) -> int:
        """`LayerNorm(x + residual (+ bias))`; node inputs are x, residual, [bias], gamma, beta."""
        inputs = [x, residual, *([] if bias is None else [bias]), gamma, beta]
        return self.add_node(FusedResidualLN(bias is not None, eps), inputs, name=name)

    def fused_residual_rms_norm(
        self,
        x: int,
        residual: int,
        gamma: int,
        beta: int,
        bias: int | None = None,
        eps: float = 1e-5,
        *,
        name: str | None = None,
    ) -> int:
        """`RmsNorm(x + residual (+ bias))`; node inputs are x, residual, [bias], gamma, beta."""
        inputs = [x, residual, *([] if bias is None else [bias]), gamma, beta]
        return self.add_node(FusedResidualRmsNorm(bias is not None, eps), inputs, name=name)

    # ---------------------------------------------------------------- reductions
    def softmax(self, x: int, axis: int = -1, *, name: str | None = None) -> int:
        return self.add_node(Softmax(axis), [x], name=name)

    def reduce(
        self,
        x: int,
        op: ReduceOp | str,
        axes: int | Sequence[int],
        keep_dim: bool = False,
        *,
        name: str | None = None,
    ) -> int:
        """`Reduce(op)` over `axes` (negative axes count from the end)."""
        the_op = _lookup(op, ReduceOp, _REDUCE_ALIASES)
        if the_op is None:
            raise self._fail(AttributeValueError, f"unknown reduction {op!r}", "Reduce", name)
        axis_list = [axes] if isinstance(axes, int) else list(self._sequence(axes, "axes", "Reduce", name))
        the_axes = tuple(self._signed_to_unsigned(a, x) for a in axis_list)
        return self.add_node(Reduce(the_op, the_axes, keep_dim), [x], name=name)

    def sum(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        """Sum reduction (pyrlx name); same as `reduce_sum`."""
        return self.reduce(x, ReduceOp.SUM, axes, keep_dim, name=name)

    def mean(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        return self.reduce(x, ReduceOp.MEAN, axes, keep_dim, name=name)

    def max(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        """Max *reduction* over `axes`; the element-wise maximum is `maximum`."""
        return self.reduce(x, ReduceOp.MAX, axes, keep_dim, name=name)

    def min(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        """Min *reduction* over `axes`; the element-wise minimum is `minimum`."""
        return self.reduce(x, ReduceOp.MIN, axes, keep_dim, name=name)

    def prod(self, x: int, axes: int | Sequence[int], keep_dim: bool = False, *, name: str | None = None) -> int:
        return self.reduce(x, ReduceOp.PROD, axes, keep_dim, name=name)

    reduce_sum = sum
    reduce_mean = mean
    reduce_max = max
    reduce_min = min
    reduce_prod = prod

    def cumsum(self, x: int, axis: int, exclusive: bool = False, *, name: str | None = None) -> int:
        return self.add_node(Cumsum(axis, exclusive), [x], name=name)

    def topk(self, x: int, k: int, *, dtype: DType | str = "f32", name: str | None = None) -> int:
        """Indices of the `k` largest entries along the last axis, as `dtype` values."""
        the_dtype = self._dtype_arg(dtype, "TopK", name)
        declared = None
        dims = self._dims(x)
        if the_dtype is not DType.F32 and dims:
            declared = Shape((*dims[:-1], Static(k) if isinstance(k, int) and k >= 0 else dims[-1]), the_dtype)
        return self.add_node(TopK(k), [x], declared, name=name)

    # ---------------------------------------------------------------- data movement
    def reshape(self, x: int, new_shape: Sequence[int], *, name: str | None = None) -> int:
        """Row-major reshape; at most one -1 entry."""
        return self.add_node(Reshape(self._sequence(new_shape, "new_shape", "Reshape", name)), [x], name=name)

    def transpose(self, x: int, perm: Sequence[int], *, name: str | None = None) -> int:
        return self.add_node(Transpose(self._sequence(perm, "perm", "Transpose", name)), [x], name=name)

    def narrow(self, x: int, axis: int, start: int, length: int, *, name: str | None = None) -> int:
        """`x[..., start:start+length, ...]` along `axis`."""
        return self.add_node(Narrow(self._signed_to_unsigned(axis, x), start, length), [x], name=name)

    def concat(self, ids: Sequence[int], axis: int, *, name: str | None = None) -> int:
        ids = self._sequence(ids, "ids", "Concat", name)
        first = ids[0] if len(ids) else None
        return self.add_node(Concat(self._signed_to_unsigned(axis, first)), list(ids), name=name)

    def expand(self, x: int, target_shape: Sequence[int], *, name: str | None = None) -> int:
        """Broadcast to `target_shape` (left-padding with 1s; -1 keeps the input's dim)."""
        return self.add_node(Expand(self._sequence(target_shape, "target_shape", "Expand", name)), [x], name=name)

    def gather(self, table: int, indices: int, axis: int = 0, *, name: str | None = None) -> int:
        """`np.take(table, indices, axis)`."""
        return self.add_node(Gather(self._signed_to_unsigned(axis, table)), [table, indices], name=name)

    def rope(
        self, x: int, cos: int, sin: int, head_dim: int, n_rot: int | None = None, *, name: str | None = None
    ) -> int:
        """Rotary embedding (NeoX rotate-half); `n_rot` defaults to `head_dim`."""
        return self.add_node(Rope(head_dim, head_dim if n_rot is None else n_rot), [x, cos, sin], name=name)

    # ---------------------------------------------------------------- attention
    def attention(
        self,
        q: int,
        k: int,
        v: int,
        mask: int,
        num_heads: int,
        head_dim: int,
        score_scale: float | None = None,
        softcap: float | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Attention with a `Custom` key-padding mask (`[B, Sk]` elements, 1 = attend)."""
        op = Attention(num_heads, head_dim, MaskKind.CUSTOM, score_scale, softcap)
        return self.add_node(op, [q, k, v, mask], name=name)

    def attention_kind(
        self,
        q: int,
        k: int,
        v: int,
        num_heads: int,
        head_dim: int,
        mask_kind: MaskKind | str = "causal",
        score_scale: float | None = None,
        softcap: float | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Attention with a mask kind that takes no mask tensor: `"none"`, `"causal"`, `"sliding:<w>"`."""
        kind = self._mask_kind(mask_kind, "Attention", name)
        if kind.has_mask_input:
            raise self._fail(
                AttributeValueError,
                f"mask kind {kind} needs a mask tensor; use attention() or attention_bias()",
                "Attention", name,
            )
        return self.add_node(Attention(num_heads, head_dim, kind, score_scale, softcap), [q, k, v], name=name)

    def attention_bias(
        self,
        q: int,
        k: int,
        v: int,
        bias: int,
        num_heads: int,
        head_dim: int,
        score_scale: float | None = None,
        softcap: float | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Attention plus an additive bias broadcasting to `[B, H, Sq, Sk]`."""
        op = Attention(num_heads, head_dim, MaskKind.BIAS, score_scale, softcap)
        return self.add_node(op, [q, k, v, bias], name=name)

    def _mask_kind(self, kind: MaskKind | str, op: str, name: str | None) -> MaskKind:
        try:
            return MaskKind.parse(kind)
        except ValueError as err:
            raise self._fail(AttributeValueError, str(err), op, name) from None

    def attention_backward(
        self,
        q: int,
        k: int,
        v: int,
        dy: int,
        num_heads: int,
        head_dim: int,
        mask_kind: MaskKind | str,
        wrt: AttentionBwdWrt | str,
        mask: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Gradient of attention w.r.t. q, k or v (`wrt`: `"query"`/`"q"`, `"key"`, `"value"`)."""
        kind = self._mask_kind(mask_kind, "AttentionBackward", name)
        the_wrt = _lookup(wrt, AttentionBwdWrt, _WRT_ALIASES)
        if the_wrt is None:
            raise self._fail(AttributeValueError, f"unknown wrt {wrt!r}", "AttentionBackward", name)
        inputs = [q, k, v, dy, *([] if mask is None else [mask])]
        return self.add_node(AttentionBackward(num_heads, head_dim, kind, the_wrt), inputs, name=name)

    def attention_backward_all(
        self,
        q: int,
        k: int,
        v: int,
        dy: int,
        num_heads: int,
        head_dim: int,
        mask_kind: MaskKind | str,
        mask: int | None = None,
        *,
        names: tuple[str | None, str | None, str | None] = (None, None, None),
    ) -> tuple[int, int, int]:
        """`(dq, dk, dv)`: three AttentionBackward nodes sharing their inputs."""
        dq, dk, dv = (
            self.attention_backward(q, k, v, dy, num_heads, head_dim, mask_kind, wrt, mask, name=n)
            for wrt, n in zip(AttentionBwdWrt, names, strict=True)
        )
        return dq, dk, dv

    # ---------------------------------------------------------------- fused blocks
    def fused_swiglu(
        self,
        x: int,
        cast_to: DType | str | None = None,
        gate_first: bool = False,
        *,
        name: str | None = None,
    ) -> int:
        """`up * silu(gate)` from `x [..., 2N]` (up first unless `gate_first`) -> `[..., N]`."""
        dtype = None if cast_to is None else self._dtype_arg(cast_to, "FusedSwiGLU", name)
        return self.add_node(FusedSwiGLU(dtype, gate_first), [x], name=name)

    def fused_attention_block(
        self,
        hidden: int,
        qkv_w: int,
        out_w: int,
        mask: int,
        num_heads: int,
        head_dim: int,
        qkv_b: int | None = None,
        out_b: int | None = None,
        cos: int | None = None,
        sin: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Encoder self-attention block: QKV projection, optional rope, Custom-mask
        attention, output projection. Biases and rope tables come in pairs."""
        op_name = "FusedAttentionBlock"
        has_bias = self._pair(qkv_b, out_b, "qkv_b and out_b", op_name, name)
        has_rope = self._pair(cos, sin, "cos and sin", op_name, name)
        inputs = [hidden, qkv_w, out_w, mask]
        if has_bias:
            inputs += [qkv_b, out_b]  # type: ignore[list-item]
        if has_rope:
            inputs += [cos, sin]  # type: ignore[list-item]
        return self.add_node(FusedAttentionBlock(num_heads, head_dim, has_bias, has_rope), inputs, name=name)

    def _pair(self, a: int | None, b: int | None, what: str, op: str, name: str | None) -> bool:
        if (a is None) != (b is None):
            raise self._fail(AttributeValueError, f"{what} must be given together", op, name)
        return a is not None

    def fused_transformer_layer(
        self,
        hidden: int,
        mask: int,
        *,
        qkv_w: int,
        out_w: int,
        ln1_gamma: int,
        fc1_w: int,
        fc2_w: int,
        ln2_gamma: int,
        num_heads: int,
        head_dim: int,
        intermediate_size: int | None = None,
        ln1_beta: int | None = None,
        ln2_beta: int | None = None,
        qkv_b: int | None = None,
        out_b: int | None = None,
        fc1_b: int | None = None,
        fc2_b: int | None = None,
        eps1: float = 1e-12,
        eps2: float = 1e-12,
        activation: ActivationKind | str = "gelu",
        name: str | None = None,
    ) -> int:
        """BERT-style post-norm encoder layer.

        Input forms (spec 10.3): all four biases and both LN betas (14 inputs); betas without
        biases (10); neither (8, zero betas). `intermediate_size` defaults to fc1_w's width.
        """
        op_name = "FusedTransformerLayer"
        biases = (qkv_b, out_b, fc1_b, fc2_b)
        has_bias = all(b is not None for b in biases)
        if not has_bias and any(b is not None for b in biases):
            raise self._fail(AttributeValueError, "qkv_b, out_b, fc1_b and fc2_b must be given together", op_name, name)
        has_betas = self._pair(ln1_beta, ln2_beta, "ln1_beta and ln2_beta", op_name, name)
        if has_bias and not has_betas:
            raise self._fail(AttributeValueError, "the biased form also needs ln1_beta and ln2_beta", op_name, name)
        kind = self._activation_kind(activation, op_name, name)
        if intermediate_size is None:
            fc1 = self._dims(fc1_w)
            width = fc1[-1] if fc1 else None
            if not isinstance(width, Static):
                raise self._fail(
                    AttributeValueError, "pass intermediate_size (fc1_w has no static width)", op_name, name
                )
            intermediate_size = width.size
        if has_bias:
            inputs = [hidden, qkv_w, qkv_b, out_w, out_b, ln1_gamma, ln1_beta, fc1_w, fc1_b,
                      fc2_w, fc2_b, ln2_gamma, ln2_beta, mask]
        elif has_betas:
            inputs = [hidden, qkv_w, out_w, ln1_gamma, ln1_beta, fc1_w, fc2_w, ln2_gamma, ln2_beta, mask]
        else:
            inputs = [hidden, qkv_w, out_w, ln1_gamma, fc1_w, fc2_w, ln2_gamma, mask]
        op = FusedTransformerLayer(num_heads, head_dim, intermediate_size, eps1, eps2, kind, has_bias)
        return self.add_node(op, inputs, name=name)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- conv / pool
    def conv(
        self,
        x: int,
        w: int,
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] | None = None,
        dilation: int | Sequence[int] | None = None,
        groups: int = 1,
        *,
        name: str | None = None,
    ) -> int:
        """NCHW cross-correlation (no bias); `kernel_size` is read from w's spatial dims."""
        w_dims = self._dims(w) or ()
        kernel = tuple(d.size if isinstance(d, Static) else -1 for d in w_dims[2:])
        spatial = len(kernel)
        op = Conv(
            kernel,
            _per_axis(stride, 1, spatial),
            _per_axis(padding, 0, spatial),
            _per_axis(dilation, 1, spatial),
            groups,
        )
        return self.add_node(op, [x, w], name=name)

    def pool(
        self,
        x: int,
        kind: ReduceOp | str,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: int | Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Window reduction over the spatial dims of `[N, C, *spatial]`; `kind` like `"max"`,
        `"mean"`/`"avg"`. `stride` defaults to the kernel size, `padding` to 0."""
        the_kind = _lookup(kind, ReduceOp, _REDUCE_ALIASES)
        if the_kind is None:
            raise self._fail(AttributeValueError, f"unknown pool kind {kind!r}", "Pool", name)
        rank = self._rank(x)
        spatial = max(rank - 2, 0) if rank is not None else 0
        kernel = _per_axis(kernel_size, 1, spatial)
        strides = kernel if stride is None else _per_axis(stride, 1, spatial)
        return self.add_node(Pool(the_kind, kernel, strides, _per_axis(padding, 0, spatial)), [x], name=name)

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


# -------------------------------------------------------------------------------- parsing helpers


def _squash(text: str) -> str:
    """Case- and separator-insensitive key: `"gelu_approx"`, `"GeluApprox"` -> `"geluapprox"`."""
    return re.sub(r"[\s_\-]", "", text).lower()


_BINARY_ALIASES = {
    "+": BinaryOp.ADD, "-": BinaryOp.SUB, "*": BinaryOp.MUL, "/": BinaryOp.DIV, "**": BinaryOp.POW,
    "maximum": BinaryOp.MAX, "minimum": BinaryOp.MIN,
}
_COMPARE_ALIASES = {
    "==": CmpOp.EQ, "!=": CmpOp.NE, "<": CmpOp.LT, "<=": CmpOp.LE, ">": CmpOp.GT, ">=": CmpOp.GE,
}
_REDUCE_ALIASES = {"avg": ReduceOp.MEAN, "average": ReduceOp.MEAN}
_WRT_ALIASES = {"q": AttentionBwdWrt.QUERY, "k": AttentionBwdWrt.KEY, "v": AttentionBwdWrt.VALUE}


def _lookup(value: object, enum_type: type[EnumT], aliases: Mapping[str, EnumT]) -> EnumT | None:
    """An enum member from a member, its variant name, or an alias; None when unknown."""
    if isinstance(value, enum_type):
        return value
    if not isinstance(value, str):
        return None
    key = value.strip()
    if key in aliases:
        return aliases[key]
    squashed = _squash(key)
    if squashed in aliases:
        return aliases[squashed]
    for member in enum_type:
        if _squash(str(member.value)) == squashed:
            return member
    return None


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


def _floats(values: float | Sequence[float]) -> tuple[float, ...]:
    return (float(values),) if isinstance(values, (int, float)) else tuple(float(v) for v in values)


def _ints(values: int | Sequence[int]) -> tuple[int, ...]:
    return (int(values),) if isinstance(values, int) else tuple(int(v) for v in values)


def _per_axis(value: int | Sequence[int] | None, default: int, count: int) -> tuple[int, ...]:
    if value is None:
        return (default,) * count
    if isinstance(value, int):
        return (value,) * count
    return tuple(value)


def _bf16_bytes(values: np.ndarray) -> bytes:
    """Little-endian bfloat16 bytes, rounding float32 to nearest-even (NaN stays quiet NaN)."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = np.where(is_nan, (bits >> 16) | 0x0040, rounded)
    return rounded.astype("<u2").tobytes()
