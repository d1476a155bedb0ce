"""Quantized compute: QMatMul, QConv2d, FakeQuantize (spec part 2, section 6).

QMatMul/QConv2d take I8 activations and weights and an I32 bias (in accumulator scale),
accumulate `(x - x_zp) * (w - w_zp)` in i32 (wrapping) and requantize to I8:
`clip(round_half_away(f32(acc) * mult) + out_zp, -128, 127)`. QConv2d pads with `x_zp`
(padded cells add nothing to the accumulator). FakeQuantize rounds to a symmetric signed
grid of `bits` (8, 4 or 2) and back, per tensor or per channel along `axis`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import infer_shape, shape_rule
from rlx_mil.ir.op_base import Op, TernaryOp, collect_ops, f32
from rlx_mil.ir.ops.conv import Conv
from rlx_mil.ir.serde.codecs import (
    F32,
    I32,
    MISSING,
    U32,
    USIZE,
    USIZE_VEC,
    Codec,
    EnumCodec,
    OptionCodec,
    describe,
    fail,
    json_object,
    required,
    struct_form,
    tagged,
)
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import conflict, require_int, require_rank, size_of, unsigned_axis

#: Largest grid value per supported bit width.
Q_MAX = {8: 127, 4: 7, 2: 1}
#: Smallest scale FakeQuantize uses (PerBatch and Fixed floor their scale here).
MIN_SCALE = 1e-12


class SteKind(enum.Enum):
    """Straight-through estimator of the backward pass (no effect on inference)."""

    IDENTITY = "Identity"
    CLIPPED_IDENTITY = "ClippedIdentity"
    TANH = "Tanh"
    HARD_TANH = "HardTanh"


class ScaleModeKind(enum.Enum):
    PER_BATCH = "PerBatch"
    EMA = "EMA"
    FIXED = "Fixed"


@dataclass(frozen=True)
class ScaleMode:
    """Where FakeQuantize's scale comes from; `decay` only for EMA."""

    kind: ScaleModeKind
    decay: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, ScaleModeKind):
            raise AttributeValueError(f"scale mode kind must be a ScaleModeKind, got {self.kind!r}")
        if self.kind is ScaleModeKind.EMA:
            if isinstance(self.decay, bool) or not isinstance(self.decay, (int, float)):
                raise AttributeValueError(f"EMA needs a numeric decay, got {self.decay!r}")
            decay = f32(self.decay)
            if not 0.0 <= decay <= 1.0:
                raise AttributeValueError(f"EMA decay must lie in [0, 1], got {decay}")
            object.__setattr__(self, "decay", decay)
        elif self.decay is not None:
            raise AttributeValueError(f"{self.kind.value} takes no decay")

    @property
    def has_state(self) -> bool:
        return self.kind is not ScaleModeKind.PER_BATCH

    def __str__(self) -> str:
        return f"EMA({self.decay})" if self.kind is ScaleModeKind.EMA else self.kind.value


class _Requantized(TernaryOp):
    def __post_init__(self) -> None:
        super().__post_init__()
        self._check()

    def _check(self) -> None:
        for name in ("x_zp", "w_zp", "out_zp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
                raise AttributeValueError(f"{name} must be an i32, got {value!r}", op=self.type_name)
        mult = self.mult  # type: ignore[attr-defined]
        if isinstance(mult, bool) or not isinstance(mult, (int, float)):
            raise AttributeValueError(f"mult must be a number, got {mult!r}", op=self.type_name)
        object.__setattr__(self, "mult", f32(mult))

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "w", "bias")


@dataclass(frozen=True)
class QMatMul(_Requantized):
    type_name: ClassVar[str] = "QMatMul"
    x_zp: int
    w_zp: int
    out_zp: int
    mult: float


@dataclass(frozen=True)
class QConv2d(_Requantized):
    type_name: ClassVar[str] = "QConv2d"
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    x_zp: int
    w_zp: int
    out_zp: int
    mult: float


@dataclass(frozen=True)
class FakeQuantize(Op):
    type_name: ClassVar[str] = "FakeQuantize"
    bits: int
    axis: int | None
    ste: SteKind
    scale_mode: ScaleMode

    def arity(self) -> int | None:
        return 2 if isinstance(self.scale_mode, ScaleMode) and self.scale_mode.has_state else 1

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "state") if count == 2 else ("x",)


# -------------------------------------------------------------------------------- shape rules


def _require_dtype(shape: Shape, dtype: DType, operand: str) -> None:
    if shape.dtype is not dtype:
        raise DTypeError(f"{operand} must be {dtype.value}, got {shape.dtype.value}", operand=operand)


def _check_mult(mult: float) -> None:
    if not math.isfinite(mult):
        raise AttributeValueError(f"mult must be finite, got {mult}")


@shape_rule(QMatMul)
def _qmatmul(op: QMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w, bias = ins
    _check_mult(op.mult)
    for shape, operand in ((x, "x"), (w, "w")):
        _require_dtype(shape, DType.I8, operand)
        require_rank(shape, operand, exact=(2,))
    _require_dtype(bias, DType.I32, "bias")
    if conflict(x.dims[1], w.dims[0]):
        raise ShapeError(f"x {x} is [M, K] and w {w} must be [K, N]", operand="w")
    if bias.rank != 1 or conflict(bias.dims[0], w.dims[1]):
        raise ShapeError(f"bias must be [N={w.dims[1]}], got {bias}", operand="bias")
    return Shape((x.dims[0], w.dims[1]), DType.I8)


@shape_rule(QConv2d)
def _qconv2d(op: QConv2d, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, w, bias = ins
    _check_mult(op.mult)
    for shape, operand in ((x, "x"), (w, "w")):
        _require_dtype(shape, DType.I8, operand)
        require_rank(shape, operand, exact=(4,))
    _require_dtype(bias, DType.I32, "bias")
    geometry = Conv(op.kernel_size, op.stride, op.padding, op.dilation, op.groups)
    out = infer_shape(geometry, [x.with_dtype(DType.F32), w.with_dtype(DType.F32)])
    assert out is not None
    if bias.rank != 1 or conflict(bias.dims[0], w.dims[0]):
        raise ShapeError(f"bias must be [C_out={w.dims[0]}], got {bias}", operand="bias")
    return out.with_dtype(DType.I8)


@shape_rule(FakeQuantize)
def _fake_quantize(op: FakeQuantize, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    bits = require_int(op.bits, "bits")
    if bits not in Q_MAX:
        raise AttributeValueError(f"bits must be 8, 4 or 2, got {bits}")
    if not x.dtype.is_float:
        raise DTypeError(f"x must be a float tensor, got {x.dtype.value}", operand="x")
    channels: int | None = 1
    if op.axis is not None:
        axis = unsigned_axis(op.axis, x.rank, operand="x")
        channels = size_of(x.dims[axis])
    if len(ins) == 2:
        state = ins[1]
        if not state.dtype.is_float:
            raise DTypeError(f"state must be a float tensor, got {state.dtype.value}", operand="state")
        if state.rank != 1 or (channels is not None and conflict(state.dims[0], Static(channels))):
            raise ShapeError(f"state must be [{channels}] (one scale per channel), got {state}", operand="state")
    return x.with_dtype(DType.F32)


# -------------------------------------------------------------------------------- builder

_STE_ALIASES = {"clipped": SteKind.CLIPPED_IDENTITY, "ste": SteKind.IDENTITY}


class QComputeBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def qmatmul(
        self, x: int, w: int, bias: int, *, x_zp: int = 0, w_zp: int = 0, out_zp: int = 0, mult: float,
        name: str | None = None,
    ) -> int:
        """I8 `x [M, K] @ w [K, N] + bias [N]` (I32), requantized to I8 with `mult`."""
        op = QMatMul(x_zp, w_zp, out_zp, self._float(mult, "mult", "QMatMul", name))
        return self.add_node(op, [x, w, bias], name=name)

    def qconv2d(
        self, x: int, w: int, bias: int, *, stride: Sequence[int] = (1, 1), padding: Sequence[int] = (0, 0),
        dilation: Sequence[int] = (1, 1), groups: int = 1, x_zp: int = 0, w_zp: int = 0, out_zp: int = 0,
        mult: float, name: str | None = None,
    ) -> int:
        """I8 NCHW convolution with OIHW weights and an I32 bias, requantized to I8; the kernel
        size is read from `w`."""
        dims = self._dims(w)
        kernel = tuple(size_of(d) or 0 for d in dims[2:]) if dims is not None else ()
        op = QConv2d(
            kernel, self._sequence(stride, "stride", "QConv2d", name), self._sequence(padding, "padding", "QConv2d", name),
            self._sequence(dilation, "dilation", "QConv2d", name), groups, x_zp, w_zp, out_zp,
            self._float(mult, "mult", "QConv2d", name),
        )
        return self.add_node(op, [x, w, bias], name=name)

    def fake_quantize(
        self, x: int, bits: int, axis: int | None = None, *, state: int | None = None,
        scale_mode: ScaleMode | str = "PerBatch", decay: float | None = None, ste: SteKind | str = "Identity",
        name: str | None = None,
    ) -> int:
        """Quantize-dequantize `x` on a symmetric `bits`-bit grid; `scale_mode` "PerBatch"
        (scale from `x`), "Fixed" or "EMA" (with `decay`), the latter two reading `state`."""
        the_axis = None if axis is None else self._signed_to_unsigned(axis, x)
        mode = scale_mode if isinstance(scale_mode, ScaleMode) else self._scale_mode(scale_mode, decay, name)
        kind = lookup(ste, SteKind, _STE_ALIASES)
        if kind is None:
            raise self._fail(AttributeValueError, f"unknown ste {ste!r}", "FakeQuantize", name, "ste")
        inputs = [x] if state is None else [x, state]
        return self.add_node(FakeQuantize(bits, the_axis, kind, mode), inputs, name=name)

    def _scale_mode(self, text: str, decay: float | None, name: str | None) -> ScaleMode:
        kind = lookup(text, ScaleModeKind, {"batch": ScaleModeKind.PER_BATCH, "ema": ScaleModeKind.EMA})
        if kind is None:
            raise self._fail(AttributeValueError, f"unknown scale_mode {text!r}", "FakeQuantize", name, "scale_mode")
        try:
            return ScaleMode(kind, decay)
        except AttributeValueError as err:
            raise self._fail(AttributeValueError, err.detail, "FakeQuantize", name, "scale_mode") from None

    def _float(self, value: object, what: str, op: str, name: str | None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(AttributeValueError, f"{what} must be a number, got {value!r}", op, name, what)
        return float(value)


# -------------------------------------------------------------------------------- JSON


class ScaleModeCodec(Codec):
    def decode(self, value: object, path: str) -> ScaleMode:
        tag, content = tagged(value, path, "a ScaleMode")
        if tag in ("PerBatch", "Fixed"):
            if content is not MISSING:
                fail(f"{path}.{tag}", f"ScaleMode {tag} takes no value, got {describe(content)}")
            return ScaleMode(ScaleModeKind(tag))
        if tag != "EMA":
            fail(path, f"unknown ScaleMode variant {describe(tag)} (PerBatch, EMA or Fixed)")
        if content is MISSING:
            fail(path, 'EMA needs its decay: {"EMA": {"decay": 0.99}}')
        body = json_object(content, f"{path}.EMA")
        decay = F32.decode(required(body, "decay", f"{path}.EMA"), f"{path}.EMA.decay")
        try:
            return ScaleMode(ScaleModeKind.EMA, decay)
        except AttributeValueError as err:
            fail(f"{path}.EMA.decay", err.detail)

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, ScaleMode):
            fail(path, f"expected a ScaleMode, got {value!r}")
        if value.kind is ScaleModeKind.EMA:
            return {"EMA": {"decay": F32.encode(value.decay, f"{path}.EMA.decay")}}
        return value.kind.value


#: The ops of this family.
OPS = collect_ops(globals())

_ZPS = (("x_zp", I32), ("w_zp", I32), ("out_zp", I32), ("mult", F32))

#: Their JSON forms (unchanged since 0.2.2).
JSON_FORMS = (
    struct_form(QMatMul, *_ZPS),
    struct_form(
        QConv2d, ("kernel_size", USIZE_VEC), ("stride", USIZE_VEC), ("padding", USIZE_VEC), ("dilation", USIZE_VEC),
        ("groups", USIZE), *_ZPS,
    ),
    struct_form(
        FakeQuantize, ("bits", U32), ("axis", OptionCodec(USIZE)), ("ste", EnumCodec(SteKind, "SteKind")),
        ("scale_mode", ScaleModeCodec()),
    ),
)
