"""Weights held split (two tables summed, then a block scale and bias at run time: the GGUF
5-bit form before iOS26) streamed as one weight by prepared runs: the values are the op-by-op
run's bit for bit (fp16 and fp32 programs; subnormal, overflowing, zero and NaN scales and
biases included), read by `linear` and by an embedding `gather`, in "fast" (decoded once) and
"lean" (a block of rows at a time); a chain that is not the plain kind stays op by op."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from saved_programs import save_program

from rlx_mil import milexec
from rlx_mil.milexec.prepared import prepare
from rlx_mil.milexec.split_weight import split_chain, split_weight
from rlx_mil.milexec.streamed import ShiftScaleWeight

ROWS, COLS, BLOCK = 96, 64, 32


def _codes(seed: int, signed: bool, bias: bool) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    blocks = (ROWS, COLS // BLOCK)
    scale = (rng.standard_normal(blocks) * 10.0 ** rng.integers(-7, 3, blocks)).astype(np.float16)
    scale[0, 0], scale[1, 0], scale[2, 1], scale[3, 0] = 0.0, 6e-8, 4000.0, -0.0  # zero, subnormal, overflow
    offsets = (rng.standard_normal(blocks) * 10.0 ** rng.integers(-6, 4, blocks)).astype(np.float16)
    offsets[4, 0] = np.nan
    return {
        "low": rng.integers(0, 16, (ROWS, COLS)).astype(np.uint8),
        "high": rng.integers(0, 2, (ROWS, COLS)).astype(np.uint8),
        "table": (np.arange(16) - (16 if signed else 0)).astype(np.float32),
        "scale": scale,
        "bias": offsets if bias else None,
    }


def _weight(c: dict[str, Any], fp16: bool) -> np.ndarray:
    """An independent decode: the program's ops in NumPy, rounded where the program is fp16."""
    def rounded(v: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return v.astype(np.float16).astype(np.float32) if fp16 else v

    codes = c["table"][c["low"]] + np.float32(16) * c["high"]
    values = codes.reshape(ROWS, COLS // BLOCK, BLOCK)
    with np.errstate(all="ignore"):
        values = rounded(values * c["scale"].astype(np.float32)[:, :, None])
        if c["bias"] is not None:
            values = rounded(values + c["bias"].astype(np.float32)[:, :, None])
    return values.reshape(ROWS, COLS)


def _chain(c: dict[str, Any], name: str, dt: Any) -> Any:
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    low = mb.constexpr_lut_to_dense(indices=c["low"].astype(types.np_uint4_dtype),
                                    lut=c["table"].astype(dt).reshape(1, 1, 16, 1), name=f"{name}_low")
    high = mb.constexpr_lut_to_dense(indices=c["high"].astype(types.np_uint1_dtype),
                                     lut=np.asarray([0, 16], dt).reshape(1, 1, 2, 1), name=f"{name}_high")
    values = mb.reshape(x=mb.add(x=low, y=high), shape=np.asarray([ROWS, COLS // BLOCK, BLOCK], np.int32))
    values = mb.mul(x=values, y=c["scale"].astype(dt).reshape(ROWS, -1, 1))
    if c["bias"] is not None:
        values = mb.add(x=values, y=c["bias"].astype(dt).reshape(ROWS, -1, 1))
    return mb.reshape(x=values, shape=np.asarray([ROWS, COLS], np.int32), name=name)


def _plain(seed: int) -> dict[str, Any]:
    """Scales and biases of a real file's range (the fast roundings hold), one block's sums
    fp16 subnormals: scale 2^-14 plus a bias of -1021 * 2^-24 (code 1 gives 3 * 2^-24)."""
    rng = np.random.default_rng(seed)
    c = _codes(seed, False, True)
    c["scale"] = (rng.random(c["scale"].shape) * 0.01 + 1e-3).astype(np.float16)
    c["bias"] = (-rng.random(c["scale"].shape) * 0.1).astype(np.float16)
    c["scale"][5, 0], c["bias"][5, 0] = 2.0**-14, -1021 * 2.0**-24
    c["low"][5, :BLOCK], c["high"][5, :BLOCK] = np.arange(BLOCK) % 3, 0
    return c


CODES = {"q5_0": _codes(1, True, False), "q5_1": _codes(2, False, True), "q5_k": _plain(3)}


@pytest.fixture(scope="module", params=["fp16", "fp32"])
def package(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    fp16 = request.param == "fp16"
    dt, io = (np.float16, types.fp16) if fp16 else (np.float32, types.fp32)

    @mb.program(input_specs=[mb.TensorSpec((3, COLS), dtype=io), mb.TensorSpec((5,), dtype=types.int32)],
                opset_version=ct.target.iOS18)
    def prog(x: Any, ids: Any) -> Any:
        q5_0, q5_1, q5_k = (_chain(CODES[name], f"w_{name}", dt) for name in ("q5_0", "q5_1", "q5_k"))
        return (mb.linear(x=x, weight=q5_0, name="y0"), mb.linear(x=x, weight=q5_1, name="y1"),
                mb.linear(x=x, weight=q5_k, name="yk"), mb.gather(x=q5_1, indices=ids, axis=0, name="rows"),
                mb.gather(x=q5_k, indices=ids, axis=0, name="rows_k"))

    return save_program(prog, tmp_path_factory.mktemp("split") / f"{request.param}.mlpackage", fp16=fp16), fp16


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"x": rng.standard_normal((3, COLS)).astype(np.float32), "ids": np.array([0, 95, 4, 4, 31], np.int32)}


def test_streamed_weight_equals_the_ops(package: Any) -> None:
    path, fp16 = package
    function = milexec.load_program(path).functions["main"]
    consts = {id(op.outputs[0]): op.outputs[0].val for op in function.operations if op.op_type == "const"}
    chains = {op.name: split_chain(op) for op in function.operations if op.op_type == "reshape"}
    for name in ("q5_0", "q5_1", "q5_k"):
        chain = chains[f"w_{name}"]
        assert chain is not None and len(chain) == (7 if CODES[name]["bias"] is not None else 6)
        weight = split_weight(chain, lambda var: consts[id(var)], round_fp16=fp16)
        assert weight is not None and weight.data.dtype == np.int8
        # the bias's sum rounds by the integer form only where the scales and biases allow it
        assert name == "q5_0" or weight.fast_sum == (fp16 and name == "q5_k")
        want = _weight(CODES[name], fp16)
        if name == "q5_k" and fp16:
            assert np.array_equal(want[5, :3], np.array([-1021, 3, 1027]) * 2.0**-24)  # subnormal sums
        np.testing.assert_array_equal(weight.dense().view(np.int32), want.view(np.int32))  # NaNs and -0 too
        out = np.empty((40, COLS), np.float32)
        np.testing.assert_array_equal(weight.rows_into(3, 43, out).view(np.int32), want[3:43].view(np.int32))
        rows = np.array([[3, 9], [95, 0]])
        np.testing.assert_array_equal(weight.take(rows).view(np.int32), want[rows].view(np.int32))


def test_a_chain_of_another_kind_is_not_streamed(package: Any) -> None:
    path, fp16 = package
    function = milexec.load_program(path).functions["main"]
    consts = {id(op.outputs[0]): op.outputs[0].val for op in function.operations if op.op_type == "const"}
    chain = next(c for op in function.operations if op.op_type == "reshape" and (c := split_chain(op)) is not None)
    table = chain[0].inputs["lut"]
    wide = dict(consts)
    wide[id(table)] = np.full_like(consts[id(table)], 200)  # sums beyond int8
    assert split_weight(chain, lambda var: wide[id(var)], round_fp16=fp16) is None
    fraction = dict(consts)
    fraction[id(table)] = consts[id(table)] + np.asarray(0.5, consts[id(table)].dtype)
    assert split_weight(chain, lambda var: fraction[id(var)], round_fp16=fp16) is None


@pytest.mark.parametrize("memory", ["fast", "lean"])
def test_prepared_runs_equal_the_plain_run(package: Any, memory: str) -> None:
    path, _ = package
    plain = milexec.run(path, _inputs())
    program = prepare(path, memory=memory)  # type: ignore[arg-type]
    for _ in range(2):
        got = program.run(_inputs())
        for name, want in plain.items():
            np.testing.assert_array_equal(got[name], want, err_msg=f"{memory} {name}")
    plan = program._plans["main"]
    function = program._resolved["main"].function
    tables = [op for op in function.operations if op.op_type == "constexpr_lut_to_dense"]
    assert len(tables) == 6 and all(id(op) in plan.precomputed for op in tables)  # no run decodes op by op
    held = [v for v in plan.consts.values() if isinstance(v, ShiftScaleWeight)]
    # "fast" decodes what its budget (1.5x the fp16 bytes: two of the three) holds as float32,
    # the rest once into its fp16 values (an fp16 program) or streamed (fp32); "lean" streams
    cached = program.prepared_bytes // (4 * ROWS * COLS)
    half = [v for v in plan.consts.values() if isinstance(v, np.ndarray) and v.dtype == np.float16
            and v.shape == (ROWS, COLS)]
    fp16 = program._resolved["main"].function.outputs[0].dtype.__name__ == "fp16"
    want = (3, 0, 0) if memory == "lean" else ((0, 2, 1) if fp16 else (1, 2, 0))
    assert (len(held), cached, len(half)) == want


#: One table of the code's own width (GGUF's Q6_K / Q2_K before iOS26): uint6 into -32..31
#: with hostile scales, no bias; uint2 into 0..3 with a bias (one NaN).
ONE_TABLE = {"q6_k": (6, -32, _codes(4, True, False)), "q2_k": (2, 0, _codes(5, False, True))}


def _one_table_weight(name: str, fp16: bool) -> np.ndarray:
    bits, low, c = ONE_TABLE[name]
    rng = np.random.default_rng(bits)
    indices = rng.integers(0, 1 << bits, (ROWS, COLS)).astype(np.uint8)
    values = (np.arange(1 << bits) + low).astype(np.float32)[indices].reshape(ROWS, COLS // BLOCK, BLOCK)
    with np.errstate(all="ignore"):
        values = values * c["scale"].astype(np.float32)[:, :, None]
        values = values.astype(np.float16).astype(np.float32) if fp16 else values
        if c["bias"] is not None:
            values = values + c["bias"].astype(np.float32)[:, :, None]
            values = values.astype(np.float16).astype(np.float32) if fp16 else values
    return values.reshape(ROWS, COLS)


@pytest.fixture(scope="module", params=["fp16", "fp32"])
def one_table(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    fp16 = request.param == "fp16"
    dt, io = (np.float16, types.fp16) if fp16 else (np.float32, types.fp32)

    def chain(name: str) -> Any:
        bits, low, c = ONE_TABLE[name]
        indices = np.random.default_rng(bits).integers(0, 1 << bits, (ROWS, COLS)).astype(np.uint8)
        values = mb.constexpr_lut_to_dense(indices=indices.astype(getattr(types, f"np_uint{bits}_dtype")),
                                           lut=(np.arange(1 << bits) + low).astype(dt).reshape(1, 1, -1, 1),
                                           name=f"w_{name}_codes")
        values = mb.reshape(x=values, shape=np.asarray([ROWS, COLS // BLOCK, BLOCK], np.int32))
        values = mb.mul(x=values, y=c["scale"].astype(dt).reshape(ROWS, -1, 1))
        if c["bias"] is not None:
            values = mb.add(x=values, y=c["bias"].astype(dt).reshape(ROWS, -1, 1))
        return mb.reshape(x=values, shape=np.asarray([ROWS, COLS], np.int32), name=f"w_{name}")

    @mb.program(input_specs=[mb.TensorSpec((3, COLS), dtype=io), mb.TensorSpec((5,), dtype=types.int32)],
                opset_version=ct.target.iOS18)
    def prog(x: Any, ids: Any) -> Any:
        q6, q2 = chain("q6_k"), chain("q2_k")
        return (mb.linear(x=x, weight=q6, name="y6"), mb.linear(x=x, weight=q2, name="y2"),
                mb.gather(x=q2, indices=ids, axis=0, name="rows"))

    return save_program(prog, tmp_path_factory.mktemp("one_table") / f"{request.param}.mlpackage", fp16=fp16), fp16


def test_one_table_weight_equals_the_ops(one_table: Any) -> None:
    path, fp16 = one_table
    function = milexec.load_program(path).functions["main"]
    consts = {id(op.outputs[0]): op.outputs[0].val for op in function.operations if op.op_type == "const"}
    chains = {op.name: split_chain(op) for op in function.operations if op.op_type == "reshape"}
    for name in ONE_TABLE:
        chain = chains[f"w_{name}"]
        assert chain is not None and chain[0].op_type == "constexpr_lut_to_dense"
        assert len(chain) == (5 if ONE_TABLE[name][2]["bias"] is not None else 4)
        weight = split_weight(chain, lambda var: consts[id(var)], round_fp16=fp16)
        assert weight is not None and weight.data.dtype == np.int8
        want = _one_table_weight(name, fp16)
        np.testing.assert_array_equal(weight.dense().view(np.int32), want.view(np.int32))  # NaNs and -0 too
        rows = np.array([[3, 9], [95, 0]])
        np.testing.assert_array_equal(weight.take(rows).view(np.int32), want[rows].view(np.int32))
    plain = milexec.run(path, _inputs())
    for memory in ("fast", "lean"):
        program = prepare(path, memory=memory)  # type: ignore[arg-type]
        got = program.run(_inputs())
        for name, value in plain.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{memory} {name}")
        tables = [op for op in program._resolved["main"].function.operations if op.op_type == "constexpr_lut_to_dense"]
        assert len(tables) == 2 and all(id(op) in program._plans["main"].precomputed for op in tables)
