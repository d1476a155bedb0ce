"""`dequantized_params` tells each param's shape and dtype without decoding it, so the reference
evaluator reads a compressed weight at its use and lets it go (a check never holds every
dequantized weight at once); the numbers are those of the same values in a plain dict."""

from __future__ import annotations

import numpy as np
import pytest

import rlx_mil
from rlx_mil.compress import dequantized_params
from rlx_mil.ir.graph import Graph
from rlx_mil.reference import evaluate


def _mlp() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("mlp")
    x = g.input("x", [4, 64], "f32")
    h = g.silu(g.add(g.matmul(x, g.param("up.weight", [64, 128]), name="up"), g.param("up.bias", [128])), name="act")
    g.set_outputs([g.matmul(h, g.param("down.weight", [128, 64]), name="down")])
    rng = np.random.default_rng(3)
    params = {"up.weight": rng.standard_normal((64, 128)).astype(np.float32) / 8,
              "up.bias": rng.standard_normal(128).astype(np.float32),
              "down.weight": rng.standard_normal((128, 64)).astype(np.float32) / 11}
    return g, params


@pytest.mark.parametrize("scheme", ["int4", "lut4"])
def test_shapes_and_dtypes_are_told_without_decoding(scheme: str) -> None:
    graph, params = _mlp()
    model = rlx_mil.convert(graph, params, compress=f"{scheme};check=off")
    dq = dequantized_params(params, model)
    for name in params:
        value = dq[name]
        assert dq.shape_of(name) == value.shape and dq.dtype_of(name) == value.dtype, name
    assert dq.dtype_of("up.weight") == np.float32 and dq.shape_of("down.weight") == (128, 64)
    # a compressed weight decodes to other values than the float ones: the test sees the codes
    assert not np.array_equal(dq["up.weight"], params["up.weight"])
    np.testing.assert_array_equal(dq["up.bias"], params["up.bias"])


def test_the_lazy_run_gives_the_plain_dicts_numbers() -> None:
    graph, params = _mlp()
    model = rlx_mil.convert(graph, params, compress="int4;check=off")
    dq = dequantized_params(params, model)
    x = {"x": np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)}
    want = evaluate(graph, x, {name: dq[name] for name in dq})
    got = evaluate(graph, x, dq)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert not np.allclose(want["down"], evaluate(graph, x, params)["down"], rtol=0, atol=1e-6)
