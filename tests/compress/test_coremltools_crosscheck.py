"""rlx_mil's compressed weights vs coremltools.optimize.coreml on the uncompressed rlx_mil model.

For each scheme, the uncompressed conversion is quantized by `linear_quantize_weights` with the
equivalent `OpLinearQuantizerConfig`; every weight that feeds a `linear` (or the embedding
`gather`) must dequantize to within one of coremltools' quantization steps of ours.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil.compress import parse_scheme
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_params

CONFIG = TinyLM(layers=1)
GRAPH = tiny_lm(CONFIG)
PARAMS = tiny_lm_params(GRAPH, CONFIG)


def _weights(model: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Consumer op name -> (dequantized weight, per-element quantization step)."""
    out = {}
    for op in model._mil_program.functions["main"].operations:
        if op.op_type not in ("constexpr_blockwise_shift_scale", "constexpr_affine_dequantize"):
            continue
        value = np.asarray(op.materialized_val_inference(), np.float64)
        scale = np.asarray(op.scale.val, np.float64)
        if op.op_type == "constexpr_affine_dequantize":
            scale = scale.reshape([-1 if i == int(op.axis.val) else 1 for i in range(value.ndim)]) if scale.ndim else scale
            step = np.broadcast_to(scale, value.shape)
        else:
            step = scale
            for axis, (full, blocks) in enumerate(zip(value.shape, scale.shape, strict=True)):
                step = np.repeat(step, full // blocks, axis=axis)
        for child in op.outputs[0].child_ops:
            out[child.name] = (value, step)
    return out


@functools.cache
def _uncompressed(target: str, precision: str) -> Any:
    return rlx_mil.convert(GRAPH, PARAMS, target=target, precision=precision)


@pytest.mark.parametrize(
    ("spec", "target", "precision"),
    [
        (spec, "iOS18", precision)
        for spec in ("int8-sym-channel", "int4-sym-channel", "int8-sym-block32", "int4-sym-block32", "int4-asym-block16")
        for precision in ("fp32", "fp16")
    ] + [("uint8-sym-channel", "iOS18", "fp16"), ("int8-sym-channel", "iOS16", "fp16"), ("uint8-asym-channel", "iOS17", "fp32")],
)
def test_dequantized_weights_match_coremltools_within_one_step(spec: str, target: str, precision: str) -> None:
    import coremltools.optimize.coreml as cto

    scheme = parse_scheme(spec)
    assert scheme is not None
    ours = _weights(rlx_mil.convert(GRAPH, PARAMS, target=target, precision=precision, compress=spec))
    plain = _uncompressed(target, precision)
    config = cto.OptimizationConfig(global_config=cto.OpLinearQuantizerConfig(**scheme.coremltools_config(), weight_threshold=2047))
    theirs = _weights(cto.linear_quantize_weights(plain, config))
    consumers = set(theirs)
    # Every matmul weight (linear), the LM head and the embedding table are compared.
    assert len(consumers) == 7 + 2 and consumers == set(ours), sorted(theirs)
    for name in sorted(consumers):
        mine, _ = ours[name]
        ref, step = theirs[name]
        assert mine.shape == ref.shape, name
        gap = np.abs(mine - ref)
        # fp16 programs: coremltools derives its scale from the fp16-rounded weights, rlx_mil from
        # the original ones (scales may differ by an fp16 ulp), and both decode to fp16.
        rounding = np.abs(ref) * 2.0**-9 if precision == "fp16" else 0.0
        assert np.all(gap <= step * (1 + 1e-3) + rounding + 1e-6), f"{spec} {name}: worst gap {gap.max():.3g} vs step {step.max():.3g}"
        # Almost every element agrees exactly: fp32 differs on rounding ties only; in fp16
        # coremltools also divides in fp16 (an 11-bit quotient), which moves some codes by one.
        agree = float(np.mean(gap <= 0.5 * step))
        assert agree > (0.99 if precision == "fp32" else 0.9), f"{spec} {name}: {agree:.3f} of the codes agree"


def _luts(model: Any) -> dict[str, tuple[np.ndarray, tuple[int, ...]]]:
    out = {}
    for op in model._mil_program.functions["main"].operations:
        if op.op_type == "constexpr_lut_to_dense":
            for child in op.outputs[0].child_ops:
                out[child.name] = (np.asarray(op.materialized_val_inference()), tuple(op.lut.val.shape))
    return out


@pytest.mark.parametrize(("spec", "bits", "group"), [("lut4", 4, 16), ("lut2-group8", 2, 8)])
def test_grouped_palettes_match_coremltools_per_grouped_channel(spec: str, bits: int, group: int) -> None:
    """Weights whose every group of output channels holds at most 2**bits values: coremltools'
    `per_grouped_channel` palettization ("unique" mode: exact, no k-means) and rlx_mil's
    grouped LUTs must decode to the same weights, with tables of the same shape."""
    import coremltools.optimize.coreml as cto

    rng = np.random.default_rng(bits)
    params = dict(PARAMS)
    for name, value in PARAMS.items():
        if value.ndim != 2 or name.startswith("rope"):
            continue
        out_axis = 0 if name == "embed_tokens.weight" else 1  # rows of the stored [out, in] weight
        rows = np.moveaxis(value, out_axis, 0).copy()
        for g0 in range(0, rows.shape[0], group):
            palette = (rng.standard_normal(1 << bits) * 0.1).astype(np.float16).astype(np.float32)
            rows[g0:g0 + group] = palette[rng.integers(0, 1 << bits, rows[g0:g0 + group].shape)]
        params[name] = np.moveaxis(rows, 0, out_axis)
    ours = _luts(rlx_mil.convert(GRAPH, params, precision="fp16", compress=spec))
    config = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(
        mode="unique", granularity="per_grouped_channel", group_size=group, weight_threshold=2047))
    theirs = _luts(cto.palettize_weights(rlx_mil.convert(GRAPH, params, precision="fp16"), config))
    assert set(ours) == set(theirs) and len(ours) == 9
    for name in sorted(ours):
        assert ours[name][1] == theirs[name][1], name
        np.testing.assert_array_equal(ours[name][0], theirs[name][0], err_msg=name)
