"""The fp16 precision model: fp16 vars are rounded where they are produced, ops compute in fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from milexec_util import build_function, build_program, converted

from rlx_mil import milexec


def mb() -> Any:
    from coremltools.converters.mil import Builder

    return Builder


def square_sum_program() -> Any:
    feeds = {"x": np.zeros((1, 4), dtype=np.float32)}
    return build_program(
        feeds,
        lambda v: [
            mb().reduce_sum(
                x=mb().mul(x=v["x"], y=v["x"], name="sq"), axes=[-1], keep_dims=False, name="total"
            )
        ],
        "iOS17",
    )


@pytest.mark.parametrize("target", ["iOS15", "iOS17"])
def test_fp16_overflow_shows_up_as_inf_where_it_happens(tmp_path: Path, target: str) -> None:
    x = np.array([[300.0, 1.0, 2.0, 3.0]], dtype=np.float32)  # 300^2 = 90000 > 65504
    with converted(square_sum_program(), tmp_path, opset=target, fp16=True) as model:
        declared = milexec.run(model, {"x": x}, return_all=True)
        wide = milexec.run(model, {"x": x}, precision_model="float32", return_all=True)
    assert np.isposinf(declared.outputs["total"]).all()
    (origin,) = declared.nonfinite_origins
    assert origin.endswith("(mul)")
    assert declared.values[origin.split(" ")[0]].dtype == np.float16
    np.testing.assert_allclose(wide.outputs["total"], [90014.0], rtol=1e-6)
    assert wide.nonfinite_origins == []


def test_same_program_in_fp32_does_not_overflow(tmp_path: Path) -> None:
    x = np.array([[300.0, 1.0, 2.0, 3.0]], dtype=np.float32)
    with converted(square_sum_program(), tmp_path, opset="iOS17", fp16=False) as model:
        np.testing.assert_allclose(milexec.run(model, {"x": x})["total"], [90014.0], rtol=1e-6)


def test_underflow_and_intermediate_rounding() -> None:
    x = np.array([1e-4, 1.0], dtype=np.float16)
    function = build_function(
        {"x": x},
        lambda v: [
            mb().mul(x=v["x"], y=v["x"], name="tiny"),
            mb().sub(x=mb().add(x=v["x"], y=np.float16(1e-3)), y=v["x"], name="lost"),
        ],
    )
    declared = milexec.run(function, {"x": x})
    wide = milexec.run(function, {"x": x}, precision_model="float32")
    assert declared["tiny"][0] == 0.0  # 1e-8 is below the smallest fp16 subnormal
    assert wide["tiny"][0] == pytest.approx(float(np.float16(1e-4)) ** 2, rel=1e-6)
    # 1 + 1e-3 rounds to 1 + 2^-10 in fp16 before the subtraction.
    assert declared["lost"][1] == np.float32(2**-10)
    assert wide["lost"][1] == pytest.approx(float(np.float16(1e-3)), rel=1e-3)


def test_fp16_accumulation_is_fp32() -> None:
    ones = np.ones((1, 3000), dtype=np.float16)
    function = build_function(
        {"x": ones},
        lambda v: [
            mb().reduce_sum(x=v["x"], axes=[-1], name="total"),
            mb().matmul(x=v["x"], y=np.ones((3000, 1), dtype=np.float16), name="dot"),
            mb().softmax(x=v["x"], axis=-1, name="p"),
        ],
    )
    out = milexec.run(function, {"x": ones.astype(np.float32)})
    # An fp16 running sum would stall at 2048 (2048 + 1 rounds back to 2048).
    assert out["total"].tolist() == [3000.0]
    assert out["dot"].tolist() == [[3000.0]]
    np.testing.assert_array_equal(out["p"], np.float16(1 / 3000))


def test_fp16_inputs_to_an_op_are_the_rounded_values() -> None:
    x = np.array([0.1, 1 / 3, 2049.0], dtype=np.float32)
    function = build_function(
        {"x": x.astype(np.float16)}, lambda v: [mb().cast(x=v["x"], dtype="fp32", name="y")]
    )
    np.testing.assert_array_equal(
        milexec.run(function, {"x": x})["y"], x.astype(np.float16).astype(np.float32)
    )


def test_converted_fp16_model_tracks_the_fp32_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 8)).astype(np.float32) / 3
    w2 = rng.standard_normal((4, 16)).astype(np.float32) / 4
    gamma = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    feeds = {"x": np.zeros((2, 3, 8), dtype=np.float32)}

    def build(v: dict[str, Any]) -> list[Any]:
        h = mb().linear(x=v["x"], weight=w1)
        h = mb().layer_norm(x=h, axes=[-1], gamma=gamma, epsilon=np.float32(1e-5))
        h = mb().gelu(x=h, mode="TANH_APPROXIMATION")
        return [mb().softmax(x=mb().linear(x=h, weight=w2), axis=-1, name="p")]

    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    h = x @ w1.T
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * gamma
    h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    logits = h @ w2.T
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    for fp16, tolerance in ((False, 1e-5), (True, 5e-3)):
        with converted(build_program(feeds, build, "iOS17"), tmp_path, opset="iOS17", fp16=fp16) as model:
            result = milexec.cross_check(model, {"x": x})
            np.testing.assert_allclose(result.outputs["p"], expected, atol=tolerance)
            ops = {op.op_type: op for op in model._mil_program.functions["main"].operations}
            assert ops["layer_norm"].outputs[0].dtype.__name__ == ("fp16" if fp16 else "fp32")


def test_data_movement_keeps_fp16_values_as_stored() -> None:
    """reshape/transpose/squeeze/slices/split of an fp16 tensor move its stored fp16 values
    (subnormals, signed zeros, inf and NaN bit for bit) without a float32 round trip."""
    bits = np.array([0x0001, 0x8000, 0x0000, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x03FF, 0x1234, 0xC001],
                    dtype=np.uint16)
    x = bits.view(np.float16).reshape(1, 3, 1, 4)

    def build(v: dict[str, Any]) -> list[Any]:
        t = mb().transpose(x=v["x"], perm=[0, 3, 2, 1], name="t")
        r = mb().reshape(x=t, shape=[4, 3], name="r")
        e = mb().expand_dims(x=r, axes=[0], name="e")
        s = mb().squeeze(x=e, axes=[0], name="s")
        c = mb().slice_by_size(x=s, begin=[1, 0], size=[-1, 2], name="c")
        parts = mb().split(x=c, num_splits=2, axis=1, name="p")
        return [s, c, *parts]

    function = build_function({"x": x}, build)
    out = milexec.run(function, {"x": x}, return_all=True)
    moved = x.transpose(0, 3, 2, 1).reshape(4, 3)
    for name, expected in (("s", moved), ("c", moved[1:, :2]), ("p_0", moved[1:, :1]), ("p_1", moved[1:, 1:2])):
        got = out.values[name]
        assert got.dtype == np.float16, name
        np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16), err_msg=name)
    # no float32 round trip: the moved values are views of the stored fp16 input
    assert all(np.shares_memory(out.values[name], out.values["x"]) for name in ("t", "r", "s", "c", "p_0"))
