"""Stateful ops (read_state / coreml_update_state) and control flow (cond / while_loop)."""

from __future__ import annotations

import numpy as np

from rlx_mil.milexec.registry import OpContext, kernel


@kernel("read_state")
def read_state(ctx: OpContext) -> np.ndarray:
    name = ctx.op.inputs["input"].name
    if name not in ctx.states:
        raise ctx.error(f"state '{name}' has no value")
    # A state the function reads once and writes back is handed out as is (see Plan): writes
    # into it in place only change what the function writes into the state anyway.
    return ctx.states[name] if name in ctx.shared_states else ctx.states[name].copy()


@kernel("coreml_update_state")
def coreml_update_state(ctx: OpContext) -> np.ndarray:
    name = ctx.op.inputs["state"].name
    if name not in ctx.states:
        raise ctx.error(f"state '{name}' has no value")
    current = ctx.states[name]
    value = ctx.raw("value")
    if value.shape != current.shape:
        raise ctx.error(f"value of shape {value.shape} written to state '{name}' of shape {current.shape}")
    if value is not current:
        if current.flags.writeable:
            np.copyto(current, value, casting="unsafe")  # the state's own buffer, updated in place
        else:
            ctx.states[name] = value.astype(current.dtype, copy=True)
    return value


@kernel("cond")
def cond(ctx: OpContext) -> tuple[np.ndarray, ...]:
    branch = ctx.op.blocks[0] if bool(np.asarray(ctx.val("pred"))) else ctx.op.blocks[1]
    return tuple(ctx.run_block(branch, []))


@kernel("while_loop")
def while_loop(ctx: OpContext) -> tuple[np.ndarray, ...]:
    condition, body = ctx.op.blocks
    values = ctx.vals("loop_vars")
    while bool(np.asarray(ctx.run_block(condition, values)[0])):
        values = ctx.run_block(body, values)
    return tuple(values)
