"""The JSON form of every op, collected from the op families (`JSON_FORMS` of each)."""

from __future__ import annotations

from rlx_mil.ir.ops import FAMILIES
from rlx_mil.ir.serde.codecs import OpForm

#: JSON spelling of every op, keyed by variant name. Struct fields are listed in the
#: dataclass declaration order, which is also serde's field order (tests check both).
OP_FORMS: dict[str, OpForm] = {
    form.op_type.type_name: form for module in FAMILIES.values() for form in module.JSON_FORMS
}
