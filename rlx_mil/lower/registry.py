"""The lowering-rule table: one rule per IR op type.

A rule takes the op and a `LowerContext` and returns the MIL var holding the node's value.
Rules live in modules by op family (`rlx_mil.lower.rules.*`); importing `rlx_mil.lower.rules`
registers them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rlx_mil.errors import UnsupportedOpError
from rlx_mil.ir.ops import Op
from rlx_mil.lower.target import Target

if TYPE_CHECKING:
    from rlx_mil.lower.context import LowerContext

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


def lowering(
    op_type: type[OpT], *, family: str, min_target: Target = Target.IOS15, notes: str = ""
) -> Callable[[Callable[[OpT, LowerContext], Any]], Callable[[OpT, LowerContext], Any]]:
    """Register the lowering rule of `op_type` (one per op type)."""

    def register(fn: Callable[[OpT, LowerContext], Any]) -> Callable[[OpT, LowerContext], Any]:
        if op_type in _RULES:
            raise RuntimeError(f"duplicate lowering rule for {op_type.type_name}")
        _RULES[op_type] = RuleInfo(op_type, fn, family, min_target, notes)
        return fn

    return register


def registered_rules() -> dict[type[Op], RuleInfo]:
    import rlx_mil.lower.rules  # noqa: F401  (registers every rule)

    return dict(_RULES)


def rule_for(op: Op, target: Target, *, node: int | None = None, name: str | None = None) -> RuleInfo:
    info = registered_rules().get(type(op))
    if info is None:
        raise UnsupportedOpError(
            f"node %{node}{f' {name!r}' if name else ''}: no Core ML lowering for op {op.type_name}"
        )
    if target < info.min_target:
        raise UnsupportedOpError(
            f"node %{node}{f' {name!r}' if name else ''}: op {op.type_name} needs target"
            f" {info.min_target.label} or newer (asked for {target.label})"
        )
    return info
