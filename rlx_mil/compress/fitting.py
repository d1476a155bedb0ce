"""Codes fitted to calibration activations: activation-weighted tables and error-compensating
(GPTQ-style) rounding.

A linear weight W ([out, in], y = x W^T) compressed to Q changes the layer's output on inputs X
by X (W - Q)^T; its expected squared size is the sum over rows r of (w_r - q_r) H (w_r - q_r)^T
with H = E[x^T x] ([in, in], the second moment of the calibration activations). Plain rounding
minimises each element's own error, as if H were the identity; two fits here use H instead:

* **activation-weighted tables** (``weighted``): a palette's entries are fitted by a 1-D
  k-means in which element (r, j) counts ``H_jj`` times (times the row's squared scale for a
  scaled table): the diagonal of the objective, AWQ's E[x_j^2] per input feature; a table per
  group of rows is also started from the shared weighted table of the rows normalised by
  their group's largest magnitude, so a table per row never fits worse than one scaled table;
* **error-compensating rounding** (``gptq``, Frantar et al. 2022): the columns are rounded
  one at a time, in order of decreasing ``H_jj``, each onto the row's grid (its palette
  entries, times its scale, or its integer levels), and the error each rounding makes is
  spread over the columns not yet rounded through the inverse Hessian's Cholesky factor, so
  later codes compensate for it. The grid (table, scales) stays what the scheme fitted; the
  codes change. ``H`` gets 10 % of its mean diagonal added (the calibration text may have fewer
  tokens than inputs; its rank is then below `in`);
* **tables refitted to the codes** (``on``, after ``gptq``; tables of at most 16 entries, one
  or one per group of rows, each group its own problem): the entries solve the least-squares
  problem the codes leave (`refit_tables`). Measured on
  SmolLM2's Neural Engine `lut4-scaled` codes (held-out output error, layers 2 and 11):
  `down_proj` 0.0028 -> 0.0021 and 0.0057 -> 0.0036, the other projections within 1 %;
* **scales refitted to the codes** (`FitOptions.rescale`, after ``gptq`` and the table refit;
  a scaled one-table palette; in no `fit=` mode): each row's scale is the least-squares one
  for its codes (`refit_scales`, one number per row fitted on every calibration position).
  Measured on SmolLM2, every layer `lut4-scaled` GPTQ-rounded with an `int8` head, 128
  calibration tokens (benchmarks/gptq_lut_bench.py): held-out KL 0.257 -> 0.235, perplexity
  x1.311 -> x1.288, but top-1 0.719 -> 0.703 (KL on the fitted tokens 0.071 -> 0.037); in
  the Neural Engine `auto4` package top-1 fell too (0.887 -> 0.879, KL 0.0433 -> 0.0429,
  docs/compression.md), so it is kept out of `on`.

H is the mean of x x^T / |x|^2 over the calibration positions (`input_hessian`): every position
counts once. Unnormalised, the few positions with massive activations (a decoder's first token,
tens of times the median norm at some layers) dominate it, and the codes fitted to them lose
on every other position (measured: SmolLM2 layer 27's down_proj, held-out output error 0.098
plain, 0.16-0.22 fitted to the raw second moment, 0.10 to the normalised one).

H is built from the float model's activations (`rlx_mil.compress.moments.second_moments`) for
autoN's measurements (each encodes one weight or one layer alone, the rest float) and, with
`fit=MODE` / `MODE,float`, for the conversion's codes. `fit=MODE,sequential` fits the
conversion's codes in GPTQ's order instead: each weight to the inputs the calibration graph
gives with every weight before it encoded (`rlx_mil.compress.sequential`; measured in
docs/compression.md, "Codes fitted to the calibration").
The codes are ordinary codes of the scheme: the package holds and decodes them as any other,
but they depend on the calibration text (a check must decode the package's codes, not encode
the weights again). Holds one weight in float64 while fitting.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlx_mil.compress.code_store import CodeWriter, WriterFactory
from rlx_mil.compress.linear import SLAB_ELEMENTS, LinearCodes, finite_slab, quantize_linear, rows_view
from rlx_mil.compress.moments import SecondMoment
from rlx_mil.compress.palette import (
    GROUP_BINS,
    PaletteCodes,
    fit_lut,
    group_rows,
    grouped_luts,
    lloyd_1d,
    palettize,
    quantile_seeds,
    weighted_sse,
)
from rlx_mil.compress.schemes import FIT_ORDER, LinearScheme, PaletteScheme, Scheme
from rlx_mil.errors import CompressionError

#: The share of H's mean diagonal added to its diagonal before inverting. Measured on
#: SmolLM2's projections against held-out text (benchmarks/gptq_lut_bench.py): GPTQ's usual
#: 0.01 over-fits a few hundred calibration tokens (held-out output error above plain
#: rounding on the MLP's projections); 0.1 keeps the gain on held-out text.
DAMPING = 0.1
#: Columns rounded between two updates of the rest of the weight (GPTQ's lazy batch).
COLUMN_BLOCK = 128


@dataclass(frozen=True)
class FitOptions:
    """What a fit uses the calibration Hessian for."""

    weighted: bool = True
    gptq: bool = True
    #: After `gptq`, one table's entries refitted to the codes (`refit_table`; needs the activations).
    refit: bool = True
    #: After `gptq` (and `refit`), a scaled palette's per-row scales refitted to the codes
    #: (`refit_scales`; needs the activations). Not part of any `fit=` mode (module doc).
    rescale: bool = False


def input_hessian(rows: np.ndarray) -> np.ndarray:
    """H = mean over positions of x x^T / |x|^2 ([in, in], float64) of activation rows
    ([positions, in]); all-zero positions count as nothing."""
    x = np.asarray(rows, np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.where(norm > 0, norm, 1.0)
    return x.T @ x / max(x.shape[0], 1)


def _check_hessian(hessian: np.ndarray, width: int, name: str) -> np.ndarray:
    h = np.asarray(hessian, np.float64)
    if h.shape != (width, width):
        raise CompressionError(f"weight {name!r}: its calibration Hessian is {list(h.shape)}, its input width {width}")
    if not np.isfinite(h).all():
        raise CompressionError(f"weight {name!r}: its calibration Hessian holds non-finite values")
    return h


def weighted_table(values: np.ndarray, weights: np.ndarray, k: int, seeds: tuple[np.ndarray, ...] = ()) -> np.ndarray:
    """A sorted k-entry table minimising sum(weights * (values - nearest entry)^2): weighted
    Lloyd from weighted-quantile seeds, evenly spaced seeds, the unweighted table and each of
    `seeds` (k-entry tables), the best of them."""
    flat = values.reshape(-1).astype(np.float64)
    wts = np.broadcast_to(weights, values.shape).reshape(-1).astype(np.float64)
    order = np.argsort(flat, kind="stable")
    flat, wts = flat[order], wts[order]
    keep = wts > 0
    if np.count_nonzero(keep) <= k:  # nothing (or little) weighs: an unweighted table
        flat, wts = flat, np.ones_like(wts)
    else:
        flat, wts = flat[keep], wts[keep]
    distinct, start = np.unique(flat, return_index=True)
    summed = np.add.reduceat(wts, start)
    if distinct.size <= k:
        return np.concatenate([distinct, np.full(k - distinct.size, distinct[-1])])
    # Lloyd is local: also from the unweighted table, so the result never costs more than it.
    runs = [lloyd_1d(distinct, summed, quantile_seeds(distinct, summed, k)),
            lloyd_1d(distinct, summed, np.linspace(distinct[0], distinct[-1], k)),
            lloyd_1d(distinct, summed, fit_lut(flat, k)),
            *(lloyd_1d(distinct, summed, np.asarray(seed, np.float64)) for seed in seeds)]
    errors = [weighted_sse(distinct, summed, c) for c in runs]
    return runs[int(np.argmin(errors))]


class _Grid:
    """Each row's representable values and rounding onto them (one column at a time)."""

    def round(self, column: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(codes, decoded values) of `column` (all rows of input column j)."""
        raise NotImplementedError


class _PaletteGrid(_Grid):
    def __init__(self, luts: np.ndarray, per_group: int, scale: np.ndarray | None) -> None:
        self.luts = luts.astype(np.float64)  # [groups, k], sorted
        self.group = np.arange(luts.shape[0] * per_group) // per_group if luts.shape[0] > 1 else None
        self.scale = None if scale is None else scale.astype(np.float64)
        mids = (self.luts[:, :-1] + self.luts[:, 1:]) / 2
        self.mids = mids if self.group is None else mids[self.group]

    def round(self, column: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
        u = column if self.scale is None else column / self.scale
        if self.group is None:
            idx = np.searchsorted(self.mids[0], u, side="left")
            value = self.luts[0][idx]
        else:
            idx = np.sum(u[:, None] > self.mids, axis=1)
            value = self.luts[self.group, idx]
        return idx, value if self.scale is None else value * self.scale


class _LinearGrid(_Grid):
    def __init__(self, codes: LinearCodes, channels: int) -> None:
        self.scheme = codes.scheme
        blocks = codes.scale.reshape(codes.scale.shape[0], -1).shape[1]
        self.block = max(1, codes.data.reshape(codes.data.shape[0], -1).shape[1] // blocks)
        self.scale = np.broadcast_to(codes.scale.reshape(codes.scale.shape[0], -1).astype(np.float64), (channels, blocks))
        off = codes.offset
        self.offset = None if off is None else np.broadcast_to(
            off.reshape(off.shape[0], -1).astype(np.float64), (channels, blocks))

    def round(self, column: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
        b = j // self.block
        s = self.scale[:, b]
        z = None if self.offset is None else self.offset[:, b]
        qmin, qmax = self.scheme.quant_range
        q = column / s
        if z is not None and self.scheme.float_offset:
            q = np.rint(q + z)
        else:
            q = np.rint(q) + (0.0 if z is None else z)
        q = np.clip(q, qmin, qmax)
        return q, s * (q - (0.0 if z is None else z))


def compensated_codes(rows: np.ndarray, hessian: np.ndarray, grid: _Grid, damping: float = DAMPING) -> np.ndarray:
    """GPTQ: the codes of `rows` ([out, in], float64, consumed) rounded onto `grid` column by
    column in order of decreasing H_jj, each rounding's error fed forward through the upper
    Cholesky factor of H^-1 (H damped by `damping` x its mean diagonal). Columns no
    calibration input reached (H_jj = 0) are rounded plainly and pass no error on."""
    out, width = rows.shape
    h = hessian.copy()
    diag = np.diag(h).copy()
    dead = diag <= 0
    h[dead, :] = 0
    h[:, dead] = 0
    h[dead, dead] = 1
    h[np.diag_indices(width)] += damping * (float(np.mean(diag[~dead])) if (~dead).any() else 1.0)
    order = np.argsort(-diag, kind="stable")
    h = h[order][:, order]
    w = rows[:, order]
    try:
        upper = np.linalg.cholesky(np.linalg.inv(h)).T
    except np.linalg.LinAlgError:  # not positive definite even damped: plain rounding
        upper = np.eye(width)
    codes = np.empty((out, width), np.float64)
    for i1 in range(0, width, COLUMN_BLOCK):
        i2 = min(i1 + COLUMN_BLOCK, width)
        block = w[:, i1:i2]
        errors = np.empty((out, i2 - i1))
        for i in range(i2 - i1):
            col = order[i1 + i]
            code, value = grid.round(block[:, i], int(col))
            codes[:, col] = code
            err = (block[:, i] - value) / upper[i1 + i, i1 + i]
            errors[:, i] = err
            block[:, i + 1:] -= np.outer(err, upper[i1 + i, i1 + i + 1:i2])
        w[:, i2:] -= errors @ upper[i1:i2, i2:]
    return codes


#: Tables of at most this many entries are refitted after error-compensating rounding (`refit_table`).
REFIT_ENTRIES = 16


def _unit_positions(activations: np.ndarray | SecondMoment, width: int, damping: float) -> tuple[np.ndarray, int, float]:
    """(activation rows scaled to unit length, their count, the damping added to H's diagonal):
    the pieces of ``H = X^T X / N + lam I`` as `input_hessian` weighs positions (of a
    `SecondMoment`: rows X with that Gram matrix, `SecondMoment.factor`)."""
    if isinstance(activations, SecondMoment):
        x, n = activations.factor()
        n = max(n, 1)
    else:
        x = np.asarray(activations, np.float64)
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        x = x / np.where(norm > 0, norm, 1.0)
        n = max(x.shape[0], 1)
    diag_mean = float(np.sum(x * x)) / n / max(width, 1)
    return x, n, damping * (diag_mean if diag_mean > 0 else 1.0)


def refit_table(
    rows: np.ndarray, codes: np.ndarray, table: np.ndarray, scale: np.ndarray | None, activations: np.ndarray | SecondMoment,
    damping: float = DAMPING,
) -> tuple[np.ndarray, np.ndarray]:
    """The k entries of a one-table palette refitted to its `codes` (`refit_tables` with one
    group): returns (table, codes)."""
    luts, out = refit_tables(rows, codes, np.asarray(table)[None, :], scale, activations, damping)
    return luts[0], out


#: Rows of one-hot codes held at once by `refit_tables` (a [rows, in, k] float64 slab).
REFIT_SLAB_ELEMENTS = 1 << 21


def refit_tables(
    rows: np.ndarray, codes: np.ndarray, luts: np.ndarray, scale: np.ndarray | None, activations: np.ndarray | SecondMoment,
    damping: float = DAMPING,
) -> tuple[np.ndarray, np.ndarray]:
    """The k entries of each group's table (`luts` [groups, k]; a group is `out / groups`
    consecutive rows) minimising the calibration output error of the palette with these
    `codes`: ``sum_r (w_r - s_r T_g(r)[c_r]) H (w_r - s_r T_g(r)[c_r])^T``, H the damped Hessian
    of `activations` ([positions, in]; each position normalised as `input_hessian`; or their
    `SecondMoment`). The rows of one group share its table and nothing else, so each group is
    its own problem.

    GPTQ chooses each code for the table k-means gave, then moves later codes to make up for
    earlier ones; the table that best serves the codes it ended with is no longer the k-means
    one. The error is quadratic in T_g, so the best table solves the normal equations
    ``M_g T_g = b_g``: ``M_g = sum_{r in g} s_r^2 A_r^T H A_r``, ``b_g = sum_{r in g} s_r A_r^T H
    w_r`` (A_r the one-hot matrix of row r's codes). With H = X^T X / N + lam I, ``A_r^T X^T X
    A_r`` is the Gram matrix of ``X A_r`` (per code, the sum of the input columns holding it).
    Returns (luts, codes): entries no code of the group uses keep their value, and each table
    is sorted again (its codes renumbered to match)."""
    w = np.asarray(rows, np.float64)
    idx = np.asarray(codes).astype(np.int64)
    old = np.asarray(luts, np.float64)
    groups, k = old.shape
    out_rows = w.shape[0]
    per = out_rows // groups
    x, n, lam = _unit_positions(activations, w.shape[1], damping)
    s = np.ones(out_rows) if scale is None else np.asarray(scale, np.float64)
    m = np.zeros((groups, k, k))
    b = np.zeros((groups, k))
    counts = np.zeros((groups, k))
    entries = np.arange(k)
    step = max(1, REFIT_SLAB_ELEMENTS // max(w.shape[1] * k, 1))
    for r0 in range(0, out_rows, step):
        part = slice(r0, min(r0 + step, out_rows))
        onehot = (idx[part, :, None] == entries).astype(np.float64)  # [R, in, k]
        z = np.einsum("ni,rik->rnk", x, onehot, optimize=True)  # X A_r
        sr = s[part]
        g = np.arange(part.start, part.stop) // per
        np.add.at(m, g, np.einsum("rnk,rnl->rkl", z, z, optimize=True) / n * (sr * sr)[:, None, None])
        hw = (w[part] @ x.T) @ x / n + lam * w[part]  # rows of W H
        np.add.at(b, g, np.einsum("rik,ri->rk", onehot, hw, optimize=True) * sr[:, None])
        np.add.at(counts, g, onehot.sum(axis=1) * (sr * sr)[:, None])
    m[:, entries, entries] += lam * counts
    new = old.copy()
    for grp in range(groups):
        used = counts[grp] > 0
        if not used.any():
            continue
        sub = m[grp][np.ix_(used, used)]
        try:
            new[grp, used] = np.linalg.solve(sub + 1e-12 * max(float(np.trace(sub)), 1e-30) * np.eye(int(used.sum())),
                                             b[grp, used])
        except np.linalg.LinAlgError:  # singular even with the ridge: keep this group's table
            continue
    order = np.argsort(new, axis=1, kind="stable")
    rank = np.empty((groups, k), np.int64)
    np.put_along_axis(rank, order, np.broadcast_to(entries, (groups, k)), axis=1)
    renumbered = rank[(np.arange(out_rows) // per)[:, None], idx]
    return np.take_along_axis(new, order, axis=1), renumbered.astype(np.asarray(codes).dtype)


def refit_scales(
    rows: np.ndarray, codes: np.ndarray, table: np.ndarray, scale: np.ndarray, activations: np.ndarray | SecondMoment,
    damping: float = DAMPING,
) -> np.ndarray:
    """Each row's scale s_r minimising the calibration output error of a scaled one-table
    palette with these `codes` and `table`: ``(w_r - s_r t_r) H (w_r - s_r t_r)^T`` with
    ``t_r = T[c_r]``, H the damped Hessian of `activations` as in `refit_table`. Closed form
    per row: ``s_r = t_r H w_r^T / t_r H t_r^T`` (one parameter fitted on every calibration
    position: it does not learn the tokens). A row whose codes decode to zeros keeps its scale.

    The plain scale (the row's largest magnitude) makes the table's end reach the row's
    largest weight; after error-compensating rounding the codes are no longer the nearest ones,
    and the scale that serves them best differs."""
    w = np.asarray(rows, np.float64)
    t = np.asarray(table, np.float64)[np.asarray(codes).astype(np.int64)]
    x, n, lam = _unit_positions(activations, w.shape[1], damping)
    xt, xw = x @ t.T, x @ w.T  # [positions, out]
    num = np.sum(xt * xw, axis=0) / n + lam * np.sum(t * w, axis=1)
    den = np.sum(xt * xt, axis=0) / n + lam * np.sum(t * t, axis=1)
    old = np.asarray(scale, np.float64)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), old)


#: Grouped weighted tables: groups of at most this many elements are fitted all at once on a
#: per-group histogram (`palette.grouped_luts`, with as many bins: near-exact there); larger
#: groups one at a time on their exact values.
VECTOR_GROUP_ELEMENTS = GROUP_BINS


def _weighted_luts(u: np.ndarray, weights: np.ndarray, per_group: int, k: int, store: type[np.floating]) -> np.ndarray:
    """One table per group of `per_group` rows of `u` ([out, in]), fitted by k-means weighted
    by `weights` (broadcast to `u`). Grouped tables also start from the shared table of the
    rows normalised by their group's largest magnitude (the weighted fit of a scaled table),
    scaled back to each group: Lloyd never raises the error of its start, so a table per row
    keeps at most the error of one scaled table (before fp16 rounding); from quantile seeds alone a 16-entry table on
    one row's few hundred values stops in worse local optima."""
    groups = u.shape[0] // per_group
    wts = np.broadcast_to(weights, u.shape)
    if groups == 1:
        return np.sort(weighted_table(u, wts, k).astype(store))[None, :]
    peak = np.max(np.abs(u.reshape(groups, -1)), axis=1)
    peak[peak == 0] = 1
    each = np.repeat(peak, per_group)[:, None]
    shared = weighted_table(u / each, wts * each * each, k)
    seeds = peak[:, None] * shared[None, :]
    luts = np.empty((groups, k), store)
    if per_group * u.shape[1] <= VECTOR_GROUP_ELEMENTS:
        step = max(1, SLAB_ELEMENTS // max(per_group * u.shape[1], 1))
        for g0 in range(0, groups, step):
            part = slice(g0 * per_group, (g0 + step) * per_group)
            x = u[part].reshape(-1, per_group * u.shape[1])
            fitted = grouped_luts(x.astype(np.float32), k, wts[part].reshape(x.shape), (seeds[g0:g0 + x.shape[0]],))
            luts[g0:g0 + x.shape[0]] = np.sort(fitted.astype(store), axis=1)
        return luts
    for g in range(groups):
        part = slice(g * per_group, (g + 1) * per_group)
        luts[g] = np.sort(weighted_table(u[part], wts[part], k, (seeds[g],)).astype(store))
    return luts


def fit_palette(
    weight: np.ndarray, scheme: PaletteScheme, store: type[np.floating], name: str, hessian: np.ndarray,
    options: FitOptions = FitOptions(), code_writer: WriterFactory = CodeWriter,
    activations: np.ndarray | SecondMoment | None = None,
) -> PaletteCodes:
    """`scheme`'s codes of `weight` (storage [out, in]) fitted with the calibration Hessian
    (and, to refit a table after `gptq`, the `activations` it was built from)."""
    shape = tuple(int(d) for d in weight.shape)
    rows = finite_slab(rows_view(weight), name, 0).astype(np.float64)
    channels, width = rows.shape
    h = _check_hessian(hessian, width, name)
    k = 1 << scheme.bits
    per_group = group_rows(scheme, shape, name)
    scale = None
    if scheme.channel_scale:
        peak = np.max(np.abs(rows), axis=1).astype(store)
        peak[peak == 0] = 1
        scale = peak
        u = rows / peak.astype(np.float64)[:, None]
    else:
        u = rows
    if options.weighted:
        importance = np.maximum(np.diag(h), 0.0)[None, :]
        row_weight = np.ones((channels, 1)) if scale is None else np.square(scale.astype(np.float64))[:, None]
        luts = _weighted_luts(u, importance * row_weight, per_group, k, store)
    else:
        plain = palettize(u.astype(store).reshape(shape), replace(scheme, channel_scale=False), store, name)
        luts = plain.lut
    grid = _PaletteGrid(luts, per_group, scale)
    if options.gptq:
        idx = compensated_codes(rows.copy(), h, grid)
        if options.refit and activations is not None and k <= REFIT_ENTRIES:
            refitted, idx = refit_tables(rows, idx, luts, scale, activations)
            luts = refitted.astype(store)
        if options.rescale and activations is not None and scale is not None and luts.shape[0] == 1:
            scale = refit_scales(rows, idx, luts[0], scale, activations).astype(store)
    else:
        idx = np.stack([grid.round(rows[:, j], j)[0] for j in range(width)], axis=1)
    writer = code_writer((channels, width), np.dtype(np.uint8))
    writer.put(0, idx.astype(np.uint8))
    codes = PaletteCodes(writer.result().reshape(shape), luts, scheme, 0.0, float(np.sum(rows * rows)), channel_scale=scale)
    codes.sq_error = float(np.sum(np.square(codes.dequantize().reshape(channels, width).astype(np.float64) - rows)))
    return codes


def fit_linear(
    weight: np.ndarray, scheme: LinearScheme, store: type[np.floating], name: str, hessian: np.ndarray,
    options: FitOptions = FitOptions(), code_writer: WriterFactory = CodeWriter,
) -> LinearCodes:
    """`scheme`'s codes of `weight` with the scales of plain quantization and the codes
    rounded with error compensation (`options.gptq`; else plain rounding)."""
    if not options.gptq:
        return quantize_linear(weight, scheme, store, name, code_writer)
    plain = quantize_linear(weight, scheme, store, name)  # its scales; the codes are replaced
    rows = rows_view(np.asarray(weight)).astype(np.float64)
    h = _check_hessian(hessian, rows.shape[1], name)
    grid = _LinearGrid(plain, rows.shape[0])
    q = compensated_codes(rows.copy(), h, grid)
    writer = code_writer(rows.shape, plain.data.dtype)
    writer.put(0, q.astype(plain.data.dtype))
    plain.data = writer.result().reshape(plain.data.shape)
    plain.sq_error = float(np.sum(np.square(plain.dequantize().reshape(rows.shape).astype(np.float64) - rows)))
    return plain


def fit_codes(
    weight: np.ndarray, scheme: Scheme, store: type[np.floating], name: str, hessian: np.ndarray,
    options: FitOptions = FitOptions(), code_writer: WriterFactory = CodeWriter,
    activations: np.ndarray | SecondMoment | None = None,
) -> LinearCodes | PaletteCodes:
    """`scheme`'s codes of `weight` (output channels on axis 0, the input on the rest)
    fitted to its input's calibration Hessian (`activations`: the rows it was built from, or
    their `SecondMoment`)."""
    if np.ndim(weight) < 2:
        raise CompressionError(f"weight {name!r}: fitting to activations takes a matmul weight (2-D or more), got {list(np.shape(weight))}")
    if isinstance(scheme, LinearScheme):
        return fit_linear(weight, scheme, store, name, hessian, options, code_writer)
    return fit_palette(weight, scheme, store, name, hessian, options, code_writer, activations)


#: `fit=` (`rlx_mil.compress.schemes.FIT_MODES`) -> what the fit uses H for.
FIT_OPTIONS = {"weighted": FitOptions(weighted=True, gptq=False, refit=False, rescale=False),
               "gptq": FitOptions(weighted=False, gptq=True, refit=False, rescale=False),
               "on": FitOptions(weighted=True, gptq=True, refit=True, rescale=False)}


class CalibrationFit:
    """A conversion's fitted codes. autoN's measurements (`encode`) fit each weight to the
    second moment of its calibration input in the float model
    (`rlx_mil.compress.moments.second_moments`, gathered at the first weight asked for, in
    bounded memory); the conversion's own codes (`final`) are fitted in GPTQ's order when
    `fit=MODE,sequential` (`rlx_mil.compress.sequential`: each weight to the inputs the weights
    before it give encoded), else as the measurements. H is built when a weight is encoded."""

    def __init__(self, options: FitOptions | None, moments: Callable[[], Mapping[str, SecondMoment]],
                 store: type[np.floating], plain: Callable[..., LinearCodes | PaletteCodes],
                 skip: frozenset[str] = frozenset(), sequential: Callable[[], Any] | None = None) -> None:
        self.options = options
        #: Weights encoded plainly whatever the config: an embedding table (also a tied LM head)
        #: is read by token lookups the head's activations say nothing about.
        self.skip = skip
        self.store = store
        self._gather = moments
        self._plain = plain
        self._moments: Mapping[str, SecondMoment] | None = None
        #: Makes the `SequentialCodes` of the conversion's codes (None: fitted as the measurements).
        self._sequential = sequential
        self._ahead: Any = None
        self._last: SecondMoment | None = None  # the one whose H and factor are kept

    @classmethod
    def of(cls, compressor: Any, plain: Callable[..., LinearCodes | PaletteCodes]) -> CalibrationFit:
        """The fit a `WeightCompressor`'s config asks for (none without calibration inputs);
        `plain(storage, scheme, precision, name, code_writer)` encodes where there is none."""
        from rlx_mil.lowering.target import Precision

        config = compressor.config
        mode, _, order = (config.fit or "off").partition(",")
        options = FIT_OPTIONS.get(mode) if config.calibration is not None else None

        def gather() -> Mapping[str, SecondMoment]:
            # the positions before autoN's held-apart measuring part (`sensitivity.held_apart`),
            # and the fit's own sequences (`CompressionConfig.fit_calibration`)
            from rlx_mil.compress.sensitivity import fit_moments

            return fit_moments(compressor)
        precision = compressor.precision
        fit = cls(options, gather, np.float16 if precision is Precision.FP16 else np.float32,
                  lambda storage, scheme, name, writer: plain(storage, scheme, precision, name, writer),
                  frozenset(n for n, role in compressor.roles.items() if role == "embedding"))
        if options is not None and (order or FIT_ORDER) == "sequential" and compressor.params is not None:
            from rlx_mil.compress.sequential import sequential_codes

            fit._sequential = lambda: sequential_codes(compressor, fit)
        return fit

    def moment(self, name: str, width: int) -> SecondMoment | None:
        """The second moment of weight `name`'s input (None: no fit, or no matmul input of `width`)."""
        if self.options is None or name in self.skip:
            return None
        if self._moments is None:
            self._moments = self._gather()
        found = self._moments.get(name)
        if found is None or found.width != width or found.count == 0:
            return None
        if self._last is not None and self._last is not found:
            self._last.release()
        self._last = found
        return found

    def hessian(self, name: str, width: int) -> np.ndarray | None:
        """H (`input_hessian`) of the input of weight `name` (None: no fit, or no matmul input of `width`)."""
        found = self.moment(name, width)
        return None if found is None else found.hessian()

    def encode(self, storage: np.ndarray, scheme: Scheme, name: str,
               code_writer: WriterFactory = CodeWriter) -> LinearCodes | PaletteCodes:
        """`scheme`'s codes of `storage` fitted to its input's float activations, else (no fit
        asked for, or no activations of that width) encoded plainly."""
        found = self.moment(name, rows_view(storage).shape[1]) if np.ndim(storage) >= 2 else None
        return self.encode_moment(storage, scheme, name, found, code_writer)

    def encode_moment(self, storage: np.ndarray, scheme: Scheme, name: str, moment: SecondMoment | None,
                      code_writer: WriterFactory = CodeWriter) -> LinearCodes | PaletteCodes:
        """`scheme`'s codes of `storage` fitted to the second `moment` of the input its matmul
        multiplies, else (none, another width, a weight in `skip`, no fit) plainly."""
        width = rows_view(storage).shape[1] if np.ndim(storage) >= 2 else -1
        if self.options is None or name in self.skip or moment is None or moment.width != width or moment.count == 0:
            return self._plain(storage, scheme, name, code_writer)
        return fit_codes(storage, scheme, self.store, name, moment.hessian(), self.options, code_writer, moment)

    def ahead(self, name: str, transposed: bool) -> Any:
        """The conversion's codes of weight `name` fitted in GPTQ's order (`fit=MODE,sequential`;
        a low-rank correction included), the lowering holding it `transposed` against the
        param (or not); None when not sequential, or not in the planned layout (the caller then
        encodes it as `encode` does)."""
        if self._sequential is None:
            return None
        if self._ahead is None:
            self._ahead = self._sequential()
            self._moments = self._last = None  # the float statistics of the measurements: no longer needed
        return self._ahead.final_codes(name, transposed)

    def final(self, storage: np.ndarray, scheme: Scheme, name: str, transposed: bool,
              code_writer: WriterFactory = CodeWriter) -> Any:
        """The conversion's codes of weight `name` (`storage`: the param, or its transpose when
        `transposed`; a scheme without a low-rank correction): `ahead`'s, else `encode`'s."""
        codes = self.ahead(name, transposed)
        return self.encode(storage, scheme, name, code_writer) if codes is None else codes
