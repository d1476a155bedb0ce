"""Losses and the small training pieces inference graphs carry: ReluBackward, ActivationBackward,
CumsumBackward, GatherBackward, RopeBackward, SoftmaxCrossEntropy, SoftmaxCrossEntropyWithLogits
and FakeQuantizeLSQ. All exist only in the newest upstream JSON; their contract is upstream's
`op.rs` documentation (decisions where it is silent: docs/upstream-ops-3.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, Op, UnaryOp, collect_ops
from rlx_mil.ir.ops.elementwise import ACTIVATION, ActivationKind
from rlx_mil.ir.ops.qcompute import Q_MAX
from rlx_mil.ir.ops.scatter import check_index_dtype
from rlx_mil.ir.serde.codecs import BOOL, I32, U8, USIZE, OptionCodec, struct_form, unit_form
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Dim, DimLike, Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    normalize_axis,
    require_float,
    require_int,
    require_rank,
    unsigned_axis,
)


@dataclass(frozen=True)
class ReluBackward(BinaryArityOp):
    """`dx = dy where x > 0 else 0` (a NaN `x` passes no gradient)."""

    type_name: ClassVar[str] = "ReluBackward"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "dy")


@dataclass(frozen=True)
class ActivationBackward(BinaryArityOp):
    """`dx = act'(x) * dy` with upstream's closed-form derivative of `kind`."""

    type_name: ClassVar[str] = "ActivationBackward"
    kind: ActivationKind

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "dy")


@dataclass(frozen=True)
class CumsumBackward(UnaryOp):
    """The gradient of Cumsum(axis, exclusive): the reversed (suffix) sum of `dy` along `axis`,
    exclusive of the element itself when the forward was exclusive."""

    type_name: ClassVar[str] = "CumsumBackward"
    axis: int
    exclusive: bool

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("dy",)


@dataclass(frozen=True)
class GatherBackward(BinaryArityOp):
    """The gradient of Gather(axis) w.r.t. its table: zeros of the (declared) table shape with
    each slice of `dy` added at its index along `axis` (repeated indices accumulate)."""

    type_name: ClassVar[str] = "GatherBackward"
    axis: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("dy", "indices")


@dataclass(frozen=True)
class RopeBackward(Op):
    """The gradient of NeoX Rope(head_dim, n_rot) w.r.t. x: the inverse rotation, i.e. Rope of
    `dy` with `-sin`."""

    type_name: ClassVar[str] = "RopeBackward"
    head_dim: int
    n_rot: int

    def arity(self) -> int | None:
        return 3

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("dy", "cos", "sin")


@dataclass(frozen=True)
class SoftmaxCrossEntropy(BinaryArityOp):
    """`loss[n] = logsumexp(logits[n]) - sum_c targets[n, c] * logits[n, c]` over the last axis
    (dense targets: soft labels or one-hot rows)."""

    type_name: ClassVar[str] = "SoftmaxCrossEntropy"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("logits", "targets")


@dataclass(frozen=True)
class SoftmaxCrossEntropyWithLogits(BinaryArityOp):
    """`loss[n] = logsumexp(logits[n]) - logits[n, labels[n]]` (labels are class indices,
    f32-encoded upstream)."""

    type_name: ClassVar[str] = "SoftmaxCrossEntropyWithLogits"

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("logits", "labels")


@dataclass(frozen=True)
class FakeQuantizeLSQ(BinaryArityOp):
    """Learned-step-size fake quantization: `clamp(round(x / s[c]), -q_max, q_max) * s[c]`, the
    scale a (learned) second input, per channel along `axis` or one for the tensor."""

    type_name: ClassVar[str] = "FakeQuantizeLSQ"
    bits: int
    axis: int | None

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "scale")


# -------------------------------------------------------------------------------- shape rules


def _same_shape(x: Shape, other: Shape, operand: str, like: str) -> None:
    if other.rank != x.rank or any(conflict(a, b) for a, b in zip(x.dims, other.dims, strict=True)):
        raise ShapeError(f"{operand} {other} must have the shape of {like} {x}", operand=operand)
    if other.dtype is not x.dtype:
        raise DTypeError(f"{operand} is {other.dtype.value} but {like} is {x.dtype.value}", operand=operand)


@shape_rule(ReluBackward)
def _relu_backward(op: ReluBackward, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, dy = ins
    require_float(dy, "dy", op.type_name)
    if x.rank != dy.rank or any(conflict(a, b) for a, b in zip(x.dims, dy.dims, strict=True)):
        raise ShapeError(f"dy {dy} must have the shape of x {x}", operand="dy")
    return dy


@shape_rule(ActivationBackward)
def _activation_backward(op: ActivationBackward, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, dy = ins
    if not isinstance(op.kind, ActivationKind):
        raise AttributeValueError(f"kind must be an Activation, got {op.kind!r}")
    require_float(x, "x", op.type_name)
    _same_shape(x, dy, "dy", "x")
    return x


@shape_rule(CumsumBackward)
def _cumsum_backward(op: CumsumBackward, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    dy = ins[0]
    normalize_axis(require_int(op.axis, "axis"), dy.rank, operand="dy")
    if not isinstance(op.exclusive, bool):
        raise AttributeValueError(f"exclusive must be a bool, got {op.exclusive!r}")
    return dy


@shape_rule(GatherBackward)
def _gather_backward(op: GatherBackward, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    dy, indices = ins
    check_index_dtype(indices)
    if declared is None:
        raise ShapeError("GatherBackward needs its output (the table's shape) declared")
    axis = normalize_axis(require_int(op.axis, "axis"), declared.rank, operand="table")
    want = (*declared.dims[:axis], *indices.dims, *declared.dims[axis + 1:])
    if dy.rank != len(want) or any(conflict(a, b) for a, b in zip(dy.dims, want, strict=True)):
        raise ShapeError(
            f"dy {dy} must be the gathered shape [table dims before axis {axis}, indices dims, the rest]"
            f" = {list(map(str, want))} of the declared table {declared}",
            operand="dy",
        )
    if declared.dtype is not dy.dtype:
        raise DTypeError(f"the declared table is {declared.dtype.value} but dy is {dy.dtype.value}", operand="dy")
    return declared


@shape_rule(RopeBackward)
def _rope_backward(op: RopeBackward, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    dy, cos, sin = ins
    head_dim = require_int(op.head_dim, "head_dim", minimum=2)
    n_rot = require_int(op.n_rot, "n_rot", minimum=2)
    if n_rot > head_dim or n_rot % 2:
        raise AttributeValueError(f"n_rot must be even and at most head_dim {head_dim}, got {n_rot}")
    require_float(dy, "dy", op.type_name)
    last = dy.dims[-1] if dy.rank else None
    if not isinstance(last, Static) or last.size % head_dim:
        raise ShapeError(f"the last dim of dy {dy} must be a multiple of head_dim {head_dim}", operand="dy")
    for table, operand in ((cos, "cos"), (sin, "sin")):
        if table.rank < 1 or conflict(table.dims[-1], Static(n_rot // 2)):
            raise ShapeError(f"{operand} {table} must end in n_rot/2 = {n_rot // 2}", operand=operand)
    return dy


def _logits(logits: Shape, op: Op) -> Dim:
    require_rank(logits, "logits", minimum=1)
    require_float(logits, "logits", op.type_name)
    return logits.dims[-1]


@shape_rule(SoftmaxCrossEntropy)
def _softmax_cross_entropy(op: SoftmaxCrossEntropy, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    logits, targets = ins
    _logits(logits, op)
    _same_shape(logits, targets, "targets", "logits")
    return Shape(logits.dims[:-1], logits.dtype)


@shape_rule(SoftmaxCrossEntropyWithLogits)
def _softmax_cross_entropy_labels(
    op: SoftmaxCrossEntropyWithLogits, ins: Sequence[Shape], declared: Shape | None,
) -> Shape | None:
    logits, labels = ins
    _logits(logits, op)
    check_index_dtype(labels, "labels")
    rows = logits.dims[:-1]
    if labels.rank != len(rows) or any(conflict(a, b) for a, b in zip(labels.dims, rows, strict=True)):
        raise ShapeError(f"labels {labels} must hold one class per row of logits {logits}", operand="labels")
    return Shape(rows, logits.dtype)


@shape_rule(FakeQuantizeLSQ)
def _fake_quantize_lsq(op: FakeQuantizeLSQ, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, scale = ins
    if op.bits not in Q_MAX:
        raise AttributeValueError(f"bits must be one of {sorted(Q_MAX)}, got {op.bits!r}")
    require_float(x, "x", op.type_name)
    require_float(scale, "scale", op.type_name)
    channels: Dim = Static(1)
    if op.axis is not None:
        channels = x.dims[unsigned_axis(op.axis, x.rank, operand="x")]
    if scale.rank != 1 or conflict(scale.dims[0], channels):
        what = f"[{channels}] (x's axis {op.axis})" if op.axis is not None else "[1] (per tensor)"
        raise ShapeError(f"scale {scale} must be {what}", operand="scale")
    return x


# -------------------------------------------------------------------------------- builder


class TrainingBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def relu_backward(self, x: int, dy: int, *, name: str | None = None) -> int:
        """`dy` where `x > 0`, else 0."""
        return self.add_node(ReluBackward(), [x, dy], name=name)

    def activation_backward(self, x: int, dy: int, kind: ActivationKind | str, *, name: str | None = None) -> int:
        """`act'(x) * dy` for the activation `kind`."""
        the_kind = ActivationKind(kind) if isinstance(kind, str) else kind
        return self.add_node(ActivationBackward(the_kind), [x, dy], name=name)

    def cumsum_backward(self, dy: int, axis: int, exclusive: bool = False, *, name: str | None = None) -> int:
        """The gradient of `cumsum(x, axis, exclusive)` given `dy`."""
        return self.add_node(CumsumBackward(axis, exclusive), [dy], name=name)

    def gather_backward(
        self, dy: int, indices: int, table_shape: Sequence[DimLike], axis: int = 0, *, name: str | None = None,
    ) -> int:
        """The gradient of `gather(table, indices, axis)` w.r.t. a table of `table_shape`."""
        dtype = self._nodes[dy].shape.dtype if self._is_node_id(dy) else DType.F32
        declared = self._shape_arg(table_shape, dtype, "GatherBackward", name)
        return self.add_node(GatherBackward(axis), [dy, indices], declared, name=name)

    def rope_backward(
        self, dy: int, cos: int, sin: int, head_dim: int, n_rot: int | None = None, *, name: str | None = None,
    ) -> int:
        """The gradient of NeoX `rope(x, cos, sin, head_dim, n_rot)` w.r.t. x."""
        return self.add_node(RopeBackward(head_dim, head_dim if n_rot is None else n_rot), [dy, cos, sin], name=name)

    def softmax_cross_entropy(self, logits: int, targets: int, *, name: str | None = None) -> int:
        """Per-row cross-entropy of `softmax(logits)` against dense `targets`."""
        return self.add_node(SoftmaxCrossEntropy(), [logits, targets], name=name)

    def softmax_cross_entropy_with_logits(self, logits: int, labels: int, *, name: str | None = None) -> int:
        """Per-row `-log softmax(logits)[label]`."""
        return self.add_node(SoftmaxCrossEntropyWithLogits(), [logits, labels], name=name)

    def fake_quantize_lsq(self, x: int, scale: int, bits: int = 8, axis: int | None = None, *,
                          name: str | None = None) -> int:
        """`clamp(round(x / scale), -q_max, q_max) * scale` with a learned scale input."""
        the_axis = None if axis is None else self._signed_to_unsigned(axis, x)
        return self.add_node(FakeQuantizeLSQ(bits, the_axis), [x, scale], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (newest upstream only).
JSON_FORMS = (
    unit_form(ReluBackward, since=NEWEST),
    struct_form(ActivationBackward, ("kind", ACTIVATION), since=NEWEST),
    struct_form(CumsumBackward, ("axis", I32), ("exclusive", BOOL), since=NEWEST),
    struct_form(GatherBackward, ("axis", I32), since=NEWEST),
    struct_form(RopeBackward, ("head_dim", USIZE), ("n_rot", USIZE), since=NEWEST),
    unit_form(SoftmaxCrossEntropy, since=NEWEST),
    unit_form(SoftmaxCrossEntropyWithLogits, since=NEWEST),
    struct_form(FakeQuantizeLSQ, ("bits", U8), ("axis", OptionCodec(USIZE)), since=NEWEST),
)
