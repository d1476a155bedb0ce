"""The words of a scheme's text form (`rlx_mil.compress.schemes.parse_scheme`): its modifiers,
one per kind."""

from __future__ import annotations

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
