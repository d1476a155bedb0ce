"""Compressed weights in prepared runs: the fast fp16 rounding, row-block decoding of
`constexpr_blockwise_shift_scale` weights, the 4-bit blob reader, and int4 packages run
streamed (lean), cached (fast) and partly both, against the plain runs' numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from milexec_util import unprepared_logits

from rlx_mil.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.milexec import prepared
from rlx_mil.milexec.fp16 import round_exact_into, round_into
from rlx_mil.milexec.prepared import prepare
from rlx_mil.milexec.streamed import ShiftScaleWeight
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


def _every_fp16_neighbourhood() -> np.ndarray:
    """Every finite fp16 value, the midpoints between neighbours (the ties) and the float32
    values one ulp either side of each midpoint, as float32."""
    finite = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.sort(finite[np.isfinite(finite)].astype(np.float64))
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)  # exact in float32
    return np.concatenate([finite.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf)), np.array([-0.0, np.inf, -np.inf, np.nan], np.float32)])


def _as_fp16(values: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return values.astype(np.float16).astype(np.float32)


def test_fp16_rounding_is_numpys_cast_bit_for_bit() -> None:
    values = _every_fp16_neighbourhood()
    want = _as_fp16(values)
    got = round_exact_into(values.copy())
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)], want.view(np.uint32)[~np.isnan(want)])
    assert np.array_equal(np.isnan(got), np.isnan(want))
    # The integer form alone, over its range: zeros and [2^-14, 65504] of either sign.
    inside = values[(values == 0) | ((np.abs(values) >= 2.0**-14) & (np.abs(values) <= 65504))]
    assert np.array_equal(round_into(inside.copy()).view(np.uint32), _as_fp16(inside).view(np.uint32))


def _reference(data: np.ndarray, scale: np.ndarray, offset: np.ndarray | None) -> np.ndarray:
    """fp16(scale * (data - offset)) with each block parameter repeated over its block."""
    def spread(p: np.ndarray) -> np.ndarray:
        for axis in range(data.ndim):
            p = np.repeat(p, data.shape[axis] // p.shape[axis], axis=axis)
        return p.astype(np.float32)

    values = data.astype(np.float32)
    if offset is not None:
        values = values - spread(offset)
    return _as_fp16(spread(scale) * values)


@pytest.mark.parametrize("case", ["int4", "int8_offset", "tiny_scales", "row_blocks"])
def test_shift_scale_rows_equal_the_decoded_weight(case: str) -> None:
    rng = np.random.default_rng(3)
    rows, cols = (96, 64) if case != "row_blocks" else (96, 8)
    low, high = (-8, 8) if case == "int4" else (-128, 128)
    data = rng.integers(low, high, (rows, cols)).astype(np.int8)
    scale_shape = (rows, cols // 16) if case != "row_blocks" else (rows // 8, cols // 4)
    scale = (rng.random(scale_shape) * 0.02 + 1e-3).astype(np.float16)
    if case == "tiny_scales":  # products in fp16's subnormal range and near overflow
        scale[0] = np.float16(2.0**-20)
        scale[1] = np.float16(600.0)
    offset = rng.integers(-3, 3, scale_shape).astype(np.int8) if case in ("int8_offset", "row_blocks") else None
    weight = ShiftScaleWeight(data, scale, offset, round_fp16=True)
    assert weight.fast_rounding == (case != "tiny_scales")
    want = _reference(data, scale, offset)
    assert np.array_equal(weight.dense().view(np.uint32), want.view(np.uint32))
    step = weight.row_block * 2
    for start in range(0, rows, step):
        out = np.empty((min(rows, start + step) - start, cols), np.float32)
        weight.rows_into(start, start + out.shape[0], out)
        assert np.array_equal(out, want[start:start + out.shape[0]])
    picked = np.array([[5, 0], [95, 5]])
    assert np.array_equal(weight.take(picked), want[picked])
    # Unrounded (the float32 precision model): the float32 products themselves.
    plain = ShiftScaleWeight(data, scale, offset, round_fp16=False).dense()
    assert np.array_equal(_as_fp16(plain), want) and not np.array_equal(plain, want)


@pytest.fixture(scope="module")
def int4_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("int4")
    config = dict(TINY_CONFIGS["qwen3"], vocab_size=4096)
    checkpoint = write_random_checkpoint(folder / "qwen3", config, seed=5)
    path = folder / "qwen3_int4.mlpackage"
    convert_llm_checkpoint(checkpoint, path, max_context=32, prefill=[4], compress="int4")
    return path


def test_int4_blobs_load_as_coremltools_reads_them(int4_package: Path) -> None:
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load
    from coremltools.converters.mil.mil import types

    from rlx_mil.milexec import load_program

    ours = load_program(int4_package)
    model = ct.models.MLModel(str(int4_package), skip_model_load=True)
    spec = model.get_spec()
    theirs = milproto_load(spec, specification_version=spec.specificationVersion, file_weights_dir=model.weights_dir)
    compared = 0
    for a, b in zip(ours.functions["decode"].operations, theirs.functions["decode"].operations, strict=True):
        if a.op_type == "const" and isinstance(b.outputs[0].val, np.ndarray) and b.outputs[0].dtype == types.int4:
            mine, want = a.outputs[0].val, b.outputs[0].val
            assert a.outputs[0].dtype == b.outputs[0].dtype and mine.dtype == want.dtype
            assert np.array_equal(mine, want)
            compared += 1
    assert compared >= 8


@pytest.mark.parametrize("budget", [0.0, 0.8, 2.0])
def test_int4_sessions_give_the_plain_runs_numbers(int4_package: Path, budget: float,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed (lean), partly cached (fast: the rest decoded once into fp16) and wholly cached
    (fast) weights: the same logits."""
    monkeypatch.setattr(prepared, "FAST_CACHE_RATIO", budget)
    session = Session(int4_package, engine="milexec", memory="lean" if budget == 0 else "fast")
    plans = session._prepared._plans.values()
    streamed = sum(isinstance(v, ShiftScaleWeight) for plan in plans for v in plan.consts.values())
    assert (streamed == 0) == (budget > 0) and (session._prepared.prepared_bytes == 0) == (budget == 0)
    prompt = [7, 3001, 12, 4095, 40]  # prefill_4, then decode
    got = [session.feed(prompt), session.feed([9]), session.feed([10])]
    calls = [("prefill_4", prompt[:4], 0), ("decode", prompt[4:], 4), ("decode", [9], 5), ("decode", [10], 6)]
    want = unprepared_logits(int4_package, calls)
    for g, w in zip(got, want[1:], strict=True):
        np.testing.assert_array_equal(g, w)


def test_lean_runs_decode_each_weight_once_and_only_the_embedded_rows(
    int4_package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lean = prepare(int4_package, memory="lean")
    weights = {id(v): v for v in lean._plans["decode"].consts.values() if isinstance(v, ShiftScaleWeight)}
    decoded: list[int] = []
    original = ShiftScaleWeight._decode

    def counting(self: ShiftScaleWeight, data: np.ndarray, *args: object) -> np.ndarray:
        decoded.append(data.size)
        return original(self, data, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ShiftScaleWeight, "_decode", counting)
    feeds = {"input_ids": np.array([[17]], np.int32), "position_ids": np.array([[0]], np.int32),
             "cache_position": np.array([0], np.int32)}
    lean.run(feeds, function_name="decode", states={})
    hidden = TINY_CONFIGS["qwen3"]["hidden_size"]
    # Every streamed weight once through its linear; the tied embedding once more for the
    # gather, one row of it.
    assert sum(decoded) == sum(w.size for w in weights.values()) + hidden
    # Under a budget that holds every weight, a run decodes nothing.
    monkeypatch.setattr(prepared, "FAST_CACHE_RATIO", 2.0)
    fast = prepare(int4_package, memory="fast")
    decoded.clear()
    fast.run(feeds, function_name="decode", states={})
    assert decoded == []


def test_rows_split_between_threads_give_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large linear's rows shared out between threads: bit for bit the one-thread result, for
    an fp16 weight widened in blocks and a streamed int4 weight; a prepared run with threads
    (its fp16 weight streamed, then cached as float32) gives the plain run's numbers."""
    from coremltools.converters.mil import Builder as mb
    from milexec_util import build_function

    from rlx_mil import milexec
    from rlx_mil.milexec.kernels.linalg import _blocked_linear, rows_in_threads

    rng = np.random.default_rng(9)
    rows, depth = 1200, 1024  # past BLOCKED_WEIGHT_MIN
    x = rng.standard_normal((3, depth)).astype(np.float32)
    fp16 = (rng.standard_normal((rows, depth)) * 0.03).astype(np.float16)
    int4 = ShiftScaleWeight(rng.integers(-8, 8, (rows, depth)).astype(np.int8),
                            (rng.random((rows, depth // 32)) * 0.01 + 1e-3).astype(np.float16), None, True)
    for weight in (fp16, int4):
        one = _blocked_linear(x, weight)
        for threads in (2, 3):
            with rows_in_threads(threads):
                assert np.array_equal(_blocked_linear(x, weight), one)

    def build(inputs: dict[str, object]) -> list[object]:
        half = mb.cast(x=inputs["x"], dtype="fp16")
        return [mb.linear(x=half, weight=fp16)]

    function = build_function({"x": x}, build)
    plain = milexec.run(function, {"x": x})
    for ratio in (0.0, 2.0):  # the weight widened in blocks, then held as float32
        monkeypatch.setattr(prepared, "FAST_CACHE_RATIO", ratio)
        for threads in (1, 2):
            program = prepare(function, memory="fast", threads=threads)
            assert program.prepared_bytes == (4 * fp16.size if ratio else 0)
            got = program.run({"x": x})
            # Held as float32 it is multiplied in the widened form's row blocks
            # (`streamed.product_rows`): the same BLAS sums, bit for bit.
            assert all(np.array_equal(got[k], plain[k]) for k in plain)
