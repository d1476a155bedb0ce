"""Low-precision codes with scale tables (upstream's `ScaledFormat` / `ScaleLayout`):
ScaledDequantize, ScaledMatMul and its expert-indexed ScaledGroupedMatMul. Newest upstream JSON
only; decisions in docs/upstream-ops-3.md.

A code is one byte per element (logical dims, U8); its value is `decode(format, code) *
scale(block)`: one F32 scale for the tensor (`PerTensor`), an OCP E8M0 byte per `block`
consecutive elements along the last axis (`BlockMxE8M0`, MXFP8/MXFP6/MXFP4), or an FP8 E4M3
byte per `group` (`Nvfp4`). Scale tensors of the block layouts are `[.., ceil(K / block)]`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, Op, collect_ops
from rlx_mil.ir.ops.scatter import check_index_dtype
from rlx_mil.ir.serde.codecs import (
    BOOL,
    MISSING,
    U32,
    Codec,
    describe,
    fail,
    json_object,
    required,
    struct_form,
    tagged,
)
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Dim, Shape, Static
from rlx_mil.ir.shape_checks import conflict, numel, require_rank


class ScaledFormat(enum.Enum):
    """The element formats (upstream's named `ScaledFormat` variants)."""

    F8E4M3 = "F8E4M3"
    F8E5M2 = "F8E5M2"
    F8E4M3_FNUZ = "F8E4M3Fnuz"
    F8E5M2_FNUZ = "F8E5M2Fnuz"
    F6E2M3 = "F6E2M3"
    F6E3M2 = "F6E3M2"
    F4E2M1 = "F4E2M1"

    @property
    def bits(self) -> int:
        return int(self.value[1])


class ScaleKind(enum.Enum):
    PER_TENSOR = "PerTensor"
    BLOCK_MX_E8M0 = "BlockMxE8M0"
    NVFP4 = "Nvfp4"


@dataclass(frozen=True)
class ScaleLayout:
    """`PerTensor`, `BlockMxE8M0 { block }` or `Nvfp4 { group }` (`block` holds either size)."""

    kind: ScaleKind
    block: int = 1

    @property
    def dtype(self) -> DType:
        """The scale tensor's element type (upstream's `scale_dtype`)."""
        return DType.F32 if self.kind is ScaleKind.PER_TENSOR else DType.U8

    def scale_dims(self, codes: Shape) -> tuple[Dim, ...]:
        """The scale tensor `codes` needs: `[1]`, or codes' dims with K -> ceil(K / block)."""
        if self.kind is ScaleKind.PER_TENSOR:
            return (Static(1),)
        last = codes.dims[-1]
        if not isinstance(last, Static):
            raise ShapeError(f"codes {codes} need a static last dim for block scales", operand="codes")
        return (*codes.dims[:-1], Static(-(-last.size // self.block)))

    def __str__(self) -> str:
        return self.kind.value if self.kind is ScaleKind.PER_TENSOR else f"{self.kind.value}({self.block})"


@dataclass(frozen=True)
class ScaledDequantize(BinaryArityOp):
    """`decode(format, codes) * scale` as F32, codes' shape."""

    type_name: ClassVar[str] = "ScaledDequantize"
    format: ScaledFormat
    scale_layout: ScaleLayout

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("codes", "scale")


@dataclass(frozen=True)
class ScaledMatMul(Op):
    """`lhs @ rhs^T (+ bias)` on decoded operands: lhs `[m, k]`, rhs `[n, k]` (K last), F32 out."""

    type_name: ClassVar[str] = "ScaledMatMul"
    lhs_format: ScaledFormat
    rhs_format: ScaledFormat
    scale_layout: ScaleLayout
    has_bias: bool

    def arity(self) -> int | None:
        return 5 if self.has_bias else 4

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("lhs", "rhs", "lhs_scale", "rhs_scale", "bias")[:count]


@dataclass(frozen=True)
class ScaledGroupedMatMul(Op):
    """Row i: `decode(input[i]) @ decode(weight[e_i])^T (+ bias[e_i])`; weight `[E, N, K]`."""

    type_name: ClassVar[str] = "ScaledGroupedMatMul"
    lhs_format: ScaledFormat
    rhs_format: ScaledFormat
    scale_layout: ScaleLayout
    has_bias: bool

    def arity(self) -> int | None:
        return 6 if self.has_bias else 5

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("input", "weight", "input_scale", "weight_scale", "expert_idx", "bias")[:count]


# -------------------------------------------------------------------------------- shape rules


def check_layout(layout: ScaleLayout) -> None:
    if not isinstance(layout, ScaleLayout):
        raise AttributeValueError(f"scale_layout must be a ScaleLayout, got {layout!r}")
    if layout.kind is not ScaleKind.PER_TENSOR and (not isinstance(layout.block, int) or layout.block < 1):
        raise AttributeValueError(f"the {layout.kind.value} block size must be >= 1, got {layout.block!r}")


def check_scaled_operand(codes: Shape, scale: Shape, fmt: ScaledFormat, layout: ScaleLayout, role: str) -> None:
    """`codes` U8 codes of `fmt` and their `scale` tensor in `layout`."""
    if not isinstance(fmt, ScaledFormat):
        raise AttributeValueError(f"the {role} format must be a ScaledFormat, got {fmt!r}")
    if codes.dtype is not DType.U8:
        raise DTypeError(f"{role} codes must be U8 (one code per byte), got {codes.dtype.value}", operand=role)
    require_rank(codes, role, minimum=1)
    want = layout.scale_dims(codes)
    scale_role = f"{role}_scale"
    if scale.dtype is not layout.dtype:
        raise DTypeError(f"{scale_role} must be {layout.dtype.value} for {layout}, got {scale.dtype.value}",
                         operand=scale_role)
    if layout.kind is ScaleKind.PER_TENSOR:
        if numel(scale.dims) not in (None, 1):
            raise ShapeError(f"{scale_role} {scale} must hold one scale", operand=scale_role)
        return
    if scale.rank != len(want) or any(conflict(a, b) for a, b in zip(scale.dims, want, strict=True)):
        raise ShapeError(f"{scale_role} {scale} must be [{', '.join(map(str, want))}] ({layout} along the last axis)",
                         operand=scale_role)


@shape_rule(ScaledDequantize)
def _scaled_dequantize(op: ScaledDequantize, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    codes, scale = ins
    check_layout(op.scale_layout)
    check_scaled_operand(codes, scale, op.format, op.scale_layout, "codes")
    return codes.with_dtype(DType.F32)


@shape_rule(ScaledMatMul)
def _scaled_matmul(op: ScaledMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    lhs, rhs = ins[0], ins[1]
    check_layout(op.scale_layout)
    require_rank(lhs, "lhs", exact=(2,))
    require_rank(rhs, "rhs", exact=(2,))
    check_scaled_operand(lhs, ins[2], op.lhs_format, op.scale_layout, "lhs")
    check_scaled_operand(rhs, ins[3], op.rhs_format, op.scale_layout, "rhs")
    if conflict(lhs.dims[1], rhs.dims[1]):
        raise ShapeError(f"lhs {lhs} and rhs {rhs} must share K (both are K-last)", operand="rhs")
    if op.has_bias:
        _check_bias(ins[4], (rhs.dims[0],))
    return Shape((lhs.dims[0], rhs.dims[0]), DType.F32)


@shape_rule(ScaledGroupedMatMul)
def _scaled_grouped_matmul(op: ScaledGroupedMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    inp, weight = ins[0], ins[1]
    check_layout(op.scale_layout)
    require_rank(inp, "input", exact=(2,))
    require_rank(weight, "weight", exact=(3,))
    check_scaled_operand(inp, ins[2], op.lhs_format, op.scale_layout, "input")
    check_scaled_operand(weight, ins[3], op.rhs_format, op.scale_layout, "weight")
    if conflict(inp.dims[1], weight.dims[2]):
        raise ShapeError(f"input {inp} and weight {weight} must share K (weight is [E, N, K])", operand="weight")
    idx = ins[4]
    check_index_dtype(idx, "expert_idx")
    if idx.rank != 1 or conflict(idx.dims[0], inp.dims[0]):
        raise ShapeError(f"expert_idx {idx} must hold one expert per input row", operand="expert_idx")
    if op.has_bias:
        _check_bias(ins[5], weight.dims[:2])
    return Shape((inp.dims[0], weight.dims[1]), DType.F32)


def _check_bias(bias: Shape, want: tuple[Dim, ...]) -> None:
    if bias.dtype is not DType.F32:
        raise DTypeError(f"bias must be F32, got {bias.dtype.value}", operand="bias")
    if bias.rank != len(want) or any(conflict(a, b) for a, b in zip(bias.dims, want, strict=True)):
        raise ShapeError(f"bias {bias} must be [{', '.join(map(str, want))}]", operand="bias")


# -------------------------------------------------------------------------------- builder


def _layout(layout: ScaleLayout | str, block: int) -> ScaleLayout:
    return layout if isinstance(layout, ScaleLayout) else ScaleLayout(ScaleKind(layout), block)


def _format(fmt: ScaledFormat | str) -> ScaledFormat:
    return fmt if isinstance(fmt, ScaledFormat) else ScaledFormat(fmt)


class ScaledBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`); layouts by name ("PerTensor",
    "BlockMxE8M0", "Nvfp4") with `block`."""

    def scaled_dequantize(self, codes: int, scale: int, fmt: ScaledFormat | str, layout: ScaleLayout | str,
                          block: int = 32, *, name: str | None = None) -> int:
        """`decode(fmt, codes) * scale` as F32."""
        return self.add_node(ScaledDequantize(_format(fmt), _layout(layout, block)), [codes, scale], name=name)

    def scaled_matmul(self, lhs: int, rhs: int, lhs_scale: int, rhs_scale: int, lhs_format: ScaledFormat | str,
                      rhs_format: ScaledFormat | str, layout: ScaleLayout | str, block: int = 32,
                      bias: int | None = None, *, name: str | None = None) -> int:
        """`decode(lhs) @ decode(rhs)^T (+ bias)`, rhs `[n, k]`."""
        op = ScaledMatMul(_format(lhs_format), _format(rhs_format), _layout(layout, block), bias is not None)
        inputs = [lhs, rhs, lhs_scale, rhs_scale] + ([] if bias is None else [bias])
        return self.add_node(op, inputs, name=name)

    def scaled_grouped_matmul(self, inp: int, weight: int, input_scale: int, weight_scale: int, expert_idx: int,
                              lhs_format: ScaledFormat | str, rhs_format: ScaledFormat | str,
                              layout: ScaleLayout | str, block: int = 32, bias: int | None = None, *,
                              name: str | None = None) -> int:
        """Row i: `decode(inp[i]) @ decode(weight[expert_idx[i]])^T (+ bias[expert_idx[i]])`."""
        op = ScaledGroupedMatMul(_format(lhs_format), _format(rhs_format), _layout(layout, block), bias is not None)
        inputs = [inp, weight, input_scale, weight_scale, expert_idx] + ([] if bias is None else [bias])
        return self.add_node(op, inputs, name=name)


class ScaledFormatCodec(Codec):
    VALUES: ClassVar[dict[str, ScaledFormat]] = {f.value: f for f in ScaledFormat}

    def decode(self, value: object, path: str) -> ScaledFormat:
        if isinstance(value, dict) and "Custom" in value:
            fail(path, "ScaledFormat Custom (a parameterized minifloat) is not supported; rlx_mil decodes the named"
                       f" formats {', '.join(self.VALUES)}")
        if not isinstance(value, str) or value not in self.VALUES:
            fail(path, f"unknown ScaledFormat {describe(value)}")
        return self.VALUES[value]

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, ScaledFormat):
            fail(path, f"expected a ScaledFormat, got {value!r}")
        return value.value


class ScaleLayoutCodec(Codec):
    FIELD: ClassVar[dict[ScaleKind, str]] = {ScaleKind.BLOCK_MX_E8M0: "block", ScaleKind.NVFP4: "group"}

    def decode(self, value: object, path: str) -> ScaleLayout:
        tag, content = tagged(value, path, "a ScaleLayout")
        kinds = {k.value: k for k in ScaleKind}
        if tag not in kinds:
            fail(path, f"unknown ScaleLayout variant {describe(tag)}")
        kind = kinds[tag]
        if kind is ScaleKind.PER_TENSOR:
            if content is not MISSING and content is not None:
                fail(path, "PerTensor takes no value")
            return ScaleLayout(kind)
        field = self.FIELD[kind]
        if content is MISSING:
            fail(path, f'{tag} needs {{"{field}": n}}')
        body = json_object(content, f"{path}.{tag}")
        for key in body:
            if key != field:
                fail(f"{path}.{tag}.{key}", f'unknown field "{key}" for ScaleLayout {tag}')
        return ScaleLayout(kind, int(U32.decode(required(body, field, f"{path}.{tag}"), f"{path}.{tag}.{field}")))

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, ScaleLayout):
            fail(path, f"expected a ScaleLayout, got {value!r}")
        if value.kind is ScaleKind.PER_TENSOR:
            return value.kind.value
        return {value.kind.value: {self.FIELD[value.kind]: U32.encode(value.block, path)}}


SCALED_FORMAT = ScaledFormatCodec()
SCALE_LAYOUT = ScaleLayoutCodec()

#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (newest upstream only).
JSON_FORMS = (
    struct_form(ScaledDequantize, ("format", SCALED_FORMAT), ("scale_layout", SCALE_LAYOUT), since=NEWEST),
    struct_form(ScaledMatMul, ("lhs_format", SCALED_FORMAT), ("rhs_format", SCALED_FORMAT),
                ("scale_layout", SCALE_LAYOUT), ("has_bias", BOOL), since=NEWEST),
    struct_form(ScaledGroupedMatMul, ("lhs_format", SCALED_FORMAT), ("rhs_format", SCALED_FORMAT),
                ("scale_layout", SCALE_LAYOUT), ("has_bias", BOOL), since=NEWEST),
)
