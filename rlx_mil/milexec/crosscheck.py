"""Checking every kernel against coremltools' own `value_inference` while a program runs.

Values are attached to the program's Vars for the duration of a run (so `op.value_inference()`
sees the inputs, including those inside nested blocks) and the previous symbolic values are
restored afterwards. coremltools computes in the input dtype (numpy fp16 arithmetic for fp16
ops), so fp16 outputs are compared with an fp16-sized tolerance.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import MilExecError
from rlx_mil.milexec.registry import declared_dtype


@dataclass(frozen=True)
class Tolerance:
    """|ours - theirs| <= atol + rtol * |theirs| + scale_atol * max|theirs over the tensor|."""

    rtol: float
    atol: float
    scale_atol: float


DEFAULT_TOLERANCES: Mapping[np.dtype, Tolerance] = {
    np.dtype(np.float32): Tolerance(rtol=1e-4, atol=1e-6, scale_atol=1e-5),
    # fp16 has an 11-bit significand (ulp 2^-10 ~ 1e-3 relative); numpy fp16 arithmetic in
    # value_inference rounds every intermediate, the kernels round once.
    np.dtype(np.float16): Tolerance(rtol=8e-3, atol=1e-4, scale_atol=8e-3),
}

_SILENT_LOGGERS = ("coremltools",)


def _has_own_value_inference(op: Any) -> bool:
    from coremltools.converters.mil.mil import Operation

    return type(op).value_inference is not Operation.value_inference


def _known_divergence(op: Any) -> str | None:
    """Reasons coremltools' reference is known to be wrong for this op instance."""
    if op.op_type == "scatter_along_axis" and op.mode is not None and op.mode.val != "update":
        return "coremltools' scatter_along_axis value_inference ignores `mode` (always 'update')"
    if op.op_type == "cumsum" and op.exclusive is not None and bool(op.exclusive.val):
        return "coremltools' cumsum value_inference cannot compute exclusive=True"
    return None


class CrossChecker:
    """Attaches computed values to Vars, compares each op with coremltools, restores on close."""

    def __init__(self, tolerances: Mapping[np.dtype, Tolerance] | None = None) -> None:
        self.tolerances = dict(DEFAULT_TOLERANCES)
        if tolerances:
            self.tolerances.update({np.dtype(k): v for k, v in tolerances.items()})
        self.checked: list[str] = []
        self.skipped: dict[str, str] = {}
        self._saved: list[tuple[Any, Any]] = []

    # -- attaching values -------------------------------------------------------------------
    def attach(self, var: Any, value: Any) -> None:
        from coremltools.converters.mil.mil import types

        if types.is_state(var.sym_type) or not isinstance(value, np.ndarray):
            return
        dtype = declared_dtype(var)
        if dtype is None:
            return
        holder = var.sym_type()
        holder.val = _native(value.astype(dtype, copy=True), var)
        self._saved.append((var, var._sym_val))
        var._sym_val = holder

    def restore(self) -> None:
        for var, old in reversed(self._saved):
            var._sym_val = old
        self._saved.clear()

    # -- checking ---------------------------------------------------------------------------
    def check(self, op: Any, ours: list[np.ndarray], lookup: Callable[[Any], np.ndarray]) -> None:
        reason = _known_divergence(op)
        if reason is not None:
            self.skipped[op.name] = reason
            return
        expected = self._reference(op)
        if isinstance(expected, str):
            self.skipped[op.name] = expected
            return
        refs = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        if len(refs) != len(ours):
            self.skipped[op.name] = f"coremltools returned {len(refs)} values for {len(ours)} outputs"
            return
        if any(ref is None or np.asarray(ref).dtype == object for ref in refs):
            self.skipped[op.name] = "coremltools returned a symbolic or missing value"
            return
        for index, (var, mine, ref) in enumerate(zip(op.outputs, ours, refs, strict=True)):
            problem = self._compare(op, index, var, mine, ref, lookup)
            if problem is not None:
                raise MilExecError(
                    f"cross-check: op '{op.name}' ({op.op_type}) output {index} '{var.name}' disagrees "
                    f"with coremltools' value_inference: {problem}"
                )
        self.checked.append(op.name)

    def _reference(self, op: Any) -> Any:
        quiet = [logging.getLogger(name) for name in _SILENT_LOGGERS]
        levels = [logger.level for logger in quiet]
        for logger in quiet:
            logger.setLevel(logging.CRITICAL)
        try:
            with np.errstate(all="ignore"):
                if hasattr(op, "materialized_val_inference"):
                    result = op.materialized_val_inference()
                elif _has_own_value_inference(op):
                    result = op.value_inference()
                else:
                    return "coremltools has no value_inference for this op type"
        except NotImplementedError as exc:
            return f"coremltools value_inference not implemented here: {exc}"
        except Exception as exc:
            return f"coremltools value_inference failed: {type(exc).__name__}: {exc}"
        finally:
            for logger, level in zip(quiet, levels, strict=True):
                logger.setLevel(level)
        if result is None:
            return "coremltools value_inference returned no value"
        return result

    def _compare(
        self,
        op: Any,
        index: int,
        var: Any,
        mine: np.ndarray,
        ref: Any,
        lookup: Callable[[Any], np.ndarray],
    ) -> str | None:
        dtype = declared_dtype(var)
        theirs = np.asarray(ref)
        if dtype is None:
            return None
        if theirs.shape != mine.shape:
            if theirs.size == mine.size and theirs.size <= 1:
                theirs = theirs.reshape(mine.shape)
            else:
                return f"shape {mine.shape} vs coremltools {theirs.shape}"
        with np.errstate(all="ignore"):
            theirs = theirs.astype(dtype)
        if dtype.kind in "biu":
            return _compare_exact(op, index, mine, theirs, lookup)
        tolerance = self.tolerances.get(dtype, self.tolerances[np.dtype(np.float32)])
        return _compare_float(mine, theirs, tolerance)


def _native(value: np.ndarray, var: Any) -> Any:
    """Scalars go onto a Var as numpy scalars, as coremltools itself stores them."""
    from coremltools.converters.mil.mil import types

    if not types.is_tensor(var.sym_type) and value.ndim == 0:
        return value[()]
    return value


def _compare_exact(
    op: Any, index: int, mine: np.ndarray, theirs: np.ndarray, lookup: Callable[[Any], np.ndarray]
) -> str | None:
    if np.array_equal(mine, theirs):
        return None
    if op.op_type in ("argsort", "topk") and _same_up_to_ties(op, index, mine, theirs, lookup):
        return None
    if op.op_type == "quantize" and np.max(np.abs(mine.astype(np.int64) - theirs.astype(np.int64))) <= 1:
        # round(x / scale) of a value sitting on a .5 boundary may land either side after
        # fp16 vs fp32 division.
        return None
    where = np.argwhere(mine != theirs)
    first = tuple(int(i) for i in where[0]) if where.size else ()
    return (
        f"{len(where)} of {mine.size} elements differ; first at {first}: "
        f"ours {mine[first]!r}, coremltools {theirs[first]!r}"
    )


def _same_up_to_ties(
    op: Any, index: int, mine: np.ndarray, theirs: np.ndarray, lookup: Callable[[Any], np.ndarray]
) -> bool:
    """Index outputs of argsort/topk may order equal keys differently."""
    if (op.op_type == "topk" and index != 1) or mine.dtype.kind not in "iu":
        return False
    x = lookup(op.inputs["x"])
    axis = int(op.axis.val) if op.axis is not None else -1
    try:
        return bool(
            np.array_equal(
                np.take_along_axis(x, mine.astype(np.int64), axis),
                np.take_along_axis(x, theirs.astype(np.int64), axis),
            )
        )
    except (IndexError, ValueError):
        return False


def _compare_float(mine: np.ndarray, theirs: np.ndarray, tolerance: Tolerance) -> str | None:
    a = mine.astype(np.float64)
    b = theirs.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    finite = np.isfinite(a) & np.isfinite(b)
    nonfinite_mismatch = ~(both_nan | same_inf | finite)
    scale = float(np.max(np.abs(b[finite]))) if finite.any() else 0.0
    limit = tolerance.atol + tolerance.rtol * np.abs(b) + tolerance.scale_atol * scale
    too_far = finite & (np.abs(a - b) > limit)
    bad = too_far | nonfinite_mismatch
    if not bad.any():
        return None
    where = np.argwhere(bad)
    first = tuple(int(i) for i in where[0]) if where.size else ()
    worst = float(np.max(np.abs(a - b)[finite])) if finite.any() else float("nan")
    return (
        f"{len(where)} of {a.size} elements outside tolerance {tolerance}; first at {first}: "
        f"ours {a[first]!r}, coremltools {b[first]!r}; largest finite |difference| {worst:.3g}"
    )
