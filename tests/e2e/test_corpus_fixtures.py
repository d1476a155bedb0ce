"""Small end-to-end fixtures after upstream's corpus cases (low-precision element-wise and MLP,
decode and prefill matmuls, norms, attention, a small block, quantized weights), built with
rlx_mil's own builder, converted, run through the executor and compared with the reference; the
MLP and the quantized FFN are also checked against NumPy forwards written here."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import DEFAULT_TOLERANCES, compare

RNG_SEED = 11
D, H, HEAD, S = 16, 2, 8, 6


def _rng() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


def lowp_elementwise() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("lowp_elementwise")
    x, y = g.input("x", [4, 8]), g.input("y", [4, 8])
    half = g.cast(g.add(x, y), "F16")
    bf = g.cast(g.mul(x, y), "BF16")
    g.set_outputs([g.activation("Silu", g.cast(half, "F32"), name="silu_f16"), g.cast(bf, "F32", name="bf16")])
    return g, {}


def lowp_mlp() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("lowp_mlp")
    rng = _rng()
    x = g.input("x", [3, D])
    h = g.cast(g.activation("Gelu", g.matmul(x, g.param("w1", [D, 32]))), "F16")
    g.set_outputs([g.matmul(g.cast(h, "F32"), g.param("w2", [32, D]), name="y")])
    return g, {"w1": (rng.standard_normal((D, 32)) / 4).astype(np.float32),
               "w2": (rng.standard_normal((32, D)) / 6).astype(np.float32)}


def matmuls() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("decode_prefill")
    w = g.param("w", [D, 24])
    g.set_outputs([g.matmul(g.input("token", [1, D]), w, name="decode"),
                   g.matmul(g.input("prompt", [12, D]), w, name="prefill")])
    return g, {"w": (_rng().standard_normal((D, 24)) / 4).astype(np.float32)}


def norms() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("norms")
    x = g.input("x", [2, 5, D])
    gamma, beta = g.param("gamma", [D]), g.param("beta", [D])
    g.set_outputs([g.rms_norm(x, gamma, beta, name="rms"), g.layer_norm(x, gamma, beta, name="ln")])
    rng = _rng()
    return g, {"gamma": rng.uniform(0.5, 1.5, D).astype(np.float32), "beta": (rng.standard_normal(D) / 10).astype(np.float32)}


def _attention_block(g: Graph, x: int, params: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    def weight(name: str, shape: tuple[int, int]) -> int:
        params[name] = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
        return g.param(name, list(shape))

    q = g.reshape(g.matmul(x, weight("wq", (D, H * HEAD))), [1, S, H, HEAD])
    k = g.reshape(g.matmul(x, weight("wk", (D, H * HEAD))), [1, S, H, HEAD])
    v = g.reshape(g.matmul(x, weight("wv", (D, H * HEAD))), [1, S, H, HEAD])
    att = g.attention_kind(q, k, v, H, HEAD, "causal")
    return g.matmul(g.reshape(att, [1, S, H * HEAD]), weight("wo", (H * HEAD, D)))


def attention() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("attention")
    params: dict[str, np.ndarray] = {}
    g.set_outputs([g.add(_attention_block(g, g.input("x", [1, S, D]), params, _rng()), g.input("skip", [1, S, D]),
                         name="y")])
    return g, params


def small_block() -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("small_block")
    rng = _rng()
    params = {"g1": np.ones(D, np.float32), "g2": np.ones(D, np.float32), "z": np.zeros(D, np.float32)}
    x = g.input("x", [1, S, D])
    z = g.param("z", [D])
    h = g.add(x, _attention_block(g, g.rms_norm(x, g.param("g1", [D]), z), params, rng))
    n2 = g.rms_norm(h, g.param("g2", [D]), z)
    params["gate_up"] = (rng.standard_normal((D, 64)) / 4).astype(np.float32)
    params["down"] = (rng.standard_normal((32, D)) / 6).astype(np.float32)
    mlp = g.matmul(g.fused_swiglu(g.matmul(n2, g.param("gate_up", [D, 64]))), g.param("down", [32, D]))
    g.set_outputs([g.fused_matmul_residual(g.reshape(mlp, [S, D]), g.constant(np.eye(D, dtype=np.float32)),
                                           g.reshape(h, [S, D]), name="y")])
    return g, params


def quantized_ffn() -> tuple[Graph, dict[str, np.ndarray]]:
    """Codebook up-projection, MXFP4 down-projection, 4-bit MLX experts on the side."""
    g = Graph("quantized_ffn")
    rng = _rng()
    x = g.input("x", [2, 32])
    up = g.synth_matmul(x, g.param("idx", [48, 8], "u8"), g.param("codebook", [16, 4]), 4, 16)
    codes = g.cast(g.clamp(g.add(g.mul(g.activation("Relu", up), g.constant(np.float32(2.0))),
                                 g.constant(np.float32(0.5))), 0.0, 7.0), "U8")
    down = g.scaled_matmul(codes, g.param("w_down", [8, 48], "u8"), g.constant(np.full((2, 3), 127, np.uint8), "u8"),
                           g.param("s_down", [8, 3], "u8"), "F4E2M1", "F4E2M1", "BlockMxE8M0", 16, name="down")
    experts = g.dequant_grouped_matmul_mlx(x, g.param("mlx_w", [2 * 8 * 32 // 2], "u8"), g.param("mlx_s", [2, 8, 1]),
                                           g.param("mlx_b", [2, 8, 1]), g.constant(np.array([1.0, 0.0], np.float32)),
                                           4, 32, name="experts")
    g.set_outputs([down, experts])
    params = {"idx": rng.integers(0, 16, (48, 8)).astype(np.uint8),
              "codebook": (rng.standard_normal((16, 4)) / 4).astype(np.float32),
              "w_down": rng.integers(0, 16, (8, 48)).astype(np.uint8),
              "s_down": rng.integers(123, 128, (8, 3)).astype(np.uint8),
              "mlx_w": rng.integers(0, 256, 2 * 8 * 32 // 2).astype(np.uint8),
              "mlx_s": rng.uniform(0.01, 0.05, (2, 8, 1)).astype(np.float32),
              "mlx_b": rng.uniform(-0.2, 0.2, (2, 8, 1)).astype(np.float32)}
    return g, params


FIXTURES: dict[str, Callable[[], tuple[Graph, dict[str, np.ndarray]]]] = {
    "lowp_elementwise": lowp_elementwise, "lowp_mlp": lowp_mlp, "matmuls": matmuls, "norms": norms,
    "attention": attention, "small_block": small_block, "quantized_ffn": quantized_ffn,
}


def _feeds(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {n.op.name: rng.standard_normal(n.shape.sizes()).astype(np.float32)
            for n in graph if n.op.type_name == "Input"}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_converts_and_matches_the_reference(name: str, precision: str) -> None:
    graph, params = FIXTURES[name]()
    feeds = _feeds(graph)
    want = reference.evaluate(graph, feeds, params)
    model = rlx_mil.convert(graph, params, target="iOS18", precision=precision)
    got = milexec.run(model, feeds)
    tolerance = DEFAULT_TOLERANCES[Precision.parse(precision)]
    problems = [f"{key}: {detail}" for key, value in want.items()
                for ok, _, detail in [compare(got[key], value, tolerance)] if not ok]
    assert not problems, problems


def test_mlp_and_quantized_ffn_match_numpy_forwards() -> None:
    graph, params = lowp_mlp()
    x = _feeds(graph)["x"]
    pre = x.astype(np.float64) @ params["w1"]
    from math import erf, sqrt

    gelu = pre * 0.5 * (1 + np.vectorize(erf)(pre / sqrt(2)))
    want = gelu.astype(np.float16).astype(np.float64) @ params["w2"]
    np.testing.assert_allclose(reference.evaluate(graph, {"x": x}, params)["y"], want, rtol=1e-4, atol=1e-4)

    graph, params = quantized_ffn()
    x = _feeds(graph)["x"].astype(np.float64)
    weight = params["codebook"][params["idx"].astype(np.int64)].reshape(48, 32)
    codes = np.clip(np.maximum(x @ weight.T, 0) * 2 + 0.5, 0, 7).astype(np.uint8)  # Cast to U8 truncates
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    scales = np.repeat(2.0 ** (params["s_down"].astype(np.float64) - 127), 16, axis=1)
    down = e2m1[codes] @ (e2m1[params["w_down"]] * scales).T  # the activation scales (127) are 2^0
    out = reference.evaluate(graph, _feeds(graph), params)
    np.testing.assert_allclose(out["down"], down, rtol=1e-5, atol=1e-5)
    words = np.unpackbits(params["mlx_w"].reshape(16, 16), axis=1, bitorder="little").reshape(16, 32, 4)
    mlx_codes = (words * (1 << np.arange(4))).sum(axis=2).reshape(2, 8, 32)
    w = mlx_codes * params["mlx_s"] + params["mlx_b"]
    np.testing.assert_allclose(out["experts"], np.einsum("mk,mnk->mn", x, w[[1, 0]]), rtol=1e-5, atol=1e-5)
