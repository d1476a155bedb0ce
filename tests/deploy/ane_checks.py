"""What every Neural Engine program must look like, and running two programs side by side."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rlx_mil import milexec


def _ops(block: Any) -> Iterator[Any]:
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from _ops(inner)


def structure(program: Any) -> dict[str, Any]:
    """Op counts, the largest rank of any tensor computed (inputs and states included; the
    tables a constexpr op decodes at load time are not computed on) and the projections by a
    constant weight that are not convs."""
    counts: Counter[str] = Counter()
    ranks = [0]
    plain_projections = []
    for func in program.functions.values():
        ranks += [len(v.shape) for v in func.inputs.values() if getattr(v, "shape", None) is not None]
        for op in _ops(func):
            counts[op.op_type] += 1
            if op.op_type == "const" or op.op_type.startswith("constexpr_"):
                continue
            ranks += [len(o.shape) for o in op.outputs if getattr(o, "shape", None) is not None]
            weight = op.inputs.get("weight") if op.op_type == "linear" else op.inputs.get("y") if op.op_type == "matmul" else None
            if weight is not None and weight.op is not None and weight.op.op_type.startswith(("const", "constexpr_")):
                plain_projections.append(op.name)
    return {"ops": counts, "max_rank": max(ranks), "projections_not_conv": plain_projections}


def assert_neural_engine_form(program: Any, *, convs: bool = True) -> None:
    found = structure(program)
    assert found["max_rank"] <= 4, found["max_rank"]
    assert not found["projections_not_conv"], found["projections_not_conv"]
    if convs:
        assert found["ops"]["conv"] > 0


def max_relative_error(want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> float:
    assert sorted(want) == sorted(got)
    worst = 0.0
    for name, value in want.items():
        assert got[name].shape == value.shape, (name, got[name].shape, value.shape)
        scale = float(np.abs(value).max()) or 1.0
        worst = max(worst, float(np.abs(got[name].astype(np.float64) - value).max()) / scale)
    return worst


def run_both(plain: Any, deployed: Any, feeds: Mapping[str, np.ndarray], precision: str) -> float:
    model = "float32" if precision == "fp32" else "declared"
    return max_relative_error(milexec.run(plain, feeds, precision_model=model),
                              milexec.run(deployed, feeds, precision_model=model))


def run_steps(program: Any, steps: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Stateful calls one after the other on `program`, states carried."""
    states: dict[str, np.ndarray] = {}
    return [milexec.run(program, feeds, states=states, precision_model="float32") for feeds in steps]
