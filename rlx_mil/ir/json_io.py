"""JSON interchange with upstream RLX (spec section 2).

Upstream serialises `rlx_ir::Graph` with serde's derived form and `serde_json`: externally
tagged enums, `Option` as value-or-null, `Vec<u8>` as an array of byte values and `f32` in
ryu's shortest round-trip spelling. This module reads and writes exactly that form, so a
graph loaded from an upstream file is written back byte for byte.

Reading treats the text as untrusted. Every defect (bad JSON, wrong types, out-of-range
integers, unknown variants, dangling node ids, payload sizes, IR rule violations found by
`Graph.add_node`) raises :class:`~rlx_mil.errors.GraphFormatError` whose message starts with
the JSON path at fault, e.g. ``nodes[3].op.Attention.num_heads: expected a non-negative
integer, got "4"``. No other exception type escapes, and sizes are checked against
:class:`JsonLimits` before anything proportional to them is built.
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import NoReturn

import numpy as np

from rlx_mil.errors import GraphError, GraphFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph, Node, NodeOrigin
from rlx_mil.ir.ops import (
    OP_TYPES,
    ActivationKind,
    AttentionBwdWrt,
    BinaryOp,
    CmpOp,
    Constant,
    MaskKind,
    MaskType,
    Op,
    QuantKind,
    QuantScheme,
    ReduceOp,
)
from rlx_mil.ir.shape import Dim, Dynamic, Shape, Static

__all__ = [
    "DEFAULT_LIMITS",
    "JsonLimits",
    "format_f32",
    "graph_from_json",
    "graph_from_json_file",
    "graph_to_json",
    "graph_to_json_file",
    "parse_f32",
]

U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class JsonLimits:
    """Size caps applied while reading untrusted JSON.

    `max_text_length` counts characters of a `str`, or bytes of `bytes` and files; it is
    checked before parsing, so oversized input never reaches the JSON parser. `max_numel`
    caps the element count of every declared shape (static dims). `max_constant_bytes` caps
    the sum of all `Constant` payloads and is checked from the declared shape before the
    payload is converted.
    """

    max_text_length: int = 1 << 32
    max_numel: int = 1 << 40
    max_constant_bytes: int = 2 << 30


DEFAULT_LIMITS = JsonLimits()


# ============================================================================ f32 spelling
#
# serde_json writes f32 through ryu: the shortest digit string that reads back as the same
# f32 (ties between equally short strings go to the one nearest the exact value), laid out
# as plain decimal when the decimal exponent is moderate and as `d.ddde±x` otherwise. Both
# directions are computed here with exact rational arithmetic; reading rounds the decimal
# straight to f32 (round half to even) so that no intermediate f64 rounding can move a
# boundary value.

_F32_SIGNIFICAND_BITS = 24
_F32_MIN_EXP = -149  # exponent of the smallest subnormal, as n * 2**e with integer n
_F32_MAX_EXP = 104  # (2**24 - 1) * 2**104 is the largest finite f32


def format_f32(value: float) -> str:
    """The serde_json (ryu) spelling of `value` rounded to f32: `0.2`, `30.0`, `1e-12`...

    Raises ValueError for NaN and infinities (serde_json writes those as `null`).
    """
    try:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
    except OverflowError as err:
        raise ValueError(f"{value!r} is outside the f32 range") from err
    sign = "-" if bits >> 31 else ""
    biased_exp = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    if biased_exp == 0xFF:
        raise ValueError(f"{value!r} is not finite")
    if biased_exp == 0 and mantissa == 0:
        return sign + "0.0"
    digits, exp10 = _shortest_f32_digits(mantissa, biased_exp)
    return sign + _ryu_layout(str(digits), exp10)


def _shortest_f32_digits(mantissa: int, biased_exp: int) -> tuple[int, int]:
    """(n, k) with n * 10**k the shortest decimal inside the f32's rounding interval."""
    if biased_exp == 0:
        m2, e2 = mantissa, _F32_MIN_EXP
    else:
        m2, e2 = mantissa | (1 << 23), biased_exp - 150
    # Round-half-even on reading: boundaries belong to this value iff its significand is even.
    inclusive = m2 % 2 == 0
    # At an exact power of two the next value down is half as far away.
    lower_gap = 1 if mantissa == 0 and biased_exp > 1 else 2
    unit = Fraction(2) ** (e2 - 2)
    low = (4 * m2 - lower_gap) * unit
    high = (4 * m2 + 2) * unit
    exact = 4 * m2 * unit
    k = math.floor(math.log10(float(high)))
    while Fraction(10) ** k > high:
        k -= 1
    while Fraction(10) ** (k + 1) <= high:
        k += 1
    while True:
        scale = Fraction(10) ** k
        low_scaled, high_scaled = low / scale, high / scale
        n_low, n_high = math.ceil(low_scaled), math.floor(high_scaled)
        if not inclusive:
            if n_low == low_scaled:
                n_low += 1
            if n_high == high_scaled:
                n_high -= 1
        if n_low <= n_high:
            nearest = round(exact / scale)
            return min(max(nearest, n_low), n_high), k
        k -= 1


def _ryu_layout(digits: str, exp10: int) -> str:
    """Lay out digits * 10**exp10 the way ryu's f32 printer does."""
    length = len(digits)
    point = length + exp10  # 10**(point-1) <= value < 10**point
    if exp10 >= 0 and point <= 13:
        return digits + "0" * exp10 + ".0"
    if 0 < point <= 13:
        return digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return "0." + "0" * -point + digits
    if length == 1:
        return f"{digits}e{point - 1}"
    return f"{digits[0]}.{digits[1:]}e{point - 1}"


_JSON_NUMBER = re.compile(r"(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?")
# Exact rounding needs far fewer digits than this; the rest only matters as a sticky bit.
_MAX_SIGNIFICANT_DIGITS = 200


def parse_f32(text: str) -> float:
    """Round a JSON number to the nearest f32 (ties to even), returned as a Python float.

    Raises ValueError for text that is not a JSON number and for magnitudes beyond the f32
    range (which would round to infinity).
    """
    match = _JSON_NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a JSON number")
    sign, int_part, frac_part, exp_part = match.groups()
    frac_part = frac_part or ""
    digits = (int_part + frac_part).lstrip("0")
    negative = sign == "-"
    if not digits:
        return -0.0 if negative else 0.0
    exp_digits = (exp_part or "0").lstrip("+-").lstrip("0") or "0"
    exp_negative = exp_part is not None and exp_part.startswith("-")
    if len(exp_digits) > 6:
        # |exponent| >= 10**6: certainly out of range one way or the other.
        if exp_negative:
            return -0.0 if negative else 0.0
        raise ValueError(f"{text[:40]} is out of the f32 range")
    exp10 = (-int(exp_digits) if exp_negative else int(exp_digits)) - len(frac_part)
    stripped = digits.rstrip("0")
    exp10 += len(digits) - len(stripped)
    digits = stripped
    magnitude = len(digits) - 1 + exp10  # 10**magnitude <= |value|
    if magnitude >= 39:
        raise ValueError(f"{text[:40]} is out of the f32 range")
    if magnitude <= -47:  # below half the smallest subnormal (~7.0e-46)
        return -0.0 if negative else 0.0
    if len(digits) > _MAX_SIGNIFICANT_DIGITS:
        exp10 += len(digits) - _MAX_SIGNIFICANT_DIGITS
        digits = digits[:_MAX_SIGNIFICANT_DIGITS] + "1"
        exp10 -= 1
    rounded = _round_to_f32(Fraction(int(digits)) * Fraction(10) ** exp10)
    if rounded is None:
        raise ValueError(f"{text[:40]} is out of the f32 range")
    return -rounded if negative else rounded


def _round_to_f32(value: Fraction) -> float | None:
    """Nearest f32 to a positive rational (ties to even); None when it rounds to infinity."""
    exp = value.numerator.bit_length() - value.denominator.bit_length() - _F32_SIGNIFICAND_BITS
    while value / Fraction(2) ** exp >= 1 << _F32_SIGNIFICAND_BITS:
        exp += 1
    while value / Fraction(2) ** exp < 1 << (_F32_SIGNIFICAND_BITS - 1):
        exp -= 1
    exp = max(exp, _F32_MIN_EXP)
    significand = round(value / Fraction(2) ** exp)
    if significand == 1 << _F32_SIGNIFICAND_BITS:
        significand >>= 1
        exp += 1
    if exp > _F32_MAX_EXP:
        return None
    return math.ldexp(significand, exp)


def _f32_from_int(value: int) -> float | None:
    if value == 0:
        return 0.0
    if abs(value) >= 1 << 128:
        return None
    rounded = _round_to_f32(Fraction(abs(value)))
    if rounded is None:
        return None
    return -rounded if value < 0 else rounded


# ============================================================================ parsing


class _FloatToken:
    """A JSON number written with a fraction or exponent, kept as text for exact rounding."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _DuplicateKeyObject(dict[str, object]):
    """A JSON object in which some key occurs twice (serde rejects duplicate fields)."""

    duplicate: str = ""


def _object_from_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        marked = _DuplicateKeyObject(result)
        for key, _ in pairs:
            if key in seen:
                marked.duplicate = key
                break
            seen.add(key)
        return marked
    return result


def _reject_constant(name: str) -> NoReturn:
    raise GraphFormatError(f"invalid JSON: {name} is not a JSON value (non-finite numbers are not allowed)")


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_from_pairs,
    parse_float=_FloatToken,
    parse_constant=_reject_constant,
)


def _parse_document(text: str | bytes | bytearray | memoryview, limits: JsonLimits) -> object:
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        if len(raw) > limits.max_text_length:
            raise GraphFormatError(
                f"JSON text has {len(raw)} bytes, more than the limit of {limits.max_text_length}"
            )
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise GraphFormatError(f"JSON text is not valid UTF-8 (byte offset {err.start})") from err
    elif isinstance(text, str):
        decoded = text
        if len(decoded) > limits.max_text_length:
            raise GraphFormatError(
                f"JSON text has {len(decoded)} characters, more than the limit of {limits.max_text_length}"
            )
    else:
        raise GraphFormatError(f"expected JSON text as str or bytes, got {type(text).__name__}")
    if decoded.startswith("\ufeff"):
        raise GraphFormatError("invalid JSON: text starts with a byte-order mark (U+FEFF)")
    try:
        return _DECODER.decode(decoded)
    except GraphFormatError:
        raise
    except json.JSONDecodeError as err:
        raise GraphFormatError(f"invalid JSON: {err.msg} at line {err.lineno} column {err.colno}") from err
    except RecursionError as err:
        raise GraphFormatError("invalid JSON: nesting is too deep") from err
    except MemoryError as err:
        raise GraphFormatError("invalid JSON: out of memory while parsing") from err
    except (ValueError, OverflowError) as err:
        # E.g. integer literals beyond Python's int-from-string digit limit.
        raise GraphFormatError(f"invalid JSON: {err}") from err


# ============================================================================ decoding helpers


def _fail(path: str, message: str) -> NoReturn:
    raise GraphFormatError(f"{path}: {message}")


def _describe(value: object) -> str:
    """A short JSON-like rendering of an offending value for error messages."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return _int_text(value, "an integer with ")
    if isinstance(value, _FloatToken):
        text = value.text
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return json.dumps(shown, ensure_ascii=False)
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        keys = ", ".join(_describe(k) for k in list(value)[:3])
        more = ", ..." if len(value) > 3 else ""
        return f"an object with keys {{{keys}{more}}}" if value else "an empty object"
    return type(value).__name__


def _int_text(value: int, long_prefix: str) -> str:
    """`value` in decimal, or its digit count when long (str() of huge ints is slow or refused)."""
    if value.bit_length() <= 128:
        return str(value)
    digits = math.floor((value.bit_length() - 1) * math.log10(2)) + 1
    if digits + 1 < 4000:
        digits = len(str(abs(value)))
        return f"{long_prefix}{digits} digits"
    return f"{long_prefix}about {digits} digits"


def _did_you_mean(name: str, choices: Iterable[str]) -> str:
    for choice in choices:
        if choice.lower() == name.lower():
            return f' (names are case-sensitive; did you mean "{choice}"?)'
    return ""


def _object(value: object, path: str, what: str = "an object") -> dict[str, object]:
    if not isinstance(value, dict):
        _fail(path, f"expected {what}, got {_describe(value)}")
    if isinstance(value, _DuplicateKeyObject):
        _fail(path, f"duplicate key {_describe(value.duplicate)}")
    return value


def _array(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        _fail(path, f"expected an array, got {_describe(value)}")
    return value


_MISSING = object()


def _required(obj: dict[str, object], key: str, path: str) -> object:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        _fail(path, f'missing required field "{key}"')
    return value


def _tagged(value: object, path: str, what: str) -> tuple[str, object]:
    """Split serde's externally tagged enum form: "Variant" or {"Variant": content}."""
    if isinstance(value, str):
        return value, _MISSING
    if isinstance(value, dict):
        obj = _object(value, path)
        if len(obj) == 1:
            ((tag, content),) = obj.items()
            return tag, content
        _fail(path, f"expected {what} as a string or an object with exactly one key, got {_describe(value)}")
    _fail(path, f"expected {what} as a string or an object with exactly one key, got {_describe(value)}")


# ============================================================================ field codecs


class _Codec:
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


class _IntCodec(_Codec):
    def __init__(self, rust_type: str, low: int, high: int) -> None:
        self.rust_type = rust_type
        self.low = low
        self.high = high
        self.expected = "a non-negative integer" if low == 0 else "an integer"

    def _check(self, number: int | None, original: object, path: str) -> int:
        if number is None:
            _fail(path, f"expected {self.expected}, got {_describe(original)}")
        if number < self.low and self.low == 0:
            _fail(path, f"expected {self.expected}, got {_describe(number)}")
        if not self.low <= number <= self.high:
            _fail(path, f"integer {_int_text(number, 'with ')} does not fit in {self.rust_type}")
        return number

    def decode(self, value: object, path: str) -> int:
        return self._check(value if type(value) is int else None, value, path)

    def encode(self, value: object, path: str) -> int:
        return self._check(_as_int(value), value, path)


U32 = _IntCodec("u32", 0, U32_MAX)
USIZE = _IntCodec("usize", 0, U64_MAX)
I32 = _IntCodec("i32", I32_MIN, I32_MAX)
I64 = _IntCodec("i64", I64_MIN, I64_MAX)


class _RawNumber:
    """Pre-formatted number text for the emitter."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _F32Codec(_Codec):
    def decode(self, value: object, path: str) -> float:
        if value is None:
            _fail(path, "expected a number, got null (only optional fields may be null)")
        if type(value) is int:
            result = _f32_from_int(value)
        elif isinstance(value, _FloatToken):
            try:
                result = parse_f32(value.text)
            except ValueError:
                result = None
        else:
            _fail(path, f"expected a number, got {_describe(value)}")
        if result is None:
            _fail(path, f"number {_describe(value)} is out of the f32 range")
        return result

    def encode(self, value: object, path: str) -> _RawNumber:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            _fail(path, f"expected a float, got {type(value).__name__}")
        number = float(value)
        if not math.isfinite(number):
            _fail(path, f"cannot write non-finite float {number!r} (upstream JSON turns it into null)")
        try:
            return _RawNumber(format_f32(number))
        except ValueError:
            _fail(path, f"float {number!r} is outside the f32 range")


F32 = _F32Codec()


class _BoolCodec(_Codec):
    def decode(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            _fail(path, f"expected true or false, got {_describe(value)}")
        return value

    def encode(self, value: object, path: str) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            _fail(path, f"expected a bool, got {type(value).__name__}")
        return bool(value)


BOOL = _BoolCodec()


def _check_unicode(text: str, path: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        _fail(path, "string contains a lone surrogate (not valid Unicode)")
    return text


class _StrCodec(_Codec):
    def decode(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {_describe(value)}")
        return _check_unicode(value, path)

    def encode(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {type(value).__name__}")
        return _check_unicode(value, path)


STR = _StrCodec()

class _EnumCodec(_Codec):
    def __init__(self, enum_type: type[enum.Enum], label: str) -> None:
        self.enum_type = enum_type
        self.label = label
        self.by_name = {member.value: member for member in enum_type}

    def decode(self, value: object, path: str) -> object:
        if not isinstance(value, str):
            _fail(path, f"expected a {self.label} variant name (a string), got {_describe(value)}")
        member = self.by_name.get(value)
        if member is None:
            _fail(
                path,
                f"unknown {self.label} variant {_describe(value)}{_did_you_mean(value, self.by_name)}",
            )
        return member

    def encode(self, value: object, path: str) -> str:
        if not isinstance(value, self.enum_type):
            _fail(path, f"expected a {self.enum_type.__name__}, got {value!r}")
        return str(value.value)


DTYPE = _EnumCodec(DType, "DType")
ACTIVATION = _EnumCodec(ActivationKind, "Activation")


class _OptionCodec(_Codec):
    optional = True

    def __init__(self, inner: _Codec) -> None:
        self.inner = inner

    def decode(self, value: object, path: str) -> object:
        return None if value is None else self.inner.decode(value, path)

    def encode(self, value: object, path: str) -> object:
        return None if value is None else self.inner.encode(value, path)


class _VecCodec(_Codec):
    def __init__(self, inner: _Codec) -> None:
        self.inner = inner

    def decode(self, value: object, path: str) -> tuple[object, ...]:
        items = _array(value, path)
        return tuple(self.inner.decode(item, f"{path}[{i}]") for i, item in enumerate(items))

    def encode(self, value: object, path: str) -> list[object]:
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
            _fail(path, f"expected a sequence, got {type(value).__name__}")
        return [self.inner.encode(item, f"{path}[{i}]") for i, item in enumerate(value)]


_MASK_UNIT_KINDS = {t.value: t for t in MaskType if t is not MaskType.SLIDING_WINDOW}


class _MaskKindCodec(_Codec):
    def decode(self, value: object, path: str) -> MaskKind:
        tag, content = _tagged(value, path, "a MaskKind")
        if tag == MaskType.SLIDING_WINDOW.value:
            if content is _MISSING:
                _fail(path, 'SlidingWindow needs its window: {"SlidingWindow": n}')
            return MaskKind.sliding_window(USIZE.decode(content, f"{path}.SlidingWindow"))
        kind = _MASK_UNIT_KINDS.get(tag)
        if kind is None:
            choices = [*_MASK_UNIT_KINDS, MaskType.SLIDING_WINDOW.value]
            _fail(path, f"unknown MaskKind variant {_describe(tag)}{_did_you_mean(tag, choices)}")
        if content is not _MISSING and content is not None:
            _fail(f"{path}.{tag}", f"MaskKind {tag} takes no value, got {_describe(content)}")
        return MaskKind(kind)

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, MaskKind):
            _fail(path, f"expected a MaskKind, got {value!r}")
        if value.type is MaskType.SLIDING_WINDOW:
            return {MaskType.SLIDING_WINDOW.value: USIZE.encode(value.window, f"{path}.SlidingWindow")}
        return value.type.value


_QUANT_KINDS = {k.value: k for k in QuantKind}


class _QuantSchemeCodec(_Codec):
    def decode(self, value: object, path: str) -> QuantScheme:
        tag, content = _tagged(value, path, "a QuantScheme")
        kind = _QUANT_KINDS.get(tag)
        if kind is None:
            _fail(path, f"unknown QuantScheme variant {_describe(tag)}{_did_you_mean(tag, _QUANT_KINDS)}")
        if not kind.has_block_size:
            if content is not _MISSING and content is not None:
                _fail(f"{path}.{tag}", f"QuantScheme {tag} takes no value, got {_describe(content)}")
            return QuantScheme(kind)
        if content is _MISSING:
            _fail(path, f'{tag} needs its block size: {{"{tag}": {{"block_size": n}}}}')
        inner_path = f"{path}.{tag}"
        body = _object(content, inner_path)
        block_size = USIZE.decode(_required(body, "block_size", inner_path), f"{inner_path}.block_size")
        if block_size < 1:
            _fail(f"{inner_path}.block_size", "block_size must be at least 1, got 0")
        return QuantScheme(kind, block_size)

    def encode(self, value: object, path: str) -> object:
        if not isinstance(value, QuantScheme):
            _fail(path, f"expected a QuantScheme, got {value!r}")
        tag = value.kind.value
        if value.kind.has_block_size:
            return {tag: {"block_size": USIZE.encode(value.block_size, f"{path}.{tag}.block_size")}}
        return tag


# ============================================================================ op table


@dataclass(frozen=True)
class _OpForm:
    """How one Op variant is spelled: unit ("MatMul"), newtype ({"Binary": "Add"}) or struct."""

    op_type: type[Op]
    form: str  # "unit" | "newtype" | "struct"
    fields: tuple[tuple[str, _Codec], ...] = ()


def _struct(op_name: str, *op_fields: tuple[str, _Codec]) -> _OpForm:
    return _OpForm(OP_TYPES[op_name], "struct", op_fields)


_USIZE_VEC = _VecCodec(USIZE)

#: JSON spelling of every op, keyed by variant name. Struct fields are listed in the
#: dataclass declaration order, which is also serde's field order (tests check both).
OP_FORMS: dict[str, _OpForm] = {
    form.op_type.type_name: form
    for form in (
        _struct("Input", ("name", STR)),
        _struct("Param", ("name", STR)),
        _struct("Constant", ("data", _VecCodec(USIZE))),  # decoded specially, see _decode_constant
        _OpForm(OP_TYPES["Activation"], "newtype", (("kind", ACTIVATION),)),
        _struct("Cast", ("to", DTYPE)),
        _OpForm(OP_TYPES["Binary"], "newtype", (("op", _EnumCodec(BinaryOp, "BinaryOp")),)),
        _OpForm(OP_TYPES["Compare"], "newtype", (("op", _EnumCodec(CmpOp, "CmpOp")),)),
        _OpForm(OP_TYPES["Where"], "unit"),
        _OpForm(OP_TYPES["MatMul"], "unit"),
        _struct("LoraMatMul", ("scale", F32)),
        _struct("FusedMatMulBiasAct", ("activation", _OptionCodec(ACTIVATION))),
        _struct("Quantize", ("axis", _OptionCodec(USIZE)), ("scales", _VecCodec(F32)), ("zero_points", _VecCodec(I32))),
        _struct("Dequantize", ("axis", _OptionCodec(USIZE)), ("scales", _VecCodec(F32)), ("zero_points", _VecCodec(I32))),
        _struct("DequantMatMul", ("scheme", _QuantSchemeCodec())),
        _struct("LayerNorm", ("axis", I32), ("eps", F32)),
        _struct("RmsNorm", ("axis", I32), ("eps", F32)),
        _struct("GroupNorm", ("num_groups", USIZE), ("eps", F32)),
        _struct("FusedResidualLN", ("has_bias", BOOL), ("eps", F32)),
        _struct("FusedResidualRmsNorm", ("has_bias", BOOL), ("eps", F32)),
        _struct("Softmax", ("axis", I32)),
        _struct("Reduce", ("op", _EnumCodec(ReduceOp, "ReduceOp")), ("axes", _USIZE_VEC), ("keep_dim", BOOL)),
        _struct("Cumsum", ("axis", I32), ("exclusive", BOOL)),
        _struct("TopK", ("k", USIZE)),
        _struct("Reshape", ("new_shape", _VecCodec(I64))),
        _struct("Transpose", ("perm", _USIZE_VEC)),
        _struct("Narrow", ("axis", USIZE), ("start", USIZE), ("len", USIZE)),
        _struct("Concat", ("axis", USIZE)),
        _struct("Expand", ("target_shape", _VecCodec(I64))),
        _struct("Gather", ("axis", USIZE)),
        _struct("Rope", ("head_dim", USIZE), ("n_rot", USIZE)),
        _struct(
            "Attention",
            ("num_heads", USIZE),
            ("head_dim", USIZE),
            ("mask_kind", _MaskKindCodec()),
            ("score_scale", _OptionCodec(F32)),
            ("attn_logit_softcap", _OptionCodec(F32)),
        ),
        _struct(
            "AttentionBackward",
            ("num_heads", USIZE),
            ("head_dim", USIZE),
            ("mask_kind", _MaskKindCodec()),
            ("wrt", _EnumCodec(AttentionBwdWrt, "AttentionBwdWrt")),
        ),
        _struct("FusedSwiGLU", ("cast_to", _OptionCodec(DTYPE)), ("gate_first", BOOL)),
        _struct(
            "FusedAttentionBlock", ("num_heads", USIZE), ("head_dim", USIZE), ("has_bias", BOOL), ("has_rope", BOOL)
        ),
        _struct(
            "FusedTransformerLayer",
            ("num_heads", USIZE),
            ("head_dim", USIZE),
            ("intermediate_size", USIZE),
            ("eps1", F32),
            ("eps2", F32),
            ("activation", ACTIVATION),
            ("has_bias", BOOL),
        ),
        _struct(
            "Conv",
            ("kernel_size", _USIZE_VEC),
            ("stride", _USIZE_VEC),
            ("padding", _USIZE_VEC),
            ("dilation", _USIZE_VEC),
            ("groups", USIZE),
        ),
        _struct(
            "Pool",
            ("kind", _EnumCodec(ReduceOp, "ReduceOp")),
            ("kernel_size", _USIZE_VEC),
            ("stride", _USIZE_VEC),
            ("padding", _USIZE_VEC),
        ),
    )
}


# ============================================================================ graph decoding


@dataclass
class _DecodeState:
    limits: JsonLimits
    constant_bytes: int = 0


def _decode_dim(value: object, path: str) -> Dim:
    tag, content = _tagged(value, path, 'a dim ({"Static": n} or {"Dynamic": symbol})')
    if content is _MISSING:
        _fail(path, f'expected {{"Static": n}} or {{"Dynamic": symbol}}, got {_describe(value)}')
    if tag == "Static":
        return Static(USIZE.decode(content, f"{path}.Static"))
    if tag == "Dynamic":
        return Dynamic(U32.decode(content, f"{path}.Dynamic"))
    _fail(path, f'unknown Dim variant {_describe(tag)} (expected "Static" or "Dynamic")')


def _static_numel(dims: Sequence[Dim], cap: int) -> int:
    """Element count over the static dims, or cap + 1 as soon as it exceeds cap."""
    sizes = [d.size for d in dims if isinstance(d, Static)]
    if 0 in sizes:
        return 0
    numel = 1
    for size in sizes:
        numel *= size
        if numel > cap:
            return cap + 1
    return numel


def _decode_shape(value: object, path: str, state: _DecodeState) -> Shape:
    obj = _object(value, path)
    dims_path = f"{path}.dims"
    raw_dims = _array(_required(obj, "dims", path), dims_path)
    dims = tuple(_decode_dim(d, f"{dims_path}[{i}]") for i, d in enumerate(raw_dims))
    dtype = DTYPE.decode(_required(obj, "dtype", path), f"{path}.dtype")
    assert isinstance(dtype, DType)
    cap = state.limits.max_numel
    if _static_numel(dims, cap) > cap:
        _fail(dims_path, f"shape has more than {cap} elements (the configured limit)")
    return Shape(dims, dtype)


def _decode_origin(value: object, path: str) -> NodeOrigin | None:
    if value is None:
        return None
    obj = _object(value, path)
    opt_u32, opt_str = _OptionCodec(U32), _OptionCodec(STR)
    hir = opt_u32.decode(obj.get("hir"), f"{path}.hir")
    label = opt_str.decode(obj.get("label"), f"{path}.label")
    pass_name = opt_str.decode(obj.get("pass"), f"{path}.pass")
    assert hir is None or isinstance(hir, int)
    assert label is None or isinstance(label, str)
    assert pass_name is None or isinstance(pass_name, str)
    return NodeOrigin(hir=hir, label=label, pass_name=pass_name)


def _byte_at_fault(items: list[object]) -> tuple[int, object]:
    for i, item in enumerate(items):
        if type(item) is not int or not 0 <= item <= 255:
            return i, item
    raise AssertionError("no offending byte")


def _decode_constant(content: object, path: str, shape: Shape, state: _DecodeState) -> Constant:
    body = _object(content, path)
    data_path = f"{path}.data"
    items = _array(_required(body, "data", path), data_path)
    if not shape.is_static:
        _fail(path, f"a Constant needs a static shape to size its payload, got {shape}")
    expected = _static_numel(shape.dims, state.limits.max_numel) * shape.dtype.itemsize
    budget = state.limits.max_constant_bytes - state.constant_bytes
    if expected > budget:
        _fail(
            data_path,
            f"constant payloads would total more than {state.limits.max_constant_bytes} bytes"
            f" (this one needs {expected}; the configured limit)",
        )
    if len(items) != expected:
        _fail(
            data_path,
            f"payload has {len(items)} bytes but shape {shape} needs {expected}"
            f" ({shape.numel()} elements x {shape.dtype.itemsize} bytes)",
        )
    # set(map(type, ...)) and bytes() run in C; the per-item loop only runs to explain a failure.
    if set(map(type, items)) - {int}:
        index, item = _byte_at_fault(items)
        _fail(f"{data_path}[{index}]", f"expected a byte value 0..255, got {_describe(item)}")
    try:
        payload = bytes(items)  # type: ignore[arg-type]
    except ValueError:
        index, item = _byte_at_fault(items)
        _fail(f"{data_path}[{index}]", f"expected a byte value 0..255, got {_describe(item)}")
    state.constant_bytes += len(payload)
    return Constant(payload)


def _decode_op(value: object, path: str, shape: Shape, state: _DecodeState) -> Op:
    tag, content = _tagged(value, path, "an op")
    form = OP_FORMS.get(tag)
    if form is None:
        _fail(path, f"unknown or unsupported op variant {_describe(tag)}{_did_you_mean(tag, OP_FORMS)}")
    op_path = f"{path}.{tag}"
    if form.form == "unit":
        if content is not _MISSING and content is not None:
            _fail(op_path, f"{tag} takes no attributes, got {_describe(content)}")
        return form.op_type()
    if content is _MISSING:
        _fail(path, f'{tag} needs its attributes: {{"{tag}": ...}}')
    if form.op_type is Constant:
        return _decode_constant(content, op_path, shape, state)
    kwargs: dict[str, object] = {}
    if form.form == "newtype":
        ((field_name, codec),) = form.fields
        kwargs[field_name] = codec.decode(content, op_path)
    else:
        body = _object(content, op_path)
        for field_name, codec in form.fields:
            raw = body.get(field_name, _MISSING)
            if raw is _MISSING:
                if not codec.optional:
                    _fail(op_path, f'missing required field "{field_name}"')
                raw = None
            kwargs[field_name] = codec.decode(raw, f"{op_path}.{field_name}")
    try:
        return form.op_type(**kwargs)
    except (ValueError, TypeError) as err:
        raise GraphFormatError(f"{op_path}: {err}") from err


_NodeFields = tuple[Op, tuple[int, ...], Shape, "str | None", "NodeOrigin | None"]


def _decode_node(value: object, index: int, state: _DecodeState) -> _NodeFields:
    path = f"nodes[{index}]"
    obj = _object(value, path)
    node_id = U32.decode(_required(obj, "id", path), f"{path}.id")
    if node_id != index:
        # Upstream consumers look nodes up by position and never read this field, so a
        # mismatch means the producer and its consumers disagree about which node an input
        # id names. Renumbering would silently pick one reading; refusing makes the
        # inconsistency visible instead.
        _fail(f"{path}.id", f"node id {node_id} differs from its position {index} in nodes")
    inputs_path = f"{path}.inputs"
    raw_inputs = _array(_required(obj, "inputs", path), inputs_path)
    inputs: list[int] = []
    for pos, raw in enumerate(raw_inputs):
        input_id = U32.decode(raw, f"{inputs_path}[{pos}]")
        if input_id >= index:
            _fail(
                f"{inputs_path}[{pos}]",
                f"node {input_id} is not defined before node {index}"
                " (inputs must name earlier nodes; forward references and cycles are not allowed)",
            )
        inputs.append(input_id)
    shape = _decode_shape(_required(obj, "shape", path), f"{path}.shape", state)
    name = _OptionCodec(STR).decode(obj.get("name"), f"{path}.name")
    assert name is None or isinstance(name, str)
    origin = _decode_origin(obj.get("origin"), f"{path}.origin")
    op = _decode_op(_required(obj, "op", path), f"{path}.op", shape, state)
    return op, tuple(inputs), shape, name, origin


def _decode_graph(document: object, limits: JsonLimits) -> Graph:
    root = "graph"
    obj = _object(document, root, "a JSON object at the top level")
    name = STR.decode(_required(obj, "name", root), "name")
    raw_nodes = _array(_required(obj, "nodes", root), "nodes")
    raw_outputs = _array(_required(obj, "outputs", root), "outputs")
    state = _DecodeState(limits)
    graph = Graph(name)
    for index, raw_node in enumerate(raw_nodes):
        op, inputs, shape, node_name, origin = _decode_node(raw_node, index, state)
        try:
            graph.add_node(op, inputs, shape, name=node_name, origin=origin)
        except GraphError as err:
            # The GraphError text already names the node id, name and op.
            raise GraphFormatError(f"nodes[{index}]: {err}") from err
        except (ValueError, TypeError, IndexError, KeyError, ArithmeticError, AssertionError) as err:
            # IR validation is meant to raise GraphError only; keep the loader's promise of a
            # single error type even if a validation rule trips over a hostile value (the
            # original exception stays attached as the cause).
            raise GraphFormatError(
                f"nodes[{index}] ({op.type_name}): validation failed: {type(err).__name__}: {err}"
            ) from err
    outputs: list[int] = []
    for pos, raw in enumerate(raw_outputs):
        output_id = U32.decode(raw, f"outputs[{pos}]")
        if output_id >= len(raw_nodes):
            _fail(f"outputs[{pos}]", f"node {output_id} does not exist (the graph has {len(raw_nodes)} nodes)")
        outputs.append(output_id)
    graph.set_outputs(outputs)
    return graph


# ============================================================================ public API


def graph_from_json(text: str | bytes, *, limits: JsonLimits = DEFAULT_LIMITS) -> Graph:
    """Load a graph from upstream RLX's serde JSON (compact or pretty).

    Every node goes through :meth:`Graph.add_node`, so the IR checks apply. Any defect
    raises :class:`GraphFormatError` naming the JSON path at fault.
    """
    document = _parse_document(text, limits)
    try:
        return _decode_graph(document, limits)
    except RecursionError as err:
        raise GraphFormatError("graph is nested too deeply to process") from err
    except MemoryError as err:
        raise GraphFormatError("out of memory while building the graph") from err


def graph_from_json_file(path: str | os.PathLike[str], *, limits: JsonLimits = DEFAULT_LIMITS) -> Graph:
    """Load a graph from a JSON file. OS errors (missing file...) propagate unchanged."""
    file_path = Path(path)
    size = file_path.stat().st_size
    if size > limits.max_text_length:
        raise GraphFormatError(f"{file_path}: file has {size} bytes, more than the limit of {limits.max_text_length}")
    data = file_path.read_bytes()
    try:
        return graph_from_json(data, limits=limits)
    except GraphFormatError as err:
        raise GraphFormatError(f"{file_path}: {err}") from err


def graph_to_json(graph: Graph, *, indent: int | None = None) -> str:
    """Serialize exactly as upstream's serde_json would.

    `indent=None` gives `serde_json::to_string`'s compact form; an int gives
    `to_string_pretty`'s layout with that many spaces (upstream uses 2). Values upstream
    cannot represent (non-finite floats, out-of-range integers, payloads not matching their
    shape) raise GraphFormatError naming the node and field.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"expected a Graph, got {type(graph).__name__}")
    if indent is not None and (isinstance(indent, bool) or not isinstance(indent, int) or indent < 0):
        raise ValueError(f"indent must be None or a non-negative int, got {indent!r}")
    document = {
        "name": STR.encode(graph.name, "name"),
        "nodes": [_encode_node(node, index) for index, node in enumerate(graph.nodes)],
        "outputs": [U32.encode(output_id, f"outputs[{pos}]") for pos, output_id in enumerate(graph.outputs)],
    }
    out: list[str] = []
    _emit(document, out, None if indent is None else " " * indent, 0)
    return "".join(out)


def graph_to_json_file(graph: Graph, path: str | os.PathLike[str], *, indent: int | None = None) -> None:
    """Write `graph_to_json(graph, indent=indent)` as UTF-8 with a final newline."""
    text = graph_to_json(graph, indent=indent)
    Path(path).write_bytes((text + "\n").encode("utf-8"))


# ============================================================================ encoding


def _encode_node(node: Node, index: int) -> dict[str, object]:
    path = f"nodes[{index}]"
    if node.id != index:
        _fail(f"{path}.id", f"node id {node.id} differs from its position {index}")
    return {
        "id": U32.encode(node.id, f"{path}.id"),
        "op": _encode_op(node.op, node.shape, f"{path}.op"),
        "inputs": [U32.encode(i, f"{path}.inputs[{pos}]") for pos, i in enumerate(node.inputs)],
        "shape": _encode_shape(node.shape, f"{path}.shape"),
        "name": _OptionCodec(STR).encode(node.name, f"{path}.name"),
        "origin": _encode_origin(node.origin, f"{path}.origin"),
    }


def _encode_shape(shape: Shape, path: str) -> dict[str, object]:
    dims: list[object] = []
    for i, dim in enumerate(shape.dims):
        dim_path = f"{path}.dims[{i}]"
        if isinstance(dim, Static):
            dims.append({"Static": USIZE.encode(dim.size, f"{dim_path}.Static")})
        elif isinstance(dim, Dynamic):
            dims.append({"Dynamic": U32.encode(dim.symbol, f"{dim_path}.Dynamic")})
        else:
            _fail(dim_path, f"expected Static or Dynamic, got {dim!r}")
    return {"dims": dims, "dtype": DTYPE.encode(shape.dtype, f"{path}.dtype")}


def _encode_origin(origin: NodeOrigin | None, path: str) -> object:
    if origin is None:
        return None
    return {
        "hir": _OptionCodec(U32).encode(origin.hir, f"{path}.hir"),
        "label": _OptionCodec(STR).encode(origin.label, f"{path}.label"),
        "pass": _OptionCodec(STR).encode(origin.pass_name, f"{path}.pass"),
    }


def _encode_op(op: Op, shape: Shape, path: str) -> object:
    form = OP_FORMS.get(op.type_name)
    if form is None or type(op) is not form.op_type:
        _fail(path, f"no JSON form for op {type(op).__name__}")
    tag = op.type_name
    op_path = f"{path}.{tag}"
    if form.form == "unit":
        return tag
    if isinstance(op, Constant):
        data = op.data
        if shape.is_static and len(data) != shape.numel() * shape.dtype.itemsize:
            _fail(
                f"{op_path}.data",
                f"payload has {len(data)} bytes but shape {shape} needs {shape.numel() * shape.dtype.itemsize}",
            )
        return {tag: {"data": bytes(data)}}
    if form.form == "newtype":
        ((field_name, codec),) = form.fields
        return {tag: codec.encode(getattr(op, field_name), op_path)}
    return {
        tag: {
            field_name: codec.encode(getattr(op, field_name), f"{op_path}.{field_name}")
            for field_name, codec in form.fields
        }
    }


# serde_json escapes exactly what json's non-ASCII-preserving encoder escapes: quote,
# backslash and C0 controls (short forms for \b \f \n \r \t, else lowercase \u00XX).
_quote: Callable[[str], str] = json.encoder.encode_basestring
_BYTE_TEXT = [str(i) for i in range(256)]


def _emit(value: object, out: list[str], indent: str | None, depth: int) -> None:
    """Write `value` in serde_json's compact (indent None) or pretty layout."""
    if isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        if indent is None:
            out.append("{")
            for i, (key, item) in enumerate(value.items()):
                out.append(("," if i else "") + _quote(key) + ":")
                _emit(item, out, indent, depth + 1)
            out.append("}")
        else:
            inner = "\n" + indent * (depth + 1)
            out.append("{")
            for i, (key, item) in enumerate(value.items()):
                out.append(("," if i else "") + inner + _quote(key) + ": ")
                _emit(item, out, indent, depth + 1)
            out.append("\n" + indent * depth + "}")
    elif isinstance(value, (list, bytes)):
        if not value:
            out.append("[]")
            return
        if isinstance(value, bytes):
            # Constant payloads can be large: join the byte values in one C-level pass.
            separator = "," if indent is None else ",\n" + indent * (depth + 1)
            head = "[" if indent is None else "[\n" + indent * (depth + 1)
            tail = "]" if indent is None else "\n" + indent * depth + "]"
            out.append(head + separator.join(map(_BYTE_TEXT.__getitem__, value)) + tail)
            return
        if indent is None:
            out.append("[")
            for i, item in enumerate(value):
                if i:
                    out.append(",")
                _emit(item, out, indent, depth + 1)
            out.append("]")
        else:
            inner = "\n" + indent * (depth + 1)
            out.append("[")
            for i, item in enumerate(value):
                out.append(("," if i else "") + inner)
                _emit(item, out, indent, depth + 1)
            out.append("\n" + indent * depth + "]")
    elif isinstance(value, str):
        out.append(_quote(value))
    elif value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, _RawNumber):
        out.append(value.text)
    else:
        raise AssertionError(f"unexpected value in JSON document: {value!r}")

