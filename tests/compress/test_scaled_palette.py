"""``lutN-scaled``: one table fitted to max-normalised output channels plus an fp16 scale per
channel (coremltools' `OpPalettizerConfig(enable_per_channel_scale=True)`), the Neural Engine
palette that keeps trained checkpoints (docs/compression.md, "Devices")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil.compress import parse_scheme
from rlx_mil.compress.emit import check_target, compressed_bytes
from rlx_mil.compress.palette import palettize
from rlx_mil.errors import CompressionError, InvalidOptionError
from rlx_mil.lowering.target import Target
from tests.compress.helpers import convert_and_verify, op_types
from tests.compress.test_coremltools_crosscheck import GRAPH, PARAMS
from tests.compress.tiny_lm import TinyLM, tiny_lm_params


def test_parse_and_label() -> None:
    scheme = parse_scheme("lut4-scaled")
    assert scheme is not None and scheme.label == "lut4-tensor-scaled"
    assert scheme.coremltools_config() == {"mode": "kmeans", "nbits": 4, "granularity": "per_tensor",
                                           "enable_per_channel_scale": True}
    grouped = parse_scheme("lut6-group8-scaled")
    assert grouped is not None and grouped.label == "lut6-group8-scaled"
    assert parse_scheme("lut4-tensor-scaled") == scheme
    with pytest.raises(InvalidOptionError, match="scaled"):
        parse_scheme("int4-scaled")
    with pytest.raises(CompressionError, match="iOS18"):
        check_target(scheme, Target.IOS17, "w")


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 40), width=st.integers(2, 70), seed=st.integers(0, 2**16))
def test_decodes_table_times_channel_scale(rows: int, width: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, width)) * rng.uniform(0.01, 10, (rows, 1))).astype(np.float32)
    w[rng.integers(0, rows)] = 0  # a zero channel keeps scale 1 and decodes to exact zeros
    codes = palettize(w, parse_scheme("lut4-scaled"), np.float16)  # type: ignore[arg-type]
    assert codes.channel_scale is not None and codes.channel_scale.dtype == np.float16
    peak = np.abs(w.astype(np.float16)).max(1)
    np.testing.assert_array_equal(codes.channel_scale, np.where(peak == 0, 1, peak))
    back = codes.dequantize()
    np.testing.assert_allclose(back, codes.lut[0].astype(np.float32)[codes.indices] * codes.channel_scale[:, None].astype(np.float32))
    err = np.sqrt(np.sum((back.astype(np.float64) - w) ** 2))
    assert codes.relative_error == pytest.approx(err / max(np.linalg.norm(w.astype(np.float64)), 1e-30), rel=1e-5, abs=1e-12)
    assert np.all(np.abs(codes.lut) <= 1.0)  # the table holds normalised values


def test_beats_one_table_on_rows_of_different_magnitude() -> None:
    """What the scale is for: rows of very different size share one table's shape."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 256)) * np.geomspace(0.01, 1, 64)[:, None]).astype(np.float32)
    scaled = palettize(w, parse_scheme("lut4-scaled"), np.float16)  # type: ignore[arg-type]
    plain = palettize(w, parse_scheme("lut4-tensor"), np.float16)  # type: ignore[arg-type]
    def row_errors(codes: object) -> np.ndarray:
        back = codes.dequantize().astype(np.float64)  # type: ignore[attr-defined]
        return np.linalg.norm(back - w, axis=1) / np.linalg.norm(w, axis=1)

    assert scaled.relative_error < plain.relative_error
    assert np.mean(row_errors(scaled)) < 0.3 * np.mean(row_errors(plain))  # small rows keep their shape
    # iOS18 stores a scaled table per channel, iOS26 one table and the scales.
    indices = 64 * 256 // 2
    assert compressed_bytes(scaled, Target.IOS26) == indices + 16 * 2 + 64 * 2
    assert compressed_bytes(scaled, Target.IOS18) == indices + 64 * 16 * 2 + 64 * 2


@pytest.mark.parametrize("target", ["iOS18", "iOS26"])
def test_executor_runs_the_package(target: str) -> None:
    config = TinyLM(layers=1)
    params = tiny_lm_params(GRAPH, config)
    ids = np.random.default_rng(1).integers(0, config.vocab, (1, config.seq)).astype(np.int32)
    model, report = convert_and_verify(GRAPH, params, {"input_ids": ids}, "lut4-scaled;check=off", target=target)
    assert {w.scheme for w in report.weights} == {"lut4-tensor-scaled"}
    ops = op_types(model)
    assert ops.count("constexpr_blockwise_shift_scale") == ops.count("constexpr_lut_to_dense") == len(report.weights)


def test_matches_coremltools_per_channel_scale_palettization() -> None:
    """Rows that are a scale times values of one 16-entry table, each row holding the table's
    largest magnitude and a power-of-two scale: coremltools' palettization with `enable_per_channel_scale` ("unique"
    mode, exact) and rlx_mil's `lut4-scaled` decode to the same weights, within one fp16 step."""
    import coremltools.optimize.coreml as cto

    rng = np.random.default_rng(4)
    palette = np.sort(rng.uniform(-1, 1, 16)).astype(np.float16).astype(np.float32)
    palette[np.argmax(np.abs(palette))] = 1.0
    params = dict(PARAMS)
    for name, value in PARAMS.items():
        if value.ndim != 2 or name.startswith("rope"):
            continue
        out_axis = 0 if name == "embed_tokens.weight" else 1
        rows = np.moveaxis(value, out_axis, 0).copy()
        idx = rng.integers(0, 16, rows.shape)
        idx[:, 0] = np.argmax(np.abs(palette))
        scale = 2.0 ** rng.integers(-6, 0, (rows.shape[0], 1))  # exact in fp16: the normalised rows are the table
        rows[:] = palette[idx] * scale
        params[name] = np.moveaxis(rows, 0, out_axis)
    ours = rlx_mil.convert(GRAPH, params, precision="fp16", compress="lut4-scaled")
    config = cto.OptimizationConfig(global_config=cto.OpPalettizerConfig(
        mode="unique", granularity="per_tensor", enable_per_channel_scale=True, weight_threshold=2047))
    theirs = cto.palettize_weights(rlx_mil.convert(GRAPH, params, precision="fp16"), config)

    from coremltools.optimize._utils import lut_to_dense

    def value(op: object) -> np.ndarray:
        if op.op_type == "constexpr_lut_to_dense" and op.lut.val is None:  # type: ignore[attr-defined]
            return lut_to_dense(op.indices.val, value(op.lut.op), None)  # type: ignore[attr-defined]
        return np.asarray(op.materialized_val_inference())  # type: ignore[attr-defined]

    def decoded(model: object) -> dict[str, np.ndarray]:
        out = {}
        for op in model._mil_program.functions["main"].operations:  # type: ignore[attr-defined]
            # The weight's last constexpr (iOS18 stores it scaled table first, then the LUT).
            if op.op_type.startswith("constexpr_"):
                for child in op.outputs[0].child_ops:
                    if not child.op_type.startswith("constexpr_"):
                        out[child.name] = np.asarray(value(op), np.float32)
        return out

    mine, coreml = decoded(ours), decoded(theirs)
    # coremltools 9's "unique" mode palettizes the embedding and head here (it leaves the
    # [K, N] matmul weights as they are); every weight it did palettize must decode alike.
    assert len(mine) == 9 and len(coreml) >= 2 and set(coreml) <= set(mine)
    for name in sorted(coreml):  # within one fp16 step (a table entry rounded the other way)
        np.testing.assert_allclose(mine[name], coreml[name], rtol=2**-10, atol=0, err_msg=name)
    assert not np.array_equal(mine[sorted(coreml)[0]], 0)
