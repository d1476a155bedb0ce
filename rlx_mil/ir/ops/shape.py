"""Data movement: Reshape, Transpose, Narrow, Concat, Expand, Gather (spec section 8)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import (
    AttributeValueError,
    DTypeError,
    ShapeError,
)
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import (
    BinaryArityOp,
    Op,
    UnaryOp,
    collect_ops,
    f32,
)
from rlx_mil.ir.serde.codecs import (
    BOOL,
    F32,
    I64,
    MISSING,
    USIZE,
    USIZE_VEC,
    Codec,
    VecCodec,
    describe,
    did_you_mean,
    fail,
    json_array,
    struct_form,
    tagged,
)
from rlx_mil.ir.serde.versions import NEWEST
from rlx_mil.ir.shape import ROWS, Dim, Dynamic, Shape, Static
from rlx_mil.ir.shape_checks import (
    conflict,
    is_int,
    numel,
    require_int,
    require_rank,
    size_of,
    unsigned_axis,
)


@dataclass(frozen=True)
class Reshape(UnaryOp):
    type_name: ClassVar[str] = "Reshape"
    new_shape: tuple[int, ...]


@dataclass(frozen=True)
class Transpose(UnaryOp):
    type_name: ClassVar[str] = "Transpose"
    perm: tuple[int, ...]


@dataclass(frozen=True)
class Narrow(UnaryOp):
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
class Expand(UnaryOp):
    type_name: ClassVar[str] = "Expand"
    target_shape: tuple[int, ...]


@dataclass(frozen=True)
class Gather(BinaryArityOp):
    type_name: ClassVar[str] = "Gather"
    axis: int

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("table", "indices")


class PadKind(enum.Enum):
    CONSTANT = "Constant"
    REFLECT = "Reflect"
    REPLICATE = "Replicate"
    CIRCULAR = "Circular"


@dataclass(frozen=True)
class PadMode:
    """How Pad fills: `Constant(value)`, `Reflect` (edge excluded), `Replicate` (edge value),
    `Circular` (wrap around), as np.pad's constant / reflect / edge / wrap."""

    kind: PadKind
    value: float | None = None

    def __post_init__(self) -> None:
        if self.kind is PadKind.CONSTANT:
            if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
                raise AttributeValueError(f"Constant padding needs a number, got {self.value!r}")
            object.__setattr__(self, "value", f32(self.value))
        elif self.value is not None:
            raise AttributeValueError(f"{self.kind.value} padding takes no value")

    @staticmethod
    def constant(value: float = 0.0) -> PadMode:
        return PadMode(PadKind.CONSTANT, value)

    @staticmethod
    def parse(mode: PadMode | str | float) -> PadMode:
        """A PadMode, a number (constant padding) or text: "constant[:v]", "reflect", "replicate"/"edge", "circular"/"wrap"."""
        if isinstance(mode, PadMode):
            return mode
        if isinstance(mode, (int, float)) and not isinstance(mode, bool):
            return PadMode.constant(mode)
        if not isinstance(mode, str):
            raise AttributeValueError(f"a pad mode is a PadMode, a number or text such as 'reflect', got {mode!r}")
        key, _, value = mode.strip().lower().partition(":")
        aliases = {"edge": PadKind.REPLICATE, "wrap": PadKind.CIRCULAR}
        kind = aliases.get(key) or next((k for k in PadKind if k.value.lower() == key), None)
        if kind is None:
            raise AttributeValueError(f"unknown pad mode {mode!r}")
        if kind is PadKind.CONSTANT:
            try:
                return PadMode.constant(float(value) if value else 0.0)
            except ValueError:
                raise AttributeValueError(f"pad mode {mode!r}: the constant must be a number") from None
        if value:
            raise AttributeValueError(f"pad mode {mode!r}: {kind.value} takes no value")
        return PadMode(kind)


@dataclass(frozen=True)
class Pad(UnaryOp):
    """`np.pad` with `pads[i] = (before, after)` for every axis (axis 0 padded first)."""

    type_name: ClassVar[str] = "Pad"
    pads: tuple[tuple[int, int], ...]
    mode: PadMode

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            object.__setattr__(self, "pads", tuple(tuple(p) for p in self.pads))
        except TypeError:
            raise AttributeValueError(f"pads must be (before, after) pairs, got {self.pads!r}", op=self.type_name) from None


@dataclass(frozen=True)
class Slice(UnaryOp):
    """`x[..., start + j*step, ...]` for j < len along `axis`; step may be negative (then
    `start` is the highest index read). Every index read must exist."""

    type_name: ClassVar[str] = "Slice"
    axis: int
    start: int
    len: int
    step: int


@dataclass(frozen=True)
class Tile(UnaryOp):
    """`np.tile(x, reps)` with one rep per axis of x."""

    type_name: ClassVar[str] = "Tile"
    reps: tuple[int, ...]


@dataclass(frozen=True)
class Trilu(UnaryOp):
    """`np.triu(x, diagonal)` (upper) or `np.tril(x, diagonal)` over the last two axes."""

    type_name: ClassVar[str] = "Trilu"
    upper: bool
    diagonal: int


@dataclass(frozen=True)
class Reverse(UnaryOp):
    """`np.flip(x, axes)`; no axes is the identity."""

    type_name: ClassVar[str] = "Reverse"
    axes: tuple[int, ...]


# -------------------------------------------------------------------------------- shape rules


@shape_rule(Reshape)
def _reshape(op: Reshape, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    new = list(op.new_shape)
    for v in new:
        if not is_int(v) or v < -1:
            raise AttributeValueError(f"new_shape entries must be integers >= -1, got {list(op.new_shape)}")
    if new.count(-1) > 1:
        raise AttributeValueError(f"new_shape may hold at most one -1, got {new}")
    known = math.prod(v for v in new if v != -1)
    total = numel(x.dims)
    dims: list[Dim] = [Static(v) for v in new if v != -1]
    if -1 in new:
        pos = new.index(-1)
        fill: Dim
        if total is None:
            symbols = {d.symbol for d in x.dims if isinstance(d, Dynamic)}
            fill = Dynamic(symbols.pop()) if len(symbols) == 1 else Dynamic(ROWS)
        else:
            if known == 0 or total % known != 0:
                raise ShapeError(f"cannot reshape {x} ({total} elements) into {new}", operand="x")
            fill = Static(total // known)
        dims.insert(pos, fill)
    elif total is not None and total != known:
        raise ShapeError(f"cannot reshape {x} ({total} elements) into {new} ({known} elements)", operand="x")
    return Shape(tuple(dims), x.dtype)


@shape_rule(Transpose)
def _transpose(op: Transpose, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    perm = list(op.perm)
    if not all(is_int(p) for p in perm) or sorted(perm) != list(range(x.rank)):
        raise AttributeValueError(f"perm {perm} is not a permutation of 0..{x.rank - 1} (x is {x})")
    return Shape(tuple(x.dims[p] for p in perm), x.dtype)


@shape_rule(Narrow)
def _narrow(op: Narrow, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    axis = unsigned_axis(op.axis, x.rank)
    start = require_int(op.start, "start", minimum=0)
    length = require_int(op.len, "len", minimum=0)
    size = size_of(x.dims[axis])
    if size is not None and start + length > size:
        raise AttributeValueError(
            f"start {start} + len {length} exceeds dim {axis} of x {x} (size {size})", operand="x"
        )
    dims = list(x.dims)
    dims[axis] = Static(length)
    return Shape(tuple(dims), x.dtype)


@shape_rule(Concat)
def _concat(op: Concat, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    first = ins[0]
    axis = unsigned_axis(op.axis, first.rank, operand="inputs[0]")
    total = 0
    dynamic_axis = False
    for i, s in enumerate(ins):
        operand = f"inputs[{i}]"
        if s.rank != first.rank:
            raise ShapeError(f"{operand} {s} must have rank {first.rank} like inputs[0] {first}", operand=operand)
        if s.dtype != first.dtype:
            raise DTypeError(f"{operand} is {s.dtype.value} but inputs[0] is {first.dtype.value}", operand=operand)
        for d in range(first.rank):
            if d != axis and conflict(s.dims[d], first.dims[d]):
                raise ShapeError(
                    f"{operand} {s} differs from inputs[0] {first} on dim {d} (concat axis is {axis})",
                    operand=operand,
                )
        size = size_of(s.dims[axis])
        if size is None:
            dynamic_axis = True
        else:
            total += size
    out_axis: Dim
    if not dynamic_axis:
        out_axis = Static(total)
    elif declared is not None and declared.rank == first.rank:
        out_axis = declared.dims[axis]
    else:
        raise ShapeError(f"the concat axis {axis} is dynamic; pass the output shape explicitly")
    dims = list(first.dims)
    dims[axis] = out_axis
    return Shape(tuple(dims), first.dtype)


@shape_rule(Expand)
def _expand(op: Expand, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    target = list(op.target_shape)
    for v in target:
        if not is_int(v) or v < -1:
            raise AttributeValueError(f"target_shape entries must be integers >= -1, got {target}")
    if len(target) < x.rank:
        raise ShapeError(f"cannot expand rank-{x.rank} x {x} to the lower rank {len(target)} of {target}", operand="x")
    padded: list[Dim] = [Static(1) for _ in range(len(target) - x.rank)]
    padded.extend(x.dims)
    dims: list[Dim] = []
    for i, (have, want) in enumerate(zip(padded, target, strict=True)):
        if want == -1:
            dims.append(have)
        elif have == Static(want) or have == Static(1) or isinstance(have, Dynamic):
            dims.append(Static(want))
        else:
            raise ShapeError(
                f"dim {i} of x {x} (left-padded to rank {len(target)}) is {have}; only size-1 dims can grow to {want}",
                operand="x",
            )
    return Shape(tuple(dims), x.dtype)


@shape_rule(Gather)
def _gather(op: Gather, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    table, indices = ins
    axis = unsigned_axis(op.axis, table.rank, operand="table")
    if indices.dtype.is_complex:
        raise DTypeError("indices cannot be complex", operand="indices")
    return Shape((*table.dims[:axis], *indices.dims, *table.dims[axis + 1:]), table.dtype)


@shape_rule(Pad)
def _pad(op: Pad, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    if len(op.pads) != x.rank:
        raise AttributeValueError(f"pads needs one (before, after) pair per axis of x {x}, got {len(op.pads)}")
    dims: list[Dim] = []
    for axis, (pair, dim) in enumerate(zip(op.pads, x.dims, strict=True)):
        if len(pair) != 2 or not all(is_int(p) and p >= 0 for p in pair):
            raise AttributeValueError(f"pads[{axis}] must be two integers >= 0, got {list(pair)}")
        before, after = pair
        if not isinstance(dim, Static):
            if before or after:
                raise ShapeError(f"cannot pad the dynamic axis {axis} of x {x}", operand="x")
            dims.append(dim)
            continue
        limit = {PadKind.REFLECT: dim.size - 1, PadKind.CIRCULAR: dim.size}.get(op.mode.kind)
        if limit is not None and max(before, after) > limit:
            rule = "pad < n" if op.mode.kind is PadKind.REFLECT else "pad <= n"
            raise AttributeValueError(
                f"{op.mode.kind.value} padding of axis {axis} (size {dim.size}) needs {rule}, got {list(pair)}"
            )
        if op.mode.kind is PadKind.REPLICATE and dim.size == 0 and (before or after):
            raise AttributeValueError(f"Replicate padding of the empty axis {axis} has no edge value to repeat")
        dims.append(Static(dim.size + before + after))
    if op.mode.kind is PadKind.CONSTANT and op.mode.value is not None and not math.isfinite(op.mode.value):
        raise AttributeValueError(f"the padding constant must be finite, got {op.mode.value}")
    return Shape(tuple(dims), x.dtype)


@shape_rule(Slice)
def _slice(op: Slice, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    axis = unsigned_axis(op.axis, x.rank)
    start = require_int(op.start, "start", minimum=0)
    length = require_int(op.len, "len", minimum=0)
    step = require_int(op.step, "step")
    if step == 0:
        raise AttributeValueError("step must not be 0")
    size = size_of(x.dims[axis])
    if length and size is not None:
        last = start + (length - 1) * step
        if not (0 <= start < size and 0 <= last < size):
            raise AttributeValueError(
                f"indices {start} .. {last} (start {start}, len {length}, step {step}) leave dim {axis} of x {x}"
                f" (size {size})", operand="x",
            )
    dims = list(x.dims)
    dims[axis] = Static(length)
    return Shape(tuple(dims), x.dtype)


@shape_rule(Tile)
def _tile(op: Tile, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    if len(op.reps) != x.rank:
        raise AttributeValueError(f"reps needs one entry per axis of x {x}, got {list(op.reps)}")
    dims: list[Dim] = []
    for axis, (rep, dim) in enumerate(zip(op.reps, x.dims, strict=True)):
        require_int(rep, f"reps[{axis}]", minimum=1)
        if rep == 1:
            dims.append(dim)
        elif isinstance(dim, Static):
            dims.append(Static(dim.size * rep))
        else:
            raise ShapeError(f"cannot tile the dynamic axis {axis} of x {x}", operand="x")
    return Shape(tuple(dims), x.dtype)


@shape_rule(Trilu)
def _trilu(op: Trilu, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    require_rank(ins[0], "x", minimum=2)
    require_int(op.diagonal, "diagonal")
    return ins[0]


@shape_rule(Reverse)
def _reverse(op: Reverse, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x = ins[0]
    for axis in op.axes:
        unsigned_axis(axis, x.rank, "reverse axis")
    if len(set(op.axes)) != len(op.axes):
        raise AttributeValueError(f"axes must be unique, got {list(op.axes)}")
    return x


# -------------------------------------------------------------------------------- builder


class ShapeBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def pad(
        self, x: int, pads: Sequence[Sequence[int]], mode: PadMode | str | float = 0.0, *, name: str | None = None
    ) -> int:
        """`np.pad(x, pads, mode)`: `pads` one (before, after) pair per axis; `mode` a number
        (constant), "reflect", "replicate" (edge) or "circular" (wrap)."""
        try:
            the_mode = PadMode.parse(mode)
        except AttributeValueError as err:
            raise self._fail(AttributeValueError, err.detail, "Pad", name) from None
        pairs = tuple(tuple(self._sequence(p, "pads entry", "Pad", name)) for p in self._sequence(pads, "pads", "Pad", name))
        return self.add_node(Pad(pairs, the_mode), [x], name=name)

    def slice(self, x: int, axis: int, start: int, length: int, step: int = 1, *, name: str | None = None) -> int:
        """`length` elements along `axis` from `start` in strides of `step` (negative steps walk down)."""
        return self.add_node(Slice(self._signed_to_unsigned(axis, x), start, length, step), [x], name=name)

    def tile(self, x: int, reps: Sequence[int], *, name: str | None = None) -> int:
        """`np.tile(x, reps)`, one rep per axis."""
        return self.add_node(Tile(self._sequence(reps, "reps", "Tile", name)), [x], name=name)

    def trilu(self, x: int, upper: bool = True, diagonal: int = 0, *, name: str | None = None) -> int:
        """`np.triu(x, diagonal)` (upper) or `np.tril(x, diagonal)` over the last two axes."""
        return self.add_node(Trilu(upper, diagonal), [x], name=name)

    def reverse(self, x: int, axes: int | Sequence[int], *, name: str | None = None) -> int:
        """`np.flip(x, axes)` (negative axes count from the end)."""
        axis_list = [axes] if isinstance(axes, int) else list(self._sequence(axes, "axes", "Reverse", name))
        return self.add_node(Reverse(tuple(self._signed_to_unsigned(a, x) for a in axis_list)), [x], name=name)

    def reshape(self, x: int, new_shape: Sequence[int], *, name: str | None = None) -> int:
        """Row-major reshape; at most one -1 entry."""
        return self.add_node(Reshape(self._sequence(new_shape, "new_shape", "Reshape", name)), [x], name=name)

    def transpose(self, x: int, perm: Sequence[int], *, name: str | None = None) -> int:
        return self.add_node(Transpose(self._sequence(perm, "perm", "Transpose", name)), [x], name=name)

    def narrow(self, x: int, axis: int, start: int, length: int, *, name: str | None = None) -> int:
        """`x[..., start:start+length, ...]` along `axis`."""
        return self.add_node(Narrow(self._signed_to_unsigned(axis, x), start, length), [x], name=name)

    def concat(self, ids: Sequence[int], axis: int, *, name: str | None = None) -> int:
        ids = self._sequence(ids, "ids", "Concat", name)
        first = ids[0] if len(ids) else None
        return self.add_node(Concat(self._signed_to_unsigned(axis, first)), list(ids), name=name)

    def expand(self, x: int, target_shape: Sequence[int], *, name: str | None = None) -> int:
        """Broadcast to `target_shape` (left-padding with 1s; -1 keeps the input's dim)."""
        return self.add_node(Expand(self._sequence(target_shape, "target_shape", "Expand", name)), [x], name=name)

    def gather(self, table: int, indices: int, axis: int = 0, *, name: str | None = None) -> int:
        """`np.take(table, indices, axis)`."""
        return self.add_node(Gather(self._signed_to_unsigned(axis, table)), [table, indices], name=name)


class PairCodec(Codec):
    """A Rust `[T; 2]` (a two-element JSON array)."""

    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def decode(self, value: object, path: str) -> tuple[object, object]:
        items = json_array(value, path)
        if len(items) != 2:
            fail(path, f"expected a [before, after] pair, got {describe(value)}")
        return self.inner.decode(items[0], f"{path}[0]"), self.inner.decode(items[1], f"{path}[1]")

    def encode(self, value: object, path: str) -> list[object]:
        if not isinstance(value, tuple) or len(value) != 2:
            fail(path, f"expected a pair, got {value!r}")
        return [self.inner.encode(item, f"{path}[{i}]") for i, item in enumerate(value)]


class PadModeCodec(Codec):
    def decode(self, value: object, path: str) -> PadMode:
        tag, content = tagged(value, path, "a PadMode")
        kind = next((k for k in PadKind if k.value == tag), None)
        if kind is None:
            fail(path, f"unknown PadMode variant {describe(tag)}{did_you_mean(tag, [k.value for k in PadKind])}")
        if kind is PadKind.CONSTANT:
            if content is MISSING:
                fail(path, 'Constant padding needs its value: {"Constant": v}')
            return PadMode(kind, F32.decode(content, f"{path}.Constant"))
        if content is not MISSING and content is not None:
            fail(f"{path}.{tag}", f"PadMode {tag} takes no value, got {describe(content)}")
        return PadMode(kind)

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, PadMode):
            fail(path, f"expected a PadMode, got {value!r}")
        if value.kind is PadKind.CONSTANT:
            return {PadKind.CONSTANT.value: F32.encode(value.value, f"{path}.Constant")}
        return value.kind.value


#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (spec section 2).
JSON_FORMS = (
    struct_form(Reshape, ("new_shape", VecCodec(I64))),
    struct_form(Transpose, ("perm", USIZE_VEC)),
    struct_form(Narrow, ("axis", USIZE), ("start", USIZE), ("len", USIZE)),
    struct_form(Concat, ("axis", USIZE)),
    struct_form(Expand, ("target_shape", VecCodec(I64))),
    struct_form(Gather, ("axis", USIZE)),
    struct_form(Pad, ("pads", VecCodec(PairCodec(USIZE))), ("mode", PadModeCodec()), since=NEWEST),
    struct_form(Slice, ("axis", USIZE), ("start", USIZE), ("len", USIZE), ("step", I64), since=NEWEST),
    struct_form(Tile, ("reps", USIZE_VEC), since=NEWEST),
    struct_form(Trilu, ("upper", BOOL), ("diagonal", I64), since=NEWEST),
    struct_form(Reverse, ("axes", USIZE_VEC), since=NEWEST),
)
