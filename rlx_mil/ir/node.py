"""Graph nodes (spec section 1.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rlx_mil.ir.op_base import Op
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

    def __str__(self) -> str:
        args = ", ".join(f"%{i}" for i in self.inputs)
        text = f"%{self.id} = {self.op}"
        if args:
            text += f" ({args})"
        text += f" : {self.shape}"
        if self.name:
            text += f"  # {self.name}"
        return text


@runtime_checkable
class GraphValue(Protocol):
    """A graph held as an op attribute (the bodies of If, While and Scan)."""

    name: str

    @property
    def nodes(self) -> tuple[Node, ...]: ...

    @property
    def outputs(self) -> tuple[int, ...]: ...
