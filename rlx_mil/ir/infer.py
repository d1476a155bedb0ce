"""Shape and dtype inference, one rule per op type (spec sections 3-11)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from rlx_mil.ir.ops import Op
from rlx_mil.ir.shape import Shape

OpT = TypeVar("OpT", bound=Op)
ShapeRule = Callable[[Op, Sequence[Shape], "Shape | None"], "Shape | None"]

_RULES: dict[type[Op], ShapeRule] = {}


def shape_rule(op_type: type[OpT]) -> Callable[[Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]], Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]]:
    """Register the inference rule of `op_type`.

    A rule gets the op, its input shapes and the declared shape (None when the builder asks
    for inference). It returns the output shape, or None where the output is only known from
    the declaration (leaves), and raises a GraphError subclass (with `operand=` set where one
    input is at fault) on any violation.
    """

    def register(fn: Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]) -> Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]:
        _RULES[op_type] = fn  # type: ignore[assignment]
        return fn

    return register


def infer_shape(op: Op, inputs: Sequence[Shape], declared: Shape | None = None) -> Shape | None:
    rule = _RULES.get(type(op))
    if rule is None:
        return None
    return rule(op, inputs, declared)
