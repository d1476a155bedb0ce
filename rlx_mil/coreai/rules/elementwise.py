"""Elementwise MIL ops: arithmetic, comparisons, logic, activations, cast, select."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_mil.coreai.registry import RuleContext, numpy_dtype, rule

_BINARY = {
    "add": "broadcasting_add", "sub": "broadcasting_sub", "mul": "broadcasting_mul",
    "real_div": "broadcasting_divide", "maximum": "broadcasting_maximum", "minimum": "broadcasting_minimum",
    "pow": "broadcasting_pow", "equal": "broadcasting_equal", "not_equal": "broadcasting_not_equal",
    "greater": "broadcasting_greater", "logical_and": "broadcasting_and", "logical_or": "broadcasting_or",
    "logical_xor": "broadcasting_xor",
}


def _binary(ctx: RuleContext) -> Any:
    return getattr(ctx.ops, _BINARY[ctx.op_type])(ctx.v("x"), ctx.v("y"))


for _op_type in _BINARY:
    rule(_op_type)(_binary)


@rule("less")
def less(ctx: RuleContext) -> Any:
    return ctx.ops.broadcasting_greater(ctx.v("y"), ctx.v("x"))


@rule("greater_equal")
def greater_equal(ctx: RuleContext) -> Any:
    x, y = ctx.v("x"), ctx.v("y")
    return ctx.ops.broadcasting_or(ctx.ops.broadcasting_greater(x, y), ctx.ops.broadcasting_equal(x, y))


@rule("less_equal")
def less_equal(ctx: RuleContext) -> Any:
    x, y = ctx.v("x"), ctx.v("y")
    return ctx.ops.broadcasting_or(ctx.ops.broadcasting_greater(y, x), ctx.ops.broadcasting_equal(x, y))


@rule("floor_div")
def floor_div(ctx: RuleContext) -> Any:
    return ctx.ops.broadcasting_floor_divide(ctx.v("x"), ctx.v("y"))


@rule("mod")
def mod(ctx: RuleContext) -> Any:
    # MIL mod takes the divisor's sign (x - floor(x / y) * y).
    x, y = ctx.v("x"), ctx.v("y")
    return ctx.ops.broadcasting_sub(x, ctx.ops.broadcasting_mul(ctx.ops.broadcasting_floor_divide(x, y), y))


@rule("logical_not")
def logical_not(ctx: RuleContext) -> Any:
    return ctx.ops.not_(ctx.v("x"))


_UNARY = {"abs": "abs_", "exp": "exp", "sqrt": "sqrt", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh",
          "sigmoid": "sigmoid", "relu": "relu", "silu": "silu", "erf": "erf", "atan": "atan", "asin": "asin",
          "acos": "acos", "sinh": "sinh", "cosh": "cosh", "atanh": "atanh", "asinh": "asinh", "acosh": "acosh",
          "round": "round_"}


def _unary(ctx: RuleContext) -> Any:
    return getattr(ctx.ops, _UNARY[ctx.op_type])(ctx.v("x"))


for _op_type in _UNARY:
    rule(_op_type)(_unary)


def _with_epsilon(ctx: RuleContext, x: Any) -> Any:
    eps = ctx.param("epsilon", 0.0)
    return ctx.ops.broadcasting_add(x, ctx.scalar(eps, x)) if eps else x


@rule("rsqrt")
def rsqrt(ctx: RuleContext) -> Any:
    return ctx.ops.rsqrt(_with_epsilon(ctx, ctx.v("x")))


@rule("log")
def log(ctx: RuleContext) -> Any:
    return ctx.ops.log(_with_epsilon(ctx, ctx.v("x")))


@rule("inverse")
def inverse(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    return ctx.ops.broadcasting_divide(ctx.scalar(1.0, x), _with_epsilon(ctx, x))


@rule("square")
def square(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    return ctx.ops.broadcasting_mul(x, x)


def _floor(ctx: RuleContext, x: Any) -> Any:
    return ctx.ops.broadcasting_floor_divide(x, ctx.scalar(1.0, x))


@rule("floor")
def floor(ctx: RuleContext) -> Any:
    return _floor(ctx, ctx.v("x"))


@rule("ceil")
def ceil(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    minus_one = ctx.scalar(-1.0, x)
    return ctx.ops.broadcasting_mul(_floor(ctx, ctx.ops.broadcasting_mul(x, minus_one)), minus_one)


@rule("sign")
def sign(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    zero = ctx.scalar(0, x)
    positive = ctx.ops.cast(ctx.ops.broadcasting_greater(x, zero), numpy_dtype(x).type)
    negative = ctx.ops.cast(ctx.ops.broadcasting_greater(zero, x), numpy_dtype(x).type)
    return ctx.ops.broadcasting_sub(positive, negative)


@rule("clip")
def clip(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    return ctx.ops.broadcasting_minimum(ctx.ops.broadcasting_maximum(x, ctx.v("alpha")), ctx.v("beta"))


@rule("softplus")
def softplus(ctx: RuleContext) -> Any:
    # max(x, 0) + log(1 + exp(-|x|)): no overflow for large x.
    x = ctx.v("x")
    tail = ctx.ops.log(ctx.ops.broadcasting_add(ctx.ops.exp(ctx.ops.broadcasting_mul(ctx.ops.abs_(x), ctx.scalar(-1, x))),
                                                ctx.scalar(1, x)))
    return ctx.ops.broadcasting_add(ctx.ops.broadcasting_maximum(x, ctx.scalar(0, x)), tail)


@rule("gelu")
def gelu(ctx: RuleContext) -> Any:
    mode = ctx.param("mode", "EXACT")
    x = ctx.v("x")
    if mode == "EXACT":
        return ctx.ops.gelu(x, approximate="none")
    if mode == "TANH_APPROXIMATION":
        return ctx.ops.gelu(x, approximate="tanh")
    # SIGMOID_APPROXIMATION: x * sigmoid(1.702 x)
    return ctx.ops.broadcasting_mul(x, ctx.ops.sigmoid(ctx.ops.broadcasting_mul(x, ctx.scalar(1.702, x))))


@rule("leaky_relu")
def leaky_relu(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    alpha = ctx.scalar(ctx.param("alpha", 0.01), x)
    return ctx.ops.broadcasting_maximum(x, ctx.ops.broadcasting_mul(x, alpha))


@rule("elu")
def elu(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    alpha = ctx.scalar(ctx.param("alpha", 1.0), x)
    negative = ctx.ops.broadcasting_mul(alpha, ctx.ops.broadcasting_sub(ctx.ops.exp(x), ctx.scalar(1, x)))
    return ctx.ops.broadcasting_where(ctx.ops.broadcasting_greater(x, ctx.scalar(0, x)), x, negative)


@rule("linear_activation")
def linear_activation(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    return ctx.ops.broadcasting_add(ctx.ops.broadcasting_mul(x, ctx.scalar(ctx.param("alpha", 1.0), x)),
                                    ctx.scalar(ctx.param("beta", 0.0), x))


@rule("select")
def select(ctx: RuleContext) -> Any:
    return ctx.ops.broadcasting_where(ctx.v("cond"), ctx.v("a"), ctx.v("b"))


@rule("cast")
def cast(ctx: RuleContext) -> Any:
    x = ctx.v("x")
    target = ctx.out_dtype()
    source = numpy_dtype(x)
    if source.kind == "f" and target.kind in "iu":
        # MIL casts float -> int by truncation toward zero.
        x = ctx.ops.broadcasting_where(ctx.ops.broadcasting_greater(x, ctx.scalar(0, x)), _floor(ctx, x),
                                       ctx.ops.broadcasting_mul(_floor(ctx, ctx.ops.broadcasting_mul(x, ctx.scalar(-1, x))),
                                                                ctx.scalar(-1, x)))
    if ctx.param("dtype") == "fp16" and target.kind == "f" and target != np.float16:
        # An explicit cast to fp16 rounds even when floats are held wider.
        return ctx.cast(ctx.ops.cast(ctx.cast(x, target), np.float16), target)
    return ctx.cast(x, target)


@rule("identity")
def identity(ctx: RuleContext) -> Any:
    return ctx.v("x")

