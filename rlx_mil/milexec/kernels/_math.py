"""Vectorised special functions the kernels need (numpy has no erf; scipy is not a dependency)."""

from __future__ import annotations

import math

import numpy as np

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_TAYLOR_LIMIT = 2.5
# Enough Maclaurin terms that |x| < 2.5 converges below 1e-16 in float64.
_TAYLOR_TERMS = 48
# Chebyshev fit of erfc(|x|) (fractional error < 1.2e-7), used where erf is within 4e-4 of +-1,
# so the absolute error there is < 1e-10.
_ERFC_COEFFS = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)


def erf(x: np.ndarray) -> np.ndarray:
    """Gauss error function, elementwise, float64 result (absolute error < 1e-10)."""
    values = np.asarray(x, dtype=np.float64)
    out = np.empty_like(values)
    small = np.abs(values) < _TAYLOR_LIMIT
    xs = values[small]
    squared = xs * xs
    term = xs.copy()
    total = xs.copy()
    for n in range(1, _TAYLOR_TERMS):
        term *= -squared / n
        total += term / (2 * n + 1)
    out[small] = _TWO_OVER_SQRT_PI * total

    large = ~small  # NaN lands here and stays NaN
    xl = values[large]
    a = np.abs(xl)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = np.zeros_like(t)
    for c in reversed(_ERFC_COEFFS[1:]):
        poly = t * (poly + c)
    erfc = t * np.exp(-a * a + _ERFC_COEFFS[0] + poly)
    out[large] = np.sign(xl) * (1.0 - erfc)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function without overflow warnings mattering (exp(-x) -> inf gives 0)."""
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)
