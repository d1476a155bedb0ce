"""4-bit codes kept packed in prepared runs, the split form of the fp16 rounding, the row
blocks every form of a weight is multiplied in, and the "compact" memory mode: each against
the plain forms' numbers, and the memory they hold counted rather than timed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from milexec_util import unprepared_logits

from rlx_mil.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.milexec import prepared
from rlx_mil.milexec.fp16 import round_split_into, split_rounding_holds
from rlx_mil.milexec.kernels.linalg import _blocked_linear, rows_in_threads
from rlx_mil.milexec.loader import FourBitCodes, load_program
from rlx_mil.milexec.prepared import prepare
from rlx_mil.milexec.streamed import NibbleCodes, ShiftScaleWeight, product_rows
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


def _as_fp16(values: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return values.astype(np.float16).astype(np.float32)


def test_split_rounding_is_numpys_cast_in_the_fp16_normal_range() -> None:
    finite = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = np.sort(finite[np.isfinite(finite)].astype(np.float64))
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)  # the ties, exact in float32
    values = np.concatenate([finite.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                             np.nextafter(mids, np.float32(-np.inf))])
    size = np.abs(values)
    inside = values[(values == 0) | ((size >= 2.0**-14) & (size <= 65504))]
    got = round_split_into(inside.copy(), np.empty(inside.size, np.float32))
    assert np.array_equal(got.view(np.uint32), _as_fp16(inside).view(np.uint32))
    # Every scale times every int4 / uint4 / int8 code: what the decode relies on.
    assert split_rounding_holds(-8, 7) and split_rounding_holds(0, 15) and split_rounding_holds(-128, 127)


def _packed(codes: np.ndarray) -> np.ndarray:
    """A blob's bytes: two consecutive codes a byte, the first in the low nibble."""
    nibbles = codes.view(np.uint8).reshape(-1) & 0x0F
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


@pytest.mark.parametrize(("rows", "cols", "block", "signed"),
                         [(100, 64, 16, True), (37, 10, 4, False), (5, 6, 1, True), (33, 14, 3, True), (64, 2, 64, False)])
def test_nibble_codes_give_the_unpacked_codes_and_weights(rows: int, cols: int, block: int, signed: bool) -> None:
    rng = np.random.default_rng(rows)
    codes = rng.integers(-8, 8, (rows, cols)).astype(np.int8) if signed else rng.integers(0, 16, (rows, cols)).astype(np.uint8)
    nibbles = NibbleCodes(_packed(codes), (rows, cols), signed, block)
    assert nibbles.nbytes == codes.size // 2
    assert np.array_equal(nibbles.dense(), codes)
    picked = rng.integers(0, rows, 23)
    assert np.array_equal(nibbles.take(picked), codes[picked])
    scale = (rng.random((rows, max(1, cols // 2))) * 0.02 + 1e-3).astype(np.float16)
    plain, packed = ShiftScaleWeight(codes, scale, None, True), ShiftScaleWeight(nibbles, scale, None, True)
    assert packed.split_rounding and plain.split_rounding
    want = _as_fp16(np.repeat(scale.astype(np.float32), cols // scale.shape[1], axis=1) * codes.astype(np.float32))
    assert np.array_equal(packed.dense().view(np.uint32), want.view(np.uint32))
    assert np.array_equal(plain.dense().view(np.uint32), want.view(np.uint32))
    for start, stop in ((0, rows), (3, rows), (1, 2), (rows - 1, rows)):  # blocks cut anywhere
        out = packed.rows_into(start, stop, np.empty((stop - start, cols), np.float32))
        assert np.array_equal(out, want[start:stop])
    assert np.array_equal(packed.take(picked.reshape(1, -1)), want[picked][None])


def test_every_form_of_a_weight_multiplies_in_the_same_row_blocks() -> None:
    """Several rows times a weight held as float32, widened from fp16, decoded from int8
    codes or from packed codes, on one thread or two: the same numbers, bit for bit. One row
    times the float32 weight held whole gives the blocks' numbers too."""
    rng = np.random.default_rng(4)
    for rows, depth in ((1200, 1024), (700, 3072)):
        codes = rng.integers(-8, 8, (rows, depth)).astype(np.int8)
        scale = (rng.random((rows, depth // 32)) * 0.01 + 1e-3).astype(np.float16)
        int8 = ShiftScaleWeight(codes, scale, None, True)
        nibbles = ShiftScaleWeight(NibbleCodes(_packed(codes), (rows, depth), True, product_rows(depth)), scale, None, True)
        dense = int8.dense()
        for count in (1, 3, 64):
            x = rng.standard_normal((count, depth)).astype(np.float32)
            want = _blocked_linear(x, dense)
            for weight in (dense.astype(np.float16), int8, nibbles):
                for threads in (1, 2):
                    with rows_in_threads(threads):
                        assert np.array_equal(_blocked_linear(x, weight), want)
            if count == 1:
                assert np.array_equal(x @ dense.T, want)


@pytest.fixture(scope="module")
def int4_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("int4_packed")
    config = dict(TINY_CONFIGS["qwen3"], vocab_size=32768)  # a 512 KiB packed embedding
    checkpoint = write_random_checkpoint(folder / "qwen3", config, seed=6)
    path = folder / "qwen3_int4.mlpackage"
    convert_llm_checkpoint(checkpoint, path, max_context=32, prefill=[4], compress="int4")
    return path


def test_packed_loads_hold_no_unpacked_codes(int4_package: Path) -> None:
    program = load_program(int4_package, packed_4bit=True)
    stand_ins = [op.outputs[0].val for op in program.functions["decode"].operations
                 if op.op_type == "const" and isinstance(op.outputs[0].val, FourBitCodes)]
    assert len(stand_ins) >= 8
    for value in stand_ins:
        assert not any(value.strides) and value.packed.size == -(-value.size // 2)
    lean = prepare(int4_package, memory="lean")
    weights = {id(v): v for plan in lean._plans.values() for v in plan.consts.values() if isinstance(v, ShiftScaleWeight)}
    assert weights and all(isinstance(w.data, NibbleCodes) and w.data.nbytes == w.size // 2 for w in weights.values())
    # No stand-in is left where a run could read it.
    for name, plan in lean._plans.items():
        function = lean._resolved[name].function
        for op in function.operations:
            if op.op_type != "const" and id(op) not in plan.precomputed:
                for var in op.inputs.values():
                    for v in var if isinstance(var, (list, tuple)) else [var]:
                        assert not isinstance(plan.consts.get(id(v)), FourBitCodes), op.name


def test_unpacked_stand_ins_equal_coremltools_codes(int4_package: Path) -> None:
    plain = load_program(int4_package)
    packed = load_program(int4_package, packed_4bit=True)
    compared = 0
    for a, b in zip(plain.functions["decode"].operations, packed.functions["decode"].operations, strict=True):
        if isinstance(b.outputs[0].val, FourBitCodes):
            unpacked = b.outputs[0].val.unpacked()
            assert unpacked.dtype == a.outputs[0].val.dtype and np.array_equal(unpacked, a.outputs[0].val)
            compared += 1
    assert compared >= 8


def test_the_weight_files_pages_are_given_back_after_repacking(int4_package: Path) -> None:
    """The packed codes are copied once into their runtime layout; the mapped file's pages
    they were read from are dropped (the process holds the copy only)."""
    lean = prepare(int4_package, memory="lean")
    stand_ins = [op.outputs[0].val for op in lean._resolved["decode"].function.operations
                 if op.op_type == "const" and isinstance(op.outputs[0].val, FourBitCodes)]
    largest = max(stand_ins, key=lambda v: v.packed.size)
    pages = _present_pages(largest.packed)
    # Reading a neighbouring blob may map back up to 64 KiB of cached pages around it (the
    # kernel's fault-around): the rest stays out.
    assert len(pages) >= 64 and sum(pages) <= 2 * 16
    largest.packed.sum()  # reading maps them in again (from the page cache)
    assert all(_present_pages(largest.packed))


def _present_pages(view: np.ndarray) -> list[bool]:
    """Whether each whole page under `view` is resident (/proc/self/pagemap, bit 63)."""
    import mmap

    page = mmap.PAGESIZE
    start = view.__array_interface__["data"][0]
    first, last = -(-start // page), (start + view.nbytes) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read(8 * max(0, last - first))
    return [bool(int.from_bytes(raw[i:i + 8], "little") >> 63) for i in range(0, len(raw), 8)]


@pytest.mark.parametrize("ratio", [0.0, 0.3, 3.0])
def test_compact_sessions_give_the_plain_runs_numbers(int4_package: Path, ratio: float,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """"auto" picks "compact" for a compressed package when "fast" does not fit: its weights
    kept compressed, those the cache budget holds decoded once; the logits are the plain runs'."""
    monkeypatch.setattr(prepared, "COMPACT_CACHE_RATIO", ratio)
    monkeypatch.setattr(prepared, "_available_bytes", lambda: 1 << 16)
    session = Session(int4_package, engine="milexec")
    assert session.memory == "compact"
    weights = [prepared._weights(r.function) for r in session._prepared._resolved.values()]
    assert session._prepared.prepared_bytes <= ratio * prepared._fp16_bytes(weights)
    plans = session._prepared._plans.values()
    streamed = {id(v) for plan in plans for v in plan.consts.values() if isinstance(v, ShiftScaleWeight)}
    assert (session._prepared.prepared_bytes == 0) == (ratio == 0.0) and (not streamed) == (ratio == 3.0)
    if ratio == 0.3:
        assert streamed and session._prepared.prepared_bytes > 0
    prompt = [7, 30001, 12, 4095, 40]
    got = [session.feed(prompt), session.feed([9])]
    calls = [("prefill_4", prompt[:4], 0), ("decode", prompt[4:], 4), ("decode", [9], 5)]
    want = unprepared_logits(int4_package, calls)
    for g, w in zip(got, want[1:], strict=True):
        np.testing.assert_array_equal(g, w)


def test_auto_decodes_a_compressed_package_once_where_memory_allows(int4_package: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for it, "auto" is "fast" for a compressed package too: its weights decoded
    once per session up to fast's budget, the same logits as the plain runs."""
    monkeypatch.setattr(prepared, "_available_bytes", lambda: 1 << 40)
    session = Session(int4_package, engine="milexec")
    assert session.memory == "fast" and session._prepared.prepared_bytes > 0
    prompt = [7, 30001, 12, 4095, 40]
    got = [session.feed(prompt), session.feed([9])]
    want = unprepared_logits(int4_package, [("prefill_4", prompt[:4], 0), ("decode", prompt[4:], 4), ("decode", [9], 5)])
    for g, w in zip(got, want[1:], strict=True):
        np.testing.assert_array_equal(g, w)
