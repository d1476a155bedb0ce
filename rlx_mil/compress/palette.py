"""Palettization: 1-D k-means look-up tables fitted in NumPy (deterministic, no scikit-learn).

The fit is Lloyd's algorithm from quantile seeds (and from evenly spaced seeds, keeping the
better result), run on the weight's distinct values with
their counts: on sorted values every cluster is a contiguous run, so one iteration is a binary
search of the k-1 midpoints plus prefix sums, O(k log n), and the result is the same as Lloyd
on the raw values (ties go to the lower centroid, as an argmin does). Float16 / bfloat16
weights have at most 65536 distinct values, counted without sorting.

coremltools' `OpPalettizerConfig(mode="kmeans")` fits the same objective (squared error) with
scikit-learn's k-means; the test suite checks that this fit is never worse than a plain
Lloyd run from the same seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_mil.compress.code_store import CodeWriter, WriterFactory
from rlx_mil.compress.linear import SLAB_ELEMENTS, finite_slab, rows_view
from rlx_mil.compress.schemes import PER_GROUPED_CHANNEL, PaletteScheme
from rlx_mil.errors import CompressionError

MAX_ITERATIONS = 300


def _two_byte_float(dtype: np.dtype) -> bool:
    """float16 or bfloat16 (ml_dtypes): at most 65536 distinct values."""
    return dtype.itemsize == 2 and dtype.kind not in "iub"


def value_histogram(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values (float64) of a finite array and how often each occurs."""
    arr = np.asarray(values)
    if _two_byte_float(arr.dtype):
        bits = np.ascontiguousarray(arr).reshape(-1).view(np.uint16)
        counts = np.bincount(bits, minlength=1 << 16)
        present = np.nonzero(counts)[0].astype(np.uint16)
        distinct = present.view(arr.dtype).astype(np.float64)
        order = np.argsort(distinct, kind="stable")
        distinct, hits = distinct[order], counts[present][order]
        # +0 and -0 are one value.
        merged, index = np.unique(distinct, return_inverse=True)
        return merged, np.bincount(index.reshape(-1), weights=hits).astype(np.int64)
    distinct, hits = np.unique(arr.astype(np.float64).reshape(-1), return_counts=True)
    return distinct, hits.astype(np.int64)


def quantile_seeds(values: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """k seeds at the (i + 1/2)/k quantiles of the weighted values (a sorted float64 array)."""
    cum = np.cumsum(counts)
    targets = (np.arange(k) + 0.5) / k * cum[-1]
    return values[np.minimum(np.searchsorted(cum, targets, side="left"), values.size - 1)].astype(np.float64)


def lloyd_1d(values: np.ndarray, counts: np.ndarray, seeds: np.ndarray, max_iter: int = MAX_ITERATIONS) -> np.ndarray:
    """Lloyd iterations on sorted weighted 1-D data until no centroid moves; sorted centroids.

    A centroid whose cluster is empty stays where it is (as in the reference Lloyd)."""
    cum_n = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    cum_s = np.concatenate([[0.0], np.cumsum(values * counts, dtype=np.float64)])
    centroids = np.sort(seeds.astype(np.float64))
    for _ in range(max_iter):
        # x <= midpoint goes to the lower centroid (argmin picks the first of equals).
        cuts = np.searchsorted(values, (centroids[:-1] + centroids[1:]) / 2, side="right")
        edges = np.concatenate([[0], cuts, [values.size]])
        n = cum_n[edges[1:]] - cum_n[edges[:-1]]
        s = cum_s[edges[1:]] - cum_s[edges[:-1]]
        with np.errstate(invalid="ignore", divide="ignore"):
            moved = np.where(n > 0, s / np.maximum(n, 1), centroids)
        moved = np.sort(moved)
        if np.array_equal(moved, centroids):
            break
        centroids = moved
    return centroids


def weighted_sse(values: np.ndarray, counts: np.ndarray, centroids: np.ndarray) -> float:
    """Squared error of the weighted sorted values against their nearest sorted centroid."""
    idx = np.searchsorted((centroids[:-1] + centroids[1:]) / 2, values, side="left")
    return float(np.sum(counts * np.square(values - centroids[idx])))


def fit_lut(values: np.ndarray, k: int) -> np.ndarray:
    """A sorted k-entry table for the (finite) values: exact when they have <= k distinct
    values (the rest of the table repeats the largest), else the better of two Lloyd runs,
    from quantile seeds and from evenly spaced seeds (the latter wins when few values share
    each entry, where quantile seeds crowd the dense middle)."""
    distinct, counts = value_histogram(values)
    if distinct.size <= k:
        return np.concatenate([distinct, np.full(k - distinct.size, distinct[-1])])
    runs = [
        lloyd_1d(distinct, counts, quantile_seeds(distinct, counts, k)),
        lloyd_1d(distinct, counts, np.linspace(distinct[0], distinct[-1], k)),
    ]
    errors = [weighted_sse(distinct, counts, c) for c in runs]
    return runs[int(np.argmin(errors))]


def nearest_index(x: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of a sorted table (the lower one on a tie)."""
    mids = (lut[:-1].astype(np.float64) + lut[1:].astype(np.float64)) / 2
    return np.searchsorted(mids, x, side="left").astype(np.uint8)


@dataclass
class PaletteCodes:
    """Indices in the storage layout and one sorted LUT per group of output channels."""

    indices: np.ndarray
    #: [groups, 2**bits], in the program's float dtype.
    lut: np.ndarray
    scheme: PaletteScheme
    sq_error: float
    sq_norm: float

    @property
    def group_rows(self) -> int:
        return rows_view(self.indices).shape[0] // self.lut.shape[0]

    def dequantize(self) -> np.ndarray:
        rows = rows_view(self.indices)
        group = np.repeat(np.arange(self.lut.shape[0]), self.group_rows)[:, None]
        return self.lut.astype(np.float32)[group, rows.astype(np.int64)].reshape(self.indices.shape)

    @property
    def relative_error(self) -> float:
        return float(np.sqrt(self.sq_error / self.sq_norm)) if self.sq_norm > 0 else float(np.sqrt(self.sq_error))


def group_rows(scheme: PaletteScheme, shape: tuple[int, ...], name: str) -> int:
    channels = 1 if len(shape) <= 1 else shape[0]
    if scheme.granularity != PER_GROUPED_CHANNEL:
        return channels
    if channels % scheme.group_size:
        raise CompressionError(
            f"weight {name!r} {list(shape)}: group size {scheme.group_size} does not divide its {channels} output"
            " channels; pick a group size that does, or per-tensor palettization"
        )
    return scheme.group_size


def palettize(
    weight: np.ndarray, scheme: PaletteScheme, store: type[np.floating], name: str = "weight",
    code_writer: WriterFactory = CodeWriter,
) -> PaletteCodes:
    """Fit one LUT per group of output channels (axis 0 of the storage layout) and index every
    element. The LUT is rounded to `store` before indexing, so indices fit the stored table;
    the indices go to `code_writer` a slab at a time."""
    shape = tuple(int(d) for d in weight.shape)
    rows = rows_view(weight)
    channels, width = rows.shape
    per_group = group_rows(scheme, shape, name)
    k = 1 << scheme.bits
    indices = code_writer((channels, width), np.dtype(np.uint8))
    luts = np.empty((channels // per_group, k), dtype=store)
    step = max(1, SLAB_ELEMENTS // max(width, 1))
    sq_error = sq_norm = 0.0
    for g0 in range(0, channels, per_group):
        block = rows[g0:g0 + per_group]
        for r0 in range(0, block.shape[0], step):
            finite_slab(block[r0:r0 + step], name, g0 + r0)
        source = block if _two_byte_float(block.dtype) else np.asarray(block, np.float32)
        lut = np.sort(fit_lut(source, k).astype(store))
        luts[g0 // per_group] = lut
        lut64 = lut.astype(np.float64)
        for r0 in range(0, block.shape[0], step):
            slab = np.asarray(block[r0:r0 + step], dtype=np.float32)
            idx = nearest_index(slab, lut)
            indices.put(g0 + r0, idx)
            sq_error += float(np.sum(np.square(lut64[idx] - slab)))
            sq_norm += float(np.sum(np.square(slab, dtype=np.float64)))
    return PaletteCodes(indices.result().reshape(shape), luts, scheme, sq_error, sq_norm)


def check_palette_bits(bits: int, allowed: tuple[int, ...], name: str, target: str) -> None:
    if bits not in allowed:
        raise CompressionError(
            f"weight {name!r}: {bits}-bit palettization has no constexpr_lut_to_dense form on {target}"
            f" (it takes {'/'.join(map(str, allowed))} bits); use iOS18 or another bit width"
        )
