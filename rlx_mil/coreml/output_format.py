"""What a conversion writes: a Core ML package (`.mlpackage`) or Apple's Core AI asset
(`.aimodel`, the same final MIL program translated by `rlx_mil.coreai`).

The format is chosen by `format=` (`--format` on the command line) or by the output's suffix;
an output without a suffix takes the format's, and a format that contradicts the suffix is a
typed error naming both. A model converted with `format="aimodel"` remembers it, so that
`rlx_mil.save(model, "name")` writes `name.aimodel`. Imports nothing heavy (the command line's
flag parsing uses it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlx_mil.errors import InvalidOptionError

OUTPUT_FORMATS = ("mlpackage", "aimodel")
SUFFIXES = {"mlpackage": ".mlpackage", "aimodel": ".aimodel"}
#: The attribute a converted MLModel carries when it was converted with `format=`.
FORMAT_ATTRIBUTE = "rlx_mil_format"


def check_format(format: Any, option: str = "format") -> str | None:
    """`format` (None, 'mlpackage' or 'aimodel'), else an `InvalidOptionError` naming `option`."""
    if format is None or format in OUTPUT_FORMATS:
        return format
    raise InvalidOptionError(f"{option} must be one of {OUTPUT_FORMATS} (or None: the output's suffix), got {format!r}")


def format_of_suffix(path: str | os.PathLike[str]) -> str | None:
    suffix = Path(path).suffix
    return next((name for name, known in SUFFIXES.items() if known == suffix), None)


def output_path(path: str | os.PathLike[str], format: str | None, option: str = "format") -> Path:
    """`path` for output format `format`: unchanged when its suffix says the same (or no format
    is given), with the format's suffix added when it ends in neither ('llama-3.2' ->
    'llama-3.2.aimodel'); the other format's suffix is an `InvalidOptionError` naming `option`'s
    value and the suffix."""
    dest = Path(path)
    if check_format(format, option) is None:
        return dest
    assert format is not None
    by_suffix = format_of_suffix(dest)
    if by_suffix is None:
        return dest.with_name(dest.name + SUFFIXES[format])
    if by_suffix != format:
        raise InvalidOptionError(
            f"{option}={format!r} contradicts the output's suffix ({str(dest)!r} ends in {dest.suffix!r}): name it"
            f" {dest.stem}{SUFFIXES[format]} or drop {option}")
    return dest


def model_format(model: Any) -> str | None:
    """The format `model` was converted for (`convert(format=...)`), or None."""
    value = getattr(model, FORMAT_ATTRIBUTE, None)
    return value if value in OUTPUT_FORMATS else None


def remember_format(model: Any, format: str | None) -> None:
    if format is not None:
        setattr(model, FORMAT_ATTRIBUTE, format)
