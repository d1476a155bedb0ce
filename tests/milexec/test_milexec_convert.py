"""Programs converted with ct.convert for every target, in fp32 and fp16, against NumPy; save and
reload round trips; compressed weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from milexec_util import build_program, converted

from rlx_mil import milexec

RNG = np.random.default_rng(7)
EMBED = RNG.standard_normal((10, 8)).astype(np.float32)
W_UP = (RNG.standard_normal((12, 8)) / 3).astype(np.float32)
W_DOWN = (RNG.standard_normal((8, 12)) / 3).astype(np.float32)


def mb() -> Any:
    from coremltools.converters.mil import Builder

    return Builder


def block(v: dict[str, Any]) -> list[Any]:
    """Embedding gather, RMSNorm, SwiGLU-ish MLP, residual, causal scores and softmax."""
    b = mb()
    h = b.gather(x=EMBED, indices=v["ids"], axis=0)  # [T, 8]
    ms = b.reduce_mean(x=b.mul(x=h, y=h), axes=[-1], keep_dims=True)
    n = b.mul(x=h, y=b.rsqrt(x=ms, epsilon=np.float32(1e-6)))
    up = b.linear(x=n, weight=W_UP)
    h = b.add(x=h, y=b.linear(x=b.mul(x=b.sigmoid(x=up), y=up), weight=W_DOWN), name="hidden")
    scores = b.matmul(x=h, y=h, transpose_y=True)
    causal = np.triu(np.full((5, 5), -1e4, dtype=np.float32), k=1)
    probs = b.softmax(x=b.add(x=b.mul(x=scores, y=np.float32(0.25)), y=causal), axis=-1, name="probs")
    return [h, probs, b.reduce_argmax(x=probs, axis=-1, name="best")]


def reference(ids: np.ndarray) -> dict[str, np.ndarray]:
    h = EMBED[ids]
    n = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6)
    up = n @ W_UP.T
    h = h + (up / (1 + np.exp(-up))) @ W_DOWN.T
    scores = h @ h.T * 0.25 + np.triu(np.full((5, 5), -1e4), k=1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return {"hidden": h, "probs": probs, "best": probs.argmax(-1)}


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("target", ["iOS15", "iOS16", "iOS17", "iOS18"])
def test_converted_block_matches_numpy(tmp_path: Path, target: str, fp16: bool) -> None:
    ids = np.array([3, 1, 4, 1, 5], dtype=np.int32)
    program = build_program({"ids": ids}, block, target)
    expected = reference(ids)
    tolerance = 2e-2 if fp16 else 1e-5
    with converted(program, tmp_path, opset=target, fp16=fp16) as model:
        in_memory = milexec.run(model, {"ids": ids})
        assert set(in_memory) == {"hidden", "probs", "best"}
        for name in ("hidden", "probs"):
            np.testing.assert_allclose(in_memory[name], expected[name], rtol=tolerance, atol=tolerance)
        np.testing.assert_array_equal(in_memory["best"], expected["best"])
        assert in_memory["best"].dtype == np.int32
        reloaded = milexec.run(tmp_path / "model.mlpackage", {"ids": ids})
    for name in in_memory:
        np.testing.assert_array_equal(reloaded[name], in_memory[name])


def test_reloaded_fp16_program_passes_the_cross_check(tmp_path: Path) -> None:
    ids = np.array([0, 9, 2, 2, 7], dtype=np.int32)
    with converted(build_program({"ids": ids}, block, "iOS18"), tmp_path, opset="iOS18", fp16=True):
        result = milexec.cross_check(tmp_path / "model.mlpackage", {"ids": ids})
        program = milexec.load_program(tmp_path / "model.mlpackage")
    op_types = {op.name: op.op_type for op in program.functions["main"].operations}
    checked = {op_types[name] for name in result.cross_checked}
    assert {"gather", "reduce_mean", "rsqrt", "linear", "matmul", "softmax", "cast"} <= checked
    # sigmoid(x) * x was fused into silu, which coremltools cannot evaluate.
    silu = [name for name, op_type in op_types.items() if op_type == "silu"]
    assert silu and all("no value_inference" in result.cross_check_skipped[name] for name in silu)
    assert result.outputs["probs"].dtype == np.float32


def compress(model: Any, kind: str) -> Any:
    import coremltools.optimize.coreml as cto

    if kind == "int8_per_channel":
        config = cto.OptimizationConfig(
            global_config=cto.OpLinearQuantizerConfig(
                mode="linear_symmetric", dtype="int8", weight_threshold=0
            )
        )
        return cto.linear_quantize_weights(model, config=config)
    if kind == "int4_per_block":
        config = cto.OptimizationConfig(
            global_config=cto.OpLinearQuantizerConfig(
                mode="linear_symmetric",
                dtype="int4",
                granularity="per_block",
                block_size=16,
                weight_threshold=0,
            )
        )
        return cto.linear_quantize_weights(model, config=config)
    if kind == "palettize_4bit":
        config = cto.OptimizationConfig(
            global_config=cto.OpPalettizerConfig(mode="uniform", nbits=4, weight_threshold=0)
        )
        return cto.palettize_weights(model, config=config)
    config = cto.OptimizationConfig(
        global_config=cto.OpMagnitudePrunerConfig(target_sparsity=0.5, weight_threshold=0)
    )
    return cto.prune_weights(model, config=config)


@pytest.mark.parametrize(
    "kind,target,op_type,tolerance",
    [
        ("int8_per_channel", "iOS17", "constexpr_affine_dequantize", 0.02),
        ("int8_per_channel", "iOS18", "constexpr_blockwise_shift_scale", 0.02),
        ("int4_per_block", "iOS18", "constexpr_blockwise_shift_scale", 0.25),
        ("palettize_4bit", "iOS18", "constexpr_lut_to_dense", 0.25),
        ("prune_half", "iOS18", "constexpr_sparse_to_dense", None),
    ],
)
def test_compressed_weights_decompress_like_coremltools(
    tmp_path: Path, kind: str, target: str, op_type: str, tolerance: float | None
) -> None:
    weight = RNG.standard_normal((32, 64)).astype(np.float32)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    program = build_program({"x": x}, lambda v: [mb().linear(x=v["x"], weight=weight, name="y")], target)
    with converted(program, tmp_path, opset=target) as model:
        small = compress(model, kind)
        package = tmp_path / "compressed.mlpackage"
        small.save(str(package))
    result = milexec.cross_check(package, {"x": x})
    ops = [op for op in milexec.load_program(package).functions["main"].operations if op.op_type == op_type]
    assert ops and all(op.name in result.cross_checked for op in ops)
    y = result.outputs["y"]
    exact = x @ weight.T
    if tolerance is None:  # pruning zeroes the smallest half of the weights
        kept = np.where(np.abs(weight) >= np.median(np.abs(weight)), weight, 0)
        np.testing.assert_allclose(y, x @ kept.T, rtol=2e-2, atol=2e-2)
    else:
        assert np.linalg.norm(y - exact) / np.linalg.norm(exact) < tolerance
