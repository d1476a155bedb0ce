"""Intermediates a lowering creates (decomposed attention scores above all) are held to
MAX_TENSOR_ELEMENTS before coremltools sees them; evaluate and the executor refuse, typed,
rather than allocate."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import ConversionError, EvaluationError, MilExecError
from rlx_mil.ir.graph import Graph


def _long_attention() -> Graph:
    g = Graph("long_attention")
    q = g.input("q", [1, 1, 60000, 8])
    k = g.input("k", [1, 1, 60000, 8])
    v = g.input("v", [1, 1, 60000, 8])
    g.set_outputs([g.attention_kind(q, k, v, 1, 8, "causal", name="y")])
    return g


def test_decomposed_attention_scores_are_refused_before_coremltools() -> None:
    with pytest.raises(ConversionError, match=r"intermediate .* of 3600000000 elements, more than the 2147483647"):
        rlx_mil.lower(_long_attention(), attention="decomposed", precision="fp32")


def test_evaluate_refuses_the_scores_instead_of_allocating() -> None:
    x = np.zeros((1, 1, 60000, 8), np.float32)
    with pytest.raises(EvaluationError, match=r"attention scores .* 3600000000 elements"):
        reference.evaluate(_long_attention(), {"q": x, "k": x, "v": x})


def test_executor_refuses_programs_with_oversized_tensors() -> None:
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec(shape=(60000, 8), dtype=types.fp32)])
    def program(x):  # type: ignore[no-untyped-def]
        return mb.matmul(x=x, y=x, transpose_y=True, name="scores")

    with pytest.raises(MilExecError, match=r"op 'scores' \(matmul\).* 3600000000 elements.*refusing to allocate"):
        milexec.run(program, {"x": np.zeros((60000, 8), np.float32)})
