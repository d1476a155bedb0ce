"""Convert with compression and verify through the executor against the dequantized reference."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.compress import CompressionReport, dequantized_params, report_of
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import DEFAULT_TOLERANCES, compare


def convert_and_verify(
    graph: Graph, params: Mapping[str, Any], inputs: Mapping[str, np.ndarray], compress: Any, *,
    target: str = "iOS18", precision: str = "fp16", roundtrip: bool = True,
) -> tuple[Any, CompressionReport]:
    """The compressed model and its report, after checking that the in-memory and the saved
    package compute what the reference computes with the dequantized weights."""
    model = rlx_mil.convert(graph, params, target=target, precision=precision, compress=compress)
    report = report_of(model)
    assert report is not None
    want = reference.evaluate(graph, inputs, dequantized_params(params, model))
    tol = DEFAULT_TOLERANCES[Precision.parse(precision)]
    runs = [milexec.run(model, inputs)]
    tmp = Path(tempfile.mkdtemp(prefix="rlx_mil_cmp_"))
    try:
        if roundtrip:
            runs.append(milexec.run(rlx_mil.save(model, tmp / "m.mlpackage"), inputs))
        for got in runs:
            for key, ref in want.items():
                ok, _, detail = compare(got[key], ref, tol)
                assert ok, f"{compress} {target} {precision} {key}: {detail}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model, report


def op_types(model: Any) -> list[str]:
    return [op.op_type for op in model._mil_program.functions["main"].operations]
