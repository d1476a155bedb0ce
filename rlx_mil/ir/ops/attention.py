"""Scaled dot-product attention and its gradient, with the mask kinds (spec section 9)."""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rlx_mil.errors import (
    AmbiguousLayoutWarning,
    AttributeValueError,
    ShapeError,
)
from rlx_mil.ir.attention_layout import AttentionGeometry, attention_geometry, attention_output_dims
from rlx_mil.ir.builder import BuilderBase, lookup
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    NEWEST_FIELD,
    Op,
    collect_ops,
    f32,
    fix_f32,
)
from rlx_mil.ir.serde.codecs import (
    F32,
    MISSING,
    USIZE,
    Codec,
    EnumCodec,
    OptionCodec,
    describe,
    did_you_mean,
    fail,
    struct_form,
    tagged,
)
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    dims_text,
    fits_into,
    require_int,
    require_numel,
    size_of,
)


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


class AttentionBwdWrt(enum.Enum):
    QUERY = "Query"
    KEY = "Key"
    VALUE = "Value"


def mask_role(mask: MaskType) -> tuple[str, ...]:
    # The spec calls the 4th input `mask` for both Custom (key padding) and Bias (additive).
    return ("mask",) if mask in (MaskType.CUSTOM, MaskType.BIAS) else ()


@dataclass(frozen=True)
class Attention(Op):
    type_name: ClassVar[str] = "Attention"
    num_heads: int
    head_dim: int
    mask_kind: MaskKind
    score_scale: float | None = None
    attn_logit_softcap: float | None = None
    #: Width of each value (and output) head; None means head_dim. Serialised between head_dim
    #: and mask_kind, as upstream declares it; kept last here so positional construction of
    #: the 0.2.2 fields still works.
    v_head_dim: int | None = field(default=None, metadata=NEWEST_FIELD)

    SERDE_ORDER: ClassVar[tuple[str, ...]] = (
        "num_heads", "head_dim", "v_head_dim", "mask_kind", "score_scale", "attn_logit_softcap",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        fix_f32(self, "score_scale", "attn_logit_softcap")

    def arity(self) -> int | None:
        return 4 if self.mask_kind.has_mask_input else 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("q", "k", "v", *mask_role(self.mask_kind.type))

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

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("q", "k", "v", "dy", *mask_role(self.mask_kind.type))


# -------------------------------------------------------------------------------- shape rules


def _check_mask(mask_type: MaskType, mask: Shape, geom: AttentionGeometry) -> None:
    if mask_type is MaskType.CUSTOM:
        b, sk = size_of(geom.batch), size_of(geom.kv_len)
        expected = None if b is None or sk is None else b * sk
        require_numel(mask, expected, "mask", f"B*Sk = {geom.batch}*{geom.kv_len}")
    elif mask_type is MaskType.BIAS:
        target = (geom.batch, Static(geom.num_heads), geom.q_len, geom.kv_len)
        if not fits_into(mask.dims, target):
            raise ShapeError(
                f"Bias mask {mask} does not broadcast to [B, H, Sq, Sk] = {dims_text(target)}", operand="mask"
            )


def _check_attention_attrs(op: Attention | AttentionBackward) -> None:
    require_int(op.num_heads, "num_heads", minimum=1)
    require_int(op.head_dim, "head_dim", minimum=1)
    if op.mask_kind.type is MaskType.SLIDING_WINDOW:
        require_int(op.mask_kind.window, "sliding window", minimum=0)


@shape_rule(Attention)
def _attention(op: Attention, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    _check_attention_attrs(op)
    for attr in ("score_scale", "attn_logit_softcap"):
        value = getattr(op, attr)
        if value is not None and not math.isfinite(value):
            raise AttributeValueError(f"{attr} must be finite, got {value}")
    if op.v_head_dim is not None:
        require_int(op.v_head_dim, "v_head_dim", minimum=1)
    q, k, v = ins[:3]
    geom = attention_geometry(q, k, v, op.num_heads, op.head_dim, op.v_head_dim)
    _warn_if_ambiguous(geom, q)
    if op.mask_kind.has_mask_input:
        _check_mask(op.mask_kind.type, ins[3], geom)
    return Shape(attention_output_dims(q, geom), q.dtype)


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
    if dy.rank != q.rank or any(conflict(a, b) for a, b in zip(dy.dims, q.dims, strict=True)):
        raise ShapeError(f"dy must have q's shape {q}, got {dy}", operand="dy")
    if op.mask_kind.has_mask_input:
        _check_mask(op.mask_kind.type, ins[4], geom)
    if not isinstance(op.wrt, AttentionBwdWrt):
        raise AttributeValueError(f"wrt must be Query, Key or Value, got {op.wrt!r}")
    return {AttentionBwdWrt.QUERY: q, AttentionBwdWrt.KEY: k, AttentionBwdWrt.VALUE: v}[op.wrt]


# -------------------------------------------------------------------------------- builder


WRT_ALIASES = {"q": AttentionBwdWrt.QUERY, "k": AttentionBwdWrt.KEY, "v": AttentionBwdWrt.VALUE}


class AttentionBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def attention(
        self,
        q: int,
        k: int,
        v: int,
        mask: int,
        num_heads: int,
        head_dim: int,
        score_scale: float | None = None,
        softcap: float | None = None,
        *,
        v_head_dim: int | None = None,
        name: str | None = None,
    ) -> int:
        """Attention with a `Custom` key-padding mask (`[B, Sk]` elements, 1 = attend).

        `v_head_dim` (all attention builders): value and output heads of that width (MLA)."""
        op = Attention(num_heads, head_dim, MaskKind.CUSTOM, score_scale, softcap, v_head_dim)
        return self.add_node(op, [q, k, v, mask], name=name)

    def attention_kind(
        self,
        q: int,
        k: int,
        v: int,
        num_heads: int,
        head_dim: int,
        mask_kind: MaskKind | str = "causal",
        score_scale: float | None = None,
        softcap: float | None = None,
        *,
        v_head_dim: int | None = None,
        name: str | None = None,
    ) -> int:
        """Attention with a mask kind that takes no mask tensor: `"none"`, `"causal"`, `"sliding:<w>"`."""
        kind = self._mask_kind(mask_kind, "Attention", name)
        if kind.has_mask_input:
            raise self._fail(
                AttributeValueError,
                f"mask kind {kind} needs a mask tensor; use attention() or attention_bias()",
                "Attention", name,
            )
        return self.add_node(Attention(num_heads, head_dim, kind, score_scale, softcap, v_head_dim), [q, k, v], name=name)

    def attention_bias(
        self,
        q: int,
        k: int,
        v: int,
        bias: int,
        num_heads: int,
        head_dim: int,
        score_scale: float | None = None,
        softcap: float | None = None,
        *,
        v_head_dim: int | None = None,
        name: str | None = None,
    ) -> int:
        """Attention plus an additive bias broadcasting to `[B, H, Sq, Sk]`."""
        op = Attention(num_heads, head_dim, MaskKind.BIAS, score_scale, softcap, v_head_dim)
        return self.add_node(op, [q, k, v, bias], name=name)

    def _mask_kind(self, kind: MaskKind | str, op: str, name: str | None) -> MaskKind:
        try:
            return MaskKind.parse(kind)
        except ValueError as err:
            raise self._fail(AttributeValueError, str(err), op, name) from None

    def attention_backward(
        self,
        q: int,
        k: int,
        v: int,
        dy: int,
        num_heads: int,
        head_dim: int,
        mask_kind: MaskKind | str,
        wrt: AttentionBwdWrt | str,
        mask: int | None = None,
        *,
        name: str | None = None,
    ) -> int:
        """Gradient of attention w.r.t. q, k or v (`wrt`: `"query"`/`"q"`, `"key"`, `"value"`)."""
        kind = self._mask_kind(mask_kind, "AttentionBackward", name)
        the_wrt = lookup(wrt, AttentionBwdWrt, WRT_ALIASES)
        if the_wrt is None:
            raise self._fail(AttributeValueError, f"unknown wrt {wrt!r}", "AttentionBackward", name)
        inputs = [q, k, v, dy, *([] if mask is None else [mask])]
        return self.add_node(AttentionBackward(num_heads, head_dim, kind, the_wrt), inputs, name=name)

    def attention_backward_all(
        self,
        q: int,
        k: int,
        v: int,
        dy: int,
        num_heads: int,
        head_dim: int,
        mask_kind: MaskKind | str,
        mask: int | None = None,
        *,
        names: tuple[str | None, str | None, str | None] = (None, None, None),
    ) -> tuple[int, int, int]:
        """`(dq, dk, dv)`: three AttentionBackward nodes sharing their inputs."""
        dq, dk, dv = (
            self.attention_backward(q, k, v, dy, num_heads, head_dim, mask_kind, wrt, mask, name=n)
            for wrt, n in zip(AttentionBwdWrt, names, strict=True)
        )
        return dq, dk, dv


# -------------------------------------------------------------------------------- JSON


MASK_UNIT_KINDS = {t.value: t for t in MaskType if t is not MaskType.SLIDING_WINDOW}


class MaskKindCodec(Codec):
    def decode(self, value: object, path: str) -> MaskKind:
        tag, content = tagged(value, path, "a MaskKind")
        if tag == MaskType.SLIDING_WINDOW.value:
            if content is MISSING:
                fail(path, 'SlidingWindow needs its window: {"SlidingWindow": n}')
            return MaskKind.sliding_window(USIZE.decode(content, f"{path}.SlidingWindow"))
        kind = MASK_UNIT_KINDS.get(tag)
        if kind is None:
            choices = [*MASK_UNIT_KINDS, MaskType.SLIDING_WINDOW.value]
            fail(path, f"unknown MaskKind variant {describe(tag)}{did_you_mean(tag, choices)}")
        if content is not MISSING and content is not None:
            fail(f"{path}.{tag}", f"MaskKind {tag} takes no value, got {describe(content)}")
        return MaskKind(kind)

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, MaskKind):
            fail(path, f"expected a MaskKind, got {value!r}")
        if value.type is MaskType.SLIDING_WINDOW:
            return {MaskType.SLIDING_WINDOW.value: USIZE.encode(value.window, f"{path}.SlidingWindow")}
        return value.type.value

#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(
        Attention,
        ("num_heads", USIZE),
        ("head_dim", USIZE),
        ("v_head_dim", OptionCodec(USIZE)),
        ("mask_kind", MaskKindCodec()),
        ("score_scale", OptionCodec(F32)),
        ("attn_logit_softcap", OptionCodec(F32)),
        newest_fields=(("v_head_dim", None),),
    ),
    struct_form(
        AttentionBackward,
        ("num_heads", USIZE),
        ("head_dim", USIZE),
        ("mask_kind", MaskKindCodec()),
        ("wrt", EnumCodec(AttentionBwdWrt, "AttentionBwdWrt")),
    ),
)
