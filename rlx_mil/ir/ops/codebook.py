"""Weights held as codebook indices: SynthMatMul (the matmul whose weight is rebuilt from a
codebook) and SynthReconstruct (the weight itself). Newest upstream JSON only; the contract is
upstream's `op.rs` (`SynthKind::Codebook`), decisions in docs/upstream-ops-3.md.

A weight row `j` of `[n, k]` is `k / entry_dim` codebook entries: `W[j, b*entry_dim + t] =
codebook[indices[j, b], t]` - exactly Core ML's vector palettization (iOS18
`constexpr_lut_to_dense` with `vector_axis=1`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.builder import BuilderBase
from rlx_mil.ir.infer import shape_rule
from rlx_mil.ir.op_base import BinaryArityOp, Op, TernaryOp, collect_ops
from rlx_mil.ir.ops.scatter import check_index_dtype
from rlx_mil.ir.serde.codecs import (
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
from rlx_mil.ir.shape import Shape, Static
from rlx_mil.ir.shape_checks import conflict, require_float, require_rank


@dataclass(frozen=True)
class SynthKind:
    """Upstream's `SynthKind::Codebook { entry_dim, num_entries }` (its only variant)."""

    entry_dim: int
    num_entries: int

    def __str__(self) -> str:
        return f"Codebook(entry_dim={self.entry_dim}, num_entries={self.num_entries})"


@dataclass(frozen=True)
class SynthMatMul(TernaryOp):
    """`y = x @ W^T` with `W [n, k]` rebuilt from `indices [n, k/entry_dim]` and `codebook
    [num_entries, entry_dim]`."""

    type_name: ClassVar[str] = "SynthMatMul"
    kind: SynthKind

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("x", "indices", "codebook")


@dataclass(frozen=True)
class SynthReconstruct(BinaryArityOp):
    """The weight `W [n, k]` itself (upstream's shape inference: the `[n, k]` layout a caller
    transposes for a `[k, n]` matmul)."""

    type_name: ClassVar[str] = "SynthReconstruct"
    kind: SynthKind

    def roles(self, count: int) -> tuple[str, ...] | None:
        return ("indices", "codebook")


# -------------------------------------------------------------------------------- shape rules


def check_codebook(op: Op, kind: SynthKind, indices: Shape, codebook: Shape) -> tuple[Shape, int]:
    """The checked weight `[n, k]` (k static) and entry_dim."""
    if not isinstance(kind, SynthKind):
        raise AttributeValueError(f"kind must be a SynthKind, got {kind!r}")
    for value, what in ((kind.entry_dim, "entry_dim"), (kind.num_entries, "num_entries")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise AttributeValueError(f"{what} must be an integer >= 1, got {value!r}")
    if kind.num_entries > 256:
        raise AttributeValueError(f"num_entries must be at most 256 (u8 indices), got {kind.num_entries}")
    check_index_dtype(indices)
    require_rank(indices, "indices", exact=(2,))
    require_rank(codebook, "codebook", exact=(2,))
    require_float(codebook, "codebook", op.type_name)
    want = (Static(kind.num_entries), Static(kind.entry_dim))
    if any(conflict(a, b) for a, b in zip(codebook.dims, want, strict=True)):
        raise ShapeError(f"codebook {codebook} must be [num_entries, entry_dim] = [{kind.num_entries}, {kind.entry_dim}]",
                         operand="codebook")
    blocks = indices.dims[1]
    if not isinstance(blocks, Static):
        raise ShapeError(f"indices {indices} must have a static second dim (k / entry_dim)", operand="indices")
    return Shape((indices.dims[0], Static(blocks.size * kind.entry_dim)), codebook.dtype), kind.entry_dim


@shape_rule(SynthMatMul)
def _synth_matmul(op: SynthMatMul, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    x, indices, codebook = ins
    weight, _ = check_codebook(op, op.kind, indices, codebook)
    require_rank(x, "x", minimum=1)
    require_float(x, "x", op.type_name)
    if conflict(x.dims[-1], weight.dims[1]):
        raise ShapeError(f"x {x} must end in k = indices' second dim * entry_dim = {weight.dims[1]}", operand="x")
    if x.dtype is not codebook.dtype:
        raise DTypeError(f"x is {x.dtype.value} but the codebook is {codebook.dtype.value}", operand="codebook")
    return Shape((*x.dims[:-1], weight.dims[0]), x.dtype)


@shape_rule(SynthReconstruct)
def _synth_reconstruct(op: SynthReconstruct, ins: Sequence[Shape], declared: Shape | None) -> Shape | None:
    indices, codebook = ins
    weight, _ = check_codebook(op, op.kind, indices, codebook)
    return weight


# -------------------------------------------------------------------------------- builder


class CodebookBuilder(BuilderBase):
    """Builder methods of this family (composed into `Graph`)."""

    def synth_matmul(self, x: int, indices: int, codebook: int, entry_dim: int, num_entries: int, *,
                     name: str | None = None) -> int:
        """`x @ W^T`, `W[j, b*entry_dim + t] = codebook[indices[j, b], t]`."""
        return self.add_node(SynthMatMul(SynthKind(entry_dim, num_entries)), [x, indices, codebook], name=name)

    def synth_reconstruct(self, indices: int, codebook: int, entry_dim: int, num_entries: int, *,
                          name: str | None = None) -> int:
        """The `[n, k]` weight rebuilt from `indices` and `codebook`."""
        return self.add_node(SynthReconstruct(SynthKind(entry_dim, num_entries)), [indices, codebook], name=name)


class SynthKindCodec(Codec):
    """`{"Codebook": {"entry_dim": d, "num_entries": e}}`."""

    FIELDS = ("entry_dim", "num_entries")

    def decode(self, value: object, path: str) -> SynthKind:
        tag, content = tagged(value, path, "a SynthKind")
        if tag != "Codebook":
            fail(path, f"unknown SynthKind variant {describe(tag)} (rlx_mil knows Codebook)")
        if content is MISSING:
            fail(path, 'Codebook needs {"entry_dim": d, "num_entries": e}')
        body = json_object(content, f"{path}.Codebook")
        for key in body:
            if key not in self.FIELDS:
                fail(f"{path}.Codebook.{key}", f'unknown field "{key}" for SynthKind Codebook')
        entry_dim, entries = (U32.decode(required(body, key, f"{path}.Codebook"), f"{path}.Codebook.{key}")
                              for key in self.FIELDS)
        return SynthKind(int(entry_dim), int(entries))

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, SynthKind):
            fail(path, f"expected a SynthKind, got {value!r}")
        return {"Codebook": {"entry_dim": U32.encode(value.entry_dim, path), "num_entries": U32.encode(value.num_entries, path)}}


SYNTH_KIND = SynthKindCodec()

#: The ops of this family.
OPS = collect_ops(globals())

#: Their JSON forms (newest upstream only).
JSON_FORMS = (
    struct_form(SynthMatMul, ("kind", SYNTH_KIND), since=NEWEST),
    struct_form(SynthReconstruct, ("kind", SYNTH_KIND), since=NEWEST),
)
