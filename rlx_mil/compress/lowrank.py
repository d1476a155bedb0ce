"""A low-rank correction of a compressed weight's error (``SCHEME+rN``: LQER, ZeroQuant-V2's LoRC).

A matmul weight W ([out, in], y = x W^T) held as codes Q may carry a rank-r correction
``A B`` (A [out, r], B [r, in], in the program's float type) of its error ``E = W - Q``. The
package never makes the dense ``Q + A B``: the lowering runs the correction beside the
compressed projection on the activation side, ``y = x Q^T + (x B^T) A^T`` (two small `linear`
ops, 1x1 convs in the Neural Engine form, and an `add`), so only ``r (out + in)`` values are
added to the codes.

The best rank-r correction of the layer's output error for inputs whose second moment has the
diagonal ``d`` (``d_j = H_jj``, the fit's `rlx_mil.compress.fitting.input_hessian`, or the
plan's per-channel activation importance) is the truncated SVD of ``E diag(sqrt(d))`` mapped
back by ``diag(1 / sqrt(d))`` (AWQ-style diagonal weighting; the full ``H^{1/2}`` form was
measured no better, docs/compression.md). It is fitted to the codes actually stored (after
GPTQ-style rounding when the codes are fitted), and its factors are balanced (equal column /
row norms) before they are rounded to the stored float type. Without calibration input the
weighting is uniform (the plain SVD of E).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.compress.linear import LinearCodes, rows_view
from rlx_mil.compress.palette import PaletteCodes
from rlx_mil.compress.schemes import Scheme
from rlx_mil.errors import CompressionError

#: What the factor consts of a weight's correction add to the name of its decoding op
#: (B [r, in], A [out, r]): how `rlx_mil.milexec.stored_weights` finds them in a package.
FACTOR_SUFFIXES = ("_lr_down", "_lr_up")
#: Input features whose second moment is below this share of the mean count as this share:
#: a feature the calibration text never drives would otherwise get an unbounded correction.
WEIGHT_FLOOR = 1e-4


@dataclass
class CorrectedCodes:
    """Codes of a scheme plus the rank-r factors of their error's correction (module doc)."""

    base: LinearCodes | PaletteCodes
    #: A [out, r] and B [r, in], in the stored float type: the weight is ``Q + A @ B``.
    left: np.ndarray
    right: np.ndarray
    scheme: Scheme
    sq_error: float
    sq_norm: float
    max_error: float | None = None

    @property
    def rank(self) -> int:
        return int(self.right.shape[0])

    def correction(self) -> np.ndarray:
        """A @ B ([out, in], float32), computed from the factors as stored."""
        return self.left.astype(np.float32) @ self.right.astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """Q + A B in float32, in the codes' storage shape: the weight the program computes with."""
        base = self.base.dequantize()
        return (rows_view(base) + self.correction()).reshape(base.shape).astype(np.float32)

    @property
    def relative_error(self) -> float:
        return float(np.sqrt(self.sq_error / self.sq_norm)) if self.sq_norm > 0 else float(np.sqrt(self.sq_error))

    @property
    def factor_bytes(self) -> int:
        return int(self.left.nbytes + self.right.nbytes)


def check_rank_fits(scheme: Scheme, shape: tuple[int, ...], name: str) -> None:
    """Raise when `scheme`'s correction cannot ride on a weight of storage `shape`."""
    if not scheme.rank:
        return
    if len(shape) != 2:
        raise CompressionError(f"weight {name!r}: {scheme.label}: a low-rank correction is for a matmul weight [out, in],"
                               f" this one is {list(shape)}")
    if scheme.rank > min(shape):
        raise CompressionError(f"weight {name!r}: {scheme.label}: rank {scheme.rank} exceeds the smaller side of its"
                               f" [out, in] = {list(shape)} (at most +r{min(shape)})")


def fit_correction(
    error: np.ndarray, rank: int, store: type[np.floating[Any]], feature_weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(A [out, r], B [r, in]) in `store`: the rank-`rank` correction of `error` ([out, in])
    that best lowers the output error for inputs whose per-feature second moment is
    `feature_weights` ([in]; uniform when None)."""
    e = np.asarray(error, np.float64)
    if feature_weights is None or np.size(feature_weights) != e.shape[1]:
        s = np.ones(e.shape[1])
    else:
        d = np.asarray(feature_weights, np.float64).reshape(-1)
        mean = float(np.mean(d)) if d.size else 0.0
        s = np.sqrt(np.maximum(d, WEIGHT_FLOOR * mean)) if mean > 0 else np.ones(e.shape[1])
    left, right = _top_components(e * s[None, :], rank)
    right = right / s[None, :]
    # Equal norms per component keep both factors in the stored type's range and precision.
    norm = np.sqrt(np.linalg.norm(left, axis=0) / np.maximum(np.linalg.norm(right, axis=1), 1e-30))
    norm = np.where(norm > 0, norm, 1.0)
    return (left / norm).astype(store), (right * norm[:, None]).astype(store)


def _top_components(m: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(L [out, rank], R [rank, in]) with L R the best rank-`rank` approximation of `m`: the
    truncated SVD, from the eigenvectors of the smaller Gram matrix (a full SVD of a
    256 x 1536 error took 5.8 s on the shared machine, the Gram route 0.1 s)."""
    if m.shape[0] <= m.shape[1]:
        _, vectors = np.linalg.eigh(m @ m.T)
        u = vectors[:, ::-1][:, :rank]  # the left singular vectors, largest first
        return u, u.T @ m
    _, vectors = np.linalg.eigh(m.T @ m)
    v = vectors[:, ::-1][:, :rank]
    return m @ v, v.T


def correct(
    codes: LinearCodes | PaletteCodes, storage: np.ndarray, scheme: Scheme, store: type[np.floating[Any]], name: str,
    feature_weights: np.ndarray | None = None,
) -> CorrectedCodes:
    """`codes` of `storage` ([out, in]) with the rank-`scheme.rank` correction of their error
    fitted (`fit_correction`) to what they decode to."""
    shape = tuple(int(d) for d in np.shape(storage))
    check_rank_fits(scheme, shape, name)
    w = np.asarray(storage, np.float64)
    q = rows_view(codes.dequantize()).astype(np.float64)
    left, right = fit_correction(w - q, scheme.rank, store, feature_weights)
    if not (np.isfinite(left).all() and np.isfinite(right).all()):
        raise CompressionError(f"weight {name!r}: {scheme.label}: its correction's factors overflow {np.dtype(store).name}")
    rest = w - q - left.astype(np.float64) @ right.astype(np.float64)
    return CorrectedCodes(codes, left, right, scheme, float(np.sum(rest * rest)), float(np.sum(w * w)),
                          getattr(codes, "max_error", None))
