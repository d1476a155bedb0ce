"""The lowering-rule table: one rule per IR op type.

A rule takes the op and a `LowerContext` and returns the MIL var holding the node's value.
Rules live in modules by op family (`rlx_mil.lowering.rules.*`); importing `rlx_mil.lowering.rules`
registers them all.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from rlx_mil.errors import UnsupportedOpError
from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.ops import Op, family_of
from rlx_mil.lowering.target import Target

if TYPE_CHECKING:
    from rlx_mil.lowering.context import LowerContext

OpT = TypeVar("OpT", bound=Op)
LoweringRule = Callable[[Any, "LowerContext"], Any]


@dataclass(frozen=True)
class RuleInfo:
    op_type: type[Op]
    rule: LoweringRule
    family: str
    min_target: Target
    #: One line for docs/op-coverage.md: which MIL ops it emits, per-target differences and
    #: the attribute combinations it rejects.
    notes: str


_RULES: dict[type[Op], RuleInfo] = {}

#: Layouts a Param may arrive in besides its declared shape. Rule modules register hooks
#: (graph, param node, array) -> bool that accept an array as given because the consuming rule
#: decodes it, e.g. 4-bit weight codes packed two per byte behind a logical [K, N] Param.
PARAM_LAYOUT_HOOKS: list[Callable[[Graph, Node, np.ndarray], bool]] = []


def lowering(
    *, min_target: Target = Target.IOS15, notes: str = ""
) -> Callable[[Callable[[OpT, LowerContext], Any]], Callable[[OpT, LowerContext], Any]]:
    """Register a lowering rule. The op type is the annotation of the rule's first parameter
    and the family the name of the module defining it (`rules/<family>.py`), as
    stablehlo-coreml's `ops_register` does: `@lowering(notes=...)` above
    `def lower_x(op: ops.X, ctx: LowerContext)` is all a rule declares."""

    def register(fn: Callable[[OpT, LowerContext], Any]) -> Callable[[OpT, LowerContext], Any]:
        op_type = _annotated_op_type(fn)
        family = fn.__module__.rsplit(".", 1)[-1]
        if family_of(op_type) != family:
            raise RuntimeError(
                f"the rule {fn.__qualname__} for {op_type.type_name} lives in rules/{family}.py, but the op's family is"
                f" {family_of(op_type)!r}"
            )
        if op_type in _RULES:
            raise RuntimeError(f"duplicate lowering rule for {op_type.type_name}")
        _RULES[op_type] = RuleInfo(op_type, fn, family, min_target, notes)
        return fn

    return register


def _annotated_op_type(fn: Callable[..., Any]) -> type[Op]:
    params = inspect.signature(fn).parameters
    first = next(iter(params.values()), None)
    annotation = None if first is None else first.annotation
    if isinstance(annotation, str):  # `from __future__ import annotations`
        annotation = eval(annotation, fn.__globals__)  # the rule module's own names
    if not (isinstance(annotation, type) and issubclass(annotation, Op)):
        raise RuntimeError(f"the rule {fn.__qualname__} must annotate its first parameter with the IR op class it lowers")
    return annotation


def registered_rules() -> dict[type[Op], RuleInfo]:
    """Every registered rule (`rlx_mil.lowering.program` imports the rule modules, so all are
    registered once `rlx_mil` is imported)."""
    return dict(_RULES)


def rule_for(op: Op, target: Target, *, node: int | None = None, name: str | None = None) -> RuleInfo:
    info = _RULES.get(type(op))
    if info is None:
        raise UnsupportedOpError(f"node %{node}{f' {name!r}' if name else ''}: no Core ML lowering for op {op.type_name}")
    if target < info.min_target:
        raise UnsupportedOpError(
            f"node %{node}{f' {name!r}' if name else ''}: op {op.type_name} needs target"
            f" {info.min_target.label} or newer (asked for {target.label})"
        )
    return info
