"""Check a converted model package against the reference semantics of its graph."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_mil.errors import Fp16OverflowWarning, InvalidOptionError, MilExecError
from rlx_mil.ir import DType, Graph, Input
from rlx_mil.progress import Progress
from rlx_mil.testing import GreedyComparison, compare_greedy_step

#: Largest |converted - reference| allowed, relative to the output's largest magnitude. fp16
#: rounds every intermediate to ~3 significant digits; through a few transformer layers the
#: logits of the tiny test models agree to about 1e-2 of their scale.
RELATIVE_TOLERANCE = {"fp32": 1e-4, "fp16": 5e-2}

#: What runs the package in a verification: rlx_mil's NumPy MIL executor, or Apple's Core AI
#: runtime (the `coreai` extra; the package's program translated with fp32 compute, so an fp16
#: package is checked with its fp16 tolerance but without fp16 rounding inside the ops).
VERIFY_ENGINES = ("milexec", "coreai")


def engine_label(engine: str) -> str:
    """How a verification line names what ran the package."""
    return "Apple's Core AI runtime (fp32 compute)" if engine == "coreai" else "the MIL executor"


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_error: float
    relative: float
    ok: bool
    #: for logits: the greedy token at every position, compared tie-aware (rlx_mil.testing).
    greedy: GreedyComparison | None = None

    def to_text(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        text = (f"  check {self.name}: max |converted - reference| = {self.max_error:.3g} "
                f"(relative {self.relative:.3g}) {verdict}")
        if self.greedy is not None:
            text += f"\n  check {self.name}: {self.greedy.summary()}"
        return text


#: What a fidelity check's reference computes with when the package is compressed.
STORED_WEIGHTS = "the weights the package stores (decoded from its own codes)"


def package_weights(params: Mapping[str, Any], package: Any, report: Any) -> Mapping[str, Any]:
    """`params` as the saved `package` (a `.mlpackage`, or the packages of a chunked set)
    computes with them: each weight its compression `report` lists decoded from the codes the
    package stores, when read (`rlx_mil.milexec.stored_weights`); `params` itself when
    `report` is None (an uncompressed package)."""
    if report is None:
        return params
    from rlx_mil.milexec.stored_weights import package_params

    return package_params(params, package, report)


def example_inputs(graph: Graph, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Plausible feeds for a model graph's inputs: token ids below `vocab_size`, positions
    continuing the KV cache, random caches, a padded attention mask for batches > 1, SigLIP2
    spatial shapes with their patch masks."""
    rng = np.random.default_rng(seed)
    shapes = {n.op.name: n.shape.sizes() for n in graph if isinstance(n.op, Input)}
    dtypes = {n.op.name: n.shape.dtype for n in graph if isinstance(n.op, Input)}
    past = next((shape[2] for name, shape in shapes.items() if name.startswith("past_k_")), 0)
    feeds: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if name == "spatial_shapes":  # SigLIP2: the first image a square of patches, the others one row
            patches = shapes["pixel_values"][1]
            side = math.isqrt(patches)
            feeds[name] = np.array([[side, side]] + [[1, patches]] * (shape[0] - 1), np.int32)
            mask = np.zeros(shapes["pixel_attention_mask"], np.int32)
            mask[0, :side * side] = 1
            mask[1:] = 1
            feeds["pixel_attention_mask"] = mask
        elif name == "pixel_attention_mask" and "spatial_shapes" in shapes:
            continue
        elif name == "input_ids":
            feeds[name] = rng.integers(0, vocab_size, shape).astype(np.int32)
        elif name == "position_ids":
            feeds[name] = np.broadcast_to(np.arange(past, past + shape[-1], dtype=np.int32), shape).copy()
        elif name in ("attention_mask", "pixel_attention_mask"):
            mask = np.ones(shape, np.int32)
            if shape[0] > 1:
                mask[1, shape[1] - shape[1] // 4:] = 0
            feeds[name] = mask
        elif name == "token_type_ids":
            feeds[name] = np.zeros(shape, np.int32)
        elif dtypes[name].is_int or dtypes[name] is DType.BOOL:  # any other graph's indices and masks: 0 or 1
            feeds[name] = rng.integers(0, 2, shape).astype(dtypes[name].numpy)
        else:
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def verify_package(
    graph: Graph,
    params: Mapping[str, Any],
    package: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray],
    precision: str,
    engine: str = "milexec",
    progress: Progress | None = None,
) -> list[OutputCheck]:
    """Run the saved package through the NumPy MIL executor (or, `engine="coreai"`, Apple's
    Core AI runtime) and compare each output with `rlx_mil.reference.evaluate`. `progress`
    shows the reference's run (a clock) and the package's (the executor's ops counted)."""
    from rlx_mil import milexec, reference
    from rlx_mil.milexec.executor import OPS

    if engine not in VERIFY_ENGINES:
        raise InvalidOptionError(f"engine must be one of {VERIFY_ENGINES}, got {engine!r}")
    stages = progress or Progress(enabled=False)
    stages.begin("verify: the NumPy reference", min_seconds=1.0)
    want = reference.evaluate(graph, inputs, params)
    if engine == "coreai":
        from rlx_mil.coreai.engine import run as coreai_run

        stages.begin("verify: the package on Apple's Core AI runtime", min_seconds=1.0)
        got = coreai_run(package, inputs)
        origins: list[str] = []
    else:
        stages.begin("verify: the package on the executor", unit=OPS, min_seconds=1.0)
        result = milexec.execute(package, inputs)
        got, origins = result.outputs, result.nonfinite_origins
    stages.end()
    warn_nonfinite(package, got, want, origins)
    limit = RELATIVE_TOLERANCE[precision]
    checks = []
    for name, ref in want.items():
        if name not in got or np.shape(got[name]) != ref.shape:
            found = f"shape {list(np.shape(got[name]))}" if name in got else "no such output"
            raise MilExecError(f"{package}: output {name!r} does not match the graph ({found}, expected {list(ref.shape)})")
        err = float(np.max(np.abs(got[name].astype(np.float64) - ref))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        relative = err / (scale or 1.0)
        greedy = _greedy_positions(name, got[name], ref, precision) if name == "logits" and ref.ndim >= 2 else None
        ok = bool(relative <= limit) and (greedy is None or greedy.ok)
        checks.append(OutputCheck(name, err, relative, ok, greedy))
    return checks


def warn_nonfinite(package: Any, got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], origins: list[str]) -> None:
    """An `Fp16OverflowWarning` for each float output of `got` holding inf/NaN where `want`
    (the reference) is finite, naming the op where the executor saw them start."""
    for name, ref in want.items():
        value = got.get(name)
        if value is None or value.dtype.kind != "f" or np.isfinite(value).all() or not np.isfinite(ref).all():
            continue
        origin = origins[0] if origins else None
        where = f"; the first op giving inf/NaN from finite inputs is {origin}" if origin else ""
        warnings.warn(Fp16OverflowWarning(
            f"{package}: output {name!r} holds {int(np.sum(~np.isfinite(value)))} inf/NaN values where the"
            f" reference is finite{where}: an fp16 value passed 65,504; convert with precision='fp32'",
            op=origin,
        ), stacklevel=3)


def _greedy_positions(name: str, got: np.ndarray, want: np.ndarray, precision: str) -> GreedyComparison:
    """The greedy token at every position of a logits output: a different argmax passes as a
    near-tie only where the reference's own margin is within the precision's reach."""
    comparison = GreedyComparison(f"{name} (every position of the example inputs)")
    rows = want.reshape(-1, want.shape[-1])
    for index, (g, w) in enumerate(zip(got.reshape(rows.shape), rows, strict=True)):
        comparison.steps.append(compare_greedy_step(index + 1, g, w, precision))
    return comparison
