"""The JSON form of every op, collected from the op families (`JSON_FORMS` of each), and what
each JSON version can spell."""

from __future__ import annotations

from collections.abc import Iterable

from rlx_mil.ir.node import Node
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.ops import FAMILIES
from rlx_mil.ir.serde.codecs import OpForm, SubGraphCodec
from rlx_mil.ir.serde.upstream_kinds import UPSTREAM_OP_KINDS
from rlx_mil.ir.serde.versions import NEWEST, NEWEST_ONLY_MEMBERS, V0_2_2, VERSIONS, newest_only_value
from rlx_mil.ir.shape import Shape

#: JSON spelling of every op, keyed by variant name.
OP_FORMS: dict[str, OpForm] = {
    form.op_type.type_name: form for module in FAMILIES.values() for form in module.JSON_FORMS
}

#: Upstream op kinds (its newest `OpKind` list) rlx_mil has no JSON form for: reading one is an
#: UnsupportedOpFormatError naming the kind (spec part 2, section 1.11), not "unknown variant".
#: Derived, so a kind that gains a form leaves the set by itself.
UNSUPPORTED_UPSTREAM_OPS = frozenset(UPSTREAM_OP_KINDS) - frozenset(OP_FORMS)


def legacy_problem(op: Op, shape: Shape) -> str | None:
    """Why a node with `op` and output `shape` has no 0.2.2 JSON spelling; None if it has one."""
    if shape.dtype in NEWEST_ONLY_MEMBERS:
        return f"dtype {shape.dtype.value} does not exist in 0.2.2"
    form = OP_FORMS[op.type_name]
    if form.since != V0_2_2:
        return f"op {op.type_name} does not exist in 0.2.2"
    for name, default in form.newest_fields:
        value = getattr(op, name)
        if value != default:
            return f"{name} = {_text(value)} has no 0.2.2 spelling (0.2.2 always means {_text(default)})"
    for name, codec in form.fields:
        value = getattr(op, name)
        if isinstance(codec, SubGraphCodec):
            nested = _first_problem(value.nodes)
            if nested is not None:
                return f"{name}: {nested}"
            continue
        member = newest_only_value(value)
        if member is not None:
            return f"{name}: {type(member).__name__} {member.value} does not exist in 0.2.2"
    return None


def _first_problem(nodes: Iterable[Node]) -> str | None:
    for node in nodes:
        problem = legacy_problem(node.op, node.shape)
        if problem is not None:
            return f"node %{node.id}: {problem}"
    return None


def needs_newest(node: Node) -> bool:
    return legacy_problem(node.op, node.shape) is not None


def oldest_version(nodes: Iterable[Node]) -> str:
    """The oldest JSON version that spells every node."""
    return NEWEST if _first_problem(nodes) is not None else V0_2_2


def _text(value: object) -> str:
    return str(getattr(value, "value", value))


__all__ = ["OP_FORMS", "UNSUPPORTED_UPSTREAM_OPS", "VERSIONS", "legacy_problem", "needs_newest", "oldest_version"]
