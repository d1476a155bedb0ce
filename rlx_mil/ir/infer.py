"""Shape and dtype inference, one rule per op type (spec sections 3-11).

The rules follow the spec's shape rules and are stricter than upstream where the spec asks
rlx_mil to validate (reshape element counts, permutations, narrow bounds, concat dims, gather
layout, norm axes, attention geometry, ...). A dimension check only fails when it is provably
wrong: two static sizes that differ. Dynamic dims pass unless a rule needs their value.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from rlx_mil.errors import (
    AmbiguousLayoutWarning,
    ArityError,
    AttributeValueError,
    DTypeError,
    GraphError,
    ShapeError,
)
from rlx_mil.ir.attention_layout import AttentionGeometry, attention_geometry
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import (
    Activation,
    Attention,
    AttentionBackward,
    AttentionBwdWrt,
    Binary,
    Cast,
    Compare,
    Concat,
    Constant,
    Conv,
    Cumsum,
    Dequantize,
    DequantMatMul,
    Expand,
    FusedAttentionBlock,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedSwiGLU,
    FusedTransformerLayer,
    Gather,
    GroupNorm,
    Input,
    LayerNorm,
    LoraMatMul,
    MaskKind,
    MaskType,
    MatMul,
    Narrow,
    Op,
    Param,
    Pool,
    Quantize,
    QuantKind,
    QuantScheme,
    Reduce,
    Reshape,
    RmsNorm,
    Rope,
    Softmax,
    TopK,
    Transpose,
    Where,
)
from rlx_mil.ir.shape import ROWS, Dim, Dynamic, Shape, Static

OpT = TypeVar("OpT", bound=Op)
ShapeRule = Callable[[Op, Sequence[Shape], "Shape | None"], "Shape | None"]
Dims = tuple[Dim, ...]

_RULES: dict[type[Op], ShapeRule] = {}


def shape_rule(op_type: type[OpT]) -> Callable[[Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]], Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]]:
    """Register the inference rule of `op_type`.

    A rule gets the op, its input shapes and the declared shape (None when the builder asks
    for inference). It returns the output shape, or None where the output is only known from
    the declaration (leaves), and raises a GraphError subclass (with `operand=` set where one
    input is at fault) on any violation.
    """

    def register(fn: Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]) -> Callable[[OpT, Sequence[Shape], Shape | None], Shape | None]:
        _RULES[op_type] = fn  # type: ignore[assignment]
        return fn

    return register


def has_rule(op_type: type[Op]) -> bool:
    return op_type in _RULES


def infer_shape(op: Op, inputs: Sequence[Shape], declared: Shape | None = None) -> Shape | None:
    """The output shape of `op` applied to `inputs`; raises a GraphError subclass on misuse.

    Errors carry `operand=` (an input role such as "lhs" or "mask") but no node id; callers
    that know the node (Graph.add_node) re-raise with it.
    """
    accepted = op.accepted_arities()
    if accepted and len(inputs) not in accepted:
        raise ArityError(f"expects {_arity_text(op)} inputs, got {len(inputs)}")
    if not accepted and len(inputs) == 0:
        raise ArityError("expects at least 1 input, got 0")
    rule = _RULES.get(type(op))
    if rule is None:
        return None
    try:
        return rule(op, inputs, declared)
    except GraphError as err:
        if err.operand is not None or len(inputs) != 1:
            raise
        # A single-input op's attribute can only be wrong relative to that input.
        raise type(err)(err.detail, operand=input_roles(op, 1)[0]) from None


# -------------------------------------------------------------------------------- input roles


def input_roles(op: Op, count: int) -> tuple[str, ...]:
    """Names of the inputs of `op` (as error messages use them), for `count` inputs.

    Falls back to `inputs[i]` where the op has no fixed roles or `count` is not an accepted
    input count.
    """
    roles = _roles(op, count)
    if roles is None or len(roles) != count:
        return tuple(f"inputs[{i}]" for i in range(count))
    return roles


def _roles(op: Op, count: int) -> tuple[str, ...] | None:
    if isinstance(op, Dequantize):
        return ("q",)
    if isinstance(op, (Binary, Compare, MatMul)):
        return ("lhs", "rhs")
    if isinstance(op, Where):
        return ("cond", "on_true", "on_false")
    if isinstance(op, LoraMatMul):
        return ("x", "w", "a", "b")
    if isinstance(op, FusedMatMulBiasAct):
        return ("x", "w", "bias")
    if isinstance(op, DequantMatMul):
        if op.scheme.kind.is_gguf:
            return ("x", "packed_w")
        if op.scheme.kind is QuantKind.NVFP4_BLOCK:
            return ("x", "w_q", "block_scale", "global_scale")
        return ("x", "w_q", "scale", "zp")
    if isinstance(op, (LayerNorm, RmsNorm, GroupNorm)):
        return ("x", "gamma", "beta")
    if isinstance(op, (FusedResidualLN, FusedResidualRmsNorm)):
        return ("x", "residual", "bias", "gamma", "beta") if op.has_bias else ("x", "residual", "gamma", "beta")
    if isinstance(op, Gather):
        return ("table", "indices")
    if isinstance(op, Rope):
        return ("x", "cos", "sin")
    if isinstance(op, Attention):
        return ("q", "k", "v", *_mask_role(op.mask_kind.type))
    if isinstance(op, AttentionBackward):
        return ("q", "k", "v", "dy", *_mask_role(op.mask_kind.type))
    if isinstance(op, FusedAttentionBlock):
        roles: tuple[str, ...] = ("hidden", "qkv_w", "out_w", "mask")
        if op.has_bias:
            roles += ("qkv_b", "out_b")
        if op.has_rope:
            roles += ("cos", "sin")
        return roles
    if isinstance(op, FusedTransformerLayer):
        return _FTL_ROLES.get(count)
    if isinstance(op, Conv):
        return ("x", "w")
    if op.arity() == 1:
        return ("x",)
    return None


def _mask_role(mask: MaskType) -> tuple[str, ...]:
    # The spec calls the 4th input `mask` for both Custom (key padding) and Bias (additive).
    return ("mask",) if mask in (MaskType.CUSTOM, MaskType.BIAS) else ()


_FTL_ROLES: dict[int, tuple[str, ...]] = {
    14: ("hidden", "qkv_w", "qkv_b", "out_w", "out_b", "ln1_gamma", "ln1_beta", "fc1_w", "fc1_b",
         "fc2_w", "fc2_b", "ln2_gamma", "ln2_beta", "mask"),
    10: ("hidden", "qkv_w", "out_w", "ln1_gamma", "ln1_beta", "fc1_w", "fc2_w", "ln2_gamma", "ln2_beta",
         "mask"),
    8: ("hidden", "qkv_w", "out_w", "ln1_gamma", "fc1_w", "fc2_w", "ln2_gamma", "mask"),
}


def _arity_text(op: Op) -> str:
    accepted = op.accepted_arities()
    parts = []
    for n in accepted:
        roles = _roles(op, n)
        parts.append(f"{n} ({', '.join(roles)})" if roles else str(n))
    return " or ".join(parts)


# -------------------------------------------------------------------------------- attribute types

AttrCheck = tuple[str, Callable[[object], bool], str]


def _integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _type_check(hint: object) -> tuple[Callable[[object], bool], str] | None:
    """A predicate and its wording for one attribute annotation (None: nothing to check)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _type_check(options[0]) if len(options) == 1 else None
        if inner is None:
            return None
        check, text = inner
        return (lambda v: v is None or check(v)), f"{text} or None"
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        item = _type_check(args[0]) if len(args) == 2 and args[1] is Ellipsis else None
        if item is None:
            return None
        item_check, item_text = item
        plural = {"an integer": "integers", "a number": "numbers"}.get(item_text, item_text)
        return (lambda v: isinstance(v, tuple) and all(item_check(x) for x in v)), f"a sequence of {plural}"
    if hint is bool:
        return (lambda v: isinstance(v, (bool, np.bool_))), "a bool"
    if hint is int:
        return _integer, "an integer"
    if hint is float:
        return (lambda v: isinstance(v, float)), "a number"
    if hint is str:
        return (lambda v: isinstance(v, str)), "a string"
    if hint is bytes:
        return (lambda v: isinstance(v, bytes)), "bytes"
    if isinstance(hint, type) and (issubclass(hint, enum.Enum) or hint in (MaskKind, QuantScheme)):
        cls = hint
        return (lambda v: isinstance(v, cls)), f"{'an' if cls.__name__[0] in 'AEIOU' else 'a'} {cls.__name__}"
    return None


_ATTRIBUTE_CHECKS: dict[type[Op], tuple[AttrCheck, ...]] = {}


def _attribute_checks(op_type: type[Op]) -> tuple[AttrCheck, ...]:
    checks = _ATTRIBUTE_CHECKS.get(op_type)
    if checks is None:
        hints = typing.get_type_hints(op_type)
        found = ((field.name, _type_check(hints[field.name])) for field in dataclasses.fields(op_type))
        checks = tuple((name, *check) for name, check in found if check is not None)
        _ATTRIBUTE_CHECKS[op_type] = checks
    return checks


def check_attributes(op: object) -> None:
    """`op` must be an IR op whose attributes have their declared types.

    Ops built directly (not through the builder or the JSON loader) skip the parsing those
    do; a mistyped attribute (a string for an enum, None for a float...) would otherwise fail
    deep inside a shape rule, a reference kernel or coremltools.
    """
    if not isinstance(op, Op) or type(op) is Op:
        raise GraphError(f"expected an op from rlx_mil.ir.ops (e.g. ops.MatMul()), got {op!r}")
    for name, check, text in _attribute_checks(type(op)):
        value = getattr(op, name)
        if not check(value):
            raise AttributeValueError(f"attribute {name} must be {text}, got {value!r}")


# -------------------------------------------------------------------------------- helpers


def _dims_text(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _size(d: Dim) -> int | None:
    return d.size if isinstance(d, Static) else None


def _conflict(a: Dim, b: Dim) -> bool:
    """True when two dims are provably different (both static, unequal)."""
    return isinstance(a, Static) and isinstance(b, Static) and a.size != b.size


def _numel(dims: Sequence[Dim]) -> int | None:
    n = 1
    for d in dims:
        if not isinstance(d, Static):
            return None
        n *= d.size
    return n


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_int(value: object, what: str, minimum: int | None = None) -> int:
    if not _is_int(value):
        raise AttributeValueError(f"{what} must be an integer, got {value!r}")
    assert isinstance(value, int)
    if minimum is not None and value < minimum:
        raise AttributeValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def _require_rank(shape: Shape, operand: str, *, exact: Sequence[int] = (), minimum: int | None = None) -> None:
    if exact and shape.rank not in exact:
        want = " or ".join(str(r) for r in exact)
        raise ShapeError(f"{operand} must have rank {want}, got {shape}", operand=operand)
    if minimum is not None and shape.rank < minimum:
        raise ShapeError(f"{operand} must have rank >= {minimum}, got {shape}", operand=operand)


def _require_dims(shape: Shape, expected: Sequence[Dim], operand: str, what: str) -> None:
    """`shape.dims` must be `expected` (dims that are dynamic on either side pass)."""
    if shape.rank != len(expected) or any(_conflict(a, b) for a, b in zip(shape.dims, expected, strict=True)):
        raise ShapeError(f"{operand} must be {what} {_dims_text(expected)}, got {shape}", operand=operand)


def _require_numel(shape: Shape, expected: int | None, operand: str, what: str) -> None:
    n = _numel(shape.dims)
    if expected is not None and n is not None and n != expected:
        raise ShapeError(f"{operand} must hold {what} = {expected} elements, got {shape} ({n})", operand=operand)


def normalize_axis(axis: int, rank: int, what: str = "axis", operand: str | None = None) -> int:
    """A signed (i32) axis mapped into [0, rank); AttributeValueError when out of range."""
    _require_int(axis, what)
    if not -rank <= axis < rank:
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank}", operand=operand)
    return axis + rank if axis < 0 else axis


def _unsigned_axis(axis: int, rank: int, what: str = "axis", operand: str | None = None) -> int:
    """A usize axis: must already be in [0, rank)."""
    _require_int(axis, what)
    if not 0 <= axis < rank:
        raise AttributeValueError(f"{what} {axis} is out of range for rank {rank} (must be 0..{rank - 1})", operand=operand)
    return axis


def broadcast_pair(left: Sequence[Dim], right: Sequence[Dim], right_operand: str = "rhs") -> Dims:
    """NumPy broadcasting with the spec's dynamic-dim rule (section 1.4).

    `1` vs `d` gives `d`; equal dims give that dim; any other pairing involving a dynamic dim
    gives the left operand's dim. Two unequal static sizes, neither 1, are a ShapeError
    naming `right_operand`.
    """
    rank = max(len(left), len(right))
    padded_left: list[Dim | None] = [None] * (rank - len(left)) + list(left)
    padded_right: list[Dim | None] = [None] * (rank - len(right)) + list(right)
    out: list[Dim] = []
    for a, b in zip(padded_left, padded_right, strict=True):
        if a is None:
            assert b is not None
            out.append(b)
        elif b is None or b == Static(1) or a == b:
            out.append(a)
        elif a == Static(1):
            out.append(b)
        elif isinstance(a, Static) and isinstance(b, Static):
            raise ShapeError(
                f"cannot broadcast {_dims_text(left)} with {right_operand} {_dims_text(right)}",
                operand=right_operand,
            )
        else:
            out.append(a)
    return tuple(out)


def broadcast_all(named: Sequence[tuple[str, Sequence[Dim]]]) -> Dims:
    """Fold `broadcast_pair` left to right; the first operand's dims win dynamic ties."""
    result: Dims = tuple(named[0][1])
    for operand, dims in named[1:]:
        result = broadcast_pair(result, dims, operand)
    return result


def _fits_into(small: Sequence[Dim], target: Sequence[Dim]) -> bool:
    """True when `small` broadcasts to `target` without changing it."""
    if len(small) > len(target):
        return False
    for a, b in zip(reversed(small), reversed(target), strict=False):
        if a != Static(1) and _conflict(a, b):
            return False
    return True


def matmul_dims(a: Shape, b: Shape, a_operand: str = "lhs", b_operand: str = "rhs") -> Dims:
    """`[..., M, K] @ [..., K, N] -> [..., M, N]` with broadcast batch dims (spec 5.1)."""
    _require_rank(a, a_operand, minimum=2)
    _require_rank(b, b_operand, minimum=2)
    k_a, k_b = a.dims[-1], b.dims[-2]
    if k_a != k_b:
        raise ShapeError(
            f"contraction dims differ: {a_operand} {a} has K={k_a}, {b_operand} {b} has K={k_b}",
            operand=b_operand,
        )
    batch = broadcast_pair(a.dims[:-2], b.dims[:-2], b_operand)
    return (*batch, a.dims[-2], b.dims[-1])


def _require_float(shape: Shape, operand: str, op_text: str) -> None:
    if not shape.dtype.is_float:
        raise DTypeError(f"{op_text} needs a float {operand}, got {shape.dtype.value}", operand=operand)


def _leading_flattened(dims: Sequence[Dim], last: Dim) -> Dims | None:
    """`[prod(dims[:-1]), last]` when the leading dims are static (fusion passes' form)."""
    rows = _numel(dims[:-1])
    return None if rows is None else (Static(rows), last)


def _declared_or(inferred: Shape, declared: Shape | None, alternative: Dims | None) -> Shape:
    """The inferred shape, unless the declaration spells an accepted alternative layout."""
    if declared is not None and alternative is not None and declared.dims == alternative:
        return Shape(alternative, inferred.dtype)
    return inferred


# -------------------------------------------------------------------------------- leaves


def _leaf(op: Op, declared: Shape | None) -> None:
    if declared is None:
        raise ShapeError(f"{op.type_name} nodes need a declared shape (nothing to infer it from)")


@shape_rule(Input)
def _input(op: Input, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _leaf(op, declared)
    return None


@shape_rule(Param)
def _param(op: Param, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _leaf(op, declared)
    return None


@shape_rule(Constant)
def _constant(op: Constant, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _leaf(op, declared)
    assert declared is not None
    if declared.dtype is DType.C64:
        raise DTypeError("C64 constants are outside the rlx_mil IR subset")
    n = _numel(declared.dims)
    if n is not None and len(op.data) != n * declared.dtype.itemsize:
        raise AttributeValueError(
            f"data holds {len(op.data)} bytes but {declared} needs {n} x {declared.dtype.itemsize}"
            f" = {n * declared.dtype.itemsize}",
            operand="data",
        )
    return None


# -------------------------------------------------------------------------------- element-wise


@shape_rule(Activation)
def _activation(op: Activation, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return ins[0]


@shape_rule(Cast)
def _cast(op: Cast, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if not isinstance(op.to, DType) or op.to is DType.C64:
        raise DTypeError(f"cannot cast to {op.to!r}")
    return ins[0].with_dtype(op.to)


@shape_rule(Binary)
def _binary(op: Binary, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return Shape(broadcast_pair(ins[0].dims, ins[1].dims, "rhs"), ins[0].dtype)


@shape_rule(Compare)
def _compare(op: Compare, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return Shape(broadcast_pair(ins[0].dims, ins[1].dims, "rhs"), DType.BOOL)


@shape_rule(Where)
def _where(op: Where, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    cond, on_true, on_false = ins
    dims = broadcast_all([("on_true", on_true.dims), ("on_false", on_false.dims), ("cond", cond.dims)])
    return Shape(dims, on_true.dtype)


# -------------------------------------------------------------------------------- linear algebra


@shape_rule(MatMul)
def _matmul(op: MatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return Shape(matmul_dims(ins[0], ins[1]), ins[0].dtype)


@shape_rule(LoraMatMul)
def _lora_matmul(op: LoraMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w, a, b = ins
    if not math.isfinite(op.scale):
        raise AttributeValueError(f"scale must be finite, got {op.scale}")
    _require_rank(w, "w", exact=(2,))
    dims = matmul_dims(x, w, "x", "w")
    k, n = w.dims
    _require_rank(a, "a", exact=(2,))
    _require_rank(b, "b", exact=(2,))
    if _conflict(a.dims[0], k):
        raise ShapeError(f"a must be [K={k}, r], got {a}", operand="a")
    if _conflict(b.dims[0], a.dims[1]) or _conflict(b.dims[1], n):
        raise ShapeError(f"b must be [r={a.dims[1]}, N={n}], got {b}", operand="b")
    return Shape(dims, x.dtype)


@shape_rule(FusedMatMulBiasAct)
def _fused_matmul_bias_act(op: FusedMatMulBiasAct, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w, bias = ins
    dims = matmul_dims(x, w, "x", "w")
    if not _fits_into(bias.dims, dims):
        raise ShapeError(f"bias {bias} does not broadcast onto the product {_dims_text(dims)}", operand="bias")
    return Shape(dims, x.dtype)


def _check_quant_attrs(op: Quantize | Dequantize, x: Shape, operand: str) -> None:
    if len(op.scales) != len(op.zero_points):
        raise AttributeValueError(f"{len(op.scales)} scales but {len(op.zero_points)} zero points")
    for s in op.scales:
        if not math.isfinite(s) or s == 0.0:
            raise AttributeValueError(f"scales must be finite and non-zero, got {s}")
    if op.axis is None:
        if len(op.scales) != 1:
            raise AttributeValueError(f"per-tensor quantization takes one scale, got {len(op.scales)}")
        return
    axis = _unsigned_axis(op.axis, x.rank, operand=operand)
    channels = _size(x.dims[axis])
    if channels is not None and channels != len(op.scales):
        raise AttributeValueError(
            f"per-channel axis {axis} of {x} has {channels} channels but {len(op.scales)} scales are given",
            operand=operand,
        )


@shape_rule(Quantize)
def _quantize(op: Quantize, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _require_float(ins[0], "x", "Quantize")
    _check_quant_attrs(op, ins[0], "x")
    return ins[0].with_dtype(DType.I8)


@shape_rule(Dequantize)
def _dequantize(op: Dequantize, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if not ins[0].dtype.is_int:
        raise DTypeError(f"Dequantize needs an integer q, got {ins[0].dtype.value}", operand="q")
    _check_quant_attrs(op, ins[0], "q")
    return ins[0].with_dtype(DType.F32)


#: GGUF block geometry: (elements per block, bytes per block).
GGUF_BLOCKS: dict[QuantKind, tuple[int, int]] = {
    QuantKind.GGUF_Q2K: (256, 84),
    QuantKind.GGUF_Q3K: (256, 110),
    QuantKind.GGUF_Q4K: (256, 144),
    QuantKind.GGUF_Q5K: (256, 176),
    QuantKind.GGUF_Q6K: (256, 210),
    QuantKind.GGUF_Q8K: (256, 292),
    QuantKind.GGUF_Q4_0: (32, 18),
    QuantKind.GGUF_Q8_0: (32, 34),
}


@shape_rule(DequantMatMul)
def _dequant_matmul(op: DequantMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    _require_rank(x, "x", minimum=1)
    k = x.dims[-1]
    kind = op.scheme.kind
    if kind.is_gguf:
        n = _gguf_out_features(op, x, ins[1], declared)
    else:
        n = _block_weight_out_features(op, x, ins[1], declared)
        _check_block_scales(op, k, n, ins[2], ins[3])
    inferred = Shape((*x.dims[:-1], n), x.dtype)
    return _declared_or(inferred, declared, _leading_flattened(x.dims, n))


def _gguf_out_features(op: DequantMatMul, x: Shape, packed: Shape, declared: Shape | None) -> Dim:
    if declared is None or declared.rank == 0:
        raise ShapeError(f"{op.scheme} weights are packed; pass the output shape [..., N] explicitly")
    n = declared.dims[-1]
    elems, block_bytes = GGUF_BLOCKS[op.scheme.kind]
    k_size, n_size = _size(x.dims[-1]), _size(n)
    if k_size is not None and k_size % elems != 0:
        raise ShapeError(f"K={k_size} of x is not a multiple of the {op.scheme} block of {elems}", operand="x")
    packed_elems = _numel(packed.dims)
    if k_size is not None and n_size is not None and packed_elems is not None:
        want = n_size * (k_size // elems) * block_bytes
        have = packed_elems * packed.dtype.itemsize
        if have != want:
            raise ShapeError(
                f"packed_w {packed} holds {have} bytes; [N={n_size}, K={k_size}] in {op.scheme} needs {want}",
                operand="packed_w",
            )
    return n


def _block_weight_out_features(op: DequantMatMul, x: Shape, w_q: Shape, declared: Shape | None) -> Dim:
    """N of a legacy (`[K, N]`) weight; 4-bit weights may also be declared as packed bytes."""
    k = x.dims[-1]
    four_bit = op.scheme.kind in (QuantKind.INT4_BLOCK, QuantKind.NVFP4_BLOCK)
    if w_q.rank == 2:
        if w_q.dims[0] != k:
            raise ShapeError(f"w_q must be [K={k}, N], got {w_q}", operand="w_q")
        return w_q.dims[1]
    if four_bit and w_q.rank == 1:
        if declared is None or declared.rank == 0:
            raise ShapeError(f"w_q {w_q} is packed; pass the output shape [..., N] explicitly", operand="w_q")
        n = declared.dims[-1]
        k_size, n_size, packed = _size(k), _size(n), _size(w_q.dims[0])
        if k_size is not None and n_size is not None and packed is not None and packed != (k_size * n_size + 1) // 2:
            raise ShapeError(
                f"packed w_q {w_q} must hold ceil(K*N/2) = {(k_size * n_size + 1) // 2} bytes for K={k_size}, N={n_size}",
                operand="w_q",
            )
        return n
    raise ShapeError(f"w_q must be [K, N] (rank 2), got {w_q}", operand="w_q")


def _check_block_scales(op: DequantMatMul, k: Dim, n: Dim, scale: Shape, zp: Shape) -> None:
    kind = op.scheme.kind
    k_size = _size(k)
    if op.scheme.block_size is not None or kind is QuantKind.NVFP4_BLOCK:
        block = op.scheme.block_size if op.scheme.block_size is not None else 16
        scale_name = "block_scale" if kind is QuantKind.NVFP4_BLOCK else "scale"
        if k_size is not None:
            groups = Static(-(-k_size // block))
            _require_dims(scale, (groups, n), scale_name, f"[ceil(K/{block}), N] =")
            if kind is QuantKind.INT8_BLOCK_ASYM:
                _require_dims(zp, (groups, n), "zp", f"[ceil(K/{block}), N] =")
        if kind is QuantKind.NVFP4_BLOCK:
            _require_numel(zp, 1, "global_scale", "one scale")
    elif kind in (QuantKind.FP8_E4M3, QuantKind.FP8_E5M2):
        n_size, have = _size(n), _numel(scale.dims)
        if n_size is not None and have not in (None, 0, n_size):
            raise ShapeError(f"scale must hold one value per output column (N={n_size}), got {scale}", operand="scale")


# -------------------------------------------------------------------------------- normalization


def _check_affine(param: Shape, width: Dim, operand: str) -> None:
    _require_dims(param, (width,), operand, "[H] =")


def _last_axis_norm(op: LayerNorm | RmsNorm, ins: Sequence[Shape]) -> Shape:
    x, gamma, beta = ins
    _require_rank(x, "x", minimum=1)
    _require_int(op.axis, "axis")
    if op.axis not in (-1, x.rank - 1):
        raise AttributeValueError(
            f"normalizes the last axis only: axis must be -1 or {x.rank - 1} for x {x}, got {op.axis}", operand="x"
        )
    if not math.isfinite(op.eps) or op.eps < 0:
        raise AttributeValueError(f"eps must be finite and >= 0, got {op.eps}")
    _check_affine(gamma, x.dims[-1], "gamma")
    _check_affine(beta, x.dims[-1], "beta")
    return x


@shape_rule(LayerNorm)
def _layer_norm(op: LayerNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _last_axis_norm(op, ins)


@shape_rule(RmsNorm)
def _rms_norm(op: RmsNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = _last_axis_norm(op, ins)
    # A fusion pass may fold a following Reshape into the declared shape (spec 6.2).
    return _declared_or(x, declared, _leading_flattened(x.dims, x.dims[-1]))


@shape_rule(GroupNorm)
def _group_norm(op: GroupNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, gamma, beta = ins
    _require_rank(x, "x", minimum=2)
    groups = _require_int(op.num_groups, "num_groups", minimum=1)
    if not math.isfinite(op.eps) or op.eps < 0:
        raise AttributeValueError(f"eps must be finite and >= 0, got {op.eps}")
    channels = x.dims[1]
    c = _size(channels)
    if c is not None and c % groups != 0:
        raise AttributeValueError(f"channels C={c} of x {x} are not divisible by num_groups={groups}", operand="x")
    _require_dims(gamma, (channels,), "gamma", "[C] =")
    _require_dims(beta, (channels,), "beta", "[C] =")
    return x


def _fused_residual_norm(op: FusedResidualLN | FusedResidualRmsNorm, ins: Sequence[Shape]) -> Shape:
    x, residual = ins[0], ins[1]
    _require_rank(x, "x", minimum=1)
    if not math.isfinite(op.eps) or op.eps < 0:
        raise AttributeValueError(f"eps must be finite and >= 0, got {op.eps}")
    if not _fits_into(residual.dims, x.dims):
        raise ShapeError(f"residual {residual} does not match x {x}", operand="residual")
    width = x.dims[-1]
    if op.has_bias:
        _check_affine(ins[2], width, "bias")
    _check_affine(ins[-2], width, "gamma")
    _check_affine(ins[-1], width, "beta")
    return x


@shape_rule(FusedResidualLN)
def _fused_residual_ln(op: FusedResidualLN, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _fused_residual_norm(op, ins)


@shape_rule(FusedResidualRmsNorm)
def _fused_residual_rms(op: FusedResidualRmsNorm, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return _fused_residual_norm(op, ins)


# -------------------------------------------------------------------------------- reductions


@shape_rule(Softmax)
def _softmax(op: Softmax, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    normalize_axis(op.axis, ins[0].rank)
    return ins[0]


@shape_rule(Cumsum)
def _cumsum(op: Cumsum, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    normalize_axis(op.axis, ins[0].rank)
    return ins[0]


@shape_rule(Reduce)
def _reduce(op: Reduce, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    if not op.axes:
        raise AttributeValueError("axes must not be empty")
    for axis in op.axes:
        _unsigned_axis(axis, x.rank, "reduce axis")
    if len(set(op.axes)) != len(op.axes):
        raise AttributeValueError(f"axes must be unique, got {list(op.axes)}")
    reduced = set(op.axes)
    if op.keep_dim:
        dims: Dims = tuple(Static(1) if i in reduced else d for i, d in enumerate(x.dims))
    else:
        dims = tuple(d for i, d in enumerate(x.dims) if i not in reduced)
    return Shape(dims, x.dtype)


@shape_rule(TopK)
def _topk(op: TopK, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    _require_rank(x, "x", minimum=1)
    k = _require_int(op.k, "k", minimum=1)
    n = _size(x.dims[-1])
    if n is not None and k > n:
        raise AttributeValueError(f"k={k} exceeds the last dim {n} of x {x}", operand="x")
    dtype = declared.dtype if declared is not None else DType.F32
    if dtype in (DType.BOOL, DType.C64):
        raise DTypeError(f"TopK indices cannot be {dtype.value}")
    return Shape((*x.dims[:-1], Static(k)), dtype)


# -------------------------------------------------------------------------------- data movement


@shape_rule(Reshape)
def _reshape(op: Reshape, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    new = list(op.new_shape)
    for v in new:
        if not _is_int(v) or v < -1:
            raise AttributeValueError(f"new_shape entries must be integers >= -1, got {list(op.new_shape)}")
    if new.count(-1) > 1:
        raise AttributeValueError(f"new_shape may hold at most one -1, got {new}")
    known = math.prod(v for v in new if v != -1)
    total = _numel(x.dims)
    dims: list[Dim] = [Static(v) for v in new if v != -1]
    if -1 in new:
        pos = new.index(-1)
        fill: Dim
        if total is None:
            symbols = {d.symbol for d in x.dims if isinstance(d, Dynamic)}
            fill = Dynamic(symbols.pop()) if len(symbols) == 1 else Dynamic(ROWS)
        else:
            if known == 0 or total % known != 0:
                raise ShapeError(f"cannot reshape {x} ({total} elements) into {new}", operand="x")
            fill = Static(total // known)
        dims.insert(pos, fill)
    elif total is not None and total != known:
        raise ShapeError(f"cannot reshape {x} ({total} elements) into {new} ({known} elements)", operand="x")
    return Shape(tuple(dims), x.dtype)


@shape_rule(Transpose)
def _transpose(op: Transpose, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    perm = list(op.perm)
    if not all(_is_int(p) for p in perm) or sorted(perm) != list(range(x.rank)):
        raise AttributeValueError(f"perm {perm} is not a permutation of 0..{x.rank - 1} (x is {x})")
    return Shape(tuple(x.dims[p] for p in perm), x.dtype)


@shape_rule(Narrow)
def _narrow(op: Narrow, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    axis = _unsigned_axis(op.axis, x.rank)
    start = _require_int(op.start, "start", minimum=0)
    length = _require_int(op.len, "len", minimum=0)
    size = _size(x.dims[axis])
    if size is not None and start + length > size:
        raise AttributeValueError(
            f"start {start} + len {length} exceeds dim {axis} of x {x} (size {size})", operand="x"
        )
    dims = list(x.dims)
    dims[axis] = Static(length)
    return Shape(tuple(dims), x.dtype)


@shape_rule(Concat)
def _concat(op: Concat, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    first = ins[0]
    axis = _unsigned_axis(op.axis, first.rank, operand="inputs[0]")
    total = 0
    dynamic_axis = False
    for i, s in enumerate(ins):
        operand = f"inputs[{i}]"
        if s.rank != first.rank:
            raise ShapeError(f"{operand} {s} must have rank {first.rank} like inputs[0] {first}", operand=operand)
        if s.dtype != first.dtype:
            raise DTypeError(f"{operand} is {s.dtype.value} but inputs[0] is {first.dtype.value}", operand=operand)
        for d in range(first.rank):
            if d != axis and _conflict(s.dims[d], first.dims[d]):
                raise ShapeError(
                    f"{operand} {s} differs from inputs[0] {first} on dim {d} (concat axis is {axis})",
                    operand=operand,
                )
        size = _size(s.dims[axis])
        if size is None:
            dynamic_axis = True
        else:
            total += size
    out_axis: Dim
    if not dynamic_axis:
        out_axis = Static(total)
    elif declared is not None and declared.rank == first.rank:
        out_axis = declared.dims[axis]
    else:
        raise ShapeError(f"the concat axis {axis} is dynamic; pass the output shape explicitly")
    dims = list(first.dims)
    dims[axis] = out_axis
    return Shape(tuple(dims), first.dtype)


@shape_rule(Expand)
def _expand(op: Expand, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    target = list(op.target_shape)
    for v in target:
        if not _is_int(v) or v < -1:
            raise AttributeValueError(f"target_shape entries must be integers >= -1, got {target}")
    if len(target) < x.rank:
        raise ShapeError(f"cannot expand rank-{x.rank} x {x} to the lower rank {len(target)} of {target}", operand="x")
    padded: list[Dim] = [Static(1) for _ in range(len(target) - x.rank)]
    padded.extend(x.dims)
    dims: list[Dim] = []
    for i, (have, want) in enumerate(zip(padded, target, strict=True)):
        if want == -1:
            dims.append(have)
        elif have == Static(want) or have == Static(1) or isinstance(have, Dynamic):
            dims.append(Static(want))
        else:
            raise ShapeError(
                f"dim {i} of x {x} (left-padded to rank {len(target)}) is {have}; only size-1 dims can grow to {want}",
                operand="x",
            )
    return Shape(tuple(dims), x.dtype)


@shape_rule(Gather)
def _gather(op: Gather, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    table, indices = ins
    axis = _unsigned_axis(op.axis, table.rank, operand="table")
    if indices.dtype is DType.C64:
        raise DTypeError("indices cannot be complex", operand="indices")
    return Shape((*table.dims[:axis], *indices.dims, *table.dims[axis + 1:]), table.dtype)


@shape_rule(Rope)
def _rope(op: Rope, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, cos, sin = ins
    head_dim = _require_int(op.head_dim, "head_dim", minimum=2)
    n_rot = _require_int(op.n_rot, "n_rot", minimum=0)
    if head_dim % 2:
        raise AttributeValueError(f"head_dim must be even, got {head_dim}")
    if n_rot % 2 or n_rot > head_dim:
        raise AttributeValueError(f"n_rot must be even and <= head_dim={head_dim}, got {n_rot}")
    _require_rank(x, "x", exact=(2, 3, 4))
    width = _size(x.dims[-1])
    if x.rank == 4:
        if width is not None and width != head_dim:
            raise ShapeError(f"rank-4 x is [B, H, S, head_dim]; last dim must be {head_dim}, got {x}", operand="x")
    elif width is not None and width % head_dim:
        raise ShapeError(f"last dim of x {x} is not a multiple of head_dim={head_dim}", operand="x")
    seq = _size(x.dims[-2])
    for name, table in (("cos", cos), ("sin", sin)):
        _require_rank(table, name, exact=(2,))
        if _conflict(table.dims[1], Static(head_dim // 2)):
            raise ShapeError(f"{name} must be [P, head_dim/2 = {head_dim // 2}], got {table}", operand=name)
        rows = _size(table.dims[0])
        if rows is not None and seq is not None and rows != 1 and rows < seq:
            raise ShapeError(
                f"{name} {table} has {rows} rows but x {x} has {seq} positions (need P >= S or P == 1)",
                operand=name,
            )
    if _conflict(cos.dims[0], sin.dims[0]):
        raise ShapeError(f"cos {cos} and sin {sin} must have the same rows", operand="sin")
    return x


# -------------------------------------------------------------------------------- attention


def _check_mask(mask_type: MaskType, mask: Shape, geom: AttentionGeometry) -> None:
    if mask_type is MaskType.CUSTOM:
        b, sk = _size(geom.batch), _size(geom.kv_len)
        expected = None if b is None or sk is None else b * sk
        _require_numel(mask, expected, "mask", f"B*Sk = {geom.batch}*{geom.kv_len}")
    elif mask_type is MaskType.BIAS:
        target = (geom.batch, Static(geom.num_heads), geom.q_len, geom.kv_len)
        if not _fits_into(mask.dims, target):
            raise ShapeError(
                f"Bias mask {mask} does not broadcast to [B, H, Sq, Sk] = {_dims_text(target)}", operand="mask"
            )


def _check_attention_attrs(op: Attention | AttentionBackward) -> None:
    _require_int(op.num_heads, "num_heads", minimum=1)
    _require_int(op.head_dim, "head_dim", minimum=1)
    if op.mask_kind.type is MaskType.SLIDING_WINDOW:
        _require_int(op.mask_kind.window, "sliding window", minimum=0)


@shape_rule(Attention)
def _attention(op: Attention, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _check_attention_attrs(op)
    for attr in ("score_scale", "attn_logit_softcap"):
        value = getattr(op, attr)
        if value is not None and not math.isfinite(value):
            raise AttributeValueError(f"{attr} must be finite, got {value}")
    q, k, v = ins[:3]
    geom = attention_geometry(q, k, v, op.num_heads, op.head_dim)
    _warn_if_ambiguous(geom, q)
    if op.mask_kind.has_mask_input:
        _check_mask(op.mask_kind.type, ins[3], geom)
    return q


def _warn_if_ambiguous(geom: AttentionGeometry, q: Shape) -> None:
    if geom.is_ambiguous:
        warnings.warn(
            AmbiguousLayoutWarning(
                f"q {q}: dims 1 and 2 both equal num_heads={geom.num_heads}; read as [B, H, S, D]"
                " (the upstream rule). A [B, S, H, D] tensor with S == num_heads would be misread:"
                " transpose it to [B, H, S, D] first."
            ),
            stacklevel=2,
        )


@shape_rule(AttentionBackward)
def _attention_backward(op: AttentionBackward, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _check_attention_attrs(op)
    q, k, v, dy = ins[:4]
    geom = attention_geometry(q, k, v, op.num_heads, op.head_dim)
    _warn_if_ambiguous(geom, q)
    if dy.rank != q.rank or any(_conflict(a, b) for a, b in zip(dy.dims, q.dims, strict=True)):
        raise ShapeError(f"dy must have q's shape {q}, got {dy}", operand="dy")
    if op.mask_kind.has_mask_input:
        _check_mask(op.mask_kind.type, ins[4], geom)
    if not isinstance(op.wrt, AttentionBwdWrt):
        raise AttributeValueError(f"wrt must be Query, Key or Value, got {op.wrt!r}")
    return {AttentionBwdWrt.QUERY: q, AttentionBwdWrt.KEY: k, AttentionBwdWrt.VALUE: v}[op.wrt]


# -------------------------------------------------------------------------------- fused blocks


@shape_rule(FusedSwiGLU)
def _fused_swiglu(op: FusedSwiGLU, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    _require_rank(x, "x", minimum=1)
    dtype = x.dtype if op.cast_to is None else op.cast_to
    width = _size(x.dims[-1])
    half: Dim
    if width is None:
        if declared is None or declared.rank != x.rank:
            raise ShapeError(f"the last dim of x {x} is dynamic; pass the output shape explicitly", operand="x")
        half = declared.dims[-1]
    elif width % 2:
        raise ShapeError(f"last dim of x {x} must be even ([..., 2N] -> [..., N])", operand="x")
    else:
        half = Static(width // 2)
    return Shape((*x.dims[:-1], half), dtype)


def _check_block_weights(
    hidden: Shape, qkv_w: Shape, out_w: Shape, mask: Shape, num_heads: int, head_dim: int
) -> tuple[Dim, int]:
    _require_int(num_heads, "num_heads", minimum=1)
    _require_int(head_dim, "head_dim", minimum=1)
    _require_rank(hidden, "hidden", exact=(3,))
    batch, seq, width = hidden.dims
    inner = num_heads * head_dim
    _require_dims(qkv_w, (width, Static(3 * inner)), "qkv_w", "[E, 3*H*D] =")
    _require_dims(out_w, (Static(inner), width), "out_w", "[H*D, E] =")
    b, s = _size(batch), _size(seq)
    _require_numel(mask, None if b is None or s is None else b * s, "mask", f"B*S = {batch}*{seq}")
    return width, inner


@shape_rule(FusedAttentionBlock)
def _fused_attention_block(op: FusedAttentionBlock, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    hidden, qkv_w, out_w, mask = ins[:4]
    width, inner = _check_block_weights(hidden, qkv_w, out_w, mask, op.num_heads, op.head_dim)
    rest = list(ins[4:])
    if op.has_bias:
        qkv_b, out_b = rest[:2]
        rest = rest[2:]
        _require_dims(qkv_b, (Static(3 * inner),), "qkv_b", "[3*H*D] =")
        _require_dims(out_b, (width,), "out_b", "[E] =")
    if op.has_rope:
        if op.head_dim % 2:
            raise AttributeValueError(f"rope needs an even head_dim, got {op.head_dim}")
        seq = _size(hidden.dims[1])
        for name, table in zip(("cos", "sin"), rest, strict=True):
            _require_rank(table, name, exact=(2,))
            if _conflict(table.dims[1], Static(op.head_dim // 2)):
                raise ShapeError(f"{name} must be [P, head_dim/2 = {op.head_dim // 2}], got {table}", operand=name)
            rows = _size(table.dims[0])
            if rows is not None and seq is not None and rows < seq:
                raise ShapeError(f"{name} {table} has {rows} rows, fewer than S={seq}", operand=name)
    return hidden


@shape_rule(FusedTransformerLayer)
def _fused_transformer_layer(op: FusedTransformerLayer, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    roles = _FTL_ROLES[len(ins)]
    named = dict(zip(roles, ins, strict=True))
    hidden = named["hidden"]
    width, inner = _check_block_weights(
        hidden, named["qkv_w"], named["out_w"], named["mask"], op.num_heads, op.head_dim
    )
    ffn = Static(_require_int(op.intermediate_size, "intermediate_size", minimum=1))
    for eps_name in ("eps1", "eps2"):
        eps = getattr(op, eps_name)
        if not math.isfinite(eps) or eps < 0:
            raise AttributeValueError(f"{eps_name} must be finite and >= 0, got {eps}")
    expected: dict[str, tuple[Dims, str]] = {
        "qkv_b": ((Static(3 * inner),), "[3*H*D] ="),
        "out_b": ((width,), "[E] ="),
        "ln1_gamma": ((width,), "[E] ="),
        "ln1_beta": ((width,), "[E] ="),
        "fc1_w": ((width, ffn), "[E, intermediate_size] ="),
        "fc1_b": ((ffn,), "[intermediate_size] ="),
        "fc2_w": ((ffn, width), "[intermediate_size, E] ="),
        "fc2_b": ((width,), "[E] ="),
        "ln2_gamma": ((width,), "[E] ="),
        "ln2_beta": ((width,), "[E] ="),
    }
    for role, (dims, what) in expected.items():
        if role in named:
            _require_dims(named[role], dims, role, what)
    return hidden


# -------------------------------------------------------------------------------- conv / pool


def _spatial_attr(values: Sequence[int], spatial: int, what: str, default: int | None) -> list[int]:
    if len(values) == 0 and default is not None:
        return [default] * spatial
    if len(values) != spatial:
        raise AttributeValueError(f"{what} needs {spatial} entries (one per spatial dim), got {list(values)}")
    return [_require_int(v, what) for v in values]


def _window_out(size: Dim, kernel: int, stride: int, pad: int, dilation: int, axis: int) -> Dim:
    if not isinstance(size, Static):
        raise ShapeError(f"spatial dim {axis} of x must be static, got {size}", operand="x")
    span = dilation * (kernel - 1) + 1
    if size.size + 2 * pad < span:
        raise ShapeError(
            f"spatial dim {axis} of x (size {size.size}, padding {pad}) is smaller than the window {span}",
            operand="x",
        )
    return Static((size.size + 2 * pad - span) // stride + 1)


@shape_rule(Conv)
def _conv(op: Conv, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w = ins
    _require_rank(x, "x", minimum=3)
    spatial = x.rank - 2
    _require_rank(w, "w", exact=(x.rank,))
    groups = _require_int(op.groups, "groups", minimum=1)
    kernel = _spatial_attr(op.kernel_size, spatial, "kernel_size", None)
    stride = _spatial_attr(op.stride, spatial, "stride", 1)
    padding = _spatial_attr(op.padding, spatial, "padding", 0)
    dilation = _spatial_attr(op.dilation, spatial, "dilation", 1)
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise AttributeValueError("kernel_size, stride and dilation must be >= 1 and padding >= 0")
    if any(_conflict(w.dims[2 + i], Static(kernel[i])) for i in range(spatial)):
        raise ShapeError(f"w {w} spatial dims differ from kernel_size {kernel}", operand="w")
    c_in, c_out, w_in = _size(x.dims[1]), _size(w.dims[0]), _size(w.dims[1])
    if c_in is not None and w_in is not None and c_in != w_in * groups:
        raise ShapeError(f"x has C_in={c_in} channels but w {w} expects {w_in} x groups={groups}", operand="w")
    if c_out is not None and c_out % groups:
        raise AttributeValueError(f"C_out={c_out} of w {w} is not divisible by groups={groups}", operand="w")
    out = [_window_out(x.dims[2 + i], kernel[i], stride[i], padding[i], dilation[i], 2 + i) for i in range(spatial)]
    return Shape((x.dims[0], w.dims[0], *out), x.dtype)


@shape_rule(Pool)
def _pool(op: Pool, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    _require_rank(x, "x", minimum=3)
    spatial = x.rank - 2
    kernel = _spatial_attr(op.kernel_size, spatial, "kernel_size", None)
    stride = _spatial_attr(op.stride, spatial, "stride", None)
    padding = _spatial_attr(op.padding, spatial, "padding", None)
    if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0:
        raise AttributeValueError("kernel_size and stride must be >= 1 and padding >= 0")
    out = [_window_out(x.dims[2 + i], kernel[i], stride[i], padding[i], 1, 2 + i) for i in range(spatial)]
    return Shape((*x.dims[:2], *out), x.dtype)


__all__ = [
    "GGUF_BLOCKS",
    "broadcast_all",
    "broadcast_pair",
    "has_rule",
    "infer_shape",
    "input_roles",
    "matmul_dims",
    "normalize_axis",
    "shape_rule",
]
