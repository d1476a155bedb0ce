"""What every op family's builder methods share: argument parsing and error reporting.

Each family module (`rlx_mil.ir.ops.<family>`) defines a builder mixin deriving from
`BuilderBase`; `Graph` composes them. The builder methods mirror upstream's Python API
(pyrlx, spec section 12): each returns the new node's integer id, takes an optional `name=`
and accepts case-insensitive strings for enum attributes (`"gelu"`, `"+"`, `"<="`, `"causal"`,
`"sliding:4"`, `"f16"`...).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard, TypeVar

import numpy as np

from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.node import Node, NodeOrigin
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.shape import Dim, DimLike, Shape, as_dim

EnumT = TypeVar("EnumT", bound=enum.Enum)


class BuilderBase:
    """The node list and `add_node` (defined by `Graph`) plus the helpers builders share."""

    _nodes: list[Node]

    def add_node(
        self,
        op: Op,
        inputs: Sequence[int],
        shape: Shape | None = None,
        *,
        name: str | None = None,
        origin: NodeOrigin | None = None,
    ) -> int:
        raise NotImplementedError

    def _is_node_id(self, node_id: object) -> TypeGuard[int]:
        return isinstance(node_id, int) and not isinstance(node_id, bool) and 0 <= node_id < len(self._nodes)

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

    def _dtype_arg(self, dtype: DType | str | np.dtype | type, op: str, name: str | None) -> DType:
        try:
            return DType.parse(dtype)
        except (TypeError, ValueError) as err:
            raise self._fail(DTypeError, str(err), op, name) from None


def squash(text: str) -> str:
    """Case- and separator-insensitive key: `"gelu_approx"`, `"GeluApprox"` -> `"geluapprox"`."""
    return re.sub(r"[\s_\-]", "", text).lower()


def lookup(value: object, enum_type: type[EnumT], aliases: Mapping[str, EnumT]) -> EnumT | None:
    """An enum member from a member, its variant name, or an alias; None when unknown."""
    if isinstance(value, enum_type):
        return value
    if not isinstance(value, str):
        return None
    key = value.strip()
    if key in aliases:
        return aliases[key]
    squashed = squash(key)
    if squashed in aliases:
        return aliases[squashed]
    for member in enum_type:
        if squash(str(member.value)) == squashed:
            return member
    return None
