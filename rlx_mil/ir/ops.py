"""Every op of the RLX IR subset as typed, immutable data (spec sections 3-11).

Attribute names are upstream's, so the JSON form maps one to one. Float attributes are held
as the float32 value they denote (upstream stores `f32`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from rlx_mil.errors import AttributeValueError
from rlx_mil.ir.dtype import DType


def f32(value: float) -> float:
    """Round a Python float to the float32 it denotes (attributes are f32 upstream)."""
    return float(np.float32(value))


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


class BinaryOp(enum.Enum):
    ADD = "Add"
    SUB = "Sub"
    MUL = "Mul"
    DIV = "Div"
    MAX = "Max"
    MIN = "Min"
    POW = "Pow"


class CmpOp(enum.Enum):
    EQ = "Eq"
    NE = "Ne"
    LT = "Lt"
    LE = "Le"
    GT = "Gt"
    GE = "Ge"


class ReduceOp(enum.Enum):
    SUM = "Sum"
    MEAN = "Mean"
    MAX = "Max"
    MIN = "Min"
    PROD = "Prod"


class AttentionBwdWrt(enum.Enum):
    QUERY = "Query"
    KEY = "Key"
    VALUE = "Value"


class MaskType(enum.Enum):
    NONE = "None"
    CAUSAL = "Causal"
    SLIDING_WINDOW = "SlidingWindow"
    CUSTOM = "Custom"
    BIAS = "Bias"


@dataclass(frozen=True)
class MaskKind:
    """Attention mask kind. `window` is set only for SlidingWindow (w keys back)."""

    type: MaskType
    window: int | None = None

    NONE: ClassVar[MaskKind]
    CAUSAL: ClassVar[MaskKind]
    CUSTOM: ClassVar[MaskKind]
    BIAS: ClassVar[MaskKind]

    def __post_init__(self) -> None:
        if self.type is MaskType.SLIDING_WINDOW:
            if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
                raise AttributeValueError(f"SlidingWindow needs a window >= 0, got {self.window!r}")
        elif self.window is not None:
            raise AttributeValueError(f"{self.type.value} mask takes no window")

    @staticmethod
    def sliding_window(window: int) -> MaskKind:
        return MaskKind(MaskType.SLIDING_WINDOW, window)

    @staticmethod
    def parse(text: str | MaskKind) -> MaskKind:
        """`none`, `causal`, `sliding:<N>`, `custom`, `bias` (case-insensitive), as pyrlx."""
        if isinstance(text, MaskKind):
            return text
        if not isinstance(text, str):
            raise AttributeValueError(f"a mask kind is a MaskKind or text such as 'causal', got {text!r}")
        key = text.strip().lower()
        if key.startswith("sliding:") or key.startswith("slidingwindow:"):
            window = key.split(":", 1)[1].strip()
            if not window.isdigit():
                raise AttributeValueError(f"mask kind {text!r}: the sliding window must be an integer >= 0")
            return MaskKind.sliding_window(int(window))
        for t in MaskType:
            if t is not MaskType.SLIDING_WINDOW and t.value.lower() == key:
                return MaskKind(t)
        raise AttributeValueError(f"unknown mask kind {text!r}")

    @property
    def has_mask_input(self) -> bool:
        return self.type in (MaskType.CUSTOM, MaskType.BIAS)

    def __str__(self) -> str:
        if self.type is MaskType.SLIDING_WINDOW:
            return f"SlidingWindow({self.window})"
        return self.type.value


MaskKind.NONE = MaskKind(MaskType.NONE)
MaskKind.CAUSAL = MaskKind(MaskType.CAUSAL)
MaskKind.CUSTOM = MaskKind(MaskType.CUSTOM)
MaskKind.BIAS = MaskKind(MaskType.BIAS)


class QuantKind(enum.Enum):
    INT8_BLOCK = "Int8Block"
    INT8_BLOCK_ASYM = "Int8BlockAsym"
    INT4_BLOCK = "Int4Block"
    FP8_E4M3 = "Fp8E4m3"
    FP8_E5M2 = "Fp8E5m2"
    NVFP4_BLOCK = "Nvfp4Block"
    GGUF_Q2K = "GgufQ2K"
    GGUF_Q3K = "GgufQ3K"
    GGUF_Q4K = "GgufQ4K"
    GGUF_Q5K = "GgufQ5K"
    GGUF_Q6K = "GgufQ6K"
    GGUF_Q8K = "GgufQ8K"
    GGUF_Q4_0 = "GgufQ4_0"
    GGUF_Q8_0 = "GgufQ8_0"

    @property
    def has_block_size(self) -> bool:
        return self in (QuantKind.INT8_BLOCK, QuantKind.INT8_BLOCK_ASYM, QuantKind.INT4_BLOCK)

    @property
    def is_gguf(self) -> bool:
        return self.value.startswith("Gguf")


@dataclass(frozen=True)
class QuantScheme:
    kind: QuantKind
    block_size: int | None = None

    def __post_init__(self) -> None:
        if self.kind.has_block_size:
            if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
                raise AttributeValueError(f"{self.kind.value} needs block_size >= 1, got {self.block_size!r}")
        elif self.block_size is not None:
            raise AttributeValueError(f"{self.kind.value} takes no block_size")

    @staticmethod
    def int8_block(block_size: int) -> QuantScheme:
        return QuantScheme(QuantKind.INT8_BLOCK, block_size)

    @staticmethod
    def int8_block_asym(block_size: int) -> QuantScheme:
        return QuantScheme(QuantKind.INT8_BLOCK_ASYM, block_size)

    @staticmethod
    def int4_block(block_size: int) -> QuantScheme:
        return QuantScheme(QuantKind.INT4_BLOCK, block_size)

    def __str__(self) -> str:
        if self.block_size is not None:
            return f"{self.kind.value}({self.block_size})"
        return self.kind.value


# --------------------------------------------------------------------------------------------
# Ops


@dataclass(frozen=True)
class Op:
    """Base of every IR op. `type_name` is the upstream variant name (the JSON tag)."""

    type_name: ClassVar[str] = ""

    def arity(self) -> int | None:
        """Exact number of inputs, or None for the variadic Concat."""
        raise NotImplementedError

    def accepted_arities(self) -> tuple[int, ...]:
        n = self.arity()
        return () if n is None else (n,)

    def attrs(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))

    def __str__(self) -> str:
        parts = [f"{key}={_attr_text(value)}" for key, value in self.attrs().items()]
        return f"{self.type_name}({', '.join(parts)})" if parts else self.type_name


def _attr_text(value: object) -> str:
    """Attribute as printed by `Op.__str__`; floats in their shortest float32 form (0.2)."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, float):
        return str(np.float32(value))
    if isinstance(value, tuple):
        return "[" + ", ".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _attr_f32(op: Op, name: str, value: object) -> float:
    try:
        return f32(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise AttributeValueError(f"{name} must be a number, got {value!r}", op=op.type_name) from None


def _fix_f32(op: Op, *names: str) -> None:
    for name in names:
        value = getattr(op, name)
        if value is not None:
            object.__setattr__(op, name, _attr_f32(op, name, value))


class _Unary(Op):
    def arity(self) -> int | None:
        return 1


class _BinaryArity(Op):
    def arity(self) -> int | None:
        return 2


class _Leaf(Op):
    def arity(self) -> int | None:
        return 0


@dataclass(frozen=True)
class Input(_Leaf):
    type_name: ClassVar[str] = "Input"
    name: str


@dataclass(frozen=True)
class Param(_Leaf):
    type_name: ClassVar[str] = "Param"
    name: str


@dataclass(frozen=True)
class Constant(_Leaf):
    """Raw little-endian bytes of the declared dtype, row-major."""

    type_name: ClassVar[str] = "Constant"
    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            try:
                object.__setattr__(self, "data", bytes(self.data))
            except (TypeError, ValueError):
                raise AttributeValueError(
                    f"data must be bytes (or byte values 0..255), got {type(self.data).__name__}",
                    op=self.type_name, operand="data",
                ) from None


@dataclass(frozen=True)
class Activation(_Unary):
    type_name: ClassVar[str] = "Activation"
    kind: ActivationKind


@dataclass(frozen=True)
class Cast(_Unary):
    type_name: ClassVar[str] = "Cast"
    to: DType


@dataclass(frozen=True)
class Binary(_BinaryArity):
    type_name: ClassVar[str] = "Binary"
    op: BinaryOp


@dataclass(frozen=True)
class Compare(_BinaryArity):
    type_name: ClassVar[str] = "Compare"
    op: CmpOp


@dataclass(frozen=True)
class Where(Op):
    type_name: ClassVar[str] = "Where"

    def arity(self) -> int | None:
        return 3


@dataclass(frozen=True)
class MatMul(_BinaryArity):
    type_name: ClassVar[str] = "MatMul"


@dataclass(frozen=True)
class LoraMatMul(Op):
    type_name: ClassVar[str] = "LoraMatMul"
    scale: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _fix_f32(self, "scale")

    def arity(self) -> int | None:
        return 4


@dataclass(frozen=True)
class FusedMatMulBiasAct(Op):
    type_name: ClassVar[str] = "FusedMatMulBiasAct"
    activation: ActivationKind | None = None

    def arity(self) -> int | None:
        return 3


@dataclass(frozen=True)
class _AffineQuant(_Unary):
    """Per-tensor (`axis=None`, one scale/zero point) or per-channel along `axis`."""

    axis: int | None
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("scales", "zero_points"):
            if isinstance(getattr(self, name), (str, bytes)) or not hasattr(getattr(self, name), "__iter__"):
                raise AttributeValueError(f"{name} must be a sequence, got {getattr(self, name)!r}", op=self.type_name)
        object.__setattr__(self, "scales", tuple(_attr_f32(self, "scales", s) for s in self.scales))
        zero_points = tuple(self.zero_points)
        if not all(isinstance(z, (int, np.integer)) and not isinstance(z, (bool, np.bool_)) for z in zero_points):
            raise AttributeValueError(f"zero_points must be integers, got {list(zero_points)}", op=self.type_name)
        object.__setattr__(self, "zero_points", tuple(int(z) for z in zero_points))


@dataclass(frozen=True)
class Quantize(_AffineQuant):
    """Float -> I8: `clip(round_half_away(x * (1/s)) + zp, -128, 127)`."""

    type_name: ClassVar[str] = "Quantize"


@dataclass(frozen=True)
class Dequantize(_AffineQuant):
    """I8 -> F32: `(q - zp) * s`."""

    type_name: ClassVar[str] = "Dequantize"


@dataclass(frozen=True)
class DequantMatMul(Op):
    type_name: ClassVar[str] = "DequantMatMul"
    scheme: QuantScheme

    def arity(self) -> int | None:
        return 2 if self.scheme.kind.is_gguf else 4


@dataclass(frozen=True)
class _LastAxisNorm(Op):
    """Inputs x, gamma [H], beta [H]; normalises over the last axis (`axis` must name it)."""

    axis: int
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 3


@dataclass(frozen=True)
class LayerNorm(_LastAxisNorm):
    type_name: ClassVar[str] = "LayerNorm"


@dataclass(frozen=True)
class RmsNorm(_LastAxisNorm):
    """`x / sqrt(mean(x^2) + eps) * gamma + beta` (beta is added, as upstream)."""

    type_name: ClassVar[str] = "RmsNorm"


@dataclass(frozen=True)
class GroupNorm(Op):
    type_name: ClassVar[str] = "GroupNorm"
    num_groups: int
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 3


@dataclass(frozen=True)
class _FusedResidualNorm(Op):
    """Norm(x + residual (+ bias)); inputs x, residual, [bias], gamma, beta."""

    has_bias: bool
    eps: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _fix_f32(self, "eps")

    def arity(self) -> int | None:
        return 5 if self.has_bias else 4


@dataclass(frozen=True)
class FusedResidualLN(_FusedResidualNorm):
    type_name: ClassVar[str] = "FusedResidualLN"


@dataclass(frozen=True)
class FusedResidualRmsNorm(_FusedResidualNorm):
    type_name: ClassVar[str] = "FusedResidualRmsNorm"


@dataclass(frozen=True)
class Softmax(_Unary):
    type_name: ClassVar[str] = "Softmax"
    axis: int


@dataclass(frozen=True)
class Reduce(_Unary):
    type_name: ClassVar[str] = "Reduce"
    op: ReduceOp
    axes: tuple[int, ...]
    keep_dim: bool


@dataclass(frozen=True)
class Cumsum(_Unary):
    type_name: ClassVar[str] = "Cumsum"
    axis: int
    exclusive: bool


@dataclass(frozen=True)
class TopK(_Unary):
    type_name: ClassVar[str] = "TopK"
    k: int


@dataclass(frozen=True)
class Reshape(_Unary):
    type_name: ClassVar[str] = "Reshape"
    new_shape: tuple[int, ...]


@dataclass(frozen=True)
class Transpose(_Unary):
    type_name: ClassVar[str] = "Transpose"
    perm: tuple[int, ...]


@dataclass(frozen=True)
class Narrow(_Unary):
    type_name: ClassVar[str] = "Narrow"
    axis: int
    start: int
    len: int


@dataclass(frozen=True)
class Concat(Op):
    type_name: ClassVar[str] = "Concat"
    axis: int

    def arity(self) -> int | None:
        return None


@dataclass(frozen=True)
class Expand(_Unary):
    type_name: ClassVar[str] = "Expand"
    target_shape: tuple[int, ...]


@dataclass(frozen=True)
class Gather(_BinaryArity):
    type_name: ClassVar[str] = "Gather"
    axis: int


@dataclass(frozen=True)
class Rope(Op):
    type_name: ClassVar[str] = "Rope"
    head_dim: int
    n_rot: int

    def arity(self) -> int | None:
        return 3


@dataclass(frozen=True)
class Attention(Op):
    type_name: ClassVar[str] = "Attention"
    num_heads: int
    head_dim: int
    mask_kind: MaskKind
    score_scale: float | None = None
    attn_logit_softcap: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _fix_f32(self, "score_scale", "attn_logit_softcap")

    def arity(self) -> int | None:
        return 4 if self.mask_kind.has_mask_input else 3

    @property
    def scale(self) -> float:
        """The effective score scale (`head_dim ** -0.5` unless overridden), as f32."""
        return f32(self.head_dim**-0.5) if self.score_scale is None else self.score_scale

    @property
    def softcap(self) -> float | None:
        """The effective softcap: None when absent or <= 0."""
        c = self.attn_logit_softcap
        return c if c is not None and c > 0 else None


@dataclass(frozen=True)
class AttentionBackward(Op):
    type_name: ClassVar[str] = "AttentionBackward"
    num_heads: int
    head_dim: int
    mask_kind: MaskKind
    wrt: AttentionBwdWrt

    def arity(self) -> int | None:
        return 5 if self.mask_kind.has_mask_input else 4


@dataclass(frozen=True)
class FusedSwiGLU(_Unary):
    type_name: ClassVar[str] = "FusedSwiGLU"
    cast_to: DType | None = None
    gate_first: bool = False


@dataclass(frozen=True)
class FusedAttentionBlock(Op):
    type_name: ClassVar[str] = "FusedAttentionBlock"
    num_heads: int
    head_dim: int
    has_bias: bool
    has_rope: bool

    def arity(self) -> int | None:
        return 4 + 2 * int(self.has_bias) + 2 * int(self.has_rope)


@dataclass(frozen=True)
class FusedTransformerLayer(Op):
    type_name: ClassVar[str] = "FusedTransformerLayer"
    num_heads: int
    head_dim: int
    intermediate_size: int
    eps1: float
    eps2: float
    activation: ActivationKind
    has_bias: bool

    def __post_init__(self) -> None:
        super().__post_init__()
        _fix_f32(self, "eps1", "eps2")

    def arity(self) -> int | None:
        return 14 if self.has_bias else 10

    def accepted_arities(self) -> tuple[int, ...]:
        # Without bias, upstream's verifier wants 10 inputs (with LN betas) while its
        # decompositions read 8 (zero betas); both forms occur (spec section 13, Q29).
        return (14,) if self.has_bias else (10, 8)


@dataclass(frozen=True)
class Conv(Op):
    type_name: ClassVar[str] = "Conv"
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    def arity(self) -> int | None:
        return 2


@dataclass(frozen=True)
class Pool(_Unary):
    type_name: ClassVar[str] = "Pool"
    kind: ReduceOp
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]


#: Every op class, keyed by its upstream variant name.
OP_TYPES: dict[str, type[Op]] = {
    cls.type_name: cls
    for cls in (
        Input, Param, Constant, Activation, Cast, Binary, Compare, Where, MatMul, LoraMatMul,
        FusedMatMulBiasAct, Quantize, Dequantize, DequantMatMul, LayerNorm, RmsNorm, GroupNorm,
        FusedResidualLN, FusedResidualRmsNorm, Softmax, Reduce, Cumsum, TopK, Reshape,
        Transpose, Narrow, Concat, Expand, Gather, Rope, Attention, AttentionBackward,
        FusedSwiGLU, FusedAttentionBlock, FusedTransformerLayer, Conv, Pool,
    )
}
