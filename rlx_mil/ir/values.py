"""Which arrays may stand for values of an IR dtype: the one rule `rlx_mil.convert` (params)
and `rlx_mil.reference.evaluate` (inputs and params) both apply.

- Float dtypes take float arrays (float16/32/64 or `ml_dtypes.bfloat16`); an integer array
  for a float tensor is refused as a likely mix-up (quantized codes, token ids).
- Integer dtypes take integer or bool arrays, or float arrays of whole numbers, and every
  value must lie in the declared type's range: 2**40 for I32, 300 for I8, -1 for U32, inf
  and NaN are refused, never wrapped or saturated.
- Bool takes any numeric array: zero is False, anything else True.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from rlx_mil.ir.dtype import DType

INT_RANGES: dict[DType, tuple[int, int]] = {
    DType.I8: (-(2**7), 2**7 - 1), DType.I16: (-(2**15), 2**15 - 1),
    DType.I32: (-(2**31), 2**31 - 1), DType.I64: (-(2**63), 2**63 - 1),
    DType.U8: (0, 2**8 - 1), DType.U32: (0, 2**32 - 1),
}
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def numeric_kind(dtype: np.dtype[Any]) -> str | None:
    """'b', 'i', 'u' or 'f' (bfloat16 counts as 'f'); None for anything else."""
    if dtype == BFLOAT16:
        return "f"
    return dtype.kind if dtype.kind in "biuf" else None


def _int_values_problem(arr: np.ndarray, declared: DType) -> str | None:
    lo, hi = INT_RANGES[declared]
    if arr.dtype.kind == "f" or arr.dtype == BFLOAT16:
        wide = arr.astype(np.float64)
        with np.errstate(invalid="ignore"):
            integral = np.isfinite(wide) & (np.trunc(wide) == wide)
        if not integral.all():
            bad = wide[~integral].flat[0]
            return f"holds non-integer values (e.g. {bad}), which {declared.value} cannot hold"
        if wide.min() < lo or wide.max() > hi:
            return f"holds values outside the {declared.value} range [{lo}, {hi}] (from {wide.min():.17g} to {wide.max():.17g})"
        return None
    if arr.dtype.kind == "b":
        return None
    low, high = int(arr.min()), int(arr.max())
    if low < lo or high > hi:
        return f"holds values outside the {declared.value} range [{lo}, {hi}] (from {low} to {high})"
    return None


def value_problem(arr: np.ndarray, declared: DType) -> str | None:
    """Why `arr` cannot be a value of IR dtype `declared`, or None if it can (see module doc)."""
    kind = numeric_kind(arr.dtype)
    if kind is None:
        return f"has dtype {arr.dtype}, which is not a numeric array"
    if declared.is_complex:
        return f"is declared {declared.value}, which is outside the rlx_mil IR subset"
    if declared.is_float:
        if kind != "f":
            return f"has dtype {arr.dtype} where {declared.value} (float) is declared"
        return None
    if not arr.size:
        return None
    if declared is DType.BOOL:
        return None  # any number: zero is False, everything else True (NumPy's and Core ML's cast)
    return _int_values_problem(arr, declared)
