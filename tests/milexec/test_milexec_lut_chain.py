"""LUT-then-scale weights (a `constexpr_lut_to_dense` feeding a `constexpr_blockwise_shift_scale`,
the iOS26 form of GGUF codes) in plain, cached (fast) and streamed (lean) runs: the weight is
fp16(scale * (lut[indices] - offset)) bit for bit, read by `linear` and by an embedding
`gather`; a grouped table (not streamed) falls back to decoding op by op, exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from saved_programs import save_program

from rlx_mil import milexec
from rlx_mil.milexec.prepared import prepare
from rlx_mil.milexec.streamed import ShiftScaleWeight

ROWS, COLS, BLOCK = 64, 96, 16


def _codes(seed: int, bits: int, low: int, offset: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    blocks = (ROWS, COLS // BLOCK)
    return {
        "indices": rng.integers(0, 1 << bits, (ROWS, COLS)).astype(np.uint8),
        "lut": (low + np.arange(1 << bits)).astype(np.int8),
        "scale": (rng.random(blocks) * 0.05 + 1e-3).astype(np.float16),
        "offset": (rng.random(blocks) * 4 - 2).astype(np.float16) if offset else None,  # type: ignore[dict-item]
    }


def _weight(c: dict[str, np.ndarray]) -> np.ndarray:
    values = c["lut"].astype(np.float32)[c["indices"]]
    if c["offset"] is not None:
        values = values - np.repeat(c["offset"].astype(np.float32), BLOCK, axis=1)
    with np.errstate(all="ignore"):
        return (np.repeat(c["scale"].astype(np.float32), BLOCK, axis=1) * values).astype(np.float16).astype(np.float32)


def _chain(c: dict[str, np.ndarray], bits: int, name: str, groups: int = 1) -> Any:
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    dtype = np.uint8 if bits == 8 else getattr(types, f"np_uint{bits}_dtype")
    lut = np.tile(c["lut"].reshape(1, 1, -1, 1), (groups, 1, 1, 1))
    values = mb.constexpr_lut_to_dense(indices=c["indices"].astype(dtype), lut=lut, name=f"{name}_codes")
    extra = {} if c["offset"] is None else {"offset": c["offset"]}
    return mb.constexpr_blockwise_shift_scale(data=values, scale=c["scale"], name=name, **extra)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    codes = {"six": _codes(1, 6, -32, False), "two": _codes(2, 2, 0, True), "grouped": _codes(3, 3, -4, False)}

    @mb.program(input_specs=[mb.TensorSpec((2, COLS), dtype=types.fp16), mb.TensorSpec((5,), dtype=types.int32)],
                opset_version=ct.target.iOS26)
    def prog(x: Any, ids: Any) -> Any:
        six = _chain(codes["six"], 6, "w_six")
        two = _chain(codes["two"], 2, "w_two")
        grouped = _chain(codes["grouped"], 3, "w_grouped", groups=4)
        y = mb.add(x=mb.linear(x=x, weight=six), y=mb.linear(x=x, weight=grouped), name="y")
        return y, mb.gather(x=two, indices=ids, axis=0, name="rows"), mb.gather(x=six, indices=ids, axis=0, name="rows6")

    return save_program(prog, tmp_path_factory.mktemp("chain") / "chain.mlpackage", target="iOS26", fp16=True), codes


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"x": rng.standard_normal((2, COLS)).astype(np.float32), "ids": np.array([0, 63, 5, 5, 31], np.int32)}


def test_saved_program_keeps_the_lut_then_scale_order(package: Any) -> None:
    path, _ = package
    program = milexec.load_program(path)
    chains = {op.name: op.inputs["data"].op.op_type for op in program.functions["main"].operations
              if op.op_type == "constexpr_blockwise_shift_scale"}
    assert chains == {"w_six": "constexpr_lut_to_dense", "w_two": "constexpr_lut_to_dense",
                      "w_grouped": "constexpr_lut_to_dense"}


def test_plain_run_decodes_the_weight_exactly(package: Any) -> None:
    path, codes = package
    ids = _inputs()["ids"]
    got = milexec.run(path, _inputs())
    np.testing.assert_array_equal(got["rows"], _weight(codes["two"])[ids])
    np.testing.assert_array_equal(got["rows6"], _weight(codes["six"])[ids])
    x16 = _inputs()["x"].astype(np.float16).astype(np.float32)
    want = x16 @ _weight(codes["six"]).T + x16 @ _weight(codes["grouped"]).T
    np.testing.assert_allclose(got["y"], want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))


@pytest.mark.parametrize("memory", ["fast", "lean"])
def test_prepared_runs_equal_the_plain_run(package: Any, memory: str) -> None:
    path, codes = package
    plain = milexec.run(path, _inputs())
    program = prepare(path, memory=memory)  # type: ignore[arg-type]
    for _ in range(2):  # the second run reuses what the first left
        got = program.run(_inputs())
        for name, want in plain.items():
            np.testing.assert_array_equal(got[name], want)
    plan = program._plans["main"]
    held = [v for v in plan.consts.values() if isinstance(v, ShiftScaleWeight)]
    if memory == "lean":  # the one-table chains stream; the grouped one is decoded per run
        assert sorted(w.shape for w in held) == [(ROWS, COLS)] * 2 and all(w.lut is not None for w in held)
        assert {codes["six"]["lut"].size, codes["two"]["lut"].size} == {w.lut.size for w in held if w.lut is not None}
    else:
        assert held == [] and program.prepared_bytes > 0


def test_streamed_rows_and_takes_equal_the_weight(package: Any) -> None:
    path, codes = package
    program = milexec.load_program(path)
    ops = {op.name: op for op in program.functions["main"].operations}
    consts = {id(op.outputs[0]): op.outputs[0].val for op in ops.values() if op.op_type == "const"}

    def lookup(var: Any) -> Any:
        return consts[id(var)]

    assert ShiftScaleWeight.of(ops["w_grouped"], lookup, round_fp16=True) is None  # grouped: not streamed
    for name in ("six", "two"):
        weight = ShiftScaleWeight.of(ops[f"w_{name}"], lookup, round_fp16=True)
        assert weight is not None and weight.lut is not None
        want = _weight(codes[name])
        np.testing.assert_array_equal(weight.dense(), want)
        out = np.empty((16, COLS), np.float32)
        np.testing.assert_array_equal(weight.rows_into(16, 32, out), want[16:32])
        rows = np.array([[3, 9], [63, 0]])
        np.testing.assert_array_equal(weight.take(rows), want[rows])
