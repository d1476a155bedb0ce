"""milexec against Apple's Core AI runtime, on the same program: output by output after every
call of a sequence (e.g. a prefill then N decode steps), and state by state at the end.

Both engines read the same package and get the same feeds; each keeps its own states, so a
drift in a KV cache shows in the states compared after the last step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_mil.coreai.engine import CoreAIProgram
from rlx_mil.milexec.executor import PrecisionModel


@dataclass(frozen=True)
class Difference:
    """How far Core AI's value is from milexec's for one output or state."""

    step: int
    name: str
    max_abs: float
    max_rel: float
    shape_matches: bool = True

    def within(self, rtol: float, atol: float) -> bool:
        return self.shape_matches and (self.max_abs <= atol or self.max_rel <= rtol)


@dataclass
class CrossCheckReport:
    outputs: list[Difference] = field(default_factory=list)
    states: list[Difference] = field(default_factory=list)

    def worst(self) -> Difference | None:
        every = self.outputs + self.states
        return max(every, key=lambda d: d.max_rel) if every else None

    def failures(self, rtol: float = 1e-4, atol: float = 1e-5) -> list[Difference]:
        return [d for d in self.outputs + self.states if not d.within(rtol, atol)]


def difference(step: int, name: str, got: np.ndarray, want: np.ndarray) -> Difference:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Difference(step, name, float("inf"), float("inf"), shape_matches=False)
    if got.dtype == np.bool_ or want.dtype == np.bool_:
        wrong = float(np.count_nonzero(got != want))
        return Difference(step, name, wrong, wrong)
    a, b = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & (a == b)
    delta = np.where(both_nan | same_inf, 0.0, np.abs(a - b))
    delta = np.where(np.isnan(delta), np.inf, delta)
    scale = float(np.max(np.abs(np.where(np.isfinite(b), b, 0.0)))) if b.size else 0.0
    max_abs = float(np.max(delta)) if delta.size else 0.0
    return Difference(step, name, max_abs, max_abs / scale if scale > 0 else max_abs)


def crosscheck(source: Any, calls: Sequence[tuple[str | None, Mapping[str, Any]]], *,
               states: Mapping[str, np.ndarray] | None = None,
               program: CoreAIProgram | None = None, precision_model: PrecisionModel = "declared"
               ) -> CrossCheckReport:
    """Run each `(function name, feeds)` of `calls` through milexec and through Core AI, in
    order, each engine carrying its own states (starting from `states`, zeros by default), and
    compare every output of every call and every state after the last. `precision_model` is
    milexec's: "declared" rounds where the program declares fp16 (an fp32 LLM package's fp16
    KV cache: Core AI rounds at the same explicit casts); "float32" never rounds."""
    from rlx_mil import milexec

    names = sorted({name for name, _ in calls if name is not None}) or None
    own = program is None
    core_ai = program or CoreAIProgram(source, names)
    try:
        exec_states: dict[str, np.ndarray] = {k: np.array(v) for k, v in (states or {}).items()}
        core_states: dict[str, np.ndarray] = {k: np.array(v) for k, v in (states or {}).items()}
        report = CrossCheckReport()
        for step, (function_name, feeds) in enumerate(calls):
            want = milexec.run(source, feeds, function_name=function_name, states=exec_states,
                               precision_model=precision_model)
            got = core_ai.run(feeds, function_name=function_name, states=core_states)
            for name, value in want.items():
                report.outputs.append(difference(step, name, got[name], value) if name in got else
                                      Difference(step, name, float("inf"), float("inf"), shape_matches=False))
        for name, value in exec_states.items():
            report.states.append(difference(len(calls) - 1, name, core_states[name], value))
        return report
    finally:
        if own:
            core_ai.close()
