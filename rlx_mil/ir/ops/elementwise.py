"""Element-wise ops: activations, casts, binary arithmetic, comparisons, select (spec section 4)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    DTypeError,
)
from rlx_mil.ir.builder import BuilderBase, lookup, squash
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, Op, TernaryOp, UnaryOp, collect_ops, fix_f32
from rlx_mil.ir.serde.codecs import (
    DTYPE,
    F32,
    EnumCodec,
    newtype_form,
    struct_form,
    unit_form,
)
from rlx_mil.ir.serde.versions import NEWEST, newest_only
from rlx_mil.ir.shape import Shape
from rlx_mil.ir.shape_checks import (
    broadcast_all,
    broadcast_pair,
)


class ActivationKind(enum.Enum):
    GELU = "Gelu"
    GELU_APPROX = "GeluApprox"
    SILU = "Silu"
    RELU = "Relu"
    SIGMOID = "Sigmoid"
    TANH = "Tanh"
    EXP = "Exp"
    LOG = "Log"
    SQRT = "Sqrt"
    RSQRT = "Rsqrt"
    NEG = "Neg"
    ABS = "Abs"
    ROUND = "Round"
    SIN = "Sin"
    COS = "Cos"
    TAN = "Tan"
    ATAN = "Atan"
    # Newest upstream only (spec part 2, section 1.4):
    RECIP = "Recip"
    FLOOR = "Floor"
    CEIL = "Ceil"
    SIGN = "Sign"
    SOFTPLUS = "Softplus"
    ELU = "Elu"
    ERF = "Erf"
    HARD_SWISH = "HardSwish"
    HARD_SIGMOID = "HardSigmoid"
    MISH = "Mish"
    SOFTSIGN = "Softsign"
    LOG_SIGMOID = "LogSigmoid"


class BinaryOp(enum.Enum):
    ADD = "Add"
    SUB = "Sub"
    MUL = "Mul"
    DIV = "Div"
    MAX = "Max"
    MIN = "Min"
    POW = "Pow"
    # Newest upstream only (spec part 2, sections 1.5 and 3.12):
    MOD = "Mod"
    BIT_AND = "BitAnd"
    BIT_OR = "BitOr"
    BIT_XOR = "BitXor"
    SHL = "Shl"
    SHR = "Shr"
    ATAN2 = "Atan2"


class CmpOp(enum.Enum):
    EQ = "Eq"
    NE = "Ne"
    LT = "Lt"
    LE = "Le"
    GT = "Gt"
    GE = "Ge"


@dataclass(frozen=True)
class Activation(UnaryOp):
    type_name: ClassVar[str] = "Activation"
    kind: ActivationKind


@dataclass(frozen=True)
class Cast(UnaryOp):
    type_name: ClassVar[str] = "Cast"
    to: DType


@dataclass(frozen=True)
class Binary(BinaryArityOp):
    type_name: ClassVar[str] = "Binary"
    op: BinaryOp

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("lhs", "rhs")


@dataclass(frozen=True)
class Compare(BinaryArityOp):
    type_name: ClassVar[str] = "Compare"
    op: CmpOp

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("lhs", "rhs")


@dataclass(frozen=True)
class Where(Op):
    type_name: ClassVar[str] = "Where"

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("cond", "on_true", "on_false")


newest_only(
    *(kind for kind in ActivationKind if list(ActivationKind).index(kind) >= list(ActivationKind).index(ActivationKind.RECIP)),
    *(op for op in BinaryOp if list(BinaryOp).index(op) >= list(BinaryOp).index(BinaryOp.MOD)),
)


@dataclass(frozen=True)
class StopGradient(UnaryOp):
    """Identity in the forward pass (autodiff passes no gradient through it)."""

    type_name: ClassVar[str] = "StopGradient"


@dataclass(frozen=True)
class Fma(TernaryOp):
    """`a * b + c` with NumPy broadcasting (one rounding upstream; two on Core ML)."""

    type_name: ClassVar[str] = "Fma"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("a", "b", "c")


@dataclass(frozen=True)
class Clamp(UnaryOp):
    """`fmin(fmax(x, min), max)`: NaN-ignoring, so NaN becomes `min` and `min > max` gives `max`."""

    type_name: ClassVar[str] = "Clamp"
    min: float
    max: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "min", "max")


# -------------------------------------------------------------------------------- shape rules


@shape_rule(Activation)
def _activation(op: Activation, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return ins[0]


@shape_rule(Cast)
def _cast(op: Cast, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    if not isinstance(op.to, DType) or op.to.is_complex:
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


@shape_rule(StopGradient)
def _stop_gradient(op: StopGradient, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    return ins[0]


@shape_rule(Fma)
def _fma(op: Fma, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    a, b, c = ins
    dims = broadcast_all([("a", a.dims), ("b", b.dims), ("c", c.dims)])
    return Shape(dims, a.dtype)


@shape_rule(Clamp)
def _clamp(op: Clamp, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    for attr in ("min", "max"):
        value = getattr(op, attr)
        if not math.isfinite(value):
            raise AttributeValueError(f"{attr} must be finite (JSON cannot hold infinities; use +-3.4e38), got {value}")
    return ins[0]


# -------------------------------------------------------------------------------- builder


_BINARY_ALIASES = {
    "+": BinaryOp.ADD, "-": BinaryOp.SUB, "*": BinaryOp.MUL, "/": BinaryOp.DIV, "**": BinaryOp.POW,
    "maximum": BinaryOp.MAX, "minimum": BinaryOp.MIN,
}


_COMPARE_ALIASES = {
    "==": CmpOp.EQ, "!=": CmpOp.NE, "<": CmpOp.LT, "<=": CmpOp.LE, ">": CmpOp.GT, ">=": CmpOp.GE,
}


def activation_kind_arg(builder: BuilderBase, kind: ActivationKind | str, op: str, name: str | None) -> ActivationKind:
    """`kind` as an ActivationKind (from a member or text such as "gelu_approx")."""
    if isinstance(kind, ActivationKind):
        return kind
    if not isinstance(kind, str):
        raise builder._fail(AttributeValueError, f"an activation is an ActivationKind or text such as 'gelu', got {kind!r}", op, name)
    key = squash(kind)
    for member in ActivationKind:
        if squash(member.value) == key:
            return member
    raise builder._fail(AttributeValueError, f"unknown activation {kind!r}", op, name)


class ElementwiseBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def stop_gradient(self, x: int, *, name: str | None = None) -> int:
        """`x` unchanged (no gradient flows through it)."""
        return self.add_node(StopGradient(), [x], name=name)

    def fma(self, a: int, b: int, c: int, *, name: str | None = None) -> int:
        """`a * b + c` with NumPy broadcasting."""
        return self.add_node(Fma(), [a, b, c], name=name)

    def clamp(self, x: int, min: float, max: float, *, name: str | None = None) -> int:
        """`fmin(fmax(x, min), max)` (NaN-ignoring, like Binary Max/Min)."""
        return self.add_node(Clamp(min, max), [x], name=name)

    def activation(self, kind: ActivationKind | str, x: int, *, name: str | None = None) -> int:
        """`Activation(kind)`; `kind` like `"gelu"`, `"gelu_approx"`, `"silu"`, `"rsqrt"`."""
        return self.add_node(Activation(activation_kind_arg(self, kind, "Activation", name)), [x], name=name)

    def gelu(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.GELU, x, name=name)

    def gelu_approx(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.GELU_APPROX, x, name=name)

    def silu(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SILU, x, name=name)

    def relu(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.RELU, x, name=name)

    def sigmoid(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SIGMOID, x, name=name)

    def tanh(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.TANH, x, name=name)

    def exp(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.EXP, x, name=name)

    def log(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.LOG, x, name=name)

    def sqrt(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SQRT, x, name=name)

    def rsqrt(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.RSQRT, x, name=name)

    def neg(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.NEG, x, name=name)

    def abs(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ABS, x, name=name)

    def round(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ROUND, x, name=name)

    def sin(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SIN, x, name=name)

    def cos(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.COS, x, name=name)

    def tan(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.TAN, x, name=name)

    def atan(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ATAN, x, name=name)

    def recip(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.RECIP, x, name=name)

    def floor(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.FLOOR, x, name=name)

    def ceil(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.CEIL, x, name=name)

    def sign(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SIGN, x, name=name)

    def softplus(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SOFTPLUS, x, name=name)

    def elu(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ELU, x, name=name)

    def erf(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.ERF, x, name=name)

    def hard_swish(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.HARD_SWISH, x, name=name)

    def hard_sigmoid(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.HARD_SIGMOID, x, name=name)

    def mish(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.MISH, x, name=name)

    def softsign(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.SOFTSIGN, x, name=name)

    def log_sigmoid(self, x: int, *, name: str | None = None) -> int:
        return self.activation(ActivationKind.LOG_SIGMOID, x, name=name)

    def cast(self, x: int, dtype: DType | str, *, name: str | None = None) -> int:
        return self.add_node(Cast(self._dtype_arg(dtype, "Cast", name)), [x], name=name)

    def binary(self, op: BinaryOp | str, a: int, b: int, *, name: str | None = None) -> int:
        """`Binary(op)` with NumPy broadcasting; `op` like `"add"`, `"max"`, `"pow"`, `"+"`, `"/"`."""
        the_op = lookup(op, BinaryOp, _BINARY_ALIASES)
        if the_op is None:
            raise self._fail(AttributeValueError, f"unknown binary op {op!r}", "Binary", name)
        return self.add_node(Binary(the_op), [a, b], name=name)

    def add(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.ADD, a, b, name=name)

    def sub(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.SUB, a, b, name=name)

    def mul(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.MUL, a, b, name=name)

    def div(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.DIV, a, b, name=name)

    def maximum(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.MAX, a, b, name=name)

    def minimum(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.MIN, a, b, name=name)

    def pow(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.POW, a, b, name=name)

    def mod(self, a: int, b: int, *, name: str | None = None) -> int:
        """C `fmod`: the remainder has the sign of `a`."""
        return self.binary(BinaryOp.MOD, a, b, name=name)

    def bit_and(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.BIT_AND, a, b, name=name)

    def bit_or(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.BIT_OR, a, b, name=name)

    def bit_xor(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.BIT_XOR, a, b, name=name)

    def shl(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.binary(BinaryOp.SHL, a, b, name=name)

    def shr(self, a: int, b: int, *, name: str | None = None) -> int:
        """Arithmetic shift right."""
        return self.binary(BinaryOp.SHR, a, b, name=name)

    def atan2(self, a: int, b: int, *, name: str | None = None) -> int:
        """Angle of the point (b, a): `a` is y, `b` is x."""
        return self.binary(BinaryOp.ATAN2, a, b, name=name)

    def compare(self, op: CmpOp | str, a: int, b: int, *, name: str | None = None) -> int:
        """`Compare(op)` giving Bool; `op` like `"eq"`, `"ge"`, `"=="`, `"<="`."""
        the_op = lookup(op, CmpOp, _COMPARE_ALIASES)
        if the_op is None:
            raise self._fail(AttributeValueError, f"unknown comparison {op!r}", "Compare", name)
        return self.add_node(Compare(the_op), [a, b], name=name)

    def eq_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.EQ, a, b, name=name)

    def ne_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.NE, a, b, name=name)

    def lt_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.LT, a, b, name=name)

    def le_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.LE, a, b, name=name)

    def gt_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.GT, a, b, name=name)

    def ge_(self, a: int, b: int, *, name: str | None = None) -> int:
        return self.compare(CmpOp.GE, a, b, name=name)

    def where_(self, cond: int, a: int, b: int, *, name: str | None = None) -> int:
        """`Where(cond, on_true=a, on_false=b)` with 3-way broadcasting."""
        return self.add_node(Where(), [cond, a, b], name=name)


ACTIVATION = EnumCodec(ActivationKind, "Activation")


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    newtype_form(Activation, "kind", ACTIVATION),
    struct_form(Cast, ("to", DTYPE)),
    newtype_form(Binary, "op", EnumCodec(BinaryOp, "BinaryOp")),
    newtype_form(Compare, "op", EnumCodec(CmpOp, "CmpOp")),
    unit_form(Where),
    unit_form(StopGradient, since=NEWEST),
    unit_form(Fma, since=NEWEST),
    struct_form(Clamp, ("min", F32), ("max", F32), since=NEWEST),
)
