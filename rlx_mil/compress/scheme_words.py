"""The words of a scheme's text form (`rlx_mil.compress.schemes.parse_scheme`): its modifiers,
one per kind."""

from __future__ import annotations

import re
from typing import Any

from rlx_mil.errors import InvalidOptionError


class Modifiers:
    """The modifiers of one scheme text, one per kind (symmetry, granularity): a second one of
    the same kind that says otherwise (`int8-tensor-channel`, `int8-sym-asym`) is refused, not
    resolved by order."""

    def __init__(self, text: str, base: str) -> None:
        self.text = text
        self.base = base
        self.values: dict[str, tuple[str, Any]] = {}

    def set(self, kind: str, word: str, value: Any) -> None:
        prev = self.values.get(kind)
        if prev is not None and prev[1] != value:
            raise InvalidOptionError(
                f"compression scheme {self.text!r}: modifiers {prev[0]!r} and {word!r} contradict each other"
                f" (one {kind} per scheme)"
            )
        self.values[kind] = (word, value)

    def get(self, kind: str, default: Any) -> Any:
        return self.values[kind][1] if kind in self.values else default


#: ``SCHEME+rN``: the suffix of a scheme carrying a rank-N correction of its error.
_RANK = re.compile(r"\+\s*r(\d+)\s*$", re.IGNORECASE)


def split_rank(text: str) -> tuple[str, int]:
    """(the scheme text before ``+rN``, N), N 0 without the suffix; a '+' that is not ``+rN``
    (N >= 1) is refused."""
    if "+" not in text:
        return text, 0
    match = _RANK.search(text)
    body = text[:match.start()] if match else text
    if match is None or "+" in body or int(match.group(1)) < 1:
        raise InvalidOptionError(f"compression scheme {text!r}: a '+' takes a low-rank correction '+rN' with N >= 1"
                                 " (e.g. lut4-scaled+r4), once, at the end")
    return body, int(match.group(1))


def check_rank(rank: object) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise InvalidOptionError(f"a low-rank correction's rank must be a non-negative integer, got {rank!r}")


def rank_suffix(rank: int) -> str:
    return f"+r{rank}" if rank else ""
