"""MatMul family: MatMul, LoraMatMul, FusedMatMulBiasAct (spec sections 5.1-5.3).

A right-hand side known at conversion time (a Param or Constant) whose batch dims are all 1
becomes the weight of MIL `linear`, the op Core ML maps to its fastest kernels (and fuses with
a following bias/activation). Everything else is `matmul`, which broadcasts batch dims the
NumPy way.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir import ops
from rlx_mil.ir.dtype import DType
from rlx_mil.lowering.context import LowerContext, WeightSource, compressed_weight, program_array
from rlx_mil.lowering.registry import lowering
from rlx_mil.lowering.rules.elementwise import (
    activation_var,
    convert,
    join,
    kind_of,
    to_float,
    to_int32,
)

#: MIL `linear` takes x of rank 1 to 3; higher ranks are folded into rank 3 around it.
_LINEAR_MAX_RANK = 3


def _as_weight(value: np.ndarray | None) -> np.ndarray | None:
    """`value` as a [K, N] matrix when it is known and its batch dims (if any) are all 1."""
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.ndim < 2 or any(d != 1 for d in arr.shape[:-2]):
        return None
    return arr.reshape(arr.shape[-2:])


def _reshape(ctx: LowerContext, var: Any, sizes: tuple[int, ...], suffix: str) -> Any:
    from coremltools.converters.mil import Builder as mb

    if tuple(var.shape) == tuple(sizes):
        return var
    return mb.reshape(x=var, shape=np.asarray(sizes, dtype=np.int32), name=ctx.name(suffix))


def linear_weight(
    ctx: LowerContext, weight_kn: np.ndarray, source: WeightSource | None, suffix: str, index: int | None = None
) -> Any:
    """A known [K, N] matmul weight as `linear` takes it: the compressed constexpr op when the
    conversion compresses the Param `source`, else [N, K] in the program's float dtype. When
    the weight is the node's input `index`, that array is made once per conversion and shared
    (`ctx.weight`); a computed weight (index None) is cast and transposed in one pass."""
    compressed = compressed_weight(
        ctx.options, source, weight_kn, layout="kn", op_name=lambda: ctx.name(join(suffix, "weight"))
    )
    if compressed is not None:
        return compressed
    if index is not None:
        return ctx.weight(index, transpose=True)
    return program_array(weight_kn, ctx.float_dtype, transpose=True)


def linear_var(
    ctx: LowerContext,
    x: Any,
    weight: Any,
    bias: np.ndarray | None,
    out_sizes: tuple[int, ...],
    suffix: str,
) -> Any:
    """`x @ W (+ bias)` through MIL `linear` (x held in the program float), reshaped to
    `out_sizes`; `weight` is W as `linear_weight` gives it. A known all-zero bias is left out."""
    from coremltools.converters.mil import Builder as mb

    x_sizes = tuple(int(d) for d in x.shape)
    if len(x_sizes) > _LINEAR_MAX_RANK:
        x = _reshape(ctx, x, (math.prod(x_sizes[:-2]), *x_sizes[-2:]), join(suffix, "fold"))
    kwargs: dict[str, Any] = {}
    if bias is not None and np.any(np.asarray(bias) != 0):
        kwargs["bias"] = program_array(bias, ctx.float_dtype)
    result = mb.linear(x=x, weight=weight, name=ctx.name(suffix), **kwargs)
    correction = None if ctx.options.compressor is None else ctx.options.compressor.correction(weight)
    if correction is not None:  # a compressed weight's low-rank correction, never a dense weight: x B^T A^T
        down = mb.linear(x=x, weight=correction[0], name=ctx.name(join(suffix, "lowrank_down")))
        up = mb.linear(x=down, weight=correction[1], name=ctx.name(join(suffix, "lowrank_up")))
        result = mb.add(x=result, y=up, name=ctx.name(join(suffix, "corrected")))
    return _reshape(ctx, result, out_sizes, join(suffix, "shape"))


def matmul_var(
    ctx: LowerContext,
    a: tuple[Any, DType, np.ndarray | None],
    b: tuple[Any, DType, np.ndarray | None],
    out_sizes: tuple[int, ...],
    suffix: str,
    source: WeightSource | None = None,
    b_index: int | None = None,
) -> tuple[Any, DType]:
    """`a @ b` with NumPy batch broadcasting; each operand is (var or None, IR dtype, known
    value or None). Returns the result var and the IR dtype it holds (F32 for floats, I32 when
    both operands are integer). `b_index`: the node input b is, when it is one (see
    `linear_weight`)."""
    from coremltools.converters.mil import Builder as mb

    a_var, a_dt, _ = a
    b_var, b_dt, b_value = b
    if kind_of(a_dt) != "float" and kind_of(b_dt) != "float":
        ai = to_int32(ctx, a_var, a_dt, join(suffix, "lhs_int"))
        bi = to_int32(ctx, b_var, b_dt, join(suffix, "rhs_int"))
        return mb.matmul(x=ai, y=bi, name=ctx.name(suffix)), DType.I32
    x = to_float(ctx, a_var, a_dt, join(suffix, "lhs_float"))
    known = _as_weight(b_value)
    if known is not None:
        weight = linear_weight(ctx, known, source, suffix, b_index)
        return linear_var(ctx, x, weight, None, out_sizes, suffix), DType.F32
    y = to_float(ctx, b_var, b_dt, join(suffix, "rhs_float"))
    return mb.matmul(x=x, y=y, name=ctx.name(suffix)), DType.F32


def _check_matmul_shapes(ctx: LowerContext, a: int, b: int, names: tuple[str, str]) -> tuple[int, ...]:
    sa, sb = ctx.input_shape(a).sizes(), ctx.input_shape(b).sizes()
    if len(sa) < 2 or len(sb) < 2:
        raise ctx.fail(ShapeError, f"operands need rank >= 2, got {list(sa)} @ {list(sb)}", names[0] if len(sa) < 2 else names[1])
    if sa[-1] != sb[-2]:
        raise ctx.fail(ShapeError, f"contraction dims differ: {list(sa)} @ {list(sb)}", names[1])
    try:
        batch = tuple(int(d) for d in np.broadcast_shapes(sa[:-2], sb[:-2]))
    except ValueError:
        raise ctx.fail(ShapeError, f"batch dims do not broadcast: {list(sa)} @ {list(sb)}", names[1]) from None
    return (*batch, sa[-2], sb[-1])


def _check_declared(ctx: LowerContext, sizes: tuple[int, ...]) -> None:
    declared = ctx.out_shape.sizes()
    if declared != sizes:
        raise ctx.fail(ShapeError, f"the product has shape {list(sizes)}, but the node declares {list(declared)}")


def _operand(ctx: LowerContext, i: int) -> tuple[Any, DType, np.ndarray | None]:
    value = ctx.value(i)
    dtype = ctx.input_shape(i).dtype
    # A known matrix that will become a `linear` weight needs no const of its own.
    if value is not None and dtype.is_float and _as_weight(value) is not None:
        return None, dtype, value
    return ctx.var(i), dtype, value


@lowering(
    notes=(
        "`linear` when b is a Param/Constant whose batch dims are all 1 (x folded to rank 3 and"
        " back when rank > 3); otherwise `matmul` with NumPy batch broadcasting (any ranks >= 2)."
        " Integer operands multiply in int32. Same on every target."
    ),
)
def lower_matmul(op: ops.MatMul, ctx: LowerContext) -> Any:
    sizes = _check_matmul_shapes(ctx, 0, 1, ("a", "b"))
    _check_declared(ctx, sizes)
    b_node = ctx.input_node(1)
    if (b_node.op.type_name == "Transpose" and tuple(getattr(b_node.op, "perm", ())) == (1, 0)
            and ctx.input_shape(1).dtype.is_float and ctx.graph.node(b_node.inputs[0]).op.type_name == "Param"
            and not ctx.compresses(1)):
        # An [out, in] weight is `linear`'s layout as stored: its shared const, without reading
        # the tensor here (a tied LM head's embedding is already in the program).
        x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "lhs_float")
        y = linear_var(ctx, x, ctx.weight(1, transpose=True), None, sizes, "")
        return convert(ctx, y, DType.F32, ctx.out_shape.dtype, suffix="out")
    a = (ctx.var(0), ctx.input_shape(0).dtype, ctx.value(0))
    result, held = matmul_var(ctx, a, _operand(ctx, 1), sizes, "", ctx.weight_source(1), b_index=1)
    return convert(ctx, result, held, ctx.out_shape.dtype, suffix="out")


def _rank2(ctx: LowerContext, i: int, name: str) -> tuple[int, int]:
    sizes = ctx.input_shape(i).sizes()
    if len(sizes) != 2:
        raise ctx.fail(ShapeError, f"{name} must be rank 2, got {list(sizes)}", name)
    return sizes[0], sizes[1]


@lowering(
    notes=(
        "w, a, b all Params/Constants: one `linear` with the merged weight w + scale*(a@b)"
        " (computed in float64 at conversion). Otherwise x@w + scale*((x@a)@b) with `linear` for"
        " each known matrix (scale folded into a known b) and `matmul` for the others."
    ),
)
def lower_lora_matmul(op: ops.LoraMatMul, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    k, n = _rank2(ctx, 1, "w")
    ka, r = _rank2(ctx, 2, "a")
    rb, nb = _rank2(ctx, 3, "b")
    x_sizes = ctx.input_shape(0).sizes()
    if len(x_sizes) < 2 or x_sizes[-1] != k or ka != k or rb != r or nb != n:
        raise ctx.fail(ShapeError, f"shapes do not chain: x {list(x_sizes)}, w [{k}, {n}], a [{ka}, {r}], b [{rb}, {nb}]",
            "a",
        )
    out_sizes = (*x_sizes[:-1], n)
    _check_declared(ctx, out_sizes)
    out_dt = ctx.out_shape.dtype
    x_dt = ctx.input_shape(0).dtype
    w, a, b = ctx.value(1), ctx.value(2), ctx.value(3)
    x = to_float(ctx, ctx.var(0), x_dt, "x_float")
    # A compressed w stays its own (compressed) weight: merging would compress w + a@b instead.
    compressing_w = ctx.options.compressor is not None and ctx.options.compressor.scheme_for(ctx.weight_source(1)) is not None
    if w is not None and a is not None and b is not None and not compressing_w:
        merged = np.asarray(w, np.float64) + np.float64(op.scale) * (np.asarray(a, np.float64) @ np.asarray(b, np.float64))
        weight = linear_weight(ctx, merged, None, "")
        return convert(ctx, linear_var(ctx, x, weight, None, out_sizes, ""), DType.F32, out_dt, suffix="out")

    def product(left: Any, i: int, sizes: tuple[int, ...], suffix: str, scale: float = 1.0) -> Any:
        value = ctx.value(i)
        if value is not None:
            if scale == 1.0:
                weight = linear_weight(ctx, value, ctx.weight_source(i), suffix, i)
            else:
                weight = linear_weight(ctx, np.asarray(value, np.float64) * np.float64(scale), None, suffix)
            return linear_var(ctx, left, weight, None, sizes, suffix)
        right = to_float(ctx, ctx.var(i), ctx.input_shape(i).dtype, join(suffix, "rhs_float"))
        result = mb.matmul(x=left, y=right, name=ctx.name(suffix))
        if scale != 1.0:
            result = mb.mul(x=result, y=ctx.scalar(scale), name=ctx.name(join(suffix, "scaled")))
        return result

    base = product(x, 1, out_sizes, "base")
    down = product(x, 2, (*x_sizes[:-1], r), "down")
    up = product(down, 3, out_sizes, "up", scale=op.scale)
    result = mb.add(x=base, y=up, name=ctx.name())
    return convert(ctx, result, DType.F32, out_dt, suffix="out")


@lowering(
    notes=(
        "`linear` with the bias folded in when w and bias are Params/Constants (else linear/matmul"
        " + add), then the activation exactly as the Activation op lowers it (gelu EXACT/TANH,"
        " silu, ...). Core ML fuses linear + activation itself."
    ),
)
def lower_fused_matmul_bias_act(op: ops.FusedMatMulBiasAct, ctx: LowerContext) -> Any:
    from coremltools.converters.mil import Builder as mb

    sizes = _check_matmul_shapes(ctx, 0, 1, ("x", "w"))
    _check_declared(ctx, sizes)
    n = sizes[-1]
    bias_sizes = ctx.input_shape(2).sizes()
    if math.prod(bias_sizes) != n:
        raise ctx.fail(ShapeError, f"bias must hold {n} values, got shape {list(bias_sizes)}", "bias")
    out_dt = ctx.out_shape.dtype
    x = to_float(ctx, ctx.var(0), ctx.input_shape(0).dtype, "x_float")
    known = _as_weight(ctx.value(1))
    weight = None if known is None else linear_weight(ctx, known, ctx.weight_source(1), "linear", 1)
    bias_value = ctx.value(2)
    if weight is not None and bias_value is not None:
        y = linear_var(ctx, x, weight, np.asarray(bias_value).reshape(n), sizes, "linear")
    else:
        if weight is not None:
            product = linear_var(ctx, x, weight, None, sizes, "linear")
        else:
            w = to_float(ctx, ctx.var(1), ctx.input_shape(1).dtype, "w_float")
            product = mb.matmul(x=x, y=w, name=ctx.name("matmul"))
        if bias_value is not None and not np.any(np.asarray(bias_value) != 0):
            y = product  # a known all-zero bias adds nothing
        else:
            bias = to_float(ctx, ctx.var(2), ctx.input_shape(2).dtype, "bias_float")
            if len(bias_sizes) != 1:
                bias = mb.reshape(x=bias, shape=np.asarray([n], dtype=np.int32), name=ctx.name("bias_flat"))
            y = mb.add(x=product, y=bias, name=ctx.name("bias"))
    if op.activation is None:
        return convert(ctx, y, DType.F32, out_dt, suffix="out")
    return activation_var(ctx, op.activation, y, DType.F32, out_dt)


def _permuted(ctx: LowerContext, var: Any, perm: list[int], suffix: str) -> Any:
    from coremltools.converters.mil import Builder as mb

    if perm == sorted(perm):
        return var
    return mb.transpose(x=var, perm=np.asarray(perm, np.int32), name=ctx.name(suffix))


def _dot_general_operand(
    ctx: LowerContext, i: int, perm: list[int], sizes: tuple[int, ...], suffix: str
) -> tuple[Any, DType, np.ndarray | None]:
    """Input `i` permuted by `perm` and reshaped to `sizes`: a known float rhs that is a matrix
    is rearranged at conversion (it becomes a `linear` weight), anything else in the program."""
    dtype = ctx.input_shape(i).dtype
    value = ctx.value(i) if i == 1 else None
    if value is not None and dtype.is_float:
        arranged = np.transpose(np.asarray(value), perm).reshape(sizes)
        if _as_weight(arranged) is not None:
            return None, dtype, arranged
    var = _permuted(ctx, ctx.var(i), perm, join(suffix, "perm"))
    return _reshape(ctx, var, sizes, join(suffix, "fold")), dtype, None


@lowering(
    notes=(
        "lhs transposed to [batch, free, contracting] and rhs to [batch, contracting, free], each folded"
        " to rank 3 (rank 2 without batch axes), one `matmul` (`linear` when rhs is a Param/Constant"
        " without batch axes, rearranged at conversion), reshaped to batch + lhs free + rhs free dims."
    ),
)
def lower_dot_general(op: ops.DotGeneral, ctx: LowerContext) -> Any:
    sa, sb = ctx.input_shape(0).sizes(), ctx.input_shape(1).sizes()
    lc, rc, lb, rb = (list(op.lhs_contracting), list(op.rhs_contracting), list(op.lhs_batch), list(op.rhs_batch))
    for i, j in (*zip(lb, rb, strict=True), *zip(lc, rc, strict=True)):
        if sa[i] != sb[j]:
            raise ctx.fail(ShapeError, f"paired dims differ: lhs axis {i} is {sa[i]}, rhs axis {j} is {sb[j]}", "rhs")
    lf = [i for i in range(len(sa)) if i not in (*lb, *lc)]
    rf = [j for j in range(len(sb)) if j not in (*rb, *rc)]
    batch = [sa[i] for i in lb]
    m, k, n = math.prod(sa[i] for i in lf), math.prod(sa[i] for i in lc), math.prod(sb[j] for j in rf)
    out_sizes = (*batch, *(sa[i] for i in lf), *(sb[j] for j in rf))
    _check_declared(ctx, out_sizes)
    if 0 in out_sizes or k == 0:
        raise ctx.unsupported(f"Core ML cannot hold the zero-size operands of {list(sa)} x {list(sb)}")
    lead = (math.prod(batch),) if batch else ()
    a = _dot_general_operand(ctx, 0, [*lb, *lf, *lc], (*lead, m, k), "lhs")
    b = _dot_general_operand(ctx, 1, [*rb, *rc, *rf], (*lead, k, n), "rhs")
    # The compressor sees the Param itself only when it is already the [K, N] matrix.
    source = ctx.weight_source(1) if (rc, rf) == ([0], [1]) and len(sb) == 2 else None
    result, held = matmul_var(ctx, a, b, (*lead, m, n), "matmul", source)
    result = _reshape(ctx, result, out_sizes, "shape")
    return convert(ctx, result, held, ctx.out_shape.dtype, suffix="out")


@lowering(
    notes=(
        "decomposed in IR: `MatMul` (so a Param/Constant rhs becomes `linear`'s weight, compressed"
        " when asked) then `Add` of the residual, each through its own rule."
    ),
)
def lower_fused_matmul_residual(op: ops.FusedMatMulResidual, ctx: LowerContext) -> Any:
    from rlx_mil.ir.graph import Graph

    graph = Graph(f"{ctx.base_name}_parts")
    lhs, rhs, residual = (graph.input(role, ctx.input_shape(i).dims, ctx.input_shape(i).dtype)
                          for i, role in enumerate(("lhs", "rhs", "residual")))
    graph.set_outputs([graph.add(graph.matmul(lhs, rhs), residual)])
    return ctx.lower_subgraph(graph, {lhs: 0, rhs: 1, residual: 2})[0]
