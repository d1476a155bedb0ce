"""Losses and training pieces: element-wise derivatives in MIL, the rest as small IR graphs of
existing ops (GatherBackward = Reshape + ScatterAdd, RopeBackward = Rope with -sin)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_mil.errors import DTypeError
from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import ActivationKind
from rlx_mil.ir.ops.qcompute import Q_MAX
from rlx_mil.ir.shape_checks import normalize_axis
from rlx_mil.lowering.context import LowerContext
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.qcompute import round_half_away
from rlx_mil.lowering.rules.shape import gather_indices


def decomposed(ctx: LowerContext, build: Callable[[Graph, list[int]], int]) -> Any:
    """Lower this node as the IR graph `build(graph, inputs)` returns the output of; `inputs`
    are Input nodes standing for the node's inputs, so each piece goes through its own rule."""
    graph = Graph(f"{ctx.base_name}_parts")
    inputs = [graph.input(f"in{i}", ctx.input_shape(i).dims, ctx.input_shape(i).dtype) for i in range(ctx.num_inputs)]
    graph.set_outputs([build(graph, inputs)])
    return ctx.lower_subgraph(graph, {node: i for i, node in enumerate(inputs)})[0]


def _require_float(ctx: LowerContext, i: int, role: str) -> None:
    if not ctx.input_shape(i).dtype.is_float:
        raise ctx.fail(DTypeError, f"{role} must be a float tensor, got {ctx.input_shape(i).dtype.value}", role)


@lowering(notes="`select(greater(x, 0), dy, 0)`: a NaN x passes no gradient, as upstream's `x > 0` test.")
def lower_relu_backward(op: ops.ReluBackward, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    _require_float(ctx, 0, "x")
    positive = mb.greater(x=ctx.var(0), y=ctx.scalar(0.0), name=ctx.name("positive"))
    return mb.select(cond=positive, a=ctx.var(1), b=ctx.scalar(0.0), name=ctx.name())


def _derivative(ctx: LowerContext, kind: ActivationKind, x: Any) -> Any:
    """`act'(x)` composed of MIL ops (the closed forms of `reference.training.DERIVATIVES`)."""
    from coremltools.converters.mil import Builder as mb

    s = ctx.scalar

    def n(suffix: str) -> str:
        return ctx.name(suffix)

    def sigmoid(v: Any) -> Any:
        return mb.sigmoid(x=v, name=n("sigmoid"))

    def one_minus(v: Any) -> Any:
        return mb.sub(x=s(1.0), y=v, name=n("one_minus"))

    def square(v: Any) -> Any:
        return mb.mul(x=v, y=v, name=n("square"))

    def where(cond: Any, a: Any, b: Any) -> Any:
        if isinstance(a, np.generic) and isinstance(b, np.generic):
            # select takes its shape from a and b, not cond: one of them must be a tensor.
            a = mb.fill_like(ref_tensor=x, value=a, name=n("filled"))
        return mb.select(cond=cond, a=a, b=b, name=n("select"))

    def ones() -> Any:
        return mb.fill_like(ref_tensor=x, value=s(1.0), name=n("ones"))

    if kind is ActivationKind.GELU:
        cdf = mb.mul(x=mb.add(x=mb.erf(x=mb.mul(x=x, y=s(1 / math.sqrt(2.0)), name=n("scaled")), name=n("erf")),
                              y=s(1.0), name=n("erf1")), y=s(0.5), name=n("cdf"))
        pdf = mb.mul(x=mb.exp(x=mb.mul(x=square(x), y=s(-0.5), name=n("half_sq")), name=n("gauss")),
                     y=s(1 / math.sqrt(2 * math.pi)), name=n("pdf"))
        return mb.add(x=cdf, y=mb.mul(x=x, y=pdf, name=n("x_pdf")), name=n("gelu_grad"))
    if kind is ActivationKind.GELU_APPROX:
        c, cubic = math.sqrt(2 / math.pi), 0.044715
        inner = mb.mul(x=mb.add(x=x, y=mb.mul(x=mb.mul(x=square(x), y=x, name=n("cube")), y=s(cubic), name=n("c3")),
                                name=n("poly")), y=s(c), name=n("inner"))
        t = mb.tanh(x=inner, name=n("t"))
        left = mb.mul(x=mb.add(x=t, y=s(1.0), name=n("t1")), y=s(0.5), name=n("left"))
        slope = mb.mul(x=mb.add(x=mb.mul(x=square(x), y=s(3 * cubic), name=n("q")), y=s(1.0), name=n("q1")),
                       y=s(0.5 * c), name=n("slope"))
        right = mb.mul(x=mb.mul(x=x, y=one_minus(square(t)), name=n("xs")), y=slope, name=n("right"))
        return mb.add(x=left, y=right, name=n("gelu_tanh_grad"))
    if kind is ActivationKind.SILU:
        sg = sigmoid(x)
        return mb.mul(x=sg, y=mb.add(x=mb.mul(x=x, y=one_minus(sg), name=n("x1s")), y=s(1.0), name=n("b")), name=n("g"))
    if kind is ActivationKind.SIGMOID:
        sg = sigmoid(x)
        return mb.mul(x=sg, y=one_minus(sg), name=n("g"))
    if kind is ActivationKind.TANH:
        return one_minus(square(mb.tanh(x=x, name=n("tanh"))))
    if kind is ActivationKind.EXP:
        return mb.exp(x=x, name=n("exp"))
    if kind in (ActivationKind.LOG, ActivationKind.RECIP):
        denominator = x if kind is ActivationKind.LOG else square(x)
        value = 1.0 if kind is ActivationKind.LOG else -1.0
        return mb.real_div(x=s(value), y=denominator, name=n("g"))
    if kind is ActivationKind.SQRT:
        return mb.real_div(x=s(0.5), y=mb.sqrt(x=x, name=n("sqrt")), name=n("g"))
    if kind is ActivationKind.RSQRT:
        return mb.real_div(x=s(-0.5), y=mb.mul(x=x, y=mb.sqrt(x=x, name=n("sqrt")), name=n("x32")), name=n("g"))
    if kind is ActivationKind.NEG:
        return mb.fill_like(ref_tensor=x, value=s(-1.0), name=n("g"))
    if kind is ActivationKind.ABS:
        return mb.sign(x=x, name=n("g"))
    if kind is ActivationKind.ROUND:
        return ones()
    if kind in (ActivationKind.FLOOR, ActivationKind.CEIL, ActivationKind.SIGN):
        return mb.fill_like(ref_tensor=x, value=s(0.0), name=n("g"))
    if kind is ActivationKind.SIN:
        return mb.cos(x=x, name=n("g"))
    if kind is ActivationKind.COS:
        return mb.mul(x=mb.sin(x=x, name=n("sin")), y=s(-1.0), name=n("g"))
    if kind is ActivationKind.TAN:
        return mb.add(x=square(mb.tan(x=x, name=n("tan"))), y=s(1.0), name=n("g"))
    if kind is ActivationKind.ATAN:
        return mb.real_div(x=s(1.0), y=mb.add(x=square(x), y=s(1.0), name=n("d")), name=n("g"))
    if kind is ActivationKind.SOFTPLUS:
        return sigmoid(x)
    if kind is ActivationKind.LOG_SIGMOID:
        return sigmoid(mb.mul(x=x, y=s(-1.0), name=n("neg")))
    if kind is ActivationKind.ELU:
        positive = mb.greater(x=x, y=s(0.0), name=n("pos"))
        return where(positive, s(1.0), mb.exp(x=mb.minimum(x=x, y=s(0.0), name=n("neg_part")), name=n("exp")))
    if kind is ActivationKind.ERF:
        return mb.mul(x=mb.exp(x=mb.mul(x=square(x), y=s(-1.0), name=n("nsq")), name=n("gauss")),
                      y=s(2 / math.sqrt(math.pi)), name=n("g"))
    if kind is ActivationKind.HARD_SWISH:
        middle = mb.add(x=mb.mul(x=x, y=s(1 / 3), name=n("third")), y=s(0.5), name=n("mid"))
        upper = where(mb.less_equal(x=x, y=s(3.0), name=n("le3")), middle, s(1.0))
        return where(mb.less(x=x, y=s(-3.0), name=n("lt_m3")), s(0.0), upper)
    if kind is ActivationKind.HARD_SIGMOID:
        inside = mb.less(x=mb.abs(x=x, name=n("abs")), y=s(3.0), name=n("inside"))
        return where(inside, s(1 / 6), s(0.0))
    if kind is ActivationKind.MISH:
        t = mb.tanh(x=mb.softplus(x=x, name=n("sp")), name=n("t"))
        tail = mb.mul(x=mb.mul(x=x, y=one_minus(square(t)), name=n("xs")), y=sigmoid(x), name=n("tail"))
        return mb.add(x=t, y=tail, name=n("g"))
    if kind is ActivationKind.SOFTSIGN:
        return mb.real_div(x=s(1.0), y=square(mb.add(x=mb.abs(x=x, name=n("abs")), y=s(1.0), name=n("d"))), name=n("g"))
    if kind is ActivationKind.RELU:
        return where(mb.greater(x=x, y=s(0.0), name=n("pos")), s(1.0), s(0.0))
    raise ctx.unsupported(f"no derivative of {kind.value}")


@lowering(
    notes=(
        "act'(x) * dy with upstream's closed forms composed of MIL ops (erf/exp for Gelu, tanh"
        " polynomial for GeluApprox, sigmoid for Silu/Softplus/LogSigmoid, select for the piecewise"
        " Relu/Elu/HardSwish/HardSigmoid); Round passes dy straight through, Floor/Ceil/Sign give 0;"
        " Relu, Sqrt and Rsqrt `select` exactly 0 where x (sqrt(x)) is not > 0, as upstream's kernels."
    ),
)
def lower_activation_backward(op: ops.ActivationBackward, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    x = ctx.var(0)
    grad = mb.mul(x=_derivative(ctx, op.kind, x), y=ctx.var(1), name=ctx.name("grad"))
    if op.kind not in (ActivationKind.RELU, ActivationKind.SQRT, ActivationKind.RSQRT):
        return mb.identity(x=grad, name=ctx.name())
    # Upstream selects exactly 0 off the mask, whatever dy holds there.
    probe = x if op.kind is ActivationKind.RELU else mb.sqrt(x=x, name=ctx.name("root"))
    keep = mb.greater(x=probe, y=ctx.scalar(0.0), name=ctx.name("keep"))
    return mb.select(cond=keep, a=grad, b=ctx.scalar(0.0), name=ctx.name())


@lowering(notes="`cumsum` with reverse=True along the axis (exclusive when the forward was).")
def lower_cumsum_backward(op: ops.CumsumBackward, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    axis = normalize_axis(op.axis, ctx.input_shape(0).rank)
    return mb.cumsum(x=ctx.var(0), axis=axis, exclusive=op.exclusive, reverse=True, name=ctx.name())


@lowering(
    notes=(
        "decomposed in IR: `Reshape` of dy to one slice per index, then `ScatterAdd` into zeros of"
        " the table along the axis (`scatter` mode add; repeated indices accumulate)."
    ),
)
def lower_gather_backward(op: ops.GatherBackward, ctx: LowerContext) -> Any:
    sizes = ctx.out_shape.sizes()
    axis = normalize_axis(op.axis, len(sizes))
    count = math.prod(ctx.input_shape(1).sizes())

    def build(g: Graph, ins: list[int]) -> int:
        dy, indices = ins
        flat_indices = g.reshape(indices, [count])
        rows = g.reshape(dy, [*sizes[:axis], count, *sizes[axis + 1:]])
        return g.scatter_add(rows, flat_indices, sizes, axis)

    return decomposed(ctx, build)


@lowering(notes="decomposed in IR: `Activation(Neg)` of sin, then NeoX `Rope` of dy (the inverse rotation).")
def lower_rope_backward(op: ops.RopeBackward, ctx: LowerContext) -> Any:
    def build(g: Graph, ins: list[int]) -> int:
        dy, cos, sin = ins
        return g.rope(dy, cos, g.activation(ActivationKind.NEG, sin), op.head_dim, op.n_rot)

    return decomposed(ctx, build)


def _log_sum_exp(ctx: LowerContext, logits: Any) -> Any:
    """Over the last axis, max-subtracted (no overflow in fp16)."""
    from coremltools.converters.mil import Builder as mb

    peak = mb.reduce_max(x=logits, axes=[-1], keep_dims=True, name=ctx.name("peak"))
    shifted = mb.exp(x=mb.sub(x=logits, y=peak, name=ctx.name("shifted")), name=ctx.name("exp"))
    total = mb.reduce_sum(x=shifted, axes=[-1], keep_dims=False, name=ctx.name("sum"))
    flat_peak = mb.reduce_max(x=logits, axes=[-1], keep_dims=False, name=ctx.name("peak_row"))
    return mb.add(x=mb.log(x=total, name=ctx.name("log")), y=flat_peak, name=ctx.name("lse"))


@lowering(notes="logsumexp (`reduce_max`, `sub`, `exp`, `reduce_sum`, `log`, `add`) minus `reduce_sum` of targets * logits.")
def lower_softmax_cross_entropy(op: ops.SoftmaxCrossEntropy, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    logits, targets = ctx.var(0), ctx.var(1)
    dot = mb.reduce_sum(x=mb.mul(x=targets, y=logits, name=ctx.name("tl")), axes=[-1], keep_dims=False,
                        name=ctx.name("dot"))
    return mb.sub(x=_log_sum_exp(ctx, logits), y=dot, name=ctx.name())


@lowering(
    notes=(
        "logsumexp as SoftmaxCrossEntropy minus the label's logit (`gather_along_axis`; float labels"
        " floor + cast to int32, constant labels checked in range)."
    ),
)
def lower_softmax_cross_entropy_with_logits(op: ops.SoftmaxCrossEntropyWithLogits, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    logits = ctx.var(0)
    classes = ctx.input_shape(0).sizes()[-1]
    labels = mb.expand_dims(x=gather_indices(ctx, classes, 1, "labels"), axes=[-1], name=ctx.name("labels"))
    picked = mb.gather_along_axis(x=logits, indices=labels, axis=-1, name=ctx.name("picked"))
    picked = mb.squeeze(x=picked, axes=[-1], name=ctx.name("picked_row"))
    return mb.sub(x=_log_sum_exp(ctx, logits), y=picked, name=ctx.name())


@lowering(
    notes=(
        "`real_div` by the scale (reshaped to broadcast along the axis), rounding half away from zero"
        " (floor/ceil/select as FakeQuantize), `clip` to +-q_max, `mul` by the scale."
    ),
)
def lower_fake_quantize_lsq(op: ops.FakeQuantizeLSQ, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    rank = ctx.input_shape(0).rank
    shape = [1] * rank
    if op.axis is not None:
        shape[op.axis] = ctx.input_shape(1).sizes()[0]
    scale = mb.reshape(x=ctx.var(1), shape=np.asarray(shape, np.int32), name=ctx.name("scale"))
    q = float(Q_MAX[op.bits])
    ratio = mb.real_div(x=ctx.var(0), y=scale, name=ctx.name("ratio"))
    rounded = round_half_away(ctx, ratio, "rounded")
    clipped = mb.clip(x=rounded, alpha=ctx.scalar(-q), beta=ctx.scalar(q), name=ctx.name("clipped"))
    return mb.mul(x=clipped, y=scale, name=ctx.name())
