"""Reference kernels of the matrix products."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir.ops import (
    FusedMatMulBiasAct,
    LoraMatMul,
    MatMul,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.elementwise import activation
from rlx_mil.reference.registry import (
    as_vector,
    broadcast_sizes,
    finish,
    float_operands,
    reference_kernel,
)


def matmul(a: np.ndarray, b: np.ndarray, names: tuple[str, str] = ("a", "b")) -> np.ndarray:
    if a.ndim < 2 or b.ndim < 2:
        bad = names[0] if a.ndim < 2 else names[1]
        raise ShapeError(f"MatMul operands need rank >= 2, got {list(a.shape)} @ {list(b.shape)}", operand=bad)
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"contraction dims differ: {list(a.shape)} @ {list(b.shape)}", operand=names[1]
        )
    broadcast_sizes([a.shape[:-2], b.shape[:-2]], [f"{names[0]} batch", f"{names[1]} batch"])
    x, y = float_operands(a, b)
    return np.matmul(x, y)


@reference_kernel(MatMul)
def _matmul(op: MatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(matmul(inputs[0], inputs[1]), out)


@reference_kernel(LoraMatMul)
def _lora_matmul(op: LoraMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, w, a, b = inputs
    for name, t in (("w", w), ("a", a), ("b", b)):
        if t.ndim != 2:
            raise ShapeError(f"{name} must be rank 2, got {list(t.shape)}", operand=name)
    if a.shape[0] != x.shape[-1] or b.shape[0] != a.shape[1] or b.shape[1] != w.shape[1]:
        raise ShapeError(
            f"adapter shapes a {list(a.shape)}, b {list(b.shape)} do not fit x {list(x.shape)} @ w {list(w.shape)}",
            operand="a",
        )
    base = matmul(x, w, ("x", "w"))
    dt = base.dtype.type
    low_rank = matmul(matmul(x, a, ("x", "a")), b, ("x@a", "b"))
    return finish(base + dt(op.scale) * low_rank.astype(base.dtype), out)


def bias_vector(bias: np.ndarray, n: int, dtype: np.dtype, operand: str = "bias") -> np.ndarray:
    return as_vector(bias, n, operand, dtype)


@reference_kernel(FusedMatMulBiasAct)
def _fused_matmul_bias_act(op: FusedMatMulBiasAct, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, w, bias = inputs
    y = matmul(x, w, ("x", "w"))
    y = y + bias_vector(bias, y.shape[-1], y.dtype)
    if op.activation is not None:
        y = activation(op.activation, y)
    return finish(y, out)
