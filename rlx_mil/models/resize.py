"""Resampling weights of `torch.nn.functional.interpolate` (align_corners=False, an output
`size`), as `[out, in]` matrices along one axis.

A 2-D resize of a grid `G [H, W, C]` to `[H', W', C]` is separable: `R_h @ G @ R_w^T` per
channel, with `R_h = resize_matrix(H, H', ...)` and `R_w = resize_matrix(W, W', ...)`. The
vision towers resize their learned position grids this way (DINOv2 bicubic, with antialias in
the registers variant; SigLIP bicubic; SigLIP2 bilinear with antialias), so the graph holds the
two small matrices as constants and the position embeddings stay a checkpoint param.

Formulas (PyTorch's `UpSample.h` / `UpSampleKernel.cpp`, scale = in / out):
- plain bicubic: source `s = scale * (i + 0.5) - 0.5` (not clamped), the four taps
  `floor(s) - 1 .. floor(s) + 2` clamped to the edges, Keys' cubic convolution with A = -0.75;
- antialiased (PIL's scheme): centre `c = scale * (i + 0.5)`, support `taps / 2 * max(scale, 1)`,
  every source j in `[int(c - support + 0.5), int(c + support + 0.5))` within the grid weighted
  by `filter((j - c + 0.5) / max(scale, 1))`, the weights normalised to sum 1; bilinear's filter
  is the triangle `max(0, 1 - |x|)`, bicubic's Keys' cubic with A = -0.5.
"""

from __future__ import annotations

import math

import numpy as np

from rlx_mil.errors import InvalidOptionError

MODES = ("bicubic", "bilinear")


def _cubic(x: float, a: float) -> float:
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return 0.0


def _plain(in_size: int, out_size: int, mode: str) -> np.ndarray:
    scale = in_size / out_size
    matrix = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        source = scale * (i + 0.5) - 0.5
        if mode == "bilinear":
            source = max(source, 0.0)
            low = min(math.floor(source), in_size - 1)
            frac = source - low
            high = min(low + 1, in_size - 1)
            matrix[i, low] += 1.0 - frac
            matrix[i, high] += frac
            continue
        base = math.floor(source)
        t = source - base
        taps = (_cubic(t + 1.0, -0.75), _cubic(t, -0.75), _cubic(1.0 - t, -0.75), _cubic(2.0 - t, -0.75))
        for k, weight in enumerate(taps):
            matrix[i, min(max(base - 1 + k, 0), in_size - 1)] += weight
    return matrix


def _antialiased(in_size: int, out_size: int, mode: str) -> np.ndarray:
    scale = in_size / out_size
    support = (2.0 if mode == "bicubic" else 1.0) * max(scale, 1.0)
    inverse = 1.0 / max(scale, 1.0)
    matrix = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        centre = scale * (i + 0.5)
        first = max(int(centre - support + 0.5), 0)
        last = min(int(centre + support + 0.5), in_size)
        for j in range(first, last):
            x = (j - centre + 0.5) * inverse
            matrix[i, j] = _cubic(x, -0.5) if mode == "bicubic" else max(0.0, 1.0 - abs(x))
        total = matrix[i].sum()
        if total != 0.0:
            matrix[i] /= total
    return matrix


def resize_matrix(in_size: int, out_size: int, mode: str, antialias: bool = False) -> np.ndarray:
    """The `[out_size, in_size]` float32 weights of resizing one axis as `interpolate` does."""
    if mode not in MODES:
        raise InvalidOptionError(f"resize mode must be one of {MODES}, got {mode!r}")
    for what, size in (("in_size", in_size), ("out_size", out_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidOptionError(f"{what} must be an integer >= 1, got {size!r}")
    matrix = _antialiased(in_size, out_size, mode) if antialias else _plain(in_size, out_size, mode)
    return matrix.astype(np.float32)
