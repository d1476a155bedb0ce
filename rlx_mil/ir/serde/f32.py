"""The f32 spelling of upstream JSON: serde_json writes f32 through ryu.

ryu prints the shortest digit string that reads back as the same f32 (ties between equally
short strings go to the one nearest the exact value), laid out as plain decimal when the
decimal exponent is moderate and as `d.ddde±x` otherwise. Both directions are computed here
with exact rational arithmetic; reading rounds the decimal straight to f32 (round half to
even) so that no intermediate f64 rounding can move a boundary value.
"""

from __future__ import annotations

import math
import re
import struct
from fractions import Fraction

__all__ = ["f32_from_int", "format_f32", "parse_f32"]


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


def f32_from_int(value: int) -> float | None:
    if value == 0:
        return 0.0
    if abs(value) >= 1 << 128:
        return None
    rounded = _round_to_f32(Fraction(abs(value)))
    if rounded is None:
        return None
    return -rounded if value < 0 else rounded

