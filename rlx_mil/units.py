"""Sizes as people read them: the one byte formatter every message and summary uses."""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


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
