"""Linear quantization math: coremltools' formulas, ranges, degenerate weights, slabs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.compress import linear as linear_mod
from rlx_mil.compress.linear import quantize_linear
from rlx_mil.compress.schemes import PER_BLOCK, PER_CHANNEL, PER_TENSOR, LinearScheme
from rlx_mil.errors import CompressionError

SCHEMES = [
    LinearScheme(bits=b, signed=s, symmetric=m, granularity=gr, block_size=bs)
    for b in (8, 4) for s in (True, False) for m in (True, False)
    for gr, bs in ((PER_TENSOR, 32), (PER_CHANNEL, 32), (PER_BLOCK, 8), (PER_BLOCK, 16))
]


def _step(codes: linear_mod.LinearCodes) -> np.ndarray:
    """Each element's quantization step (its block's scale)."""
    return linear_mod._expand(codes.scale.astype(np.float32), codes.data.shape)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label)
def test_codes_in_range_and_error_within_half_step(scheme: LinearScheme) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 48)).astype(np.float32)
    codes = quantize_linear(w, scheme, np.float32)
    qmin, qmax = scheme.quant_range
    assert codes.data.min() >= qmin and codes.data.max() <= qmax
    back = codes.dequantize()
    # Every value lies inside its block's range, so rounding is the only error.
    assert np.all(np.abs(back - w) <= 0.5 * _step(codes) * (1 + 1e-5) + 1e-7)
    expected = np.sqrt(np.sum((back - w) ** 2) / np.sum(w**2))
    assert codes.relative_error == pytest.approx(expected, rel=1e-4)
    blocks = 1 if scheme.granularity != PER_BLOCK else 48 // scheme.block_size
    rows = 1 if scheme.granularity == PER_TENSOR else 24
    assert codes.scale.shape == (rows, blocks)
    assert (codes.offset is None) == (scheme.signed and scheme.symmetric)


def _coremltools_qparams(w: np.ndarray, scheme: LinearScheme, block_sizes: list[int]):  # type: ignore[no-untyped-def]
    from coremltools.optimize._utils import compute_qparams

    return compute_qparams(w, scheme.bits, scheme.signed, scheme.mode.upper(), None, block_sizes)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.label)
def test_matches_coremltools_compute_qparams(scheme: LinearScheme) -> None:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((16, 32)) * rng.uniform(0.1, 3, size=(16, 1))).astype(np.float32)
    block_sizes = {PER_TENSOR: [0, 0], PER_CHANNEL: [1, 0], PER_BLOCK: [1, scheme.block_size]}[scheme.granularity]
    data, scale, zp = _coremltools_qparams(w, scheme, block_sizes)
    ours = quantize_linear(w, scheme, np.float32)
    np.testing.assert_allclose(ours.scale.reshape(-1), np.asarray(scale, np.float32).reshape(-1), rtol=1e-6)
    assert np.max(np.abs(ours.data.astype(np.int64) - data.astype(np.int64))) <= 1
    if zp is None:
        assert ours.offset is None
    else:
        assert ours.offset is not None
        np.testing.assert_array_equal(ours.offset.reshape(-1).astype(np.int64), np.asarray(zp).reshape(-1).astype(np.int64))


@given(
    rows=st.integers(1, 9),
    blocks=st.integers(1, 4),
    block=st.sampled_from([1, 2, 4, 8, 32]),
    scheme_index=st.integers(0, len(SCHEMES) - 1),
    seed=st.integers(0, 2**16),
    fp16=st.booleans(),
)
def test_property_any_shape_and_block(rows: int, blocks: int, block: int, scheme_index: int, seed: int, fp16: bool) -> None:
    base = SCHEMES[scheme_index]
    scheme = LinearScheme(bits=base.bits, signed=base.signed, symmetric=base.symmetric, granularity=base.granularity,
                          block_size=block)
    w = np.random.default_rng(seed).standard_normal((rows, blocks * block)).astype(np.float32)
    store = np.float16 if fp16 else np.float32
    codes = quantize_linear(w, scheme, store)
    assert codes.scale.dtype == store
    back = codes.dequantize()
    qmin, qmax = scheme.quant_range
    assert codes.data.min() >= qmin and codes.data.max() <= qmax
    # fp16 scales are rounded before coding, so the reconstruction may exceed a half step by
    # the scale's relative rounding times the largest code.
    slack = 1e-6 + (2**-11 * max(abs(qmin), abs(qmax)) * _step(codes) if fp16 else 0)
    assert np.all(np.abs(back - w) <= 0.5 * _step(codes) * (1 + 1e-5) + slack + 1e-7)


def test_zeros_and_constant_weights_are_exact() -> None:
    for scheme in SCHEMES:
        zeros = quantize_linear(np.zeros((4, 32), np.float32), scheme, np.float16)
        assert np.all(zeros.dequantize() == 0) and zeros.relative_error == 0
        const = np.full((4, 32), 0.75, np.float32)
        out = quantize_linear(const, scheme, np.float32).dequantize()
        np.testing.assert_allclose(out, const, rtol=1e-6)


def test_mixed_zero_and_nonzero_blocks() -> None:
    w = np.zeros((2, 64), np.float32)
    w[1, 32:] = np.linspace(-1, 1, 32)
    codes = quantize_linear(w, LinearScheme(bits=4, granularity=PER_BLOCK, block_size=32), np.float16)
    back = codes.dequantize()
    assert np.all(back[0] == 0) and np.all(back[1, :32] == 0)
    assert np.max(np.abs(back[1, 32:] - w[1, 32:])) <= 1 / 7 / 2 + 1e-3


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_a_typed_error(bad: float) -> None:
    w = np.ones((4, 32), np.float32)
    w[2, 5] = bad
    with pytest.raises(CompressionError, match=r"'blk\.w'.*non-finite.*row 2"):
        quantize_linear(w, LinearScheme(), np.float32, name="blk.w")


def test_block_size_must_divide() -> None:
    with pytest.raises(CompressionError, match=r"'w' \[4, 40\]: block size 32 does not divide .* 40.*block8"):
        quantize_linear(np.ones((4, 40), np.float32), LinearScheme(bits=4, granularity=PER_BLOCK), np.float32, name="w")


def test_bfloat16_and_slabs_give_the_same_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    w32 = rng.standard_normal((40, 64)).astype(np.float32)
    wbf = w32.astype(ml_dtypes.bfloat16)
    for scheme in (LinearScheme(bits=4, granularity=PER_BLOCK), LinearScheme(granularity=PER_TENSOR, symmetric=False)):
        whole = quantize_linear(wbf, scheme, np.float16)
        monkeypatch.setattr(linear_mod, "SLAB_ELEMENTS", 64 * 3)  # three rows per slab
        sliced = quantize_linear(wbf, scheme, np.float16)
        monkeypatch.setattr(linear_mod, "SLAB_ELEMENTS", 1 << 22)
        np.testing.assert_array_equal(whole.data, sliced.data)
        np.testing.assert_array_equal(whole.scale, sliced.scale)
        np.testing.assert_array_equal(whole.dequantize(), quantize_linear(wbf.astype(np.float32), scheme, np.float16).dequantize())
        assert whole.relative_error == pytest.approx(sliced.relative_error, rel=1e-9)


def test_higher_rank_weights_block_over_the_second_axis() -> None:
    w = np.random.default_rng(4).standard_normal((8, 16, 3, 3)).astype(np.float32)
    codes = quantize_linear(w, LinearScheme(bits=8, granularity=PER_BLOCK, block_size=4), np.float32)
    assert codes.data.shape == w.shape and codes.scale.shape == (8, 4, 1, 1)
    assert np.max(np.abs(codes.dequantize() - w)) <= 0.5 * float(codes.scale.max()) + 1e-6
