"""Field codecs of upstream's serde JSON form, and the table entry (`OpForm`) of one op.

Upstream serialises `rlx_ir::Graph` with serde's derived form: externally tagged enums,
`Option` as value-or-null, `Vec<u8>` as an array of byte values and `f32` in ryu's shortest
round-trip spelling. A codec decodes one serde field type from parsed JSON (failing with a
`GraphFormatError` whose message starts with the JSON path) and encodes it back. Op families
declare their ops' forms with `unit_form`, `newtype_form` and `struct_form`.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from rlx_mil.errors import GraphFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.serde.f32 import f32_from_int, format_f32, parse_f32
from rlx_mil.ir.serde.versions import V0_2_2

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


class FloatToken:
    """A JSON number written with a fraction or exponent, kept as text for exact rounding."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text



class DuplicateKeyObject(dict[str, object]):
    """A JSON object in which some key occurs twice (serde rejects duplicate fields)."""

    duplicate: str = ""


def fail(path: str, message: str) -> NoReturn:
    raise GraphFormatError(f"{path}: {message}")


def describe(value: object) -> str:
    """A short JSON-like rendering of an offending value for error messages."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int_text(value, "an integer with ")
    if isinstance(value, FloatToken):
        text = value.text
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return json.dumps(shown, ensure_ascii=False)
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        keys = ", ".join(describe(k) for k in list(value)[:3])
        more = ", ..." if len(value) > 3 else ""
        return f"an object with keys {{{keys}{more}}}" if value else "an empty object"
    return type(value).__name__


def int_text(value: int, long_prefix: str) -> str:
    """`value` in decimal, or its digit count when long (str() of huge ints is slow or refused)."""
    if value.bit_length() <= 128:
        return str(value)
    digits = math.floor((value.bit_length() - 1) * math.log10(2)) + 1
    if digits + 1 < 4000:
        digits = len(str(abs(value)))
        return f"{long_prefix}{digits} digits"
    return f"{long_prefix}about {digits} digits"


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    for choice in choices:
        if choice.lower() == name.lower():
            return f' (names are case-sensitive; did you mean "{choice}"?)'
    return ""


def json_object(value: object, path: str, what: str = "an object") -> dict[str, object]:
    if not isinstance(value, dict):
        fail(path, f"expected {what}, got {describe(value)}")
    if isinstance(value, DuplicateKeyObject):
        fail(path, f"duplicate key {describe(value.duplicate)}")
    return value


def json_array(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        fail(path, f"expected an array, got {describe(value)}")
    return value


MISSING = object()


def required(obj: dict[str, object], key: str, path: str) -> object:
    value = obj.get(key, MISSING)
    if value is MISSING:
        fail(path, f'missing required field "{key}"')
    return value


def tagged(value: object, path: str, what: str) -> tuple[str, object]:
    """Split serde's externally tagged enum form: "Variant" or {"Variant": content}."""
    if isinstance(value, str):
        return value, MISSING
    if isinstance(value, dict):
        obj = json_object(value, path)
        if len(obj) == 1:
            ((tag, content),) = obj.items()
            return tag, content
        fail(path, f"expected {what} as a string or an object with exactly one key, got {describe(value)}")
    fail(path, f"expected {what} as a string or an object with exactly one key, got {describe(value)}")



class Codec:
    """Decodes one serde field type from parsed JSON and encodes it back."""

    optional = False

    def decode(self, value: object, path: str) -> object:
        raise NotImplementedError

    def encode(self, value: object, path: str) -> object:
        raise NotImplementedError


def _as_int(value: object) -> int | None:
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    return None


class IntCodec(Codec):
    def __init__(self, rust_type: str, low: int, high: int) -> None:
        self.rust_type = rust_type
        self.low = low
        self.high = high
        self.expected = "a non-negative integer" if low == 0 else "an integer"

    def _check(self, number: int | None, original: object, path: str) -> int:
        if number is None:
            fail(path, f"expected {self.expected}, got {describe(original)}")
        if number < self.low and self.low == 0:
            fail(path, f"expected {self.expected}, got {describe(number)}")
        if not self.low <= number <= self.high:
            fail(path, f"integer {int_text(number, 'with ')} does not fit in {self.rust_type}")
        return number

    def decode(self, value: object, path: str) -> int:
        return self._check(value if type(value) is int else None, value, path)

    def encode(self, value: object, path: str) -> int:
        return self._check(_as_int(value), value, path)


U8 = IntCodec("u8", 0, 255)
U32 = IntCodec("u32", 0, U32_MAX)
USIZE = IntCodec("usize", 0, U64_MAX)
U64 = IntCodec("u64", 0, U64_MAX)
I32 = IntCodec("i32", I32_MIN, I32_MAX)
I64 = IntCodec("i64", I64_MIN, I64_MAX)


class RawNumber:
    """Pre-formatted number text for the emitter."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _F32Codec(Codec):
    def decode(self, value: object, path: str) -> float:
        if value is None:
            fail(path, "expected a number, got null (only optional fields may be null)")
        if type(value) is int:
            result = f32_from_int(value)
        elif isinstance(value, FloatToken):
            try:
                result = parse_f32(value.text)
            except ValueError:
                result = None
        else:
            fail(path, f"expected a number, got {describe(value)}")
        if result is None:
            fail(path, f"number {describe(value)} is out of the f32 range")
        return result

    def encode(self, value: object, path: str) -> RawNumber:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            fail(path, f"expected a float, got {type(value).__name__}")
        number = float(value)
        if not math.isfinite(number):
            fail(path, f"cannot write non-finite float {number!r} (upstream JSON turns it into null)")
        try:
            return RawNumber(format_f32(number))
        except ValueError:
            fail(path, f"float {number!r} is outside the f32 range")


F32 = _F32Codec()


class _BoolCodec(Codec):
    def decode(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            fail(path, f"expected true or false, got {describe(value)}")
        return value

    def encode(self, value: object, path: str) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            fail(path, f"expected a bool, got {type(value).__name__}")
        return bool(value)


BOOL = _BoolCodec()


def _check_unicode(text: str, path: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        fail(path, "string contains a lone surrogate (not valid Unicode)")
    return text


class _StrCodec(Codec):
    def decode(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            fail(path, f"expected a string, got {describe(value)}")
        return _check_unicode(value, path)

    def encode(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            fail(path, f"expected a string, got {type(value).__name__}")
        return _check_unicode(value, path)


STR = _StrCodec()

class EnumCodec(Codec):
    def __init__(self, enum_type: type[enum.Enum], label: str) -> None:
        self.enum_type = enum_type
        self.label = label
        self.by_name = {member.value: member for member in enum_type}

    def decode(self, value: object, path: str) -> object:
        if not isinstance(value, str):
            fail(path, f"expected a {self.label} variant name (a string), got {describe(value)}")
        member = self.by_name.get(value)
        if member is None:
            fail(
                path,
                f"unknown {self.label} variant {describe(value)}{did_you_mean(value, self.by_name)}",
            )
        return member

    def encode(self, value: object, path: str) -> str:
        if not isinstance(value, self.enum_type):
            fail(path, f"expected a {self.enum_type.__name__}, got {value!r}")
        return str(value.value)


DTYPE = EnumCodec(DType, "DType")


class OptionCodec(Codec):
    optional = True

    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def decode(self, value: object, path: str) -> object:
        return None if value is None else self.inner.decode(value, path)

    def encode(self, value: object, path: str) -> object:
        return None if value is None else self.inner.encode(value, path)


class VecCodec(Codec):
    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def decode(self, value: object, path: str) -> tuple[object, ...]:
        items = json_array(value, path)
        return tuple(self.inner.decode(item, f"{path}[{i}]") for i, item in enumerate(items))

    def encode(self, value: object, path: str) -> list[object]:
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
            fail(path, f"expected a sequence, got {type(value).__name__}")
        return [self.inner.encode(item, f"{path}[{i}]") for i, item in enumerate(value)]



class SubGraphCodec(Codec):
    """A nested graph (the bodies of If, While, Scan); the reader and writer handle it, since
    building a graph needs the graph class."""

    def decode(self, value: object, path: str) -> object:
        raise AssertionError("sub-graphs are decoded by the reader")

    def encode(self, value: object, path: str) -> object:
        raise AssertionError("sub-graphs are encoded by the writer")


SUBGRAPH = SubGraphCodec()


@dataclass(frozen=True)
class OpForm:
    """How one Op variant is spelled: unit ("MatMul"), newtype ({"Binary": "Add"}) or struct.

    `since` is the upstream JSON version the op first appears in. `newest_fields` are the
    struct fields the newest JSON added to an op 0.2.2 already had, each with the value a 0.2.2
    document means by leaving it out; `legacy_unit` marks an op 0.2.2 spelled as the bare
    variant name (its newest struct fields all at their `newest_fields` values).
    """

    op_type: type[Op]
    form: str  # "unit" | "newtype" | "struct"
    fields: tuple[tuple[str, Codec], ...] = ()
    since: str = V0_2_2
    newest_fields: tuple[tuple[str, object], ...] = ()
    legacy_unit: bool = False

    @property
    def legacy_defaults(self) -> dict[str, object]:
        return dict(self.newest_fields)


def unit_form(op_type: type[Op], *, since: str = V0_2_2) -> OpForm:
    return OpForm(op_type, "unit", since=since)


def newtype_form(op_type: type[Op], field: str, codec: Codec, *, since: str = V0_2_2) -> OpForm:
    return OpForm(op_type, "newtype", ((field, codec),), since=since)


def struct_form(
    op_type: type[Op],
    *op_fields: tuple[str, Codec],
    since: str = V0_2_2,
    newest_fields: tuple[tuple[str, object], ...] = (),
    legacy_unit: bool = False,
) -> OpForm:
    """Struct fields in serde's order (upstream's declaration order)."""
    return OpForm(op_type, "struct", op_fields, since, newest_fields, legacy_unit)


USIZE_VEC = VecCodec(USIZE)
