"""Palettized weights (iOS18 `constexpr_lut_to_dense`: one table per tensor, per group of rows,
per group of columns or both; 4-, 6- and 8-bit indices) and a table of fractions then a
per-row scale (`lut4-scaled`) streamed by prepared runs: the values are the op-by-op run's
bit for bit, read by `linear` and by an embedding `gather`, in "fast" and "lean"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from saved_programs import save_program

from rlx_mil import milexec
from rlx_mil.milexec.lut_weight import LutWeight
from rlx_mil.milexec.prepared import prepare
from rlx_mil.milexec.streamed import ShiftScaleWeight, StreamedWeight

ROWS, COLS = 128, 64
#: name -> (index bits, row groups, column groups)
FORMS = {"tensor4": (4, 1, 1), "rows4": (4, 8, 1), "cols6": (6, 1, 4), "both8": (8, 4, 2)}


def _codes(seed: int, bits: int, groups_r: int, groups_c: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"indices": rng.integers(0, 1 << bits, (ROWS, COLS)).astype(np.uint8),
            "lut": rng.standard_normal((groups_r, groups_c, 1 << bits, 1)).astype(np.float32) * 0.1}


def _weight(c: dict[str, np.ndarray], fp16: bool) -> np.ndarray:
    lut = c["lut"].astype(np.float16).astype(np.float32) if fp16 else c["lut"]
    gr, gc = lut.shape[:2]
    rows = (np.arange(ROWS) // (ROWS // gr))[:, None]
    cols = (np.arange(COLS) // (COLS // gc))[None, :]
    return lut[rows, cols, c["indices"], 0]


CODES = {name: _codes(i, *form) for i, (name, form) in enumerate(FORMS.items())}
SCALED = {"indices": np.random.default_rng(9).integers(0, 16, (ROWS, COLS)).astype(np.uint8),
          "lut": np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 1, 16, 1) ** 3,
          "scale": (np.random.default_rng(10).random((ROWS, 1)) * 0.05 + 1e-3).astype(np.float32)}


@pytest.fixture(scope="module", params=["fp16", "fp32"])
def package(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    fp16 = request.param == "fp16"
    dt, io = (np.float16, types.fp16) if fp16 else (np.float32, types.fp32)

    def table(c: dict[str, np.ndarray], name: str) -> Any:
        bits = {16: 4, 64: 6, 256: 8}[c["lut"].shape[2]]
        kind = np.uint8 if bits == 8 else getattr(types, f"np_uint{bits}_dtype")
        return mb.constexpr_lut_to_dense(indices=c["indices"].astype(kind), lut=c["lut"].astype(dt), name=name)

    @mb.program(input_specs=[mb.TensorSpec((3, COLS), dtype=io), mb.TensorSpec((5,), dtype=types.int32)],
                opset_version=ct.target.iOS18)
    def prog(x: Any, ids: Any) -> Any:
        weights = {name: table(c, f"w_{name}") for name, c in CODES.items()}
        scaled = mb.constexpr_blockwise_shift_scale(data=table(SCALED, "w_scaled_lut"), scale=SCALED["scale"].astype(dt),
                                                    name="w_scaled")
        outs = [mb.linear(x=x, weight=w, name=f"y_{name}") for name, w in weights.items()]
        outs.append(mb.linear(x=x, weight=scaled, name="y_scaled"))
        outs += [mb.gather(x=weights["rows4"], indices=ids, axis=0, name="rows"),
                 mb.gather(x=weights["both8"], indices=ids, axis=0, name="rows8")]
        return tuple(outs)

    return save_program(prog, tmp_path_factory.mktemp("lut") / f"{request.param}.mlpackage", fp16=fp16), fp16


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"x": rng.standard_normal((3, COLS)).astype(np.float32), "ids": np.array([0, 127, 4, 4, 33], np.int32)}


def test_streamed_tables_equal_the_weight(package: Any) -> None:
    path, fp16 = package
    function = milexec.load_program(path, packed_4bit=True).functions["main"]
    consts = {id(op.outputs[0]): op.outputs[0].val for op in function.operations if op.op_type == "const"}
    ops = {op.name: op for op in function.operations}
    for name, c in CODES.items():
        weight = LutWeight.of(ops[f"w_{name}"], lambda var: consts.get(id(var)), round_fp16=fp16)
        assert weight is not None
        want = _weight(c, fp16)
        np.testing.assert_array_equal(weight.dense(), want, err_msg=name)
        out = np.empty((50, COLS), np.float32)
        np.testing.assert_array_equal(weight.rows_into(5, 55, out), want[5:55], err_msg=name)
        rows = np.array([[3, 9], [127, 0]])
        np.testing.assert_array_equal(weight.take(rows), want[rows], err_msg=name)


@pytest.mark.parametrize("memory", ["fast", "lean"])
def test_prepared_runs_equal_the_plain_run(package: Any, memory: str) -> None:
    path, fp16 = package
    plain = milexec.run(path, _inputs())
    program = prepare(path, memory=memory)  # type: ignore[arg-type]
    for _ in range(2):
        got = program.run(_inputs())
        for name, want in plain.items():
            np.testing.assert_array_equal(got[name], want, err_msg=f"{memory} {name}")
    x = _inputs()["x"].astype(np.float16 if fp16 else np.float32).astype(np.float32)
    for name, c in CODES.items():  # and the plain run is the weight's product
        np.testing.assert_allclose(plain[f"y_{name}"], x @ _weight(c, fp16).T, rtol=1e-2, atol=1e-2)
    plan = program._plans["main"]
    held = [v for v in plan.consts.values() if isinstance(v, StreamedWeight)]
    if memory == "lean":  # every one streams: no weight decoded whole by a run
        # coremltools folds the per-row scale into the table (a scaled table per row): a
        # LutWeight over the table decoded once, or the LUT-then-scale form if it is kept
        assert len(held) == 5 and sum(isinstance(w, LutWeight) for w in held) >= 4
        assert all(w.lut is not None and w.fast_rounding == fp16 for w in held if isinstance(w, ShiftScaleWeight))
    constexprs = [op for op in program._resolved["main"].function.operations if op.op_type.startswith("constexpr_")]
    assert len(constexprs) >= 6 and all(id(op) in plan.precomputed for op in constexprs)
