"""The Neural Engine form takes dense weights off the 1 MiB notch (`rlx_mil.coreml.deploy.notch`)
without changing the outputs; preflight's `ane-dma-notch` rule is the judge."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec
from rlx_mil.coreml.deploy.notch import avoid_notch, notch_pieces
from rlx_mil.coreml.preflight_rules import core_payload, on_notch
from rlx_mil.ir.graph import Graph


def test_notch_pieces_leave_both_slices_off_the_notch() -> None:
    assert notch_pieces(2048, 2048, 1) is None  # 512 KiB per core: fine
    for rows, width in ((2048, 4096), (8192, 2048), (2048, 8192), (16, 1 << 19)):
        assert on_notch(core_payload(rows, width))
        how, sizes = notch_pieces(rows, width, 1)  # type: ignore[misc]
        if how == "rows":
            assert sum(sizes) == rows and all(s % 16 == 0 for s in sizes)
            assert not any(on_notch(core_payload(s, width)) for s in sizes)
        else:
            assert rows <= 16 and sum(sizes) == width
            assert not any(on_notch(core_payload(rows, s)) for s in sizes)


def _program(rows: int, width: int, bias: bool) -> tuple[Any, np.ndarray, np.ndarray | None]:
    from coremltools.converters.mil import Builder as mb

    rng = np.random.default_rng(rows)
    w = (rng.standard_normal((rows, width)) / np.sqrt(width)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32) if bias else None

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 2, width))])
    def prog(x: Any) -> Any:
        y = mb.linear(x=x, weight=w, bias=b, name="proj") if bias else mb.linear(x=x, weight=w, name="proj")
        return mb.relu(x=y, name="out"), mb.identity(x=y, name="raw")

    return prog, w, b


@pytest.mark.parametrize("rows, width, bias", [(64, 1 << 17, True), (16, 1 << 19, False)])
def test_notched_projection_is_split_and_computes_the_same(rows: int, width: int, bias: bool) -> None:
    prog, w, b = _program(rows, width, bias)
    x = np.random.default_rng(1).standard_normal((1, 2, width)).astype(np.float32)
    assert avoid_notch(prog) == ["proj"]
    function = prog.functions["main"]
    linears = [op for op in function.operations if op.op_type == "linear"]
    assert len(linears) == 2
    for op in linears:
        rows_, width_ = (int(d) for d in op.inputs["weight"].shape)
        assert not on_notch(core_payload(rows_, width_))
    got = milexec.run(prog, {"x": x})
    want = x @ w.T + (b if b is not None else 0)
    np.testing.assert_allclose(got["raw"], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["out"], np.maximum(want, 0), rtol=1e-4, atol=1e-4)
    assert avoid_notch(prog) == []  # nothing is left on the notch


def test_convert_ane_clears_the_preflight_notch_finding() -> None:
    g = Graph("notched")
    x = g.input("x", [1, 1, 4096])
    w = g.param("w", [4096, 2048])
    g.set_outputs([g.matmul(x, w, name="y")])
    params = {"w": (np.random.default_rng(0).standard_normal((4096, 2048)) / 64).astype(np.float32)}
    plain = rlx_mil.convert(g, params)
    ane = rlx_mil.convert(g, params, deploy="ane")
    assert "ane-dma-notch" in [f.rule for f in rlx_mil.preflight(plain, device="ane")]
    assert "ane-dma-notch" not in [f.rule for f in rlx_mil.preflight(ane, device="ane")]
    feed = {"x": np.random.default_rng(1).standard_normal((1, 1, 4096)).astype(np.float32)}
    np.testing.assert_allclose(milexec.run(ane, feed)["y"], milexec.run(plain, feed)["y"], rtol=1e-3, atol=1e-3)
