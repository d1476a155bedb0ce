"""Nearest-neighbour resampling of NC* tensors: ResizeNearest2x and Interpolate3d (part-2 spec
sections 5.7 and 5.8)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import UnaryOp, collect_ops
from rlx_mil.ir.serde.codecs import USIZE_VEC, struct_form, unit_form
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import require_float, require_int, require_rank


@dataclass(frozen=True)
class ResizeNearest2x(UnaryOp):
    """`[N, C, H, W] -> [N, C, 2H, 2W]`, `out[.., i, j] = x[.., i // 2, j // 2]`."""

    type_name: ClassVar[str] = "ResizeNearest2x"


@dataclass(frozen=True)
class Interpolate3d(UnaryOp):
    """Nearest-neighbour resize of `[N, C, D, H, W]` to `size = [D', H', W']` with
    `src = min(dst * in // out, in - 1)` per axis (integer arithmetic)."""

    type_name: ClassVar[str] = "Interpolate3d"
    size: tuple[int, ...]


# -------------------------------------------------------------------------------- shape rules


@shape_rule(ResizeNearest2x)
def _resize_nearest_2x(op: ResizeNearest2x, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", exact=(4,))
    require_float(x, "x", "ResizeNearest2x")
    doubled = []
    for axis in (2, 3):
        dim = x.dims[axis]
        if not isinstance(dim, Static):
            raise ShapeError(f"spatial dim {axis} of x must be static, got {x}", operand="x")
        doubled.append(Static(2 * dim.size))
    return Shape((*x.dims[:2], *doubled), x.dtype)


@shape_rule(Interpolate3d)
def _interpolate3d(op: Interpolate3d, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    require_rank(x, "x", exact=(5,))
    require_float(x, "x", "Interpolate3d")
    if len(op.size) != 3:
        raise AttributeValueError(f"size must be [D_out, H_out, W_out], got {list(op.size)}")
    sizes = [require_int(s, "size", minimum=1) for s in op.size]
    for axis in (2, 3, 4):
        dim = x.dims[axis]
        if not isinstance(dim, Static) or dim.size < 1:
            raise ShapeError(f"spatial dim {axis} of x must be static and >= 1, got {x}", operand="x")
    return Shape((*x.dims[:2], *(Static(s) for s in sizes)), x.dtype)


# -------------------------------------------------------------------------------- builder


class ResampleBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def resize_nearest_2x(self, x: int, *, name: str | None = None) -> int:
        """Nearest-neighbour 2x upsampling of `[N, C, H, W]`."""
        return self.add_node(ResizeNearest2x(), [x], name=name)

    def interpolate3d(self, x: int, size: Sequence[int], *, name: str | None = None) -> int:
        """Nearest-neighbour resize of `[N, C, D, H, W]` to `size = [D', H', W']`."""
        return self.add_node(Interpolate3d(self._sequence(size, "size", "Interpolate3d", name)), [x], name=name)


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms: ResizeNearest2x as in 0.2.2; Interpolate3d newest only.
JSON_FORMS = (
    unit_form(ResizeNearest2x),
    struct_form(Interpolate3d, ("size", USIZE_VEC), since=NEWEST),
)
