"""Graph factories, value generators and the one entry point (`verify`) of the end-to-end suite.

Every test builds a small graph around one op, feeds values chosen so the spec is unambiguous
(no exact .5 ties for Round, no divisions by ~0, fractions clear of integers before a float ->
int cast...), and hands it to `verify`, which runs `rlx_mil.testing.check_conversion` on every
target up to iOS18 that has rules for the graph's ops (`E2E_TARGETS`), in fp32 and fp16, through the MIL executor before
and after a save/reload round trip. A graph whose ops lack a lowering rule is still converted
on every target, so the missing rule fails the test instead of silently checking nothing.

Each `check_conversion` call converts up to 8 models, so hypothesis example counts are small;
`e2e_settings(n)` gives about half of `n` examples (at least 2) in the default quick profile and
8 x `n` in the thorough one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from hypothesis import Phase, settings
from hypothesis import strategies as st

from rlx_mil.ir.dtype import DType
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.naming import output_names
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.testing import CheckReport, Tolerance, check_conversion, supported_targets

PRECISIONS: tuple[Precision, ...] = (Precision.FP32, Precision.FP16)
#: The targets `verify` checks by default: iOS15-iOS18. iOS26 lowers every op as iOS18 does (the
#: same rules and MIL ops; Core ML's passes differ only for compressed weights), so a
#: representative set of graphs checks it instead (tests/e2e/test_ios26_e2e.py), which keeps the
#: suite's time.
E2E_TARGETS: tuple[Target, ...] = tuple(t for t in Target if t <= Target.IOS18)
THOROUGH = os.environ.get("RLX_MIL_HYPOTHESIS_PROFILE", "quick") == "thorough"
#: The thorough profile runs `THOROUGH_FACTOR` x a test's declared count; the quick one (every
#: suite run, derandomized) about half of it, at least `QUICK_MIN`: each example converts up to
#: 8 models, and these tests were a sixth of the suite's time.
THOROUGH_FACTOR = 8
QUICK_MIN = 2
#: Engines `check_conversion` reports per target x precision without macOS (executor on the
#: in-memory model, and on the saved + reloaded package).
ENGINES_ON_LINUX = 2


def examples(quick: int) -> int:
    return quick * THOROUGH_FACTOR if THOROUGH else max(QUICK_MIN, (quick + 1) // 2)


def e2e_settings(quick: int) -> settings:
    """`examples(quick)` hypothesis examples (each converts up to 8 models): fewer in the quick
    profile, more when thorough.

    No shrinking: every shrink step converts the graph again on every target, which turns a
    failure into many minutes; the unshrunk falsifying example is still reported."""
    return settings(max_examples=examples(quick), phases=(Phase.explicit, Phase.reuse, Phase.generate))


seeds = st.integers(min_value=0, max_value=2**32 - 1)


# ------------------------------------------------------------------------------ running


def verify(
    graph: Graph,
    inputs: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    *,
    tolerances: Mapping[Precision, Tolerance] | None = None,
    attention: str = "auto",
    targets: Sequence[Target] | None = None,
) -> CheckReport:
    """Reference vs converted model on every supported target, fp32 and fp16; raises
    `ConversionMismatch` (an AssertionError) on any difference beyond tolerance."""
    if targets is not None and not targets:
        raise ValueError("targets must not be empty (None means every supported target)")
    chosen = list(targets) if targets is not None else [t for t in supported_targets(graph) if t in E2E_TARGETS]
    if not chosen:
        # No rule for some op: convert anyway so the UnsupportedOpError names it.
        chosen = list(E2E_TARGETS)
    with packages_not_synced():
        report = check_conversion(
            graph, params or {}, inputs, targets=chosen, precisions=PRECISIONS,
            tolerances=tolerances, attention=attention, roundtrip=True,
        )
    outputs = len(output_names(graph))
    expected = len(chosen) * len(PRECISIONS) * outputs * ENGINES_ON_LINUX
    assert len(report.checks) >= expected, (
        f"only {len(report.checks)} comparisons made, expected {expected}: {report.summary()}"
    )
    return report


@contextmanager
def packages_not_synced() -> Iterator[None]:
    """`rlx_mil.save` without its fsyncs: the round trip reads each package back from a
    temporary folder deleted right after, so its durability on disk is never in question
    (tests/lower/test_save.py checks the fsyncs), and on a busy disk they cost more than the
    save itself (8 saves per `verify`)."""
    from rlx_mil.coreml import saving

    real = saving._fsync_path
    saving._fsync_path = lambda path: None
    try:
        yield
    finally:
        saving._fsync_path = real


def fp16_tolerance(atol: float, rtol: float) -> dict[Precision, Tolerance]:
    return {Precision.FP16: Tolerance(atol, rtol)}


# ------------------------------------------------------------------------------ values


def rng_for(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def uniform(rng: np.random.Generator, dims: Sequence[int], low: float, high: float) -> np.ndarray:
    return rng.uniform(low, high, size=tuple(dims)).astype(np.float32)


def normal(rng: np.random.Generator, dims: Sequence[int], scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(tuple(dims)) * scale).astype(np.float32)


def signed(rng: np.random.Generator, dims: Sequence[int], low: float, high: float) -> np.ndarray:
    """Random sign, magnitude in [low, high] (keeps divisors and logs away from 0)."""
    magnitude = rng.uniform(low, high, size=tuple(dims))
    sign = np.where(rng.random(tuple(dims)) < 0.5, -1.0, 1.0)
    return (sign * magnitude).astype(np.float32)


def integers(rng: np.random.Generator, dims: Sequence[int], low: int, high: int) -> np.ndarray:
    """Integer values in [low, high] held as float32 (exact in fp16 for |v| <= 2048)."""
    return rng.integers(low, high + 1, size=tuple(dims)).astype(np.float32)


def clear_fractions(rng: np.random.Generator, dims: Sequence[int], low: int, high: int) -> np.ndarray:
    """Values k + f with integer k in [low, high) and f in [0.1, 0.35] or [0.65, 0.9]: no
    Round tie, and for |v| < 256 the fp16 rounding of the input (at most 1/16) keeps v on the
    same side of every integer and every .5, so truncation and rounding agree with fp32."""
    whole = rng.integers(low, high, size=tuple(dims))
    frac = rng.uniform(0.1, 0.35, size=tuple(dims))
    frac = np.where(rng.random(tuple(dims)) < 0.5, frac, 1.0 - frac)
    return (whole + frac).astype(np.float32)


def distinct_grid(rng: np.random.Generator, dims: Sequence[int], step: float = 0.25) -> np.ndarray:
    """Distinct multiples of `step` (exact in fp16 for small sizes) in random order along
    the last axis: no ties that fp16 rounding could create or break."""
    dims = tuple(dims)
    count = int(np.prod(dims)) if dims else 1
    values = (rng.permutation(count) - count // 2) * step
    return values.reshape(dims).astype(np.float32)


# ------------------------------------------------------------------------------ graph building


class Feeds:
    """A graph under construction plus the values of its leaves.

    `input`/`param`/`constant` add a leaf holding `value` (stored in `inputs`/`params`, or
    in the graph for constants) and return its node id.
    """

    def __init__(self, name: str) -> None:
        self.graph = Graph(name)
        self.inputs: dict[str, np.ndarray] = {}
        self.params: dict[str, np.ndarray] = {}

    def input(self, name: str, value: np.ndarray, dtype: DType | str = DType.F32) -> int:
        the_dtype = DType.parse(dtype)
        self.inputs[name] = _as_dtype(value, the_dtype)
        return self.graph.input(name, list(np.shape(value)), the_dtype)

    def param(self, name: str, value: np.ndarray, dtype: DType | str = DType.F32) -> int:
        the_dtype = DType.parse(dtype)
        self.params[name] = _as_dtype(value, the_dtype)
        return self.graph.param(name, list(np.shape(value)), the_dtype)

    def constant(self, name: str, value: np.ndarray, dtype: DType | str = DType.F32) -> int:
        the_dtype = DType.parse(dtype)
        return self.graph.constant(_as_dtype(value, the_dtype), the_dtype, name=name)

    def leaf(self, kind: str, name: str, value: np.ndarray, dtype: DType | str = DType.F32) -> int:
        """`kind` is "input", "param" or "constant" (see `leaf_kinds`)."""
        if kind == "input":
            return self.input(name, value, dtype)
        if kind == "param":
            return self.param(name, value, dtype)
        if kind == "constant":
            return self.constant(name, value, dtype)
        raise ValueError(f"unknown leaf kind {kind!r}")

    def verify(self, outputs: Sequence[int] | int, **options: Any) -> CheckReport:
        self.graph.set_outputs(outputs)
        return verify(self.graph, self.inputs, self.params, **options)


#: Where an operand comes from: a run-time input, a weight, or a constant baked in the graph.
LEAF_KINDS = ("input", "param", "constant")
leaf_kinds = st.sampled_from(LEAF_KINDS)
#: Weights and run-time tensors (constants are only worth drawing where rules special-case them).
weight_kinds = st.sampled_from(("input", "param"))


def _as_dtype(value: np.ndarray, dtype: DType) -> np.ndarray:
    arr = np.asarray(value)
    if dtype is DType.BOOL:
        return arr != 0
    if dtype is DType.BF16:
        return arr.astype(np.float32)
    if dtype.is_int:
        return np.trunc(arr).astype(dtype.numpy)
    return arr.astype(dtype.numpy)
