"""End-to-end verification harness: reference semantics vs the converted model.

`check_conversion` converts a graph for each requested target and precision, runs the
converted program (after Core ML's pass pipeline) through the NumPy MIL executor, also after a
save -> reload round trip, and on macOS through `MLModel.predict` on CPU_ONLY and ALL; every
output is compared with `rlx_mil.reference.evaluate`.

`compare_greedy_step` / `GreedyComparison` compare greedy generations tie-aware: a different
token where the reference's top choice leads the package's by no more than the precision's
reach is a near-tie, reported, and the comparison continues teacher-forced with the
reference's token; a real divergence or a logit beyond tolerance fails.

Tolerances (elementwise `|got - want| <= atol + rtol * |want|`, non-finite values must match):

* fp32 precision: atol 1e-4, rtol 1e-4 — float32 kernels, differences come from summation
  order and transcendental approximations only.
* fp16 precision: atol 2e-2, rtol 2e-2 — every intermediate is rounded to fp16 (about 3
  significant digits) and errors grow along a chain of ops; graphs with long chains or large
  reductions may pass a looser `Tolerance`.
* Core ML on macOS gets the same tolerance as the executor for fp32, and twice it for fp16
  (GPU/ANE kernels differ in accumulation order and transcendental approximations).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision, Target


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float

    def scaled(self, factor: float) -> Tolerance:
        return Tolerance(self.atol * factor, self.rtol * factor)


DEFAULT_TOLERANCES: dict[Precision, Tolerance] = {
    Precision.FP32: Tolerance(1e-4, 1e-4),
    Precision.FP16: Tolerance(2e-2, 2e-2),
}


@dataclass
class OutputCheck:
    target: Target
    precision: Precision
    engine: str
    output: str
    max_abs_error: float
    ok: bool
    detail: str = ""


@dataclass
class CheckReport:
    checks: list[OutputCheck] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[OutputCheck]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        lines = [f"{len(self.checks)} comparisons, {len(self.failures)} failed"]
        for c in self.failures:
            lines.append(f"  {c.target.label} {c.precision.value} {c.engine} {c.output}: {c.detail}")
        lines += [f"  skipped: {s}" for s in self.skipped]
        return "\n".join(lines)


class ConversionMismatch(AssertionError):
    """The converted model's numbers differ from the reference beyond tolerance."""


def compare(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> tuple[bool, float, str]:
    """(ok, max |got - want| over finite entries, description of the worst problem)."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        if got.size == want.size and got.size <= 1:
            got = got.reshape(want.shape)
        else:
            return False, float("inf"), f"shape {got.shape} != reference {want.shape}"
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    finite_w = np.isfinite(w)
    bad_nonfinite = ~finite_w & ~((np.isnan(w) & np.isnan(g)) | (g == w))
    if bad_nonfinite.any():
        idx = tuple(int(i) for i in np.argwhere(bad_nonfinite)[0])
        return False, float("inf"), f"at {idx}: got {g[idx]}, reference {w[idx]}"
    unexpected = finite_w & ~np.isfinite(g)
    if unexpected.any():
        idx = tuple(int(i) for i in np.argwhere(unexpected)[0])
        return False, float("inf"), f"at {idx}: got non-finite {g[idx]}, reference {w[idx]}"
    if not finite_w.any():
        return True, 0.0, ""
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: masked out below
        diff = np.where(finite_w, np.abs(g - w), 0.0)
    allowed = tol.atol + tol.rtol * np.abs(np.where(finite_w, w, 0.0))
    max_err = float(diff.max())
    excess = diff - allowed
    if (excess > 0).any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape))
        return False, max_err, (
            f"max |error| {max_err:.3g}; worst at {idx}: got {g[idx]:.6g}, reference {w[idx]:.6g}"
            f" (allowed {allowed[idx]:.3g})"
        )
    return True, max_err, ""


def supported_targets(graph: Graph) -> list[Target]:
    """Targets for which every op of `graph` has a lowering rule."""
    import rlx_mil.lowering.program  # noqa: F401  (its import registers every rule; `rlx_mil` loads it lazily)
    from rlx_mil.ir.ops import Constant, Input, Param
    from rlx_mil.lowering.registry import registered_rules

    rules = registered_rules()
    minimum = Target.IOS15
    for node in graph:
        if isinstance(node.op, (Input, Param, Constant)):
            continue
        info = rules.get(type(node.op))
        if info is None:
            return []
        minimum = max(minimum, info.min_target)
    return [t for t in Target if t >= minimum]


def _coreml_outputs(model_path: Path, inputs: Mapping[str, np.ndarray], compute_units: str) -> dict[str, np.ndarray]:
    import coremltools as ct

    from rlx_mil.llm.runner import predict_coreml

    model = ct.models.MLModel(str(model_path), compute_units=getattr(ct.ComputeUnit, compute_units))
    return predict_coreml(model, inputs)


def check_conversion(
    graph: Graph,
    params: Mapping[str, Any] | None,
    inputs: Mapping[str, Any],
    *,
    targets: Iterable[str | Target] | None = None,
    precisions: Sequence[str | Precision] = ("fp32", "fp16"),
    tolerances: Mapping[Precision, Tolerance] | None = None,
    attention: str = "auto",
    roundtrip: bool = True,
    coreml: bool | None = None,
    compute_units: Sequence[str] = ("CPU_ONLY", "ALL"),
    raise_on_failure: bool = True,
) -> CheckReport:
    """Compare reference vs converted model for every target x precision; see module doc."""
    from rlx_mil import milexec, reference
    from rlx_mil.api import convert, save
    from rlx_mil.llm.runner import coreml_available

    params = dict(params or {})
    tols = dict(DEFAULT_TOLERANCES)
    tols.update(tolerances or {})
    want = reference.evaluate(graph, inputs, params)
    target_list = [Target.parse(t) for t in targets] if targets is not None else supported_targets(graph)
    use_coreml = coreml_available() if coreml is None else coreml
    report = CheckReport()
    if not use_coreml:
        report.skipped.append("Core ML predictions (MLModel.predict needs macOS)")

    def record(target: Target, precision: Precision, engine: str, got: Mapping[str, np.ndarray], tol: Tolerance) -> None:
        for key, ref in want.items():
            if key not in got:
                report.checks.append(OutputCheck(target, precision, engine, key, float("inf"), False, "missing output"))
                continue
            ok, err, detail = compare(got[key], ref, tol)
            report.checks.append(OutputCheck(target, precision, engine, key, err, ok, detail))

    for target in target_list:
        for prec_like in precisions:
            precision = Precision.parse(prec_like)
            tol = tols[precision]
            model = convert(graph, params, target=target, precision=precision, attention=attention)
            tmp = Path(tempfile.mkdtemp(prefix="rlx_mil_check_"))
            try:
                record(target, precision, "milexec", milexec.run(model, inputs), tol)
                if roundtrip or use_coreml:
                    path = save(model, tmp / "model.mlpackage")
                    if roundtrip:
                        record(target, precision, "milexec(saved)", milexec.run(path, inputs), tol)
                    if use_coreml:
                        for units in compute_units:
                            core_tol = tol if precision is Precision.FP32 else tol.scaled(2.0)
                            record(target, precision, f"coreml[{units}]", _coreml_outputs(path, inputs, units), core_tol)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
                package = getattr(model, "package_path", None)
                if package:
                    shutil.rmtree(package, ignore_errors=True)
    if raise_on_failure and report.failures:
        raise ConversionMismatch(f"graph {graph.name!r}: " + report.summary())
    return report


# -- greedy generations, tie-aware ---------------------------------------------------------------
#: Logit tolerance per precision, relative to the reference logits' largest magnitude at a step
#: (what `rlx_mil.models.verify` allows a plain package's outputs).
GREEDY_RELATIVE_TOLERANCE = {"fp32": 1e-4, "fp16": 5e-2}


@dataclass(frozen=True)
class GreedyStep:
    """One position of a greedy comparison.

    verdict: "match" (same argmax), "near-tie" (another argmax, but the reference prefers its
    own token by no more than twice the tolerance: within the precision's reach, the comparison
    goes on with the reference's token), "diverged" (another argmax the precision cannot
    explain) or "logits" (same or tied tokens, but some logit is off by more than the
    tolerance)."""

    step: int
    reference_token: int
    package_token: int
    margin: float  # reference logit of its token minus that of the package's token
    logit_error: float  # max |package - reference| over the vocabulary
    tolerance: float
    verdict: str

    @property
    def ok(self) -> bool:
        return self.verdict in ("match", "near-tie")

    def to_text(self) -> str:
        chosen = f"token {self.reference_token}" if self.package_token == self.reference_token else (
            f"reference {self.reference_token}, package {self.package_token} (margin {self.margin:.3g})")
        return (f"step {self.step}: {chosen}; max |logit error| {self.logit_error:.3g}"
                f" (tolerance {self.tolerance:.3g}): {self.verdict}")


@dataclass
class GreedyComparison:
    """Every step of a teacher-forced greedy comparison; see `compare_greedy_step`."""

    what: str
    steps: list[GreedyStep] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    @property
    def near_ties(self) -> list[GreedyStep]:
        return [s for s in self.steps if s.verdict == "near-tie"]

    @property
    def max_logit_error(self) -> float:
        return max((s.logit_error for s in self.steps), default=0.0)

    def summary(self) -> str:
        failed = [s for s in self.steps if not s.ok]
        ties = self.near_ties
        tie_text = f"{len(ties)} near-tie{'s' if len(ties) != 1 else ''}" + (
            f" (steps {', '.join(str(s.step) for s in ties)})" if ties else "")
        verdict = "ok" if self.ok else f"MISMATCH at step {failed[0].step}" if failed else "MISMATCH (nothing compared)"
        return (f"compared {len(self.steps)} greedy steps of {self.what}: max |logit error| {self.max_logit_error:.3g},"
                f" {tie_text}: {verdict}")


def compare_greedy_step(step: int, got: np.ndarray, want: np.ndarray, precision: str) -> GreedyStep:
    """Compare the package's logits `got` with the reference's `want` at one position.

    A different argmax is a near-tie when the reference's margin between its token and the
    package's is at most twice the tolerance (a difference each side's rounding can make up);
    the caller then continues with the reference's token (teacher forcing)."""
    got = np.asarray(got, np.float64).reshape(-1)
    want = np.asarray(want, np.float64).reshape(-1)
    if got.shape != want.shape:
        raise ConversionMismatch(f"step {step}: package logits {got.shape} vs reference {want.shape}")
    tolerance = GREEDY_RELATIVE_TOLERANCE[precision] * max(float(np.max(np.abs(want))), 1e-6)
    ref_token, pkg_token = int(np.argmax(want)), int(np.argmax(got))
    finite = bool(np.isfinite(got).all())
    error = float(np.max(np.abs(got - want))) if finite else float("inf")
    margin = float(want[ref_token] - want[pkg_token])
    if pkg_token != ref_token:
        verdict = "near-tie" if margin <= 2 * tolerance else "diverged"
    else:
        verdict = "match"
    if verdict != "diverged" and not error <= tolerance:
        verdict = "logits"
    return GreedyStep(step, ref_token, pkg_token, margin, error, tolerance, verdict)
