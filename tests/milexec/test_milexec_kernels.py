"""Kernels against independent NumPy / loop references (mostly ops coremltools cannot evaluate)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from milexec_util import build_function

from rlx_mil import milexec
from rlx_mil.errors import MilExecError
from rlx_mil.milexec.kernels._math import erf


def mb() -> Any:
    from coremltools.converters.mil import Builder

    return Builder


def run1(feeds: dict[str, np.ndarray], build: Any, opset: str = "iOS18", **kw: Any) -> np.ndarray:
    function = build_function(feeds, lambda v: [build(v)], opset)
    (out,) = milexec.run(function, feeds, **kw).values()
    return out


RNG = np.random.default_rng(1234)


# -- special functions -------------------------------------------------------------------------


def test_erf_matches_math_erf_everywhere() -> None:
    x = np.concatenate(
        [np.linspace(-7, 7, 20001), [0.0, 1e-30, -1e-8, 2.4999999, 2.5, 30.0, -np.inf, np.inf]]
    )
    expected = np.array([math.erf(v) for v in x])
    got = erf(x)
    assert np.max(np.abs(got - expected)) < 1e-10
    small = np.abs(x) < 1e-3
    assert np.allclose(got[small], expected[small], rtol=1e-12, atol=0)
    assert np.isnan(erf(np.array([np.nan])))[0]


def test_gelu_exact_uses_true_erf() -> None:
    x = np.linspace(-5, 5, 101, dtype=np.float32)
    out = run1({"x": x}, lambda v: mb().gelu(x=v["x"]))
    expected = np.array([0.5 * t * (1 + math.erf(t / math.sqrt(2))) for t in x.astype(np.float64)])
    np.testing.assert_allclose(out, expected, rtol=2e-7, atol=1e-7)


def test_round_sends_halves_to_even() -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51], dtype=np.float32)
    np.testing.assert_array_equal(
        run1({"x": x}, lambda v: mb().round(x=v["x"])), [-2, -2, -0, 0, 2, 2, 0, -1]
    )


def test_cast_truncates_toward_zero_and_tests_nonzero_for_bool() -> None:
    x = np.array([-1.7, -0.2, 0.0, 0.6, 2.9], dtype=np.float32)
    function = build_function(
        {"x": x}, lambda v: [mb().cast(x=v["x"], dtype="int32"), mb().cast(x=v["x"], dtype="bool")]
    )
    as_int, as_bool = milexec.run(function, {"x": x}).values()
    np.testing.assert_array_equal(as_int, [-1, 0, 0, 0, 2])
    assert as_int.dtype == np.int32
    np.testing.assert_array_equal(as_bool, [True, True, False, True, True])
    assert as_bool.dtype == np.bool_


# -- conv / pool reference implementations -----------------------------------------------------


def ref_pads(pad_type: str, size: int, k: int, s: int, d: int, custom: tuple[int, int]) -> tuple[int, int]:
    if pad_type == "valid":
        return 0, 0
    if pad_type == "custom":
        return custom
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return (total // 2, total - total // 2) if pad_type == "same" else (total - total // 2, total // 2)


def ref_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    strides: list[int],
    dil: list[int],
    pads: list[tuple[int, int]],
    groups: int,
) -> np.ndarray:
    n = x.shape[0]
    c_out, c_g = w.shape[:2]
    ks = w.shape[2:]
    nd = len(ks)
    outs = [
        (size + pb + pa - (k - 1) * d - 1) // s + 1
        for size, (pb, pa), k, d, s in zip(x.shape[2:], pads, ks, dil, strides, strict=True)
    ]
    y = np.zeros((n, c_out, *outs))
    per_group = c_out // groups
    for bi, co in itertools.product(range(n), range(c_out)):
        g = co // per_group
        for pos in itertools.product(*(range(o) for o in outs)):
            acc = b[co]
            for ci, kpos in itertools.product(range(c_g), itertools.product(*(range(k) for k in ks))):
                src = [
                    p * s + kk * d - pb
                    for p, s, kk, d, (pb, _) in zip(pos, strides, kpos, dil, pads, strict=True)
                ]
                if all(0 <= t < size for t, size in zip(src, x.shape[2:], strict=True)):
                    acc += x[(bi, g * c_g + ci, *src)] * w[(co, ci, *kpos)]
            y[(bi, co, *pos)] = acc
    assert nd == len(outs)
    return y


CONV_CASES = [
    # shape, c_out, kernel, strides, dilations, pad_type, custom pad, groups
    ((1, 2, 9), 3, (3,), [2], [1], "valid", [], 1),
    ((2, 4, 7), 4, (2,), [1], [2], "same", [], 2),
    ((1, 3, 6, 5), 2, (3, 2), [1, 2], [1, 1], "same", [], 1),
    ((1, 4, 6, 7), 4, (3, 3), [2, 1], [1, 2], "custom", [1, 0, 2, 1], 4),
    ((1, 2, 5, 6), 4, (2, 3), [2, 2], [1, 1], "same_lower", [], 2),
]


@pytest.mark.parametrize("shape,c_out,ks,strides,dil,pad_type,pad,groups", CONV_CASES)
def test_conv_matches_direct_definition(
    shape: tuple[int, ...],
    c_out: int,
    ks: tuple[int, ...],
    strides: list[int],
    dil: list[int],
    pad_type: str,
    pad: list[int],
    groups: int,
) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((c_out, shape[1] // groups, *ks)).astype(np.float32)
    b = RNG.standard_normal(c_out).astype(np.float32)
    kwargs: dict[str, Any] = {"strides": strides, "dilations": dil, "pad_type": pad_type, "groups": groups}
    if pad_type == "custom":
        kwargs["pad"] = pad
    out = run1({"x": x}, lambda v: mb().conv(x=v["x"], weight=w, bias=b, **kwargs), opset="iOS17")
    customs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(ks))] if pad else [(0, 0)] * len(ks)
    pads = [
        ref_pads(pad_type, size, k, s, d, c)
        for size, k, s, d, c in zip(shape[2:], ks, strides, dil, customs, strict=True)
    ]
    np.testing.assert_allclose(out, ref_conv(x, w, b, strides, dil, pads, groups), rtol=1e-5, atol=1e-5)


def ref_conv_transpose(
    x: np.ndarray, w: np.ndarray, strides: list[int], dil: list[int], groups: int
) -> np.ndarray:
    """Uncropped transposed conv: every input element scatters weight * x."""
    n, c_in = x.shape[:2]
    c_out_g = w.shape[1]
    ks = w.shape[2:]
    full = [
        (size - 1) * s + (k - 1) * d + 1 for size, s, k, d in zip(x.shape[2:], strides, ks, dil, strict=True)
    ]
    y = np.zeros((n, c_out_g * groups, *full))
    c_in_g = c_in // groups
    for bi, ci in itertools.product(range(n), range(c_in)):
        g = ci // c_in_g
        for pos in itertools.product(*(range(size) for size in x.shape[2:])):
            for co, kpos in itertools.product(range(c_out_g), itertools.product(*(range(k) for k in ks))):
                dst = [p * s + kk * d for p, s, kk, d in zip(pos, strides, kpos, dil, strict=True)]
                y[(bi, g * c_out_g + co, *dst)] += x[(bi, ci, *pos)] * w[(ci, co, *kpos)]
    return y


@pytest.mark.parametrize(
    "shape,c_out_g,ks,strides,dil,groups,pad_type,pad",
    [
        ((1, 2, 4), 3, (3,), [2], [1], 1, "valid", []),
        ((1, 4, 3, 3), 1, (2, 3), [2, 1], [1, 2], 2, "custom", [1, 0, 0, 2]),
        ((2, 2, 3, 4), 2, (3, 3), [2, 2], [1, 1], 1, "same", []),
    ],
)
def test_conv_transpose_matches_scatter_definition(
    shape: tuple[int, ...],
    c_out_g: int,
    ks: tuple[int, ...],
    strides: list[int],
    dil: list[int],
    groups: int,
    pad_type: str,
    pad: list[int],
) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    w = RNG.standard_normal((shape[1], c_out_g, *ks)).astype(np.float32)
    kwargs: dict[str, Any] = {"strides": strides, "dilations": dil, "groups": groups, "pad_type": pad_type}
    if pad:
        kwargs["pad"] = pad
    out = run1({"x": x}, lambda v: mb().conv_transpose(x=v["x"], weight=w, **kwargs), opset="iOS17")
    full = ref_conv_transpose(x, w, strides, dil, groups)
    if pad_type == "custom":
        index = tuple(slice(pad[2 * i], full.shape[2 + i] - pad[2 * i + 1]) for i in range(len(ks)))
    elif pad_type == "same":
        wanted = [size * s for size, s in zip(shape[2:], strides, strict=True)]
        index = tuple(
            slice((f - w_) // 2, (f - w_) // 2 + w_) for f, w_ in zip(full.shape[2:], wanted, strict=True)
        )
    else:
        index = tuple(slice(None) for _ in ks)
    np.testing.assert_allclose(out, full[(slice(None), slice(None), *index)], rtol=1e-5, atol=1e-5)


def ref_pool(
    x: np.ndarray,
    kind: str,
    ks: list[int],
    strides: list[int],
    pads: list[tuple[int, int]],
    ceil_mode: bool,
    exclude_pad: bool,
) -> np.ndarray:
    outs = []
    for size, k, s, (pb, pa) in zip(x.shape[2:], ks, strides, pads, strict=True):
        span = size + pb + pa - k
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= size + pb:
            out -= 1
        outs.append(out)
    y = np.zeros(x.shape[:2] + tuple(outs))
    for pos in itertools.product(*(range(o) for o in outs)):
        starts = [p * s - pb for p, s, (pb, _) in zip(pos, strides, pads, strict=True)]
        ends = [st + k for st, k in zip(starts, ks, strict=True)]
        real = tuple(
            slice(max(st, 0), min(en, size)) for st, en, size in zip(starts, ends, x.shape[2:], strict=True)
        )
        window = x[(slice(None), slice(None), *real)]
        axes = tuple(range(2, x.ndim))
        if kind == "max":
            y[(slice(None), slice(None), *pos)] = window.max(axis=axes)
        elif kind == "l2":
            y[(slice(None), slice(None), *pos)] = np.sqrt((window.astype(np.float64) ** 2).sum(axis=axes))
        else:
            if exclude_pad:
                count = math.prod(r.stop - r.start for r in real)
            else:
                count = math.prod(
                    min(en, size + pa) - st
                    for st, en, size, (_, pa) in zip(starts, ends, x.shape[2:], pads, strict=True)
                )
            y[(slice(None), slice(None), *pos)] = window.sum(axis=axes) / count
    return y


POOL_CASES = [
    ("avg", (1, 2, 7), [3], [2], "valid", [], False, False),
    ("avg", (1, 2, 6, 5), [3, 2], [2, 2], "custom", [1, 1, 1, 1], True, False),
    ("avg", (1, 2, 6, 5), [3, 2], [2, 2], "custom", [1, 1, 0, 0], True, True),
    ("avg", (2, 1, 5, 6), [2, 3], [1, 2], "same", [], False, True),
    ("avg", (2, 1, 5, 6), [2, 3], [1, 2], "same", [], False, False),
    ("max", (1, 3, 7, 6), [3, 3], [2, 2], "custom", [1, 1, 1, 1], True, False),
    ("max", (1, 2, 5, 5), [2, 2], [2, 2], "same_lower", [], False, False),
    ("max", (1, 1, 2, 3, 4), [2, 2, 2], [1, 1, 2], "valid", [], False, False),
    ("l2", (1, 2, 6, 5), [2, 3], [2, 1], "custom", [0, 1, 1, 0], False, False),
]


@pytest.mark.parametrize("kind,shape,ks,strides,pad_type,pad,ceil_mode,exclude", POOL_CASES)
def test_pools_match_loop_reference(
    kind: str,
    shape: tuple[int, ...],
    ks: list[int],
    strides: list[int],
    pad_type: str,
    pad: list[int],
    ceil_mode: bool,
    exclude: bool,
) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    kwargs: dict[str, Any] = {"kernel_sizes": ks, "strides": strides, "pad_type": pad_type}
    if pad:
        kwargs["pad"] = pad
    if ceil_mode:
        kwargs["ceil_mode"] = True
    if kind == "avg":
        kwargs["exclude_padding_from_average"] = exclude
    op = {"avg": "avg_pool", "max": "max_pool", "l2": "l2_pool"}[kind]
    out = run1({"x": x}, lambda v: getattr(mb(), op)(x=v["x"], **kwargs), opset="iOS17")
    customs = [(pad[2 * i], pad[2 * i + 1]) for i in range(len(ks))] if pad else [(0, 0)] * len(ks)
    pads = [
        ref_pads(pad_type, size, k, s, 1, c)
        for size, k, s, c in zip(shape[2:], ks, strides, customs, strict=True)
    ]
    np.testing.assert_allclose(
        out, ref_pool(x, kind, ks, strides, pads, ceil_mode, exclude), rtol=1e-5, atol=1e-6
    )


# -- normalisation ops without value_inference ---------------------------------------------------


def test_batch_and_instance_norm() -> None:
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    mean, var = RNG.standard_normal(3).astype(np.float32), RNG.uniform(0.5, 2, 3).astype(np.float32)
    gamma, beta = RNG.standard_normal(3).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    c = (1, 3, 1, 1)
    out = run1(
        {"x": x},
        lambda v: mb().batch_norm(
            x=v["x"], mean=mean, variance=var, gamma=gamma, beta=beta, epsilon=np.float32(1e-3)
        ),
    )
    expected = (x - mean.reshape(c)) / np.sqrt(var.reshape(c) + 1e-3) * gamma.reshape(c) + beta.reshape(c)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    out = run1(
        {"x": x}, lambda v: mb().instance_norm(x=v["x"], gamma=gamma, beta=beta, epsilon=np.float32(1e-5))
    )
    mu = x.mean(axis=(2, 3), keepdims=True)
    sd = np.sqrt(x.var(axis=(2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(out, (x - mu) / sd * gamma.reshape(c) + beta.reshape(c), rtol=1e-5, atol=1e-5)


def test_local_response_norm_window() -> None:
    x = RNG.standard_normal((1, 6, 2, 3)).astype(np.float32)
    size, alpha, beta, k = 3, 1e-2, 0.75, 2.0
    out = run1(
        {"x": x},
        lambda v: mb().local_response_norm(
            x=v["x"], size=size, alpha=np.float32(alpha), beta=np.float32(beta), k=np.float32(k)
        ),
    )
    expected = np.empty_like(x)
    for c in range(6):
        lo, hi = max(0, c - (size - 1) // 2), min(6, c + size // 2 + 1)
        expected[:, c] = x[:, c] / (k + alpha / size * (x[:, lo:hi] ** 2).sum(axis=1)) ** beta
    np.testing.assert_allclose(out, expected, rtol=1e-5)


# -- layout / indexing ops -----------------------------------------------------------------------


def test_gather_negative_indices_wrap_before_ios17_and_fail_after() -> None:
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    idx = np.array([-1, 0, -4], dtype=np.int32)
    out = run1({"x": x}, lambda v: mb().gather(x=v["x"], indices=idx, axis=0), opset="iOS16")
    np.testing.assert_array_equal(out, x[[3, 0, 0]])
    with pytest.raises(
        MilExecError, match=r"gather index -1 at \(0,\) is outside \[0, 4\) \(opset iOS17\).*undefined"
    ):
        run1({"x": x}, lambda v: mb().gather(x=v["x"], indices=idx, axis=0, name="g"), opset="iOS17")
    with pytest.raises(MilExecError, match=r"op 'g' \(gather\).*index 9.*\[-5, 5\)"):
        run1(
            {"x": x},
            lambda v: mb().gather(x=v["x"], indices=np.array([9], dtype=np.int32), axis=1, name="g"),
            opset="iOS15",
        )


def test_gather_bounds_use_runtime_indices() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    feeds = {"x": x, "i": np.array([2, 3], dtype=np.int32)}
    function = build_function(
        feeds, lambda v: [mb().gather(x=v["x"], indices=v["i"], axis=1, validate_indices=True)]
    )
    np.testing.assert_array_equal(milexec.run(function, feeds)[function.outputs[0].name], x[:, [2, 3]])
    with pytest.raises(MilExecError, match="Core ML raises"):
        milexec.run(function, {"x": x, "i": np.array([4, 0], dtype=np.int32)})


def test_gather_nd_and_scatter_nd() -> None:
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    idx = np.array([[[0, 1], [2, 3]], [[1, 0], [2, 2]]], dtype=np.int32)
    out = run1({"x": x}, lambda v: mb().gather_nd(x=v["x"], indices=idx))
    np.testing.assert_array_equal(out, x[idx[..., 0], idx[..., 1]])
    bidx = np.array([[[1], [3]], [[0], [0]], [[2], [1]]], dtype=np.int32)  # batch_dims=1
    out = run1({"x": x}, lambda v: mb().gather_nd(x=v["x"], indices=bidx, batch_dims=1))
    np.testing.assert_array_equal(out, np.stack([x[b, bidx[b, :, 0]] for b in range(3)]))
    upd = RNG.standard_normal((2, 2, 5)).astype(np.float32)
    dup = np.array([[[0, 1], [0, 1]], [[2, 3], [1, 0]]], dtype=np.int32)
    for mode, fn in (("add", np.add), ("mul", np.multiply), ("max", np.maximum)):
        out = run1({"x": x}, lambda v, m=mode: mb().scatter_nd(data=v["x"], indices=dup, updates=upd, mode=m))
        expected = x.copy()
        fn.at(expected, (dup[..., 0], dup[..., 1]), upd)
        np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("mode", ["update", "add", "sub", "mul", "div", "max", "min"])
def test_scatter_modes(mode: str) -> None:
    data = RNG.uniform(1, 2, (4, 3)).astype(np.float32)
    idx = np.array([2, 0], dtype=np.int32)
    upd = RNG.uniform(1, 2, (4, 2)).astype(np.float32)
    out = run1({"d": data}, lambda v: mb().scatter(data=v["d"], indices=idx, updates=upd, axis=1, mode=mode))
    expected = data.copy()
    ops = {
        "update": lambda a, b: b,
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "div": np.divide,
        "max": np.maximum,
        "min": np.minimum,
    }
    expected[:, idx] = ops[mode](data[:, idx], upd)
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_slice_by_index_masks_match_python_slicing() -> None:
    x = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    out = run1(
        {"x": x},
        lambda v: mb().slice_by_index(
            x=v["x"],
            begin=[3, 1, 5],
            end=[0, 0, 0],
            stride=[-1, 2, -2],
            begin_mask=[False, False, False],
            end_mask=[True, True, False],
            squeeze_mask=[False, False, False],
        ),
    )
    np.testing.assert_array_equal(out, x[3::-1, 1::2, 5:0:-2])
    out = run1(
        {"x": x},
        lambda v: mb().slice_by_index(
            x=v["x"], begin=[0, -2, 0], end=[4, 0, 6], squeeze_mask=[False, True, False]
        ),
    )
    np.testing.assert_array_equal(out, x[:, -2, :])


def test_reverse_sequence_and_sliding_windows_and_one_hot() -> None:
    x = np.arange(3 * 5 * 2, dtype=np.float32).reshape(3, 5, 2)
    lengths = np.array([2, 5, 0], dtype=np.int32)
    out = run1(
        {"x": x, "n": lengths},
        lambda v: mb().reverse_sequence(x=v["x"], lengths=v["n"], seq_axis=1, batch_axis=0),
    )
    expected = x.copy()
    for b, n in enumerate(lengths):
        expected[b, :n] = x[b, :n][::-1]
    np.testing.assert_array_equal(out, expected)

    out = run1({"x": x}, lambda v: mb().sliding_windows(x=v["x"], axis=1, size=3, stride=2))
    np.testing.assert_array_equal(out, np.stack([x[:, 0:3], x[:, 2:5]], axis=1))

    idx = np.array([[0, 3], [2, 1]], dtype=np.int32)
    out = run1(
        {"i": idx},
        lambda v: mb().one_hot(
            indices=v["i"], one_hot_vector_size=4, axis=1, on_value=np.float32(5), off_value=np.float32(-1)
        ),
    )
    expected = np.where(np.arange(4)[None, :, None] == idx[:, None, :], 5, -1)
    np.testing.assert_array_equal(out, expected)


def test_pixel_shuffle_depth_to_space_and_upsample() -> None:
    x = np.arange(1 * 8 * 2 * 3, dtype=np.float32).reshape(1, 8, 2, 3)
    out = run1({"x": x}, lambda v: mb().pixel_shuffle(x=v["x"], upscale_factor=2))
    # PyTorch: out[n, c, h*r + i, w*r + j] = in[n, c*r*r + i*r + j, h, w]
    expected = np.zeros((1, 2, 4, 6), dtype=np.float32)
    for c, i, j, h, w in itertools.product(range(2), range(2), range(2), range(2), range(3)):
        expected[0, c, h * 2 + i, w * 2 + j] = x[0, c * 4 + i * 2 + j, h, w]
    np.testing.assert_array_equal(out, expected)
    back = run1(
        {"x": out}, lambda v: mb().pixel_unshuffle(x=v["x"], downscale_factor=np.uint32(2)), opset="iOS16"
    )
    np.testing.assert_array_equal(back, x)
    # TensorFlow depth_to_space (DCR): out[n, c, h*r + i, w*r + j] = in[n, (i*r + j)*C + c, h, w]
    out = run1({"x": x}, lambda v: mb().depth_to_space(x=v["x"], block_size=2))
    for c, i, j, h, w in itertools.product(range(2), range(2), range(2), range(2), range(3)):
        expected[0, c, h * 2 + i, w * 2 + j] = x[0, (i * 2 + j) * 2 + c, h, w]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(run1({"x": out}, lambda v: mb().space_to_depth(x=v["x"], block_size=2)), x)

    small = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    out = run1(
        {"x": small},
        lambda v: mb().upsample_nearest_neighbor(x=v["x"], scale_factor_height=2, scale_factor_width=3),
    )
    np.testing.assert_array_equal(out, np.repeat(np.repeat(small, 2, axis=2), 3, axis=3))


def test_sdpa_masks_and_fully_masked_rows() -> None:
    q = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    k = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    v = RNG.standard_normal((2, 5, 6)).astype(np.float32)
    mask = RNG.random((3, 5)) < 0.6
    mask[:, 0] = True
    mask[2] = False
    feeds = {"q": q, "k": k, "v": v}
    out = run1(
        feeds,
        lambda t: mb().scaled_dot_product_attention(query=t["q"], key=t["k"], value=t["v"], attn_mask=mask),
    )
    scores = q @ k.transpose(0, 2, 1) / 2.0
    scores = np.where(mask, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        w = np.exp(scores - scores.max(-1, keepdims=True))
        expected = (w / w.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(out[:, :2], expected[:, :2], rtol=1e-5, atol=1e-6)
    assert np.isnan(out[:, 2]).all()


def test_while_loop_runs_its_blocks() -> None:
    x = np.array([1.0, 2.0], dtype=np.float32)

    def build(v: dict[str, Any]) -> list[Any]:
        b = mb()
        counter, total = b.while_loop(
            _cond=lambda i, t: b.less(x=i, y=np.int32(5)),
            _body=lambda i, t: (b.add(x=i, y=np.int32(1)), b.mul(x=t, y=np.float32(2))),
            loop_vars=(np.int32(0), v["x"]),
        )
        return [counter, total]

    function = build_function({"x": x}, build)
    counter, total = milexec.run(function, {"x": x}).values()
    assert int(counter) == 5
    np.testing.assert_array_equal(total, x * 32)


def test_silu_reshape_like_topk_all_and_fractional_upsample() -> None:
    x = np.linspace(-6, 6, 13, dtype=np.float32)
    np.testing.assert_allclose(run1({"x": x}, lambda v: mb().silu(x=v["x"])), x / (1 + np.exp(-x)), rtol=1e-6)

    data = np.arange(24, dtype=np.float32)
    refs = {"a": np.zeros((2, 3, 5), dtype=np.float32), "b": np.zeros((7, 4), dtype=np.float32)}
    out = run1(
        {"x": data, **refs},
        lambda v: mb().reshape_like(
            x=v["x"], ref_tensors=(v["a"], v["b"]), begins=(0, 1), ends=(2, 0), end_masks=(False, True)
        ),
        opset="iOS16",
    )
    np.testing.assert_array_equal(out, data.reshape(2, 3, 4))

    scores = np.array([[0.3, 0.9, 0.1, 0.5]], dtype=np.float32)
    function = build_function({"s": scores}, lambda v: list(mb().topk(x=v["s"], k=-1)), "iOS17")
    values, indices = milexec.run(function, {"s": scores}).values()
    np.testing.assert_array_equal(values, scores[:, [1, 3, 0, 2]])
    np.testing.assert_array_equal(indices, [[1, 3, 0, 2]])

    image = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    out = run1(
        {"x": image},
        lambda v: mb().upsample_nearest_neighbor(
            x=v["x"], scale_factor_height=np.float32(1.5), scale_factor_width=np.float32(2)
        ),
    )
    # Output row i reads input row floor(i / 1.5): rows 0, 0, 1.
    np.testing.assert_array_equal(out[0, 0], [[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3]])
