"""The base of every IR op, and the attribute conventions the op families share.

Attribute names are upstream's, so the JSON form maps one to one. Float attributes are held
as the float32 value they denote (upstream stores `f32`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from rlx_mil.errors import AttributeValueError

#: Metadata of a dataclass field the newest upstream added to an op 0.2.2 already had; its
#: default is what a 0.2.2 graph means (and keeps positional construction of the 0.2.2 fields).
NEWEST_FIELD = {"newest": True}


def f32(value: float) -> float:
    """Round a Python float to the float32 it denotes (attributes are f32 upstream)."""
    return float(np.float32(value))


@dataclass(frozen=True)
class Op:
    """Base of every IR op. `type_name` is the upstream variant name (the JSON tag)."""

    type_name: ClassVar[str] = ""

    def arity(self) -> int | None:
        """Exact number of inputs, or None for a variadic op (Concat)."""
        raise NotImplementedError

    def accepted_arities(self) -> tuple[int, ...]:
        n = self.arity()
        return () if n is None else (n,)

    def roles(self, count: int) -> tuple[str, ...] | None:
        """Names of the inputs (as error messages use them) when there are `count` of them;
        None where the op has no fixed names. Single-input ops call their input `x`."""
        return ("x",) if self.arity() == 1 else None

    def carried_operands(self) -> tuple[int, ...]:
        """Input positions holding a state the op writes back in place (upstream's decode
        threading: GatedDeltaNet `state`, the RNNs' `h0`/`c0` with `carry`). Converted models
        and `reference.evaluate` publish each final state as an extra output
        (`rlx_mil.ir.naming.state_outputs`)."""
        return ()

    def attrs(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))

    def __str__(self) -> str:
        # Attributes the newest upstream added print only when they differ from their 0.2.2
        # meaning, so 0.2.2 graphs print as before.
        parts = [
            f"{f.name}={_attr_text(getattr(self, f.name))}"
            for f in fields(self)
            if not (f.metadata.get("newest") and getattr(self, f.name) == f.default)
        ]
        return f"{self.type_name}({', '.join(parts)})" if parts else self.type_name


def _attr_text(value: object) -> str:
    """Attribute as printed by `Op.__str__`; floats in their shortest float32 form (0.2)."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, float):
        return str(np.float32(value))
    if isinstance(value, tuple):
        return "[" + ", ".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def attr_f32(op: Op, name: str, value: object) -> float:
    try:
        return f32(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AttributeValueError(f"{name} must be a number, got {value!r}", op=op.type_name) from None


def fix_f32(op: Op, *names: str) -> None:
    """Replace the named float attributes of a frozen op by their float32 values."""
    for name in names:
        value = getattr(op, name)
        if value is not None:
            object.__setattr__(op, name, attr_f32(op, name, value))


class UnaryOp(Op):
    def arity(self) -> int | None:
        return 1


class BinaryArityOp(Op):
    def arity(self) -> int | None:
        return 2


class LeafOp(Op):
    def arity(self) -> int | None:
        return 0


class TernaryOp(Op):
    def arity(self) -> int | None:
        return 3


def collect_ops(namespace: Mapping[str, object]) -> tuple[type[Op], ...]:
    """The op classes a family module defines (those naming their own `type_name`), in the
    order they are defined: `OPS = collect_ops(globals())` after the last one."""
    module = namespace["__name__"]
    return tuple(
        value for value in namespace.values()
        if isinstance(value, type) and issubclass(value, Op) and value.__module__ == module and "type_name" in value.__dict__
    )
