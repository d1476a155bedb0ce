"""Reference kernels: leaves, element-wise, linear algebra, normalization, reductions,
selection, shape/data movement and Rope (spec sections 3-8).

Each op also has a plain function (`activation`, `layer_norm`, `rope`...) taking arrays, which
the fused kernels and tests reuse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, DTypeError, EvaluationError, ShapeError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import (
    Activation,
    ActivationKind,
    Binary,
    BinaryOp,
    Cast,
    CmpOp,
    Compare,
    Concat,
    Constant,
    Cumsum,
    Expand,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    Gather,
    GroupNorm,
    LayerNorm,
    LoraMatMul,
    MatMul,
    Narrow,
    Reduce,
    ReduceOp,
    Reshape,
    RmsNorm,
    Rope,
    Softmax,
    TopK,
    Transpose,
    Where,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import (
    as_float,
    compute_dtype,
    finish,
    reference_kernel,
    sizes_of,
    static_sizes,
    to_dtype,
)
from rlx_mil.reference.special import erf

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_GELU_TANH_C = 0.7978845608  # sqrt(2/pi) as the spec writes it
_GELU_TANH_CUBIC = 0.044715


def _floats(*arrays: np.ndarray) -> list[np.ndarray]:
    dt = compute_dtype(*arrays)
    return [as_float(a, dt) for a in arrays]


def _broadcast(shapes: Sequence[tuple[int, ...]], names: Sequence[str]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = ", ".join(f"{n} {list(s)}" for n, s in zip(names, shapes, strict=True))
        raise ShapeError(f"operands do not broadcast: {listed}", operand=names[-1]) from None


def _signed_axis(axis: int, rank: int, what: str = "axis") -> int:
    """An i32 axis attribute (may be negative), normalised."""
    if not -rank <= axis < max(rank, 1):
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _unsigned_axis(axis: int, rank: int, what: str = "axis") -> int:
    """A usize axis attribute: 0 <= axis < rank."""
    if not 0 <= axis < rank:
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank} (must be 0..{rank - 1})")
    return axis


def _vector(a: np.ndarray, length: int, operand: str, dtype: np.dtype) -> np.ndarray:
    if a.size != length:
        raise ShapeError(f"{operand} must hold {length} values, got shape {list(a.shape)}", operand=operand)
    return as_float(a, dtype).reshape(length)


# ------------------------------------------------------------------------------ leaves


@reference_kernel(Constant)
def _constant(op: Constant, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    sizes = static_sizes(out, "Constant")
    numel = math.prod(sizes)
    dtype = out.dtype
    if dtype is DType.C64:
        raise DTypeError("C64 constants are outside the rlx_mil IR subset")
    want = numel * dtype.itemsize
    if len(op.data) != want:
        raise AttributeValueError(
            f"data holds {len(op.data)} bytes, but {numel} {dtype.value} values need {want}", operand="data"
        )
    raw = np.frombuffer(op.data, dtype=np.uint8)
    if dtype is DType.BF16:
        halves = raw.view("<u2").astype(np.uint32) << 16
        values = halves.view(np.float32)
    elif dtype is DType.BOOL:
        values = raw != 0
    else:
        values = raw.view(dtype.numpy.newbyteorder("<")).astype(dtype.numpy)
    return values.reshape(sizes).copy()


# ------------------------------------------------------------------------------ element-wise


def activation(kind: ActivationKind, x: np.ndarray) -> np.ndarray:
    """Spec 4.1, in float32 (float64 for float64 or wide-integer inputs)."""
    (v,) = _floats(x)
    dt = v.dtype.type
    with np.errstate(all="ignore"):
        if kind is ActivationKind.GELU:
            w = v.astype(np.float64)
            return (0.5 * w * (1.0 + erf(w * _SQRT_HALF))).astype(v.dtype)
        if kind is ActivationKind.GELU_APPROX:
            inner = dt(_GELU_TANH_C) * (v + dt(_GELU_TANH_CUBIC) * v * v * v)
            return dt(0.5) * v * (dt(1) + np.tanh(inner))
        if kind is ActivationKind.SILU:
            return v / (dt(1) + np.exp(-v))
        if kind is ActivationKind.SIGMOID:
            return dt(1) / (dt(1) + np.exp(-v))
        if kind is ActivationKind.RELU:
            # NaN-ignoring max, like Binary Max (CPU maps NaN to 0).
            return np.fmax(v, dt(0))
        if kind is ActivationKind.RSQRT:
            return dt(1) / np.sqrt(v)
        if kind is ActivationKind.ROUND:
            return np.rint(v)  # ties to even
        unary = {
            ActivationKind.TANH: np.tanh, ActivationKind.EXP: np.exp, ActivationKind.LOG: np.log,
            ActivationKind.SQRT: np.sqrt, ActivationKind.NEG: np.negative, ActivationKind.ABS: np.abs,
            ActivationKind.SIN: np.sin, ActivationKind.COS: np.cos, ActivationKind.TAN: np.tan,
            ActivationKind.ATAN: np.arctan,
        }
        return np.asarray(unary[kind](v))


@reference_kernel(Activation)
def _activation(op: Activation, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(activation(op.kind, inputs[0]), out)


@reference_kernel(Cast)
def _cast(op: Cast, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return to_dtype(inputs[0], op.to)


def binary(op: BinaryOp, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    _broadcast([lhs.shape, rhs.shape], ["lhs", "rhs"])
    a, b = _floats(lhs, rhs)
    with np.errstate(all="ignore"):
        if op is BinaryOp.ADD:
            return a + b
        if op is BinaryOp.SUB:
            return a - b
        if op is BinaryOp.MUL:
            return a * b
        if op is BinaryOp.DIV:
            return a / b
        if op is BinaryOp.MAX:
            return np.fmax(a, b)
        if op is BinaryOp.MIN:
            return np.fmin(a, b)
        return np.power(a, b)


@reference_kernel(Binary)
def _binary(op: Binary, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(binary(op.op, inputs[0], inputs[1]), out)


_COMPARE = {
    CmpOp.EQ: np.equal, CmpOp.NE: np.not_equal, CmpOp.LT: np.less,
    CmpOp.LE: np.less_equal, CmpOp.GT: np.greater, CmpOp.GE: np.greater_equal,
}


@reference_kernel(Compare)
def _compare(op: Compare, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    _broadcast([inputs[0].shape, inputs[1].shape], ["lhs", "rhs"])
    a, b = _floats(inputs[0], inputs[1])
    return finish(_COMPARE[op.op](a, b), out)


@reference_kernel(Where)
def _where(op: Where, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    cond, on_true, on_false = inputs
    _broadcast([cond.shape, on_true.shape, on_false.shape], ["cond", "on_true", "on_false"])
    if on_true.dtype != on_false.dtype:
        on_true, on_false = _floats(on_true, on_false)
    return finish(np.where(cond != 0, on_true, on_false), out)


# ------------------------------------------------------------------------------ linear algebra


def matmul(a: np.ndarray, b: np.ndarray, names: tuple[str, str] = ("a", "b")) -> np.ndarray:
    if a.ndim < 2 or b.ndim < 2:
        bad = names[0] if a.ndim < 2 else names[1]
        raise ShapeError(f"MatMul operands need rank >= 2, got {list(a.shape)} @ {list(b.shape)}", operand=bad)
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"contraction dims differ: {list(a.shape)} @ {list(b.shape)}", operand=names[1]
        )
    _broadcast([a.shape[:-2], b.shape[:-2]], [f"{names[0]} batch", f"{names[1]} batch"])
    x, y = _floats(a, b)
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


def _bias_vector(bias: np.ndarray, n: int, dtype: np.dtype, operand: str = "bias") -> np.ndarray:
    return _vector(bias, n, operand, dtype)


@reference_kernel(FusedMatMulBiasAct)
def _fused_matmul_bias_act(op: FusedMatMulBiasAct, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, w, bias = inputs
    y = matmul(x, w, ("x", "w"))
    y = y + _bias_vector(bias, y.shape[-1], y.dtype)
    if op.activation is not None:
        y = activation(op.activation, y)
    return finish(y, out)


# ------------------------------------------------------------------------------ normalization


def _last_axis_only(axis: int, rank: int) -> None:
    if axis not in (-1, rank - 1):
        raise AttributeValueError(f"normalization runs over the last axis; axis must be -1 or {rank - 1}, got {axis}")


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Two-pass LayerNorm over the last axis (spec 6.1)."""
    (v,) = _floats(x)
    h = v.shape[-1]
    g = _vector(gamma, h, "gamma", v.dtype)
    b = _vector(beta, h, "beta", v.dtype)
    dt = v.dtype.type
    mean = v.mean(axis=-1, keepdims=True)
    centred = v - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        return centred / np.sqrt(var + dt(eps)) * g + b


def rms_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """RmsNorm over the last axis with the beta add (spec 6.2)."""
    (v,) = _floats(x)
    h = v.shape[-1]
    g = _vector(gamma, h, "gamma", v.dtype)
    b = _vector(beta, h, "beta", v.dtype)
    dt = v.dtype.type
    mean_sq = (v * v).mean(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        return v / np.sqrt(mean_sq + dt(eps)) * g + b


def group_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, num_groups: int, eps: float) -> np.ndarray:
    """GroupNorm over contiguous channel blocks of `[N, C, *spatial]` (spec 6.3)."""
    if x.ndim < 2:
        raise ShapeError(f"x must be [N, C, ...], got {list(x.shape)}", operand="x")
    n, c = x.shape[:2]
    if num_groups < 1 or c % num_groups != 0:
        raise AttributeValueError(f"num_groups={num_groups} must divide the {c} channels")
    (v,) = _floats(x)
    g = _vector(gamma, c, "gamma", v.dtype)
    b = _vector(beta, c, "beta", v.dtype)
    dt = v.dtype.type
    grouped = v.reshape(n, num_groups, -1)
    mean = grouped.mean(axis=-1, keepdims=True)
    centred = grouped - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    with np.errstate(all="ignore"):
        normed = (centred / np.sqrt(var + dt(eps))).reshape(v.shape)
    affine_shape = (1, c) + (1,) * (x.ndim - 2)
    return normed * g.reshape(affine_shape) + b.reshape(affine_shape)


def _matching_rows(y: np.ndarray, out: Shape) -> np.ndarray:
    """RmsNorm may be declared leading-flattened `[prod(leading), H]` (spec 6.2)."""
    sizes = sizes_of(out)
    if None not in sizes and tuple(sizes) != y.shape and math.prod(s or 0 for s in sizes) == y.size:
        if sizes and sizes[-1] == y.shape[-1]:
            return y.reshape(tuple(s or 0 for s in sizes))
    return y


@reference_kernel(LayerNorm)
def _layer_norm(op: LayerNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    _last_axis_only(op.axis, inputs[0].ndim)
    return finish(layer_norm(inputs[0], inputs[1], inputs[2], op.eps), out)


@reference_kernel(RmsNorm)
def _rms_norm(op: RmsNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    _last_axis_only(op.axis, inputs[0].ndim)
    return finish(_matching_rows(rms_norm(inputs[0], inputs[1], inputs[2], op.eps), out), out)


@reference_kernel(GroupNorm)
def _group_norm(op: GroupNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(group_norm(inputs[0], inputs[1], inputs[2], op.num_groups, op.eps), out)


def _residual_sum(inputs: Sequence[np.ndarray], has_bias: bool) -> np.ndarray:
    x, residual = inputs[0], inputs[1]
    if x.shape != residual.shape:
        _broadcast([x.shape, residual.shape], ["x", "residual"])
    total = binary(BinaryOp.ADD, x, residual)
    if has_bias:
        total = total + _bias_vector(inputs[2], total.shape[-1], total.dtype)
    return total


@reference_kernel(FusedResidualLN)
def _fused_residual_ln(op: FusedResidualLN, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    total = _residual_sum(inputs, op.has_bias)
    return finish(layer_norm(total, inputs[-2], inputs[-1], op.eps), out)


@reference_kernel(FusedResidualRmsNorm)
def _fused_residual_rms_norm(op: FusedResidualRmsNorm, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    total = _residual_sum(inputs, op.has_bias)
    return finish(_matching_rows(rms_norm(total, inputs[-2], inputs[-1], op.eps), out), out)


# ------------------------------------------------------------------------------ reductions


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    (v,) = _floats(x)
    with np.errstate(all="ignore"):
        e = np.exp(v - v.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


@reference_kernel(Softmax)
def _softmax(op: Softmax, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    axis = _signed_axis(op.axis, inputs[0].ndim)
    return finish(softmax(inputs[0], axis), out)


def reduce(kind: ReduceOp, x: np.ndarray, axes: Sequence[int], keep_dim: bool) -> np.ndarray:
    rank = x.ndim
    if not axes:
        raise AttributeValueError("axes must not be empty")
    if len(set(axes)) != len(axes):
        raise AttributeValueError(f"axes {list(axes)} repeat an axis")
    for a in axes:
        _unsigned_axis(a, rank, "reduce axis")
    (v,) = _floats(x)
    ax = tuple(axes)
    with np.errstate(all="ignore"):
        if kind is ReduceOp.SUM:
            return np.sum(v, axis=ax, keepdims=keep_dim)
        if kind is ReduceOp.MEAN:
            count = math.prod(v.shape[a] for a in ax)
            return np.sum(v, axis=ax, keepdims=keep_dim) / v.dtype.type(count)
        if kind is ReduceOp.PROD:
            return np.prod(v, axis=ax, keepdims=keep_dim)
        if any(v.shape[a] == 0 for a in ax):
            raise ShapeError(f"{kind.value} over an empty axis of {list(x.shape)}", operand="x")
        ufunc = np.fmax if kind is ReduceOp.MAX else np.fmin
        return np.asarray(ufunc.reduce(v, axis=ax, keepdims=keep_dim))  # type: ignore[call-overload]


@reference_kernel(Reduce)
def _reduce(op: Reduce, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(reduce(op.op, inputs[0], op.axes, op.keep_dim), out)


def cumsum(x: np.ndarray, axis: int, exclusive: bool) -> np.ndarray:
    (v,) = _floats(x)
    inclusive = np.cumsum(v, axis=axis, dtype=v.dtype)
    if not exclusive:
        return inclusive
    # Shift rather than subtract x, so y_i is exactly the sum of x_j for j < i.
    shifted = np.zeros_like(inclusive)
    index: list[slice] = [slice(None)] * v.ndim
    index[axis] = slice(1, None)
    head: list[slice] = [slice(None)] * v.ndim
    head[axis] = slice(0, -1)
    if v.shape[axis] > 1:
        shifted[tuple(index)] = inclusive[tuple(head)]
    return shifted


@reference_kernel(Cumsum)
def _cumsum(op: Cumsum, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    axis = _signed_axis(op.axis, inputs[0].ndim)
    return finish(cumsum(inputs[0], axis, op.exclusive), out)


def top_k_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values along the last axis, descending, ties by smaller index."""
    if x.ndim < 1:
        raise ShapeError("TopK needs rank >= 1", operand="x")
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise AttributeValueError(f"k={k} must lie in 1..{n} (the last dim)")
    (v,) = _floats(x)
    order = np.argsort(-v, axis=-1, kind="stable")
    return order[..., :k].astype(np.float32)


@reference_kernel(TopK)
def _top_k(op: TopK, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(top_k_indices(inputs[0], op.k), out)


# ------------------------------------------------------------------------------ shape ops


def reshape_target(sizes: tuple[int, ...], new_shape: Sequence[int]) -> tuple[int, ...]:
    """Resolve `new_shape` (at most one -1; 0 is a literal size) against `sizes`."""
    if sum(1 for d in new_shape if d == -1) > 1:
        raise AttributeValueError(f"new_shape {list(new_shape)} has more than one -1")
    if any(d < -1 for d in new_shape):
        raise AttributeValueError(f"new_shape {list(new_shape)} has a negative size other than -1")
    numel = math.prod(sizes)
    known = math.prod(d for d in new_shape if d != -1)
    if -1 in new_shape:
        if known == 0 or numel % known != 0:
            raise ShapeError(f"cannot reshape {list(sizes)} to {list(new_shape)}", operand="x")
        return tuple(numel // known if d == -1 else d for d in new_shape)
    if known != numel:
        raise ShapeError(f"cannot reshape {list(sizes)} ({numel} elements) to {list(new_shape)}", operand="x")
    return tuple(new_shape)


@reference_kernel(Reshape)
def _reshape(op: Reshape, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    return finish(x.reshape(reshape_target(x.shape, op.new_shape)), out)


@reference_kernel(Transpose)
def _transpose(op: Transpose, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    if sorted(op.perm) != list(range(x.ndim)):
        raise AttributeValueError(f"perm {list(op.perm)} is not a permutation of 0..{x.ndim - 1}")
    return finish(np.transpose(x, op.perm), out)


@reference_kernel(Narrow)
def _narrow(op: Narrow, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    axis = _unsigned_axis(op.axis, x.ndim)
    if op.start < 0 or op.len < 0 or op.start + op.len > x.shape[axis]:
        raise AttributeValueError(
            f"slice start={op.start} len={op.len} does not fit axis {axis} of size {x.shape[axis]}"
        )
    index: list[slice] = [slice(None)] * x.ndim
    index[axis] = slice(op.start, op.start + op.len)
    return finish(x[tuple(index)], out)


@reference_kernel(Concat)
def _concat(op: Concat, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    if not inputs:
        raise ShapeError("Concat needs at least one input")
    first = inputs[0]
    axis = _unsigned_axis(op.axis, first.ndim)
    for pos, t in enumerate(inputs[1:], start=1):
        same_rest = t.ndim == first.ndim and all(
            t.shape[d] == first.shape[d] for d in range(first.ndim) if d != axis
        )
        if not same_rest:
            raise ShapeError(
                f"input {pos} {list(t.shape)} does not match input 0 {list(first.shape)} off axis {axis}",
                operand=str(pos),
            )
    if len({t.dtype for t in inputs}) > 1:
        arrays = _floats(*inputs)
    else:
        arrays = list(inputs)
    return finish(np.concatenate(arrays, axis=axis), out)


def expand_target(sizes: tuple[int, ...], target: Sequence[int]) -> tuple[int, ...]:
    if len(target) < len(sizes):
        raise AttributeValueError(f"target_shape {list(target)} has lower rank than the input {list(sizes)}")
    padded = (1,) * (len(target) - len(sizes)) + tuple(sizes)
    result = []
    for have, want in zip(padded, target, strict=True):
        if want == -1:
            result.append(have)
        elif want < 0:
            raise AttributeValueError(f"target_shape {list(target)} has a negative size other than -1")
        elif have != want and have != 1:
            raise ShapeError(f"cannot expand {list(sizes)} to {list(target)}: only size-1 dims may grow", operand="x")
        else:
            result.append(want)
    return tuple(result)


@reference_kernel(Expand)
def _expand(op: Expand, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x = inputs[0]
    target = expand_target(x.shape, op.target_shape)
    padded = x.reshape((1,) * (len(target) - x.ndim) + x.shape)
    return finish(np.broadcast_to(padded, target), out)


def gather_indices(indices: np.ndarray, limit: int) -> np.ndarray:
    """int64 indices: floats truncate toward zero; every index must lie in [0, limit)."""
    if indices.dtype.kind == "f":
        finite = np.isfinite(indices)
        if not finite.all():
            raise EvaluationError("Gather indices must be finite", [f"{int((~finite).sum())} NaN/inf indices"])
        idx = np.trunc(indices.astype(np.float64)).astype(np.int64)
    else:
        idx = indices.astype(np.int64)
    bad = (idx < 0) | (idx >= limit)
    if bad.any():
        examples = ", ".join(str(int(i)) for i in np.unique(idx[bad])[:5])
        raise EvaluationError(
            "Gather index out of range",
            [f"{int(bad.sum())} indices outside [0, {limit}), e.g. {examples}"],
        )
    return idx


@reference_kernel(Gather)
def _gather(op: Gather, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    table, indices = inputs
    axis = _unsigned_axis(op.axis, table.ndim)
    idx = gather_indices(indices, table.shape[axis])
    return finish(np.take(table, idx, axis=axis), out)


# ------------------------------------------------------------------------------ Rope


def _rope_table(t: np.ndarray, name: str, half: int, dtype: np.dtype) -> np.ndarray:
    if t.ndim < 1 or t.size == 0:
        raise ShapeError(f"{name} must be a [P, head_dim/2] table, got {list(t.shape)}", operand=name)
    table = as_float(t, dtype).reshape(-1, t.shape[-1])
    if table.shape[1] < half:
        raise ShapeError(
            f"{name} rows hold {table.shape[1]} values but n_rot/2 = {half} are needed", operand=name
        )
    return table[:, :half]


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int) -> np.ndarray:
    """Rotate-half rotary embedding (spec 8.7); rank 2/3 `[.., S, H*D]`, rank 4 `[B, H, S, D]`."""
    if head_dim < 1 or n_rot < 0 or n_rot % 2 != 0 or n_rot > head_dim:
        raise AttributeValueError(f"need 0 <= n_rot <= head_dim with n_rot even, got head_dim={head_dim} n_rot={n_rot}")
    (v,) = _floats(x)
    if v.ndim == 4:
        if v.shape[3] != head_dim:
            raise ShapeError(f"rank-4 x must be [B, H, S, {head_dim}], got {list(x.shape)}", operand="x")
        seq = v.shape[2]
        heads = v
    elif v.ndim in (2, 3):
        if v.shape[-1] % head_dim != 0:
            raise ShapeError(f"feature width {v.shape[-1]} is not a multiple of head_dim {head_dim}", operand="x")
        seq = v.shape[-2]
        heads = v.reshape((*v.shape[:-1], -1, head_dim))
    else:
        raise ShapeError(f"x must have rank 2, 3 or 4, got {list(x.shape)}", operand="x")
    half = n_rot // 2
    c = _rope_table(cos, "cos", half, v.dtype)
    s = _rope_table(sin, "sin", half, v.dtype)
    if c.shape[0] != s.shape[0]:
        raise ShapeError(f"cos has {c.shape[0]} rows but sin has {s.shape[0]}", operand="sin")
    rows = c.shape[0]
    if rows == 1:
        c, s = np.repeat(c, seq, axis=0), np.repeat(s, seq, axis=0)
    elif rows < seq:
        raise ShapeError(f"tables have {rows} rows but the sequence has {seq} positions", operand="cos")
    else:
        c, s = c[:seq], s[:seq]
    if v.ndim == 4:
        c, s = c[None, None], s[None, None]  # [1, 1, S, h] against [B, H, S, h]
    else:
        c, s = c[:, None, :], s[:, None, :]  # [S, 1, h] against [.., S, H, h]
    result = heads.copy()
    first, second = heads[..., :half], heads[..., half:n_rot]
    result[..., :half] = first * c - second * s
    result[..., half:n_rot] = second * c + first * s
    return result.reshape(v.shape)


@reference_kernel(Rope)
def _rope(op: Rope, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(rope(inputs[0], inputs[1], inputs[2], op.head_dim, op.n_rot), out)
