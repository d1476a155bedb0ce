"""MIL states: `read_state` reads a state's current value, `coreml_update_state` sets it (the
final value of each state becomes the Core AI state's update)."""

from __future__ import annotations

from typing import Any

from rlx_mil.coreai.registry import RuleContext, rule


def _state_name(ctx: RuleContext, input_name: str) -> str:
    var = ctx.var(input_name)
    name = ctx.translator.state_of_var.get(id(var))
    if name is None:
        raise ctx.fail(f"input '{input_name}' is not a function state")
    return name


@rule("read_state")
def read_state(ctx: RuleContext) -> Any:
    return ctx.translator.state_values[_state_name(ctx, "input")]


@rule("coreml_update_state")
def coreml_update_state(ctx: RuleContext) -> Any:
    value = ctx.v("value")
    ctx.translator.state_values[_state_name(ctx, "state")] = value
    return value
