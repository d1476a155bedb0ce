"""The built-in English text compression checks run on when the user gives none.

Two passages of original prose ship with the package (`rlx_mil/compress/texts/`): a
*calibration* part (for activation statistics: what a fit may look at) and a *held-out* part,
distinct from it, that the quality check measures on, so a scheme fitted to the calibration
text is not judged on the text it was fitted to. Each is a few hundred tokens for a typical
BPE tokenizer.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal

Part = Literal["calibration", "heldout"]

#: Tokens of the held-out text the conversion-time quality check scores at most (the NumPy
#: reference runs the model twice over them: float and compressed).
CHECK_TOKENS = 256


def builtin_text(part: Part = "heldout") -> str:
    """The text of one part (`calibration` or `heldout`)."""
    if part not in ("calibration", "heldout"):
        raise ValueError(f"the built-in text has parts 'calibration' and 'heldout', not {part!r}")
    return resources.files("rlx_mil.compress").joinpath("texts").joinpath(f"{part}.txt").read_text(encoding="utf-8")
