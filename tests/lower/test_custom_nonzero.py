"""Upstream's `onnx.NonZero` read as its kernel's fixed-size form: the reference against a loop
transcribed from rlx-cpu's `NonZeroKernel`, the converted program against the reference, and
what the kernel cannot compute refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil import milexec, reference
from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import graph_from_json
from rlx_mil.testing import Tolerance, compare

from .conftest import convert_and_cleanup


def _graph(in_dims: list[int], dtype: str, out_dims: list[int], out_dtype: str = "I64") -> Graph:
    def node(i: int, op: object, inputs: list[int], dims: list[int], dt: str, label: str | None = None) -> dict:
        return {"id": i, "op": op, "inputs": inputs, "name": label, "origin": None,
                "shape": {"dims": [{"Static": d} for d in dims], "dtype": dt}}

    nodes = [node(0, {"Input": {"name": "x"}}, [], in_dims, dtype),
             node(1, {"Custom": {"name": "onnx.NonZero", "num_inputs": 1, "attrs": []}}, [0], out_dims, out_dtype, "out")]
    return graph_from_json(json.dumps({"name": "nz", "nodes": nodes, "outputs": [1]}))


def _kernel(x: np.ndarray, total: int) -> np.ndarray:
    """`NonZeroKernel::execute`, transcribed: coordinates of the first cols non-zeros, [rank, cols]."""
    rank = max(x.ndim, 1)
    cols = total // rank
    out = np.zeros(total, np.int64)
    strides = [int(np.prod(x.shape[d + 1:])) for d in range(x.ndim)]
    for c, flat in enumerate(i for i, v in enumerate(x.reshape(-1)) if v != 0):
        if c >= cols:
            break
        rem = flat
        for d in range(rank):
            out[d * cols + c] = rem // strides[d]
            rem %= max(strides[d], 1)
    return out


@settings(max_examples=6, deadline=None)
@given(in_dims=st.sampled_from([[7], [3, 4], [2, 3, 2]]), cols=st.integers(0, 30), extra=st.integers(0, 2),
       dtype=st.sampled_from(["F32", "I64", "Bool"]), density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_non_zero_fills_the_declared_output_as_upstreams_kernel(
    in_dims: list[int], cols: int, extra: int, dtype: str, density: float, seed: int,
) -> None:
    rank = len(in_dims)
    total = rank * cols + extra
    if total == 0:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(in_dims) * (rng.random(in_dims) < density)
    if dtype == "F32" and x.size > 1:
        x.flat[1] = np.nan  # non-zero, as the kernel's `v != 0.0` has it
    feeds = {"x": x.astype({"F32": np.float32, "I64": np.int64, "Bool": np.bool_}[dtype])}
    g = _graph(in_dims, dtype, [total])
    want = reference.evaluate(g, feeds)["out"]
    np.testing.assert_array_equal(want, _kernel(feeds["x"], total))
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
    ok, _, detail = compare(np.asarray(got, np.float32), np.asarray(want, np.float32), Tolerance(0, 0))
    assert ok, detail


def test_non_zero_takes_the_declared_shape_and_dtype() -> None:
    g = _graph([2, 3], "F32", [2, 2, 2], "F32")
    x = np.asarray([[0, 5, 0], [1, 2, 0]], np.float32)
    np.testing.assert_array_equal(reference.evaluate(g, {"x": x})["out"], _kernel(x, 8).reshape(2, 2, 2))


@pytest.mark.parametrize(("in_dims", "out_dims", "message"), [
    ([], [2], "rank >= 1"),
    ([4096, 4096], [2, 2], "pairs"),
])
def test_non_zero_forms_the_kernel_cannot_compute_are_refused(in_dims: list[int], out_dims: list[int],
                                                              message: str) -> None:
    with pytest.raises(UnsupportedOpFormatError, match=message):
        _graph(in_dims, "F32", out_dims)
