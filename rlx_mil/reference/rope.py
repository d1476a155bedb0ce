"""Reference kernels of Rope (NeoX rotate-half) and AxialRope2d."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.ops import (
    AxialRope2d,
    Rope,
    RopeStyle,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.registry import (
    as_float,
    finish,
    float_operands,
    reference_kernel,
)


def _rope_table(t: np.ndarray, name: str, half: int, dtype: np.dtype) -> np.ndarray:
    if t.ndim < 1 or t.size == 0:
        raise ShapeError(f"{name} must be a [P, head_dim/2] table, got {list(t.shape)}", operand=name)
    table = as_float(t, dtype).reshape(-1, t.shape[-1])
    if table.shape[1] < half:
        raise ShapeError(
            f"{name} rows hold {table.shape[1]} values but n_rot/2 = {half} are needed", operand=name
        )
    return table[:, :half]


def rope(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int, n_rot: int, style: RopeStyle = RopeStyle.NEOX
) -> np.ndarray:
    """Rotary embedding (spec 8.7); rank 2/3 `[.., S, H*D]`, rank 4 `[B, H, S, D]`.

    NeoX rotates dim i with dim i + n_rot/2 (rotate-half); GptJ rotates the adjacent pair
    (2i, 2i+1) (spec part 2, 1.8). Either way pair i turns by row s, column i of the tables,
    and dims from n_rot on are copied.
    """
    if head_dim < 1 or n_rot < 0 or n_rot % 2 != 0 or n_rot > head_dim:
        raise AttributeValueError(f"need 0 <= n_rot <= head_dim with n_rot even, got head_dim={head_dim} n_rot={n_rot}")
    (v,) = float_operands(x)
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
    if style is RopeStyle.GPTJ:
        first_at, second_at = slice(0, n_rot, 2), slice(1, n_rot, 2)
    else:
        first_at, second_at = slice(0, half), slice(half, n_rot)
    first, second = heads[..., first_at], heads[..., second_at]
    result[..., first_at] = first * c - second * s
    result[..., second_at] = second * c + first * s
    return result.reshape(v.shape)


@reference_kernel(Rope)
def _rope(op: Rope, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    return finish(rope(inputs[0], inputs[1], inputs[2], op.head_dim, op.n_rot, op.style), out)


@reference_kernel(AxialRope2d)
def _axial_rope2d(op: AxialRope2d, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    """Part-2 spec 5.9: token t at grid position `t // repeat_factor` (repeat-interleave, 9 Q30),
    x = pos % end_x, y = pos // end_x; pairs of the first half of each head rotate by x * freq,
    pairs of the second half by y * freq, `freq_c = theta^(-4c / head_dim)`; angles and their
    cos/sin in float32."""
    x = inputs[0]
    head_dim, repeat = op.head_dim, max(op.repeat_factor, 1)
    if x.ndim != 3 or x.shape[1] != op.end_x * op.end_y * repeat or x.shape[2] != op.num_heads * head_dim:
        raise ShapeError(f"x must be [B, end_x * end_y * repeat_factor, num_heads * head_dim], got {list(x.shape)}",
                         operand="x")
    if head_dim < 4 or head_dim % 4:
        raise AttributeValueError(f"head_dim must be a positive multiple of 4, got {head_dim}")
    (v,) = float_operands(x)
    quarter, half = head_dim // 4, head_dim // 2
    exponents = np.arange(quarter, dtype=np.float32) * np.float32(4) / np.float32(head_dim)
    freqs = (np.float32(1) / np.float32(op.theta) ** exponents).astype(np.float32)
    position = np.arange(x.shape[1]) // repeat
    angles = {0: (position % op.end_x).astype(np.float32)[:, None] * freqs,
              half: (position // op.end_x).astype(np.float32)[:, None] * freqs}
    heads = v.reshape(x.shape[0], x.shape[1], op.num_heads, head_dim).copy()
    for offset, angle in angles.items():
        c = np.cos(angle).astype(v.dtype)[None, :, None, :]
        s = np.sin(angle).astype(v.dtype)[None, :, None, :]
        even = heads[..., offset:offset + half:2].copy()
        odd = heads[..., offset + 1:offset + half:2].copy()
        heads[..., offset:offset + half:2] = even * c - odd * s
        heads[..., offset + 1:offset + half:2] = even * s + odd * c
    return finish(heads.reshape(x.shape), out)
