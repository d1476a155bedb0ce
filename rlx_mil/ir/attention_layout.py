"""Attention operand layouts and geometry (spec sections 9.2-9.3), shared by shape inference,
the reference semantics and the lowering so all three read q/k/v the same way."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.shape import Dim, Shape, Static


class AttentionLayout(enum.Enum):
    BHSD = "bhsd"  # [B, H, S, D], rank 4 with dim 1 == num_heads
    BSHD = "bshd"  # [B, S, H, D], any other rank 4
    BSX = "bsx"  # [B, S, H*D] (fused heads; H == 1 is the single-head [B, S, D])
    SX = "sx"  # [S, H*D], batch 1

    @property
    def seq_axis(self) -> int:
        return {AttentionLayout.BHSD: 2, AttentionLayout.BSHD: 1, AttentionLayout.BSX: 1, AttentionLayout.SX: 0}[self]

    @property
    def rank(self) -> int:
        return {AttentionLayout.BHSD: 4, AttentionLayout.BSHD: 4, AttentionLayout.BSX: 3, AttentionLayout.SX: 2}[self]


def detect_layout(q: Shape, num_heads: int) -> AttentionLayout:
    """Layout from q alone, the upstream rule: rank 4 is BHSD iff dim 1 == num_heads."""
    if q.rank == 4:
        return AttentionLayout.BHSD if q.dims[1] == Static(num_heads) else AttentionLayout.BSHD
    if q.rank == 3:
        return AttentionLayout.BSX
    if q.rank == 2:
        return AttentionLayout.SX
    raise ShapeError(f"q must have rank 2, 3 or 4, got rank {q.rank} ({q})", operand="q")


@dataclass(frozen=True)
class AttentionGeometry:
    layout: AttentionLayout
    batch: Dim
    num_heads: int
    num_kv_heads: int
    q_len: Dim
    kv_len: Dim
    head_dim: int
    #: Width of each value head (and of each output head); head_dim unless the op sets
    #: v_head_dim (multi-head latent attention).
    v_head_dim: int = 0

    def __post_init__(self) -> None:
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)

    @property
    def group_size(self) -> int:
        """Query heads per kv head (1 = plain multi-head attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def batch_size(self) -> int:
        return _static(self.batch, "batch")

    @property
    def q_size(self) -> int:
        return _static(self.q_len, "query length")

    @property
    def kv_size(self) -> int:
        return _static(self.kv_len, "key length")

    @property
    def rows(self) -> int:
        """Rows of the folded query `[B, H_kv, G*Sq, D]` (static sizes)."""
        return self.group_size * self.q_size

    @property
    def offset(self) -> int:
        """Query offset of bottom-right aligned masks (spec 9.4; static sizes)."""
        return max(self.kv_size - self.q_size, 0)

    @property
    def is_ambiguous(self) -> bool:
        """A BHSD reading of a tensor whose seq length equals num_heads (spec 9.2 warning)."""
        return self.num_heads > 1 and self.layout is AttentionLayout.BHSD and self.q_len == Static(self.num_heads)


def _static(dim: Dim, what: str) -> int:
    if not isinstance(dim, Static):
        raise ShapeError(f"the attention's {what} must be static here, got {dim}")
    return dim.size


def _heads_in(t: Shape, layout: AttentionLayout, head_dim: int, operand: str) -> int:
    if layout is AttentionLayout.BHSD:
        d = t.dims[1]
    elif layout is AttentionLayout.BSHD:
        d = t.dims[2]
    else:
        width = t.dims[-1]
        if not isinstance(width, Static):
            raise ShapeError(f"feature width of {operand} must be static, got {t}", operand=operand)
        if width.size % head_dim != 0:
            raise ShapeError(
                f"feature width {width.size} of {operand} is not a multiple of head_dim {head_dim}",
                operand=operand,
            )
        return width.size // head_dim
    if not isinstance(d, Static):
        raise ShapeError(f"head axis of {operand} must be static, got {t}", operand=operand)
    if layout in (AttentionLayout.BHSD, AttentionLayout.BSHD) and t.dims[3] != Static(head_dim):
        raise ShapeError(f"last dim of {operand} must be head_dim={head_dim}, got {t}", operand=operand)
    return d.size


def attention_geometry(
    q: Shape, k: Shape, v: Shape, num_heads: int, head_dim: int, v_head_dim: int | None = None
) -> AttentionGeometry:
    """Validate q/k/v against each other and the attributes; raise a typed error naming the
    operand at fault. GQA/MQA: k and v may carry H_kv heads with num_heads % H_kv == 0. With
    `v_head_dim`, value heads (and output heads) are that wide instead of head_dim."""
    if num_heads < 1 or head_dim < 1:
        raise AttributeValueError(f"num_heads and head_dim must be >= 1, got {num_heads} and {head_dim}")
    v_dim = head_dim if v_head_dim is None else v_head_dim
    if v_dim < 1:
        raise AttributeValueError(f"v_head_dim must be >= 1, got {v_dim}")
    layout = detect_layout(q, num_heads)
    for name, t in (("k", k), ("v", v)):
        if t.rank != q.rank:
            raise ShapeError(f"{name} must have q's rank {q.rank}, got {t}", operand=name)
    heads = _heads_in(q, layout, head_dim, "q")
    if heads != num_heads:
        raise AttributeValueError(
            f"q {q} holds {heads} heads of {head_dim} in layout {layout.value}, but num_heads={num_heads}",
            operand="q",
        )
    kv_heads = _heads_in(k, layout, head_dim, "k")
    v_heads = _heads_in(v, layout, v_dim, "v")
    if v_heads != kv_heads:
        raise ShapeError(f"k has {kv_heads} heads but v has {v_heads}", operand="v")
    if kv_heads < 1 or num_heads % kv_heads != 0:
        raise AttributeValueError(
            f"num_heads={num_heads} is not a multiple of the {kv_heads} kv heads in k {k}", operand="k"
        )
    seq = layout.seq_axis
    if k.dims[seq] != v.dims[seq]:
        raise ShapeError(f"k and v must share the key length, got k {k} and v {v}", operand="v")
    if layout is AttentionLayout.SX:
        batch: Dim = Static(1)
    else:
        batch = q.dims[0]
        for name, t in (("k", k), ("v", v)):
            if t.dims[0] != batch:
                raise ShapeError(f"{name} batch {t.dims[0]} differs from q batch {batch}", operand=name)
    return AttentionGeometry(layout, batch, num_heads, kv_heads, q.dims[seq], k.dims[seq], head_dim, v_dim)


def attention_output_dims(q: Shape, geometry: AttentionGeometry) -> tuple[Dim, ...]:
    """The attention output's dims: q's, with each head v_head_dim wide."""
    width = geometry.v_head_dim if geometry.layout.rank == 4 else geometry.num_heads * geometry.v_head_dim
    return (*q.dims[:-1], Static(width))
