"""Sizes and counts as people read them: the one byte formatter every message and summary uses,
the one parser of sizes people type (`--chunk-bytes 1GB`), and counts with their noun in the
singular or plural (`counted`)."""

from __future__ import annotations

import re
from fractions import Fraction

from rlx_mil.errors import InvalidOptionError

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")

#: Suffix (lower case) -> bytes: SI powers of 1000 (`KB`, `MB`, `GB`, `TB`) and IEC powers of
#: 1024 (`KiB`, `MiB`, `GiB`, `TiB`); a bare number (or `B`) is bytes.
SIZE_SUFFIXES: dict[str, int] = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def human_bytes(n: float) -> str:
    """`n` bytes in binary units: '512 B', '1.5 KiB', '2.3 GiB'."""
    if abs(n) < 1024:
        return f"{n:.0f} B"
    size = float(n)
    for unit in _UNITS:
        size /= 1024
        if abs(size) < 1024 or unit == _UNITS[-1]:
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def counted(count: int, word: str, plural: str | None = None) -> str:
    """`count` `word`s in a sentence: "1 weight", "0 weights", "2 weights", "1,234 weights";
    `plural` where adding an s is not it ("1 entry", "2 entries"). A count of a total says
    "1 of 3 weights" / "1 of 1 weight": f"{n} of {counted(total, 'weight')}"."""
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def parse_bytes(text: str | int, what: str = "size") -> int:
    """A byte count from `text`: an int, or a number with an SI (`200KB`, `1GB` = 10**9) or IEC
    (`1GiB` = 2**30) suffix, case-insensitive. The result must be >= 1; anything else is an
    InvalidOptionError naming `what`."""
    if isinstance(text, bool):
        raise InvalidOptionError(f"{what} must be a size such as 200KB, 1GB or 1GiB, got {text!r}")
    if isinstance(text, int):
        value = text
    elif isinstance(text, str):
        match = _SIZE.fullmatch(text)
        factor = SIZE_SUFFIXES.get(match.group(2).lower()) if match else None
        if match is None or factor is None:
            raise InvalidOptionError(
                f"{what} must be a size such as 200KB, 1GB (10^9 bytes) or 1GiB (2^30 bytes), got {text!r}"
            )
        number = match.group(1)
        value = int(Fraction(number) * factor)
    else:
        raise InvalidOptionError(f"{what} must be a size such as 200KB, 1GB or 1GiB, got {type(text).__name__}")
    if value < 1:
        raise InvalidOptionError(f"{what} must be at least 1 byte, got {text!r}")
    return value
