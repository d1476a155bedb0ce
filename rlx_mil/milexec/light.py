"""The light program `rlx_mil.milexec.protoread` reads a package into: what the executor reads of
pymil's Program, Function, Operation and Var, and nothing else (no builder, no type inference)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class LightVar:
    """A var of a light program: what the executor reads of a pymil Var."""

    __slots__ = ("child_ops", "dtype", "name", "op", "shape", "sym_type", "val")

    def __init__(self, name: str, sym_type: Any, op: LightOp | None = None, val: Any = None) -> None:
        from coremltools.converters.mil.mil import types

        self.name = name
        self.sym_type = sym_type
        self.op = op
        self.child_ops: list[LightOp] = []
        self.val = val
        inner = sym_type.wrapped_type() if types.is_state(sym_type) else sym_type
        if types.is_tensor(inner):
            self.shape: tuple[Any, ...] = tuple(inner.get_shape())
            self.dtype: Any = inner.get_primitive()
        else:
            self.shape = ()
            self.dtype = inner

    @property
    def sym_val(self) -> Any:
        return self.val

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"LightVar({self.name!r}, {self.shape})"


class LightOp:
    """An op of a light program: type, name, inputs by name, outputs, its pymil definition."""

    __slots__ = ("blocks", "enclosing_block", "inputs", "name", "op_class", "op_type", "outputs")

    def __init__(self, op_type: str, name: str, op_class: Any, enclosing_block: Any) -> None:
        self.op_type = op_type
        self.name = name
        self.inputs: dict[str, Any] = {}
        self.outputs: list[LightVar] = []
        self.blocks: list[Any] = []
        self.enclosing_block = enclosing_block
        #: the pymil op class this op instantiates (its module names the opset).
        self.op_class = op_class

    def __repr__(self) -> str:
        return f"LightOp({self.op_type!r}, {self.name!r})"


@dataclass
class LightFunction:
    """A function (its top-level block) of a light program."""

    name: str
    opset_version: Any
    inputs: dict[str, LightVar] = field(default_factory=dict)
    operations: list[LightOp] = field(default_factory=list)
    outputs: list[LightVar] = field(default_factory=list)


@dataclass
class LightProgram:
    functions: dict[str, LightFunction]
    default_function_name: str
    #: Every function the package holds, read or not (`read_program(..., default_only=True)`).
    all_functions: tuple[str, ...] = ()
