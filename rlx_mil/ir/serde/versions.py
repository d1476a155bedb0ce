"""The two JSON forms rlx_mil reads and writes: upstream 0.2.2 and the newest upstream.

Graph JSON carries no schema version, so a document's form is recognised from what it spells:
fields and variants that exist only in the newest upstream (`Rope.style`,
`Attention.v_head_dim`, the struct form of `ScatterAdd`, new activation kinds, new ops...)
make it newest; otherwise it is 0.2.2 (the two forms coincide for most graphs). Reading
upgrades 0.2.2 spellings as the spec's upgrade rules say (a missing `style` is NeoX, a bare
`"ScatterAdd"` is axis 0, ...). Writing the 0.2.2 form refuses, naming the node and field,
whatever 0.2.2 cannot express; writing never loses meaning silently.
"""

from __future__ import annotations

import dataclasses
import enum

from rlx_mil.ir.dtype import DType
from rlx_mil.ir.op_base import Op

V0_2_2 = "0.2.2"
NEWEST = "newest"
#: The JSON forms `to_json(version=...)` writes, oldest first.
VERSIONS = (V0_2_2, NEWEST)

#: Enum members (serde variants) that exist only in the newest upstream JSON.
NEWEST_ONLY_MEMBERS: set[enum.Enum] = {DType.C128}


def newest_only(*members: enum.Enum) -> None:
    """Record enum members that 0.2.2 JSON has no spelling for."""
    NEWEST_ONLY_MEMBERS.update(members)


def newest_only_value(value: object) -> enum.Enum | None:
    """The first newest-only enum member inside an attribute value (tuples and nested
    dataclasses such as QuantScheme are searched), or None."""
    if isinstance(value, enum.Enum):
        return value if value in NEWEST_ONLY_MEMBERS else None
    if isinstance(value, tuple):
        for item in value:
            found = newest_only_value(item)
            if found is not None:
                return found
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and not isinstance(value, Op):
        for field in dataclasses.fields(value):
            found = newest_only_value(getattr(value, field.name))
            if found is not None:
                return found
    return None
