"""A matmul layer and its calibration inputs for the fitting tests, and their damped H."""

from __future__ import annotations

import numpy as np

from rlx_mil.compress.fitting import DAMPING, input_hessian


def calibrated_layer(seed: int, out: int, width: int, tokens: int, outlier_row: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(weight [out, width], calibration inputs [tokens, width]): correlated inputs whose first
    two features are 6x the others, and, with `outlier_row`, one weight 12x the rest's scale."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out, width)) * 0.05
    if outlier_row:
        w[3, 5] = 0.6
    x = rng.standard_normal((tokens, width)) @ (np.eye(width) + rng.standard_normal((width, width)) / 4)
    x[:, :2] *= 6.0  # outlier features
    return w, x


def damped_hessian(x: np.ndarray) -> np.ndarray:
    """`input_hessian(x)` with the fit's damping added, as the fit solves with it."""
    h = input_hessian(x)
    return h + DAMPING * float(np.mean(np.diag(h))) * np.eye(h.shape[0])
