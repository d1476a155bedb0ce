"""MatMul family."""

from __future__ import annotations

from typing import Any

from rlx_mil.ir import ops
from rlx_mil.lower.context import LowerContext
from rlx_mil.lower.registry import lowering


@lowering(ops.MatMul, family="linalg", notes="`linear` when b is a rank-2 weight, else `matmul`")
def lower_matmul(op: ops.MatMul, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    weight = ctx.value(1)
    if weight is not None and weight.ndim == 2:
        return mb.linear(x=ctx.var(0), weight=weight.T.astype(ctx.float_dtype), name=ctx.name())
    return mb.matmul(x=ctx.var(0), y=ctx.var(1), name=ctx.name())
