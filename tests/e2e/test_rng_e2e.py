"""End-to-end: RngNormal, RngUniform, Sample (the contract of docs/indexing-quant-random.md).

Exact where the ops are deterministic (scale 0, low == high, greedy Sample) through the usual
reference-vs-executor check on every target and precision. Otherwise converted models draw
from Core ML's generators, so the converted program (run by the executor, whose kernels draw
from NumPy's PCG64 with the program's seed) and the reference (upstream's Philox stream) are
each checked against the distribution with fixed seeds and fixed tolerances: moments and the
Kolmogorov-Smirnov distance for the generators, and for Sample the support (exact) and the
total-variation distance of the token frequencies from `sample_distribution`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx_mil
from e2e.factory import Feeds, distinct_grid, e2e_settings, rng_for, seeds
from rlx_mil import milexec, reference
from rlx_mil.errors import AttributeValueError, DTypeError, ShapeError
from rlx_mil.ir.graph import Graph
from rlx_mil.reference.rng import sample_distribution

SAMPLES = 20000
#: KS distance allowed for 20000 draws (the 1% critical value is 1.63 / sqrt(n) = 0.0115).
KS_LIMIT = 0.02


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _ks(values: np.ndarray, cdf: np.ndarray) -> float:
    n = values.size
    ranks = np.arange(1, n + 1) / n
    return float(max(np.max(ranks - cdf), np.max(cdf - (ranks - 1.0 / n))))


def _converted(graph: Graph, inputs: dict[str, np.ndarray], target: str, precision: str) -> dict[str, np.ndarray]:
    return milexec.run(rlx_mil.convert(graph, {}, target=target, precision=precision), inputs)


def _generator_graph(kind: str, a: float, b: float, key: int) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph(kind)
    x = g.input("x", [1])
    shape = [SAMPLES // 100, 100]
    node = g.rng_normal(shape, a, b, key, name="r") if kind == "normal" else g.rng_uniform(shape, a, b, key, name="r")
    g.set_outputs([node, g.add(x, x, name="x2")])
    return g, {"x": np.ones(1, np.float32)}


@pytest.mark.parametrize(("target", "precision"), [("iOS15", "fp32"), ("iOS18", "fp16")])
@pytest.mark.parametrize(("mean", "scale", "key"), [(0.0, 1.0, 0), (3.0, 0.5, 12345), (-2.0, 4.0, 2**64 - 1)])
def test_rng_normal_distribution(mean: float, scale: float, key: int, target: str, precision: str) -> None:
    g, feeds = _generator_graph("normal", mean, scale, key)
    for values in (reference.evaluate(g, feeds)["r"], _converted(g, feeds, target, precision)["r"]):
        v = np.asarray(values, np.float64).ravel()
        assert v.size == SAMPLES and np.isfinite(v).all()
        assert abs(v.mean() - mean) < 0.035 * scale
        assert abs(v.std() / scale - 1.0) < 0.03
        assert _ks(np.sort(v), _normal_cdf((np.sort(v) - mean) / scale)) < KS_LIMIT
    again = _converted(g, feeds, target, precision)["r"]
    np.testing.assert_array_equal(again, _converted(g, feeds, target, precision)["r"])  # fixed seed: same draws


@pytest.mark.parametrize(("target", "precision"), [("iOS15", "fp32"), ("iOS18", "fp16")])
@pytest.mark.parametrize(("low", "high", "key"), [(0.0, 1.0, 7), (-3.0, 5.0, 99)])
def test_rng_uniform_distribution(low: float, high: float, key: int, target: str, precision: str) -> None:
    g, feeds = _generator_graph("uniform", low, high, key)
    for values in (reference.evaluate(g, feeds)["r"], _converted(g, feeds, target, precision)["r"]):
        v = np.sort(np.asarray(values, np.float64).ravel())
        assert v[0] >= low and v[-1] <= high
        assert _ks(v, (v - low) / (high - low)) < KS_LIMIT


def test_reference_streams_differ_by_key_and_repeat_by_run() -> None:
    g = Graph("keys")
    g.set_outputs([g.rng_uniform([64], key=1, name="a"), g.rng_uniform([64], key=2, name="b"),
                   g.rng_uniform([64], key=1, name="c")])
    got = reference.evaluate(g, {})
    assert not np.array_equal(got["a"], got["b"])
    np.testing.assert_array_equal(got["a"], got["c"])


@e2e_settings(3)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), value=st.integers(-8, 8), seed=seeds)
def test_degenerate_generators_are_exact(shape: list[int], value: int, seed: int) -> None:
    """scale 0 fills the mean, low == high fills low: checkable elementwise."""
    f = Feeds("constant_draws")
    x = f.input("x", np.zeros(shape, np.float32))
    normal = f.graph.rng_normal(shape, value * 0.5, 0.0, seed, template=x, name="normal")
    uniform = f.graph.rng_uniform(shape, value * 0.25, value * 0.25, seed, name="uniform")
    f.verify([f.graph.add(x, normal, name="y"), uniform])


@e2e_settings(4)
@given(rows=st.integers(1, 3), vocab=st.integers(1, 12), mode=st.sampled_from(("top_k", "top_p", "temperature")),
       rank1=st.booleans(), seed=seeds)
def test_greedy_sample_is_exact(rows: int, vocab: int, mode: str, rank1: bool, seed: int) -> None:
    """top_k == 1, top_p <= 0 or temperature <= 0 pick the maximal logit (distinct logits)."""
    dims = [vocab] if rank1 else [rows, vocab]
    f = Feeds("greedy")
    logits = f.input("logits", distinct_grid(rng_for(seed), dims))
    options = {"top_k": {"top_k": 1}, "top_p": {"top_p": 0.0}, "temperature": {"temperature": 0.0}}[mode]
    f.verify([f.graph.sample(logits, seed=seed % 1000, name="token", **options)])


@pytest.mark.parametrize(("top_k", "top_p", "temperature"), [(0, 1.0, 1.0), (3, 1.0, 0.8), (0, 0.7, 1.0), (5, 0.9, 1.5)])
def test_sample_distribution(top_k: int, top_p: float, temperature: float) -> None:
    rows, vocab = 4000, 8
    logits = np.linspace(-1.5, 2.0, vocab, dtype=np.float32)[np.random.default_rng(3).permutation(vocab)]
    g = Graph("sample")
    g.set_outputs([g.sample(g.input("logits", [rows, vocab]), top_k=top_k, top_p=top_p, temperature=temperature,
                            seed=11, name="token")])
    feeds = {"logits": np.tile(logits, (rows, 1))}
    want = sample_distribution(logits, top_k=top_k, top_p=top_p, temperature=temperature)[0]
    for precision in ("fp32", "fp16"):
        for tokens in (reference.evaluate(g, feeds)["token"], _converted(g, feeds, "iOS16", precision)["token"]):
            ids = np.asarray(tokens).astype(np.int64)
            assert ids.shape == (rows,)
            assert set(np.unique(ids)) <= set(np.nonzero(want > 0)[0])  # never outside top-k / nucleus
            frequencies = np.bincount(ids, minlength=vocab) / rows
            assert 0.5 * np.abs(frequencies - want).sum() < 0.05


def test_sample_filters_match_the_spec() -> None:
    """top-k keeps ties at the k-th value; top-p keeps the smallest prefix reaching the mass."""
    p = sample_distribution(np.array([1.0, 3.0, 3.0, 0.0, 2.0], np.float32), top_k=2, top_p=1.0, temperature=1.0)[0]
    np.testing.assert_allclose(p, [0, 0.5, 0.5, 0, 0])
    logits = np.log(np.array([0.1, 0.5, 0.3, 0.1], np.float32))
    p = sample_distribution(logits, top_k=0, top_p=0.75, temperature=1.0)[0]
    np.testing.assert_allclose(p, [0, 0.625, 0.375, 0], rtol=1e-5)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda g: g.add_node(g.node(g.rng_normal([2])).op, []), ShapeError, "declared shape"),
        (lambda g: g.rng_normal([2], 0.0, -1.0), AttributeValueError, "scale"),
        (lambda g: g.rng_uniform([2], 1.0, 0.0), AttributeValueError, "below low"),
        (lambda g: g.rng_uniform([2], key=-1), AttributeValueError, "u64"),
        (lambda g: g.rng_uniform([2], dtype="i32"), DTypeError, "floats"),
        (lambda g: g.sample(g.input("l", [2, 3, 4])), ShapeError, r"\[B, V\]"),
        (lambda g: g.sample(g.input("l", [3], "i32")), DTypeError, "floats"),
        (lambda g: g.sample(g.input("l", [3]), top_p=float("nan")), AttributeValueError, "finite"),
        (lambda g: g.sample(g.input("l", [3]), seed=2**64), AttributeValueError, "u64"),
    ],
)
def test_bad_graphs_get_typed_errors(build, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        build(Graph())


def test_json_round_trip() -> None:
    import json

    g = Graph("rng")
    a = g.rng_normal([2], 0.0, 1.0, 1234567, name="n")
    b = g.rng_uniform([3], 0.0, 1.0, 7, op_seed=3.0, template=a, name="u")
    c = g.sample(g.input("l", [2, 5]), top_k=50, top_p=0.9, temperature=0.7, seed=2**64 - 1, name="s")
    g.set_outputs([a, b, c])
    text = g.to_json()
    forms = {n["name"]: n["op"] for n in json.loads(text)["nodes"]}
    assert forms["n"] == {"RngNormal": {"mean": 0.0, "scale": 1.0, "key": 1234567, "op_seed": None}}
    assert forms["u"] == {"RngUniform": {"low": 0.0, "high": 1.0, "key": 7, "op_seed": 3.0}}
    assert forms["s"] == {"Sample": {"top_k": 50, "top_p": 0.9, "temperature": 0.7, "seed": 2**64 - 1}}
    assert Graph.from_json(text).to_json() == text
