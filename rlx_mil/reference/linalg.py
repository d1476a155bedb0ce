"""Reference kernels of the matrix products."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir.ops import (
    DotGeneral,
    FusedMatMulBiasAct,
    FusedMatMulResidual,
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


@reference_kernel(FusedMatMulResidual)
def _fused_matmul_residual(op: FusedMatMulResidual, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    lhs, rhs, residual = inputs
    product = matmul(lhs, rhs)
    return finish(product + residual.astype(product.dtype), out)


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


_EINSUM_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def dot_general(op: DotGeneral, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """XLA `dot_general` as one einsum: output = batch dims (lhs order), lhs free dims, rhs
    free dims (spec part 2, section 2.7)."""
    letters = iter(_EINSUM_LETTERS)
    sa: list[str | None] = [None] * a.ndim
    sb: list[str | None] = [None] * b.ndim
    for kind, pairs in (("batch", zip(op.lhs_batch, op.rhs_batch, strict=True)),
                        ("contracting", zip(op.lhs_contracting, op.rhs_contracting, strict=True))):
        for i, j in pairs:
            if a.shape[i] != b.shape[j]:
                raise ShapeError(f"{kind} dims differ: lhs axis {i} is {a.shape[i]}, rhs axis {j} is {b.shape[j]}",
                                 operand="rhs")
            sa[i] = sb[j] = next(letters)
    lhs = [s or next(letters) for s in sa]
    rhs = [s or next(letters) for s in sb]
    paired_a, paired_b = {*op.lhs_batch, *op.lhs_contracting}, {*op.rhs_batch, *op.rhs_contracting}
    out = ([lhs[i] for i in op.lhs_batch] + [lhs[i] for i in range(a.ndim) if i not in paired_a]
           + [rhs[j] for j in range(b.ndim) if j not in paired_b])
    x, y = float_operands(a, b)
    return np.einsum(f"{''.join(lhs)},{''.join(rhs)}->{''.join(out)}", x, y)


@reference_kernel(DotGeneral)
def _dot_general(op: DotGeneral, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(dot_general(op, inputs[0], inputs[1]), out)
