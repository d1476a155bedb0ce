"""Constant payloads taken out of graph JSON text before it is parsed, to bound memory.

Upstream writes a `Constant`'s bytes as a JSON array of byte values (`[12,0,255,...]`), about
four characters per byte. Parsed by `json`, such an array costs 8 bytes of list slot per
payload byte on top of the text and its decoded `str`: a 200 MB graph file peaked near 900 MB.
Here each `"Constant": {"data": [...]}` array of well-formed byte values is decoded straight
from the raw bytes with NumPy, in bounded chunks, into the payload's own `bytes`, and replaced
in the text by a string key no document can forge (it holds a random nonce). The remaining
text (the graph's structure) is small and goes to the ordinary parser; the reader then takes
each payload by its key.

Only arrays that are plainly valid are taken: digits, commas and JSON whitespace, each value
0..255 without leading zeros. Anything else stays in the text for the ordinary parser, so every
defect keeps its exact error. A caller that meets any error on the extracted form re-reads the
original text the ordinary way, so the messages of hostile documents never depend on this.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

import numpy as np

#: Text characters decoded per NumPy pass: temporaries stay near 30x this (a few MB), whatever the payload.
CHUNK_CHARS = 1 << 18

_WHITESPACE = b" \t\n\r"
_OPENING = re.compile(
    rb'"Constant"[ \t\n\r]*:[ \t\n\r]*\{[ \t\n\r]*"data"[ \t\n\r]*:[ \t\n\r]*\['
)

# Character classes: 0 anything else, 1 digit, 2 comma, 3 JSON whitespace.
_CLASS = np.zeros(256, np.uint8)
_CLASS[ord("0"): ord("9") + 1] = 1
_CLASS[ord(",")] = 2
_CLASS[list(_WHITESPACE)] = 3


@dataclass
class ExtractedPayloads:
    """The text with payload arrays replaced by keys, and the payloads by key."""

    skeleton: bytes
    payloads: dict[str, bytes] = field(default_factory=dict)

    def take(self, key: object) -> bytes | None:
        """The payload a key stands for (once), or None for any other value."""
        if isinstance(key, str):
            return self.payloads.pop(key, None)
        return None


def _decode_chunk(text: np.ndarray) -> np.ndarray | None:
    """Byte values of `text` (comma-separated, optional whitespace), or None if it is not
    exactly such a list with at least one value."""
    classes = _CLASS[text]
    if not classes.all():
        return None
    kept = np.flatnonzero(classes != 3)
    if not kept.size:
        return None
    chars = text[kept]
    digit = classes[kept] == 1
    # Whitespace between two digits splits a number: "1 2" is not JSON.
    if (digit[:-1] & digit[1:] & (np.diff(kept) > 1)).any():
        return None
    commas = np.flatnonzero(~digit)
    starts = np.concatenate(([0], commas + 1))
    ends = np.concatenate((commas, [chars.size]))
    lengths = ends - starts
    if lengths.min() < 1 or lengths.max() > 3:
        return None
    values = chars.astype(np.int16) - ord("0")
    if ((lengths > 1) & (values[np.minimum(starts, chars.size - 1)] == 0)).any():
        return None  # a leading zero
    number = values[ends - 1]
    number = number + 10 * np.where(lengths >= 2, values[np.maximum(ends - 2, 0)], 0)
    number = number + 100 * np.where(lengths >= 3, values[np.maximum(ends - 3, 0)], 0)
    if number.max() > 255:
        return None
    return number.astype(np.uint8)


def _decode_array(raw: bytes, begin: int, end: int) -> bytes | None:
    """The bytes of the array body `raw[begin:end]`, chunk by chunk, or None if not plain."""
    if end - begin <= 64 and not raw[begin:end].strip(_WHITESPACE):
        return b""
    count = raw.count(b",", begin, end) + 1
    out = np.empty(count, np.uint8)
    filled, position = 0, begin
    while True:
        cut = raw.find(b",", min(position + CHUNK_CHARS, end), end)
        stop = end if cut < 0 else cut
        values = _decode_chunk(np.frombuffer(raw, np.uint8, stop - position, position))
        if values is None or filled + values.size > count:
            return None
        out[filled: filled + values.size] = values
        filled += values.size
        if cut < 0:
            break
        position = cut + 1
    if filled != count:
        return None
    return out.tobytes()


def extract_payloads(raw: bytes, max_bytes: int) -> ExtractedPayloads | None:
    """`raw` with its plain Constant payload arrays taken out, or None when none was (or when
    they would total more than `max_bytes`: the ordinary reader then reports the limit)."""
    nonce = secrets.token_hex(16)
    pieces: list[bytes] = []
    extracted = ExtractedPayloads(b"")
    total, copied_to = 0, 0
    for match in _OPENING.finditer(raw):
        if match.start() < copied_to or (match.start() and raw[match.start() - 1] == ord("\\")):
            continue
        close = raw.find(b"]", match.end())
        if close < 0:
            break
        payload = _decode_array(raw, match.end(), close)
        if payload is None:
            continue
        total += len(payload)
        if total > max_bytes:
            return None
        key = f"rlx-payload:{nonce}:{len(extracted.payloads)}"
        extracted.payloads[key] = payload
        pieces.append(raw[copied_to: match.end() - 1])
        pieces.append(b'"' + key.encode() + b'"')
        copied_to = close + 1
    if not extracted.payloads:
        return None
    pieces.append(raw[copied_to:])
    extracted.skeleton = b"".join(pieces)
    return extracted
