"""Reference kernels of the losses and training pieces (`rlx_mil.ir.ops.training`), float32
like every kernel (float64 where the inputs are)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from rlx_mil.errors import EvaluationError
from rlx_mil.ir.ops import ActivationKind
from rlx_mil.ir.ops.qcompute import Q_MAX
from rlx_mil.ir.ops.training import (
    ActivationBackward,
    CumsumBackward,
    FakeQuantizeLSQ,
    GatherBackward,
    ReluBackward,
    RopeBackward,
    SoftmaxCrossEntropy,
    SoftmaxCrossEntropyWithLogits,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.ir.shape_checks import normalize_axis
from rlx_mil.reference.qcompute import round_half_away
from rlx_mil.reference.registry import finish, float_operands, reference_kernel
from rlx_mil.reference.rope import rope
from rlx_mil.reference.shape import gather_indices
from rlx_mil.reference.special import erf

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-v))


def _gelu_exact(v: np.ndarray) -> np.ndarray:
    w = v.astype(np.float64)
    cdf = 0.5 * (1.0 + erf(w / math.sqrt(2.0)))
    return (cdf + w * np.exp(-0.5 * w * w) / math.sqrt(2.0 * math.pi)).astype(v.dtype)


def _gelu_tanh(v: np.ndarray) -> np.ndarray:
    t = np.tanh(_SQRT_2_OVER_PI * (v + _GELU_CUBIC * v**3))
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _GELU_CUBIC * v * v)


def _mish(v: np.ndarray) -> np.ndarray:
    t = np.tanh(np.logaddexp(0, v))
    return t + v * (1 - t * t) * _sigmoid(v)


#: d/dx act(x) for each Activation kind (upstream's closed forms; docs/upstream-ops-3.md lists
#: the conventions at kinks: Relu and Abs take 0 at 0, Round passes the gradient straight through,
#: Sqrt and Rsqrt give 0 where sqrt(x) is not > 0).
DERIVATIVES: dict[ActivationKind, Callable[[np.ndarray], np.ndarray]] = {
    ActivationKind.GELU: _gelu_exact,
    ActivationKind.GELU_APPROX: _gelu_tanh,
    ActivationKind.SILU: lambda v: _sigmoid(v) * (1 + v * (1 - _sigmoid(v))),
    ActivationKind.RELU: lambda v: (v > 0).astype(v.dtype),
    ActivationKind.SIGMOID: lambda v: _sigmoid(v) * (1 - _sigmoid(v)),
    ActivationKind.TANH: lambda v: 1 - np.tanh(v) ** 2,
    ActivationKind.EXP: np.exp,
    ActivationKind.LOG: lambda v: 1 / v,
    ActivationKind.SQRT: lambda v: np.where(np.sqrt(v) > 0, 0.5 / np.sqrt(v), 0),
    ActivationKind.RSQRT: lambda v: np.where(np.sqrt(v) > 0, -0.5 / (v * np.sqrt(v)), 0),
    ActivationKind.NEG: lambda v: np.full_like(v, -1),
    ActivationKind.ABS: np.sign,
    ActivationKind.ROUND: np.ones_like,
    ActivationKind.SIN: np.cos,
    ActivationKind.COS: lambda v: -np.sin(v),
    ActivationKind.TAN: lambda v: 1 + np.tan(v) ** 2,
    ActivationKind.ATAN: lambda v: 1 / (1 + v * v),
    ActivationKind.RECIP: lambda v: -1 / (v * v),
    ActivationKind.FLOOR: np.zeros_like,
    ActivationKind.CEIL: np.zeros_like,
    ActivationKind.SIGN: np.zeros_like,
    ActivationKind.SOFTPLUS: _sigmoid,
    ActivationKind.ELU: lambda v: np.where(v > 0, 1, np.exp(np.minimum(v, 0))),
    ActivationKind.ERF: lambda v: (2 / math.sqrt(math.pi)) * np.exp(-v * v),
    ActivationKind.HARD_SWISH: lambda v: np.where(v < -3, 0, np.where(v <= 3, (2 * v + 3) / 6, 1)),
    ActivationKind.HARD_SIGMOID: lambda v: np.where((v > -3) & (v < 3), 1 / 6, 0),
    ActivationKind.MISH: _mish,
    ActivationKind.SOFTSIGN: lambda v: 1 / (1 + np.abs(v)) ** 2,
    ActivationKind.LOG_SIGMOID: lambda v: _sigmoid(-v),
}


def activation_derivative(kind: ActivationKind, x: np.ndarray) -> np.ndarray:
    """`act'(x)` in x's float type (float32 for narrower floats)."""
    (v,) = float_operands(x)
    with np.errstate(all="ignore"):
        return np.asarray(DERIVATIVES[kind](v), dtype=v.dtype)


@reference_kernel(ReluBackward)
def _relu_backward(op: ReluBackward, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, dy = inputs
    return finish(np.where(x > 0, dy, np.zeros_like(dy)), out)


#: Kinds whose gradient upstream selects to exactly 0 off a mask (whatever dy holds there).
MASKED = {ActivationKind.RELU: lambda v: v > 0, ActivationKind.SQRT: lambda v: np.sqrt(v) > 0,
          ActivationKind.RSQRT: lambda v: np.sqrt(v) > 0}


@reference_kernel(ActivationBackward)
def _activation_backward(op: ActivationBackward, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, dy = float_operands(*inputs)
    with np.errstate(all="ignore"):
        grad = activation_derivative(op.kind, x) * dy
        if op.kind in MASKED:
            grad = np.where(MASKED[op.kind](x), grad, 0)
        return finish(grad, out)


def suffix_sum(dy: np.ndarray, axis: int, exclusive: bool) -> np.ndarray:
    """`sum_{i >= j} dy_i` along `axis` (`i > j` when `exclusive`)."""
    total = np.flip(np.cumsum(np.flip(dy, axis), axis=axis), axis)
    return total - dy if exclusive else total


@reference_kernel(CumsumBackward)
def _cumsum_backward(op: CumsumBackward, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    (dy,) = float_operands(inputs[0])
    return finish(suffix_sum(dy, normalize_axis(op.axis, dy.ndim), op.exclusive), out)


@reference_kernel(GatherBackward)
def _gather_backward(op: GatherBackward, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    dy, indices = inputs
    sizes = out.sizes()
    axis = normalize_axis(op.axis, len(sizes))
    idx = gather_indices(indices, sizes[axis]).reshape(-1)
    (grad,) = float_operands(dy)
    rows = grad.reshape((*sizes[:axis], idx.size, *sizes[axis + 1:]))
    table = np.zeros(sizes, grad.dtype)
    np.add.at(np.moveaxis(table, axis, 0), idx, np.moveaxis(rows, axis, 0))
    return finish(table, out)


@reference_kernel(RopeBackward)
def _rope_backward(op: RopeBackward, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    dy, cos, sin = inputs
    return finish(rope(dy, cos, -np.asarray(sin), op.head_dim, op.n_rot), out)


def log_sum_exp(logits: np.ndarray) -> np.ndarray:
    """Over the last axis, max-subtracted (a row of -inf gives -inf, one with +inf gives inf)."""
    peak = np.max(logits, axis=-1, keepdims=True)
    safe = np.where(np.isfinite(peak), peak, 0)
    with np.errstate(all="ignore"):
        return (np.log(np.sum(np.exp(logits - safe), axis=-1, keepdims=True)) + safe)[..., 0]


@reference_kernel(SoftmaxCrossEntropy)
def _softmax_cross_entropy(op: SoftmaxCrossEntropy, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    logits, targets = float_operands(*inputs)
    with np.errstate(all="ignore"):
        return finish(log_sum_exp(logits) - np.sum(targets * logits, axis=-1), out)


@reference_kernel(SoftmaxCrossEntropyWithLogits)
def _softmax_cross_entropy_labels(
    op: SoftmaxCrossEntropyWithLogits, inputs: Sequence[np.ndarray], out: Shape,
) -> np.ndarray:
    (logits,) = float_operands(inputs[0])
    labels = gather_indices(inputs[1], logits.shape[-1])
    picked = np.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    with np.errstate(all="ignore"):
        return finish(log_sum_exp(logits) - picked, out)


@reference_kernel(FakeQuantizeLSQ)
def _fake_quantize_lsq(op: FakeQuantizeLSQ, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = np.asarray(inputs[0]).astype(np.float32)
    scale = np.asarray(inputs[1]).astype(np.float32)
    if (scale <= 0).any() or not np.isfinite(scale).all():
        raise EvaluationError("FakeQuantizeLSQ scale must be finite and > 0", [f"scale holds {scale.min()}"])
    shape = [1] * x.ndim
    if op.axis is not None:
        shape[op.axis] = x.shape[op.axis]
    s = scale.reshape(shape) if op.axis is not None else scale.reshape(())
    q = np.float32(Q_MAX[op.bits])
    with np.errstate(over="ignore", invalid="ignore"):
        return finish(np.clip(round_half_away(x / s), -q, q) * s, out)
