"""Shape and dtype inference: the table of shape rules and the checks every node goes through.

Each op family (`rlx_mil.ir.ops.<family>`) registers the rules of its ops with `@shape_rule`;
the rules follow the spec's shape rules and are stricter than upstream where the spec asks
rlx_mil to validate (reshape element counts, permutations, narrow bounds, concat dims, gather
layout, norm axes, attention geometry, ...). The helpers rules share are in
`rlx_mil.ir.shape_checks`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from rlx_mil.errors import ArityError, AttributeValueError, GraphError
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.shape import Shape
from rlx_mil.ir.shape_checks import broadcast_all, broadcast_pair, matmul_dims, normalize_axis

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


def has_rule(op_type: type[Op]) -> bool:
    return op_type in _RULES


def infer_shape(op: Op, inputs: Sequence[Shape], declared: Shape | None = None) -> Shape | None:
    """The output shape of `op` applied to `inputs`; raises a GraphError subclass on misuse.

    Errors carry `operand=` (an input role such as "lhs" or "mask") but no node id; callers
    that know the node (Graph.add_node) re-raise with it.
    """
    accepted = op.accepted_arities()
    if accepted and len(inputs) not in accepted:
        raise ArityError(f"expects {_arity_text(op)} inputs, got {len(inputs)}")
    if not accepted and len(inputs) == 0:
        raise ArityError("expects at least 1 input, got 0")
    rule = _RULES.get(type(op))
    if rule is None:
        return None
    try:
        return rule(op, inputs, declared)
    except GraphError as err:
        if err.operand is not None or len(inputs) != 1:
            raise
        # A single-input op's attribute can only be wrong relative to that input.
        raise type(err)(err.detail, operand=input_roles(op, 1)[0]) from None


# -------------------------------------------------------------------------------- input roles


def input_roles(op: Op, count: int) -> tuple[str, ...]:
    """Names of the inputs of `op` (as error messages use them), for `count` inputs.

    Falls back to `inputs[i]` where the op has no fixed roles or `count` is not an accepted
    input count.
    """
    roles = op.roles(count)
    if roles is None or len(roles) != count:
        return tuple(f"inputs[{i}]" for i in range(count))
    return roles


def _arity_text(op: Op) -> str:
    accepted = op.accepted_arities()
    parts = []
    for n in accepted:
        roles = op.roles(n)
        parts.append(f"{n} ({', '.join(roles)})" if roles else str(n))
    return " or ".join(parts)


# -------------------------------------------------------------------------------- attribute types

AttrCheck = tuple[str, Callable[[object], bool], str]


def _integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _type_check(hint: object) -> tuple[Callable[[object], bool], str] | None:
    """A predicate and its wording for one attribute annotation (None: nothing to check)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _type_check(options[0]) if len(options) == 1 else None
        if inner is None:
            return None
        check, text = inner
        return (lambda v: v is None or check(v)), f"{text} or None"
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        item = _type_check(args[0]) if len(args) == 2 and args[1] is Ellipsis else None
        if item is None:
            return None
        item_check, item_text = item
        plural = {"an integer": "integers", "a number": "numbers"}.get(item_text, item_text)
        return (lambda v: isinstance(v, tuple) and all(item_check(x) for x in v)), f"a sequence of {plural}"
    if hint is bool:
        return (lambda v: isinstance(v, (bool, np.bool_))), "a bool"
    if hint is int:
        return _integer, "an integer"
    if hint is float:
        return (lambda v: isinstance(v, float)), "a number"
    if hint is str:
        return (lambda v: isinstance(v, str)), "a string"
    if hint is bytes:
        return (lambda v: isinstance(v, bytes)), "bytes"
    if isinstance(hint, type) and (issubclass(hint, enum.Enum) or dataclasses.is_dataclass(hint)):
        cls = hint
        return (lambda v: isinstance(v, cls)), f"{'an' if cls.__name__[0] in 'AEIOU' else 'a'} {cls.__name__}"
    return None


_ATTRIBUTE_CHECKS: dict[type[Op], tuple[AttrCheck, ...]] = {}


def _attribute_checks(op_type: type[Op]) -> tuple[AttrCheck, ...]:
    checks = _ATTRIBUTE_CHECKS.get(op_type)
    if checks is None:
        hints = typing.get_type_hints(op_type)
        found = ((field.name, _type_check(hints[field.name])) for field in dataclasses.fields(op_type))
        checks = tuple((name, *check) for name, check in found if check is not None)
        _ATTRIBUTE_CHECKS[op_type] = checks
    return checks


def check_attributes(op: object) -> None:
    """`op` must be an IR op whose attributes have their declared types.

    Ops built directly (not through the builder or the JSON loader) skip the parsing those
    do; a mistyped attribute (a string for an enum, None for a float...) would otherwise fail
    deep inside a shape rule, a reference kernel or coremltools.
    """
    if not isinstance(op, Op) or type(op) is Op:
        raise GraphError(f"expected an op from rlx_mil.ir.ops (e.g. ops.MatMul()), got {op!r}")
    for name, check, text in _attribute_checks(type(op)):
        value = getattr(op, name)
        if not check(value):
            raise AttributeValueError(f"attribute {name} must be {text}, got {value!r}")


__all__ = [
    "broadcast_all",
    "broadcast_pair",
    "check_attributes",
    "has_rule",
    "infer_shape",
    "input_roles",
    "matmul_dims",
    "normalize_axis",
    "shape_rule",
]
