"""Signal ops: the reference against NumPy's own histogram, loops and a DFT sum written from
upstream's definitions; each lowering through the executor on shapes hypothesis picks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil import milexec, reference
from rlx_mil.errors import AttributeValueError, DTypeError, JsonVersionError, ShapeError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import V0_2_2, graph_from_json
from rlx_mil.ir.ops import ActivationKind, BinaryOp, ChainOperand, ChainSource, ChainStep, CmpOp
from rlx_mil.testing import Tolerance, compare

from .conftest import convert_and_cleanup


def _run(g: Graph, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray] | None = None) -> None:
    want = reference.evaluate(g, feeds, params or {})
    got = milexec.run(convert_and_cleanup(g, params or {}, target="iOS18", precision="fp32"), feeds)
    for name, value in want.items():
        ok, _, detail = compare(got[name], value, Tolerance(1e-5, 1e-5))
        assert ok, f"{name}: {detail}"


@settings(max_examples=5, deadline=None)
@given(bins=st.integers(1, 12), lo=st.floats(-3, 0), width=st.floats(0.5, 4), seed=st.integers(0, 2**16))
def test_histogram_counts_like_numpy(bins: int, lo: float, width: float, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((3, 7)).astype(np.float32)
    x[0, 0], x[0, 1] = np.float32(lo), np.float32(lo + width)  # both edges are counted
    x[1, 0] = np.nan
    g = Graph("h")
    h = g.histogram(g.input("x", [3, 7]), bins, lo, lo + width, name="h")
    g.set_outputs([h])
    node = g.node(h).op
    want, _ = np.histogram(x[np.isfinite(x)], bins=bins, range=(node.min, node.max))
    np.testing.assert_array_equal(reference.evaluate(g, {"x": x})["h"], want)
    _run(g, {"x": x})


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 24), inverse=st.booleans(), norm=st.sampled_from(["Backward", "Forward", "Ortho"]),
       seed=st.integers(0, 2**16))
def test_fft_is_the_dft_sum(n: int, inverse: bool, norm: str, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((2, 2 * n)).astype(np.float32)
    g = Graph("f")
    g.set_outputs([g.fft(g.input("x", [2, 2 * n]), inverse, norm, name="y")])
    z = x[:, :n].astype(np.float64) + 1j * x[:, n:]
    sign = 1 if inverse else -1
    dft = np.array([[np.exp(sign * 2j * np.pi * j * k / n) for j in range(n)] for k in range(n)])
    scale = {"Backward": 1.0, "Forward": 1 / n if inverse else 1.0, "Ortho": 1 / np.sqrt(n)}[norm]
    want = (z @ dft.T) * scale
    got = reference.evaluate(g, {"x": x})["y"]
    np.testing.assert_allclose(got, np.concatenate([want.real, want.imag], axis=1), rtol=1e-5, atol=1e-5)
    _run(g, {"x": x})


@settings(max_examples=4, deadline=None)
@given(c=st.integers(1, 3), h=st.integers(3, 7), w=st.integers(3, 7), k=st.integers(1, 3), s=st.integers(1, 2),
       p=st.integers(0, 1), d=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_im2col_times_a_weight_is_the_convolution(c: int, h: int, w: int, k: int, s: int, p: int, d: int,
                                                  seed: int) -> None:
    if d * (k - 1) + 1 > min(h, w) + 2 * p:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((4, c, k, k)).astype(np.float32)
    g = Graph("i2c")
    xi = g.input("x", [2, c, h, w])
    cols = g.im2col(xi, k, s, p, d, name="cols")
    conv = g.conv(xi, g.param("w", [4, c, k, k]), stride=s, padding=p, dilation=d, name="conv")
    g.set_outputs([cols, conv])
    out = reference.evaluate(g, {"x": x}, {"w": weight})
    ho, wo = out["conv"].shape[2:]
    product = (out["cols"] @ weight.reshape(4, -1).T).reshape(2, ho, wo, 4).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(product, out["conv"], rtol=1e-4, atol=1e-4)
    _run(g, {"x": x}, {"w": weight})


def test_partitioned_conv_and_spline_follow_their_definitions() -> None:
    rng = np.random.default_rng(5)
    sig, ir = rng.standard_normal((2, 9)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    x, coeff = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)
    g = Graph("pc")
    g.set_outputs([g.partitioned_conv(g.input("sig", [2, 9]), g.input("ir", [4]), 8, name="y"),
                   g.spline_activation(g.input("x", [3, 2]), g.input("coeff", [2, 4]), 4, -1.0, 2.0, name="kan")])
    feeds = {"sig": sig, "ir": ir, "x": x, "coeff": coeff}
    out = reference.evaluate(g, feeds)
    full = np.zeros((2, 12))
    for i in range(9):
        for j in range(4):
            full[:, i + j] += sig[:, i] * ir[j]
    np.testing.assert_allclose(out["y"], full, rtol=1e-5, atol=1e-5)
    centers = np.array([-1.0, 0.0, 1.0, 2.0])  # grid_min + g (grid_max - grid_min) / (G - 1); inv_h = 1
    kan = np.einsum("ncg,cg->nc", np.exp(-((x[..., None] - centers) ** 2)), coeff)
    np.testing.assert_allclose(out["kan"], kan, rtol=1e-5, atol=1e-6)
    _run(g, feeds)  # run-time response and coefficients


def test_bad_signal_attributes_are_typed_errors() -> None:
    g = Graph("bad")
    x = g.input("x", [2, 6])
    with pytest.raises(AttributeValueError, match="min < max"):
        g.histogram(x, 4, 1.0, 1.0)
    with pytest.raises(ShapeError, match="2N"):
        g.fft(g.input("odd", [2, 5]))
    with pytest.raises(DTypeError, match="C64"):
        g.fft(g.input("c", [2, 4], "C64"))
    with pytest.raises(ShapeError, match="coeff"):
        g.spline_activation(x, g.input("k", [5, 3]), 3, 0.0, 1.0)
    big = Graph("big")
    big.set_outputs([big.fft(big.input("x", [1, 2 * 1025]), name="y")])
    with pytest.raises(ShapeError, match="N <= 1024"):
        convert_and_cleanup(big, {}, target="iOS18")


def test_custom_fn_and_transform_region_follow_their_bodies() -> None:
    body = Graph("fwd")
    a = body.input("a", [1, 1, 2, 2])
    body.set_outputs([body.activation("Exp", a)])
    g = Graph("s")
    x = g.input("x", [1, 1, 2, 2])
    y = g.transform_region([("Input", 0), ("Step", 0)], [g.custom_fn(body, [x])], name="y")
    g.set_outputs([y])
    v = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    got = reference.evaluate(g, {"x": v})["y"]
    np.testing.assert_allclose(got, np.exp(v).repeat(4, axis=2).repeat(4, axis=3), rtol=1e-6)
    with pytest.raises(ShapeError, match="fwd_body"):
        g.custom_fn(body, [x, x])
    with pytest.raises(AttributeValueError, match="steps"):
        g.transform_region([("Step", 0)], [x])


_BATCH_CHAINS = {
    "relu": ([("Activation", ActivationKind.RELU, [("Input", 0)])], lambda v: np.maximum(v, 0)),
    "x_sigmoid_x": ([("Activation", ActivationKind.SIGMOID, [("Input", 0)]), ("Binary", BinaryOp.MUL, [("Step", 0), ("Input", 0)])],
                    lambda v: v / (1 + np.exp(-v)) * v),
    "where_neg": ([("Compare", CmpOp.GT, [("Input", 0), ("Input", 0)]), ("Activation", ActivationKind.NEG, [("Input", 0)]),
                   ("Where", None, [("Step", 0), ("Input", 0), ("Step", 1)])], lambda v: -v),
}


@settings(max_examples=4, deadline=None)
@given(planes=st.integers(1, 3), rows=st.integers(1, 2), h=st.integers(1, 3), prologue=st.booleans(),
       chain=st.sampled_from(sorted(_BATCH_CHAINS)), seed=st.integers(0, 2**16))
def test_batch_elementwise_region_is_the_chain_per_plane_concatenated(planes: int, rows: int, h: int, prologue: bool,
                                                                      chain: str, seed: int) -> None:
    """Upstream's DecomposeFusionRegions: each plane (an axis-0 slice) through the chain as its
    Input(0), after the nearest-2x prologue, the results concatenated on axis 0 in input order."""
    steps, numpy_chain = _BATCH_CHAINS[chain]
    x = np.random.default_rng(seed).standard_normal((planes * rows, 2, h, 3)).astype(np.float32)
    g = Graph("batch")
    src = g.input("x", list(x.shape))
    slices = [g.narrow(src, 0, (planes - 1 - i) * rows, rows) for i in range(planes)]  # planes in reverse
    chain_steps = [ChainStep(kind, attr, tuple(ChainOperand(ChainSource(s), i) for s, i in operands))
                   for kind, attr, operands in steps]
    g.set_outputs([g.batch_elementwise_region(slices, chain_steps, resize_prologue=prologue, name="y")])
    reversed_planes = np.concatenate([x[(planes - 1 - i) * rows:(planes - i) * rows] for i in range(planes)])
    resized = reversed_planes.repeat(2, 2).repeat(2, 3) if prologue else reversed_planes
    got = reference.evaluate(g, {"x": x})["y"]
    np.testing.assert_allclose(got, numpy_chain(resized), rtol=1e-6, atol=1e-7)
    _run(g, {"x": x})
    text = g.to_json()
    assert graph_from_json(text).to_json() == text and '"num_batch_inputs":' in text
    with pytest.raises(JsonVersionError, match="BatchElementwiseRegion"):
        g.to_json(version=V0_2_2)  # a newest-only op


def test_batch_elementwise_region_refuses_what_upstream_never_builds() -> None:
    g = Graph("b")
    a, b = g.input("a", [1, 4]), g.input("b", [2, 4])
    two_inputs = [ChainStep("Binary", BinaryOp.ADD, (ChainOperand(ChainSource.INPUT, 0), ChainOperand(ChainSource.INPUT, 1)))]
    with pytest.raises(AttributeValueError, match=r"Input\(1\)"):
        g.batch_elementwise_region([a, a], two_inputs)
    relu = [ChainStep("Activation", ActivationKind.RELU, (ChainOperand(ChainSource.INPUT, 0),))]
    with pytest.raises(ShapeError, match="planes must agree"):
        g.batch_elementwise_region([a, b], relu)


def test_butterfly_stages_compose_to_the_dft() -> None:
    n, bits = 8, 3
    rng = np.random.default_rng(2)
    x = rng.standard_normal(n) + 1j * rng.standard_normal(n)
    order = [int(f"{i:03b}"[::-1], 2) for i in range(n)]
    state = np.stack([x[order].real, x[order].imag], -1).reshape(1, 2 * n).astype(np.float32)
    g = Graph("stages")
    cur = g.input("s", [1, 2 * n])
    for stage in range(bits):
        stride = 1 << stage
        w = np.exp(-2j * np.pi * np.tile(np.arange(stride), n // (2 * stride)) / (2 * stride))
        cur = g.fft_butterfly_stage(cur, g.constant(np.ones(n // 2, np.float32)), g.constant(np.zeros(n // 2, np.float32)),
                                    g.constant(w.real.astype(np.float32)), g.constant(w.imag.astype(np.float32)), stage, n)
    g.set_outputs([cur])
    out = next(iter(reference.evaluate(g, {"s": state}).values())).reshape(n, 2)
    np.testing.assert_allclose(out[:, 0] + 1j * out[:, 1], np.fft.fft(x), atol=1e-5)
    _run(g, {"s": state})
    with pytest.raises(AttributeValueError, match="stage"):
        g.fft_butterfly_stage(cur, *(g.input(f"t{i}", [4]) for i in range(4)), 3, 8)


@settings(max_examples=5, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), n=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_complex_norm_sq_and_conjugate_on_interleaved_pairs(lead: list[int], n: int, seed: int) -> None:
    z = np.random.default_rng(seed).standard_normal((*lead, 2 * n)).astype(np.float32)
    g = Graph("c")
    x = g.input("z", [*lead, 2 * n])
    g.set_outputs([g.complex_norm_sq(x, name="norm"), g.conjugate(x, name="conj")])
    complex_z = z[..., 0::2].astype(np.complex64) + 1j * z[..., 1::2]
    got = reference.evaluate(g, {"z": z})
    np.testing.assert_allclose(got["norm"], np.abs(complex_z) ** 2, rtol=1e-6, atol=1e-6)
    conj = np.conj(complex_z)
    np.testing.assert_array_equal(got["conj"], np.stack([conj.real, conj.imag], axis=-1).reshape(z.shape))
    _run(g, {"z": z})


def test_interleaved_complex_needs_even_f32_last_axis() -> None:
    g = Graph("c")
    with pytest.raises(ShapeError):
        g.complex_norm_sq(g.input("z", [2, 5]))
    with pytest.raises(DTypeError):
        g.conjugate(g.input("z16", [2, 4], dtype="F16"))


def _welch_loops(spectrum: np.ndarray, n_segments: int, k: int) -> np.ndarray:
    """upstream's accumulate / insertion top-k, written as loops."""
    n_fft = spectrum.shape[1] // 2
    n_bins = n_fft // 2 + 1
    out = np.zeros((spectrum.shape[0] // n_segments, 2 * k), np.float32)
    for b in range(out.shape[0]):
        psd = [np.float32(0.0)] * n_bins
        for s in range(n_segments):
            row = spectrum[b * n_segments + s]
            for i in range(n_bins):
                w = np.float32(1.0 / n_segments) * (np.float32(2.0) if 0 < i < n_bins - 1 else np.float32(1.0))
                psd[i] = np.float32(psd[i] + w * (row[i] * row[i] + row[n_fft + i] * row[n_fft + i]))
        top = sorted(range(n_bins), key=lambda i: (-psd[i], i))[:k]
        for slot, i in enumerate(top):
            out[b, 2 * slot], out[b, 2 * slot + 1] = i, psd[i]
    return out


@settings(max_examples=5, deadline=None)
@given(batch=st.integers(1, 3), segments=st.integers(1, 3), n_fft=st.sampled_from([2, 5, 8, 16]),
       k=st.integers(1, 12), ties=st.booleans(), seed=st.integers(0, 2**16))
def test_welch_peaks_rank_the_psd_like_upstream(batch: int, segments: int, n_fft: int, k: int, ties: bool,
                                                seed: int) -> None:
    spectrum = np.random.default_rng(seed).standard_normal((batch * segments, 2 * n_fft)).astype(np.float32)
    if ties:  # integer powers with power-of-two weights sum exactly: many equal bins, the lower one first
        segments = min(segments, 2)
        spectrum = np.round(np.random.default_rng(seed).standard_normal((batch * segments, 2 * n_fft))).astype(np.float32)
    g = Graph("w")
    g.set_outputs([g.welch_peaks(g.input("spec", [batch * segments, 2 * n_fft]), k, segments, name="peaks")])
    want = _welch_loops(spectrum, segments, k)
    got = reference.evaluate(g, {"spec": spectrum})["peaks"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if not ties:  # equal powers summed in another order could swap near-ties in the program
        _run(g, {"spec": spectrum})
    else:
        out = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), {"spec": spectrum})["peaks"]
        np.testing.assert_array_equal(out, want)


def test_welch_peaks_needs_whole_segments() -> None:
    g = Graph("w")
    with pytest.raises(ShapeError):
        g.welch_peaks(g.input("spec", [5, 8]), 2, 2)
    with pytest.raises(AttributeValueError):
        g.welch_peaks(g.input("spec2", [4, 8]), 0, 2)
