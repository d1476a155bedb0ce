"""Fitting a scheme to a weight's shape: a block or group size that does not divide the
weight is replaced by the nearest one that does (or a coarser granularity), never refused.

Core ML's constexpr ops need whole blocks: `constexpr_blockwise_shift_scale`'s block size is
data.shape / scale.shape, and the iOS18 `constexpr_lut_to_dense` holds one table per equal
slice of output channels. The weight itself cannot be padded (its constexpr output must have
the weight's shape), so the tool picks the divisor closest to the asked size (by ratio) within
a factor of 4 of it (blocks of at least 8), else falls back to per-channel scales; palettes
take the nearest divisor at most 4 times the asked group (down to one table per output
channel; one table for a single row). The report says what was done.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rlx_mil.compress.schemes import (
    PER_BLOCK,
    PER_CHANNEL,
    PER_GROUPED_CHANNEL,
    PER_TENSOR,
    LinearScheme,
    Scheme,
)
from rlx_mil.lowering.target import Target

#: How far (as a ratio) a replacement block / group size may be from the asked one.
MAX_RATIO = 4.0
#: Blocks smaller than this cost more in scales than per-channel quantization gains.
MIN_BLOCK = 8


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest_divisor(extent: int, wanted: int, smallest: int = 1, lowest_ratio: float = MAX_RATIO) -> int | None:
    """The divisor of `extent` closest to `wanted` by ratio (the larger on a tie), at most
    `MAX_RATIO` times it, at least `wanted / lowest_ratio` and `smallest`; None if none is."""
    best: tuple[float, int] | None = None
    for d in _divisors(max(extent, 1)):
        if d < smallest or not (wanted / lowest_ratio <= d <= wanted * MAX_RATIO):
            continue
        key = (abs(math.log(d / wanted)), -d)
        if best is None or key < (best[0], -best[1]):
            best = (key[0], d)
    return None if best is None else best[1]


def fit_to_shape(scheme: Scheme, shape: tuple[int, ...], target: Target | None = None) -> tuple[Scheme, str]:
    """The scheme to use for a weight of storage `shape` (output channels on axis 0) and a
    note saying what changed and why ("" when nothing did). A bare ``lutN`` (grouped by
    default) is held per tensor on a `target` below iOS18, which has no grouped tables."""
    if isinstance(scheme, LinearScheme):
        if scheme.granularity != PER_BLOCK:
            return scheme, ""
        extent = shape[-1] if len(shape) <= 1 else shape[1]
        if extent % scheme.block_size == 0:
            return scheme, ""
        size = nearest_divisor(extent, scheme.block_size, smallest=MIN_BLOCK)
        why = f"block {scheme.block_size} does not divide the input dimension {extent}"
        if size is None:
            return replace(scheme, granularity=PER_CHANNEL), f"{why}: per-channel scales"
        return replace(scheme, block_size=size), f"{why}: block {size}"
    if scheme.granularity != PER_GROUPED_CHANNEL:
        return scheme, ""
    if target is not None and target < Target.IOS18 and not scheme.explicit:
        return replace(scheme, granularity=PER_TENSOR), f"{target.label} has no grouped tables: one table"
    channels = 1 if len(shape) <= 1 else shape[0]
    if channels % scheme.group_size == 0:
        return scheme, ""
    why = f"group {scheme.group_size} does not divide the {channels} output channels"
    if channels == 1:
        return replace(scheme, granularity=PER_TENSOR), f"{why}: one table"
    # Smaller groups only add tables (more accuracy, a little size): any divisor will do.
    size = nearest_divisor(channels, scheme.group_size, lowest_ratio=float(scheme.group_size)) or 1
    return replace(scheme, group_size=size), f"{why}: group {size}" + (" (a table per channel)" if size == 1 else "")
