"""MIL reductions (reduce_*, reduce_argmax/argmin) and softmax; all accumulate in float32."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.milexec.kernels._math import softmax
from rlx_mil.milexec.registry import OpContext, kernel

Reducer = Callable[[np.ndarray, tuple[int, ...] | None, bool], np.ndarray]


def _log_sum_exp(x: np.ndarray, axes: tuple[int, ...] | None, keep: bool) -> np.ndarray:
    peak = np.max(x, axis=axes, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    total = np.sum(np.exp(x - peak), axis=axes, keepdims=True)
    out = np.log(total) + peak
    return out if keep else np.squeeze(out, axis=axes)


_REDUCERS: dict[str, Reducer] = {
    "reduce_sum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "reduce_mean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "reduce_prod": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "reduce_max": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "reduce_min": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "reduce_l1_norm": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "reduce_l2_norm": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)),
    "reduce_sum_square": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
    "reduce_log_sum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "reduce_log_sum_exp": _log_sum_exp,
}


def axes_param(ctx: OpContext, rank: int) -> tuple[int, ...] | None:
    if not ctx.has("axes"):
        return None
    axes = ctx.param("axes")
    if axes is None:
        return None
    if isinstance(axes, int):
        axes = [axes]
    return tuple(sorted({a + rank if a < 0 else a for a in axes}))


def _register_reducer(op_type: str, fn: Reducer) -> None:
    def run(ctx: OpContext) -> np.ndarray:
        x = ctx.val("x")
        if x.dtype.kind == "f":
            x = x.astype(np.float32, copy=False)
        return np.asarray(fn(x, axes_param(ctx, x.ndim), bool(ctx.param("keep_dims", False))))

    run.__name__ = op_type
    kernel(op_type)(run)


for _name, _fn in _REDUCERS.items():
    _register_reducer(_name, _fn)


@kernel("reduce_argmax", "reduce_argmin")
def reduce_arg(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    axis = int(ctx.param("axis", -1))
    fn = np.argmax if ctx.op_type == "reduce_argmax" else np.argmin
    return np.asarray(fn(x, axis=axis, keepdims=bool(ctx.param("keep_dims", False))))


@kernel("softmax")
def softmax_kernel(ctx: OpContext) -> np.ndarray:
    return softmax(ctx.val("x"), axis=int(ctx.param("axis", -1)))
