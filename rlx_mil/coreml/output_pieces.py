"""Outputs that come in pieces (`rlx_mil.split_outputs`, `metadata.SplitOutputs`): the Neural
Engine form returns an LM head wider than 16,384 as `ceil(V / 16384)` logits outputs.
`assemble` turns the outputs of one run back into the graph's own (each split output the
concatenation of its pieces), so callers see the same outputs as from the unsplit package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import RlxMilError


class SplitOutputError(RlxMilError):
    """A model's outputs do not match the pieces its metadata says an output is split into."""


@dataclass(frozen=True)
class OutputPieces:
    """One output of the graph computed as several model outputs: the output is the
    concatenation of `pieces` (output names, in order) along `axis`; `sizes` are their widths
    along it."""

    axis: int
    pieces: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def width(self) -> int:
        return sum(self.sizes)

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "pieces": list(self.pieces), "sizes": list(self.sizes)}


def assemble(outputs: Mapping[str, Any], split: Mapping[str, OutputPieces]) -> dict[str, Any]:
    """`outputs` with each split output's pieces replaced by their concatenation under the
    output's name. Pieces missing from `outputs`, or of shapes that do not join, are a
    `SplitOutputError` (the package and its contract disagree)."""
    if not split:
        return dict(outputs)
    joined: dict[str, Any] = {}
    used: set[str] = set()
    for name, entry in split.items():
        missing = [p for p in entry.pieces if p not in outputs]
        if missing:
            raise SplitOutputError(f"output {name!r} is split into {list(entry.pieces)}, but the model returned no"
                                   f" {missing}")
        parts = [np.asarray(outputs[p]) for p in entry.pieces]
        for part, size in zip(parts, entry.sizes, strict=True):
            if part.ndim == 0 or not -part.ndim <= entry.axis < part.ndim or part.shape[entry.axis] != size:
                raise SplitOutputError(f"output {name!r}: a piece of shape {list(part.shape)} does not have width"
                                       f" {size} on axis {entry.axis}")
        try:
            joined[name] = np.concatenate(parts, axis=entry.axis)
        except ValueError as err:
            raise SplitOutputError(f"output {name!r}: its pieces do not join ({err})") from None
        used.update(entry.pieces)
    result = {k: v for k, v in outputs.items() if k not in used}
    result.update(joined)
    return result
