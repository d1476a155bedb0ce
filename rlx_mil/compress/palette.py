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

from dataclasses import dataclass, replace

import numpy as np

from rlx_mil.compress.code_store import CodeWriter, WriterFactory
from rlx_mil.compress.linear import SLAB_ELEMENTS, finite_slab, rows_view
from rlx_mil.compress.schemes import PER_GROUPED_CHANNEL, PaletteScheme
from rlx_mil.errors import CompressionError

MAX_ITERATIONS = 300
#: Grouped fits: histogram bins per group (the atoms of the vectorised Lloyd) and its iterations.
GROUP_BINS = 2048
GROUP_ITERATIONS = 100
#: Groups of at most this many elements (a few hundred per table entry) are also fitted from
#: the shared table of the max-normalised weight (`_shared_seed`): from quantile and evenly
#: spaced seeds alone, Lloyd on one row's few hundred values stops in worse local optima than
#: one scaled table reaches (SmolLM2: `lut4-group1` 0.108-0.114 relative error against 0.102).
SHARED_SEED_ELEMENTS = 8192
#: ... and of at most this many rows: the tables per row and per 4 rows it was measured on.
#: Group 16 keeps its own seeds: there the start gains 1-3 % of weight error on Whisper base's
#: 512-wide weights, and its folder plan, re-measured with it, moved 26 weights and lost on
#: speech (LibriVox pair: mean KL 0.036 -> 0.055, top-1 1.00 -> 0.98).
SHARED_SEED_ROWS = 4


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
    """Lloyd iterations on sorted weighted 1-D data (integer counts or float weights) until
    no centroid moves; sorted centroids.

    A centroid whose cluster is empty stays where it is (as in the reference Lloyd)."""
    # Counts may be float weights (an activation-weighted fit): summed as they are.
    cum_n = np.concatenate([[0], np.cumsum(counts, dtype=np.int64 if counts.dtype.kind in "iub" else np.float64)])
    cum_s = np.concatenate([[0.0], np.cumsum(values * counts, dtype=np.float64)])
    centroids = np.sort(seeds.astype(np.float64))
    for _ in range(max_iter):
        # x <= midpoint goes to the lower centroid (argmin picks the first of equals).
        cuts = np.searchsorted(values, (centroids[:-1] + centroids[1:]) / 2, side="right")
        edges = np.concatenate([[0], cuts, [values.size]])
        n = cum_n[edges[1:]] - cum_n[edges[:-1]]
        s = cum_s[edges[1:]] - cum_s[edges[:-1]]
        with np.errstate(invalid="ignore", divide="ignore"):
            moved = np.where(n > 0, s / np.where(n > 0, n, 1), centroids)  # n may be a weight below 1
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
    #: Largest |decoded - source| when the codes came from an already quantized source.
    max_error: float | None = None
    #: ``lutN-scaled``: one scale per output channel ([channels], the program's float type)
    #: multiplying the table's values (`constexpr_blockwise_shift_scale` after the LUT).
    channel_scale: np.ndarray | None = None

    @property
    def group_rows(self) -> int:
        return rows_view(self.indices).shape[0] // self.lut.shape[0]

    def dequantize(self) -> np.ndarray:
        rows = rows_view(self.indices)
        group = np.repeat(np.arange(self.lut.shape[0]), self.group_rows)[:, None]
        values = self.lut.astype(np.float32)[group, rows.astype(np.int64)]
        if self.channel_scale is not None:
            values = values * self.channel_scale.astype(np.float32)[:, None]
        return values.reshape(self.indices.shape)

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


def grouped_luts(x: np.ndarray, k: int, weights: np.ndarray | None = None,
                  seeds: tuple[np.ndarray, ...] = ()) -> np.ndarray:
    """One sorted k-entry table per row of `x` ([groups, n] float32): Lloyd's algorithm on a
    per-group histogram of `GROUP_BINS` equal-width bins, all groups at once.

    Each bin is an atom at the exact mean of its values (per-bin counts, sums and sums of
    squares in float64), so a cluster's centroid is the exact mean of its values and its
    squared error exact; only a bin holding a midpoint moves as a whole. Runs from quantile
    seeds, from evenly spaced seeds and from each of `seeds` ([groups, k] tables, e.g. a
    shared table scaled to each group: Lloyd never raises the error of its start) and keeps,
    per group, the one with the lowest error. With `weights` (non-negative, the shape of `x`)
    every element counts its weight (an activation-weighted fit). A group with at most k
    distinct values gets them exactly."""
    groups = x.shape[0]
    bins = GROUP_BINS
    lo = x.min(axis=1).astype(np.float64)
    hi = x.max(axis=1).astype(np.float64)
    span = hi - lo
    inv = np.where(span > 0, bins / np.where(span > 0, span, 1.0), 0.0)
    b = ((x - lo[:, None].astype(np.float32)) * inv[:, None].astype(np.float32)).astype(np.int64)
    np.clip(b, 0, bins - 1, out=b)
    b += (np.arange(groups, dtype=np.int64) * bins)[:, None]
    flat = b.reshape(-1)
    x64 = x.reshape(-1).astype(np.float64)
    if weights is None:
        cnt = np.bincount(flat, minlength=groups * bins).reshape(groups, bins).astype(np.float64)
        wx = x64
    else:
        wt = np.broadcast_to(np.asarray(weights, np.float64), x.shape).reshape(-1)
        cnt = np.bincount(flat, weights=wt, minlength=groups * bins).reshape(groups, bins).astype(np.float64)
        wx = wt * x64
    s1 = np.bincount(flat, weights=wx, minlength=groups * bins).reshape(groups, bins)
    s2 = np.bincount(flat, weights=wx * x64, minlength=groups * bins).reshape(groups, bins)
    del b, flat, x64, wx
    with np.errstate(invalid="ignore", divide="ignore"):
        means = s1 / cnt
    zero = np.zeros((groups, 1))
    cum_n = np.concatenate([zero, np.cumsum(cnt, axis=1)], axis=1)
    cum_s = np.concatenate([zero, np.cumsum(s1, axis=1)], axis=1)
    cum_q = np.concatenate([zero, np.cumsum(s2, axis=1)], axis=1)
    rows = np.arange(groups)[:, None]

    def edges(c: np.ndarray) -> np.ndarray:
        mids = (c[:, :-1] + c[:, 1:]) / 2
        home = np.clip(np.floor((mids - lo[:, None]) * inv[:, None]), 0, bins - 1).astype(np.int64)
        inner = home + (means[rows, home] <= mids)  # NaN (empty bin) compares False
        return np.concatenate([np.zeros((groups, 1), np.int64), np.maximum.accumulate(inner, axis=1),
                               np.full((groups, 1), bins, np.int64)], axis=1)

    def lloyd(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        for _ in range(GROUP_ITERATIONS):
            e = edges(c)
            num = np.diff(cum_n[rows, e], axis=1)
            tot = np.diff(cum_s[rows, e], axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                moved = np.sort(np.where(num > 0, tot / np.where(num > 0, num, 1.0), c), axis=1)  # weights may be < 1
            if np.array_equal(moved, c):
                break
            c = moved
        e = edges(c)
        num = np.diff(cum_n[rows, e], axis=1)
        tot = np.diff(cum_s[rows, e], axis=1)
        sq = np.diff(cum_q[rows, e], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            sse = np.sum(np.where(num > 0, sq - tot * tot / np.where(num > 0, num, 1.0), 0.0), axis=1)
        return c, sse

    targets = (np.arange(k) + 0.5) / k * cum_n[:, -1:]
    seed_bins = np.minimum(np.sum(cum_n[:, None, 1:] <= targets[:, :, None], axis=2), bins - 1)
    quantile = np.sort(np.where(cnt[rows, seed_bins] > 0, means[rows, seed_bins], lo[:, None]), axis=1)
    even = lo[:, None] + span[:, None] * np.linspace(0.0, 1.0, k)[None, :]
    best, error = lloyd(quantile)
    for start in (even, *(np.sort(np.asarray(t, np.float64), axis=1) for t in seeds)):
        c, e = lloyd(start)
        better = e < error
        best, error = np.where(better[:, None], c, best), np.where(better, e, error)
    # Exact tables where a group has at most k distinct values (then it occupies at most k bins).
    for g in np.nonzero(np.count_nonzero(cnt, axis=1) <= k)[0]:
        values = np.unique(x[g].astype(np.float64))
        if values.size <= k:
            best[g] = np.concatenate([values, np.full(k - values.size, values[-1])])
    return best


def _nearest_grouped(x: np.ndarray, luts: np.ndarray) -> np.ndarray:
    """Index of each element's nearest entry of its row's sorted table ([groups, n] and
    [groups, k]; the lower entry on a tie): the number of midpoints below it, counted one
    midpoint at a time for up to 64 entries, else by a branch-free binary search (log2(k)
    gathers) over the whole slab."""
    groups, k = luts.shape
    lut64 = luts.astype(np.float64)
    mids = ((lut64[:, :-1] + lut64[:, 1:]) / 2).astype(np.float32)
    if k <= 64:
        count = np.zeros(x.shape, np.uint8)
        for j in range(k - 1):
            count += x > mids[:, j:j + 1]
        return count
    # One sentinel per group keeps every probe inside its own row: [groups, k] flat.
    table = np.concatenate([mids, np.full((groups, 1), np.inf, np.float32)], axis=1).reshape(-1)
    base = (np.arange(groups, dtype=np.int32) * k)[:, None]
    idx = np.zeros(x.shape, np.int32)
    step = k // 2
    while step:
        probe = idx + (step - 1)
        probe += base
        idx += np.where(x > table[probe], step, 0).astype(np.int32)
        step //= 2
    return idx.astype(np.uint8)


def palettize(
    weight: np.ndarray, scheme: PaletteScheme, store: type[np.floating], name: str = "weight",
    code_writer: WriterFactory = CodeWriter, slab_elements: int = SLAB_ELEMENTS,
) -> PaletteCodes:
    """Fit one LUT per group of output channels (axis 0 of the storage layout) and index every
    element. The LUT is rounded to `store` before indexing, so indices fit the stored table;
    the indices go to `code_writer` a slab at a time. Grouped tables are fitted a slab of
    groups at a time (about `slab_elements` weights: the fit's temporaries are some 60 bytes a
    weight), vectorised over the groups (`grouped_luts`). A ``scaled`` scheme normalises each
    output channel first (`palettize_scaled`)."""
    if scheme.channel_scale:
        return palettize_scaled(weight, scheme, store, name, code_writer)
    shape = tuple(int(d) for d in weight.shape)
    rows = rows_view(weight)
    channels, width = rows.shape
    per_group = group_rows(scheme, shape, name)
    k = 1 << scheme.bits
    indices = code_writer((channels, width), np.dtype(np.uint8))
    luts = np.empty((channels // per_group, k), dtype=store)
    sq_error = sq_norm = 0.0
    if per_group == channels:
        step = max(1, SLAB_ELEMENTS // max(width, 1))
        for r0 in range(0, channels, step):
            finite_slab(rows[r0:r0 + step], name, r0)
        source = rows if _two_byte_float(rows.dtype) else np.asarray(rows, np.float32)
        lut = np.sort(fit_lut(source, k).astype(store))
        luts[0] = lut
        lut64 = lut.astype(np.float64)
        for r0 in range(0, channels, step):
            slab = np.asarray(rows[r0:r0 + step], dtype=np.float32)
            idx = nearest_index(slab, lut)
            indices.put(r0, idx)
            sq_error += float(np.sum(np.square(lut64[idx] - slab)))
            sq_norm += float(np.sum(np.square(slab, dtype=np.float64)))
        return PaletteCodes(indices.result().reshape(shape), luts, scheme, sq_error, sq_norm)
    group_step = max(1, slab_elements // max(per_group * width, 1))
    shared, peaks = _shared_seed(rows, per_group, k, store, name, group_step) if (
        per_group <= SHARED_SEED_ROWS and per_group * width <= SHARED_SEED_ELEMENTS) else (None, None)
    for g0 in range(0, channels // per_group, group_step):
        r0 = g0 * per_group
        slab = finite_slab(rows[r0:r0 + group_step * per_group], name, r0)
        x = slab.reshape(-1, per_group * width)
        seeds = () if shared is None or peaks is None else (peaks[g0:g0 + x.shape[0], None] * shared[None, :],)
        lut = np.sort(grouped_luts(x, k, seeds=seeds).astype(store), axis=1)
        luts[g0:g0 + x.shape[0]] = lut
        idx = _nearest_grouped(x, lut)
        indices.put(r0, idx.reshape(-1, width))
        chosen = np.take_along_axis(lut.astype(np.float64), idx.astype(np.int64), axis=1)
        sq_error += float(np.sum(np.square(chosen - x)))
        sq_norm += float(np.sum(np.square(x, dtype=np.float64)))
    return PaletteCodes(indices.result().reshape(shape), luts, scheme, sq_error, sq_norm)


def _shared_seed(rows: np.ndarray, per_group: int, k: int, store: type[np.floating], name: str,
                 group_step: int) -> tuple[np.ndarray, np.ndarray]:
    """(the one table fitted to the rows normalised by their group's largest magnitude, each
    group's largest magnitude): scaled back to a group it is the start `grouped_luts` also
    runs from, so a table per row never fits worse than one scaled table (`palettize_scaled`).
    Holds the normalised weight in `store` (one weight, not the model)."""
    channels, width = rows.shape
    groups = channels // per_group
    peaks = np.empty(groups, np.float64)
    normalised = np.empty((channels, width), dtype=store)
    for g0 in range(0, groups, group_step):
        r0 = g0 * per_group
        slab = finite_slab(rows[r0:r0 + group_step * per_group], name, r0).astype(np.float64)
        peak = np.max(np.abs(slab.reshape(-1, per_group * width)), axis=1)
        peak[peak == 0] = 1
        peaks[g0:g0 + peak.size] = peak
        normalised[r0:r0 + slab.shape[0]] = (slab / np.repeat(peak, per_group)[:, None]).astype(store)
    return fit_lut(normalised, k), peaks


def palettize_scaled(
    weight: np.ndarray, scheme: PaletteScheme, store: type[np.floating], name: str = "weight",
    code_writer: WriterFactory = CodeWriter,
) -> PaletteCodes:
    """``lutN-scaled``, as coremltools' `enable_per_channel_scale`: each output channel is
    divided by its largest magnitude (a zero channel by 1), the tables are fitted to the
    normalised weight (values in [-1, 1], kept in `store`), and the scales (in `store`) multiply
    the decoded table values back. Holds the normalised weight in `store` while fitting (one
    weight, not the model)."""
    rows = rows_view(weight)
    channels, width = rows.shape
    step = max(1, SLAB_ELEMENTS // max(width, 1))
    scale = np.empty(channels, dtype=store)
    normalised = np.empty((channels, width), dtype=store)
    for r0 in range(0, channels, step):
        slab = finite_slab(rows[r0:r0 + step], name, r0).astype(store)
        peak = np.max(np.abs(slab), axis=1, keepdims=True)
        peak[peak == 0] = 1
        scale[r0:r0 + step] = peak[:, 0]
        normalised[r0:r0 + step] = slab / peak
    codes = palettize(normalised.reshape(weight.shape), replace(scheme, channel_scale=False), store, name, code_writer)
    codes.scheme, codes.channel_scale = scheme, scale
    # The error of the decoded weight (table value x scale) against the weight as given.
    sq_error = sq_norm = 0.0
    lut64, scale64 = codes.lut.astype(np.float64), scale.astype(np.float64)
    indices = rows_view(codes.indices)
    for r0 in range(0, channels, step):
        slab = np.asarray(rows[r0:r0 + step], dtype=np.float64)
        span = np.arange(r0, r0 + slab.shape[0])
        back = lut64[(span // codes.group_rows)[:, None], indices[r0:r0 + step].astype(np.int64)] * scale64[span, None]
        sq_error += float(np.sum(np.square(back - slab)))
        sq_norm += float(np.sum(np.square(slab)))
    codes.sq_error, codes.sq_norm = sq_error, sq_norm
    return codes


def check_palette_bits(bits: int, allowed: tuple[int, ...], name: str, target: str) -> None:
    if bits not in allowed:
        raise CompressionError(
            f"weight {name!r}: {bits}-bit palettization has no constexpr_lut_to_dense form on {target}"
            f" (it takes {'/'.join(map(str, allowed))} bits); use iOS18 or another bit width"
        )
