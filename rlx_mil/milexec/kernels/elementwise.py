"""Elementwise MIL ops: unary math, binary arithmetic, comparisons, logic, select, cast and the
activations."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rlx_mil.milexec.kernels._math import erf, sigmoid, softplus
from rlx_mil.milexec.registry import OpContext, kernel

Unary = Callable[[np.ndarray], np.ndarray]
Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _register_unary(op_type: str, fn: Unary) -> None:
    def run(ctx: OpContext) -> np.ndarray:
        return np.asarray(fn(ctx.val("x")))

    run.__name__ = f"unary_{op_type}"
    kernel(op_type)(run)


def _register_binary(op_type: str, fn: Binary) -> None:
    def run(ctx: OpContext) -> np.ndarray:
        return np.asarray(fn(ctx.val("x"), ctx.val("y")))

    run.__name__ = f"binary_{op_type}"
    kernel(op_type)(run)


def _erf32(x: np.ndarray) -> np.ndarray:
    return erf(x).astype(np.float32)


_UNARY: dict[str, Unary] = {
    "abs": np.abs,
    "acos": np.arccos,
    "asin": np.arcsin,
    "atan": np.arctan,
    "atanh": np.arctanh,
    "ceil": np.ceil,
    "cos": np.cos,
    "cosh": np.cosh,
    "erf": _erf32,
    "exp": np.exp,
    "exp2": np.exp2,
    "floor": np.floor,
    # MIL round sends halves to the even neighbour (0.5 -> 0), like np.rint.
    "round": np.rint,
    "sign": np.sign,
    "sin": np.sin,
    "sinh": np.sinh,
    "sqrt": np.sqrt,
    "square": np.square,
    "tan": np.tan,
    "tanh": np.tanh,
    "logical_not": np.logical_not,
    "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.minimum(np.maximum(x, 0), 6),
    "sigmoid": sigmoid,
    "silu": lambda x: x * sigmoid(x),
    "softplus": softplus,
    "softsign": lambda x: x / (1 + np.abs(x)),
    "identity": lambda x: x,
}

_BINARY: dict[str, Binary] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "real_div": np.true_divide,
    "floor_div": np.floor_divide,
    # Python-style remainder (sign of the divisor), as coremltools' reference computes it.
    "mod": np.remainder,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}

for _unary_name, _unary_fn in _UNARY.items():
    _register_unary(_unary_name, _unary_fn)
for _binary_name, _binary_fn in _BINARY.items():
    _register_binary(_binary_name, _binary_fn)


@kernel("cast")
def cast(ctx: OpContext) -> np.ndarray:
    # The executor rounds every result to its declared dtype, which is exactly the cast
    # (float -> int truncates toward zero, -> bool tests != 0, fp32 -> fp16 rounds to nearest).
    return ctx.val("x")


@kernel("select")
def select(ctx: OpContext) -> np.ndarray:
    return np.where(ctx.val("cond").astype(bool), ctx.val("a"), ctx.val("b"))


def _eps(ctx: OpContext, default: float) -> np.ndarray:
    return ctx.val("epsilon") if ctx.has("epsilon") else np.float32(default)


@kernel("inverse")
def inverse(ctx: OpContext) -> np.ndarray:
    return 1.0 / (ctx.val("x") + _eps(ctx, 1e-4))


@kernel("log")
def log(ctx: OpContext) -> np.ndarray:
    return np.log(ctx.val("x") + _eps(ctx, 1e-45))


@kernel("rsqrt")
def rsqrt(ctx: OpContext) -> np.ndarray:
    return 1.0 / np.sqrt(ctx.val("x") + _eps(ctx, 1e-12))


@kernel("clip")
def clip(ctx: OpContext) -> np.ndarray:
    return np.minimum(np.maximum(ctx.val("x"), ctx.val("alpha")), ctx.val("beta"))


@kernel("threshold")
def threshold(ctx: OpContext) -> np.ndarray:
    return np.maximum(ctx.val("x"), ctx.val("alpha"))


@kernel("clamped_relu")
def clamped_relu(ctx: OpContext) -> np.ndarray:
    x, alpha, beta = ctx.val("x"), ctx.val("alpha"), ctx.val("beta")
    return np.minimum(np.where(x >= 0, x, alpha * x), beta)


@kernel("elu")
def elu(ctx: OpContext) -> np.ndarray:
    x, alpha = ctx.val("x"), ctx.val("alpha")
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


@kernel("leaky_relu")
def leaky_relu(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    return np.where(x >= 0, x, ctx.val("alpha") * x)


@kernel("thresholded_relu")
def thresholded_relu(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    return np.where(x >= ctx.val("alpha"), x, np.zeros_like(x))


def _per_channel(param: np.ndarray, rank: int) -> np.ndarray:
    """A [C] parameter shaped to broadcast along axis 1 of a rank-`rank` tensor."""
    return param.reshape((1, -1) + (1,) * (rank - 2))


@kernel("prelu")
def prelu(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    alpha = _per_channel(ctx.val("alpha"), x.ndim)
    return np.where(x > 0, x, alpha * x)


@kernel("softplus_parametric")
def softplus_parametric(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    alpha = _per_channel(ctx.val("alpha"), x.ndim)
    beta = _per_channel(ctx.val("beta"), x.ndim)
    return alpha * softplus(beta * x)


@kernel("scaled_tanh")
def scaled_tanh(ctx: OpContext) -> np.ndarray:
    return ctx.val("alpha") * np.tanh(ctx.val("beta") * ctx.val("x"))


@kernel("sigmoid_hard")
def sigmoid_hard(ctx: OpContext) -> np.ndarray:
    return np.clip(ctx.val("alpha") * ctx.val("x") + ctx.val("beta"), 0, 1)


@kernel("linear_activation")
def linear_activation(ctx: OpContext) -> np.ndarray:
    return ctx.val("alpha") * ctx.val("x") + ctx.val("beta")


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


@kernel("gelu")
def gelu(ctx: OpContext) -> np.ndarray:
    x = ctx.val("x")
    mode = ctx.param("mode", "EXACT")
    if mode == "TANH_APPROXIMATION":
        return 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    if mode == "SIGMOID_APPROXIMATION":
        return x * sigmoid(1.702 * x)
    if mode != "EXACT":
        raise ctx.error(f"unknown gelu mode {mode!r}")
    wide = x.astype(np.float64)
    return (0.5 * wide * (1 + erf(wide / math.sqrt(2)))).astype(np.float32)
