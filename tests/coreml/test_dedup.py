"""`consts_compared_in_chunks`: Core ML's const deduplication compares candidates a chunk at a
time with the answer `np.allclose` gives on the whole arrays."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_mil.coreml import dedup


@pytest.mark.parametrize("case", range(8))
def test_chunked_allclose_is_allclose(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedup, "CHUNK", 7)
    rng = np.random.default_rng(case)
    a = rng.normal(size=(5, 9)).astype(np.float16)
    b = a.copy()
    if case % 4 == 1:
        b[4, 8] = np.nextafter(b[4, 8], np.float16(np.inf))  # within 6e-8? only for tiny values
    elif case % 4 == 2:
        b[2, 3] += np.float16(0.5)
    elif case % 4 == 3:
        a[0, 0] = b[0, 0] = np.nan
    for atol in (6e-8, 1e-3):
        ints = [np.nan_to_num(v * 10).astype(np.int8) for v in (a, b)]
        for x, y in ((a, b), (ints[0], ints[1]), (a, b[:1])):
            want = bool(np.allclose(x, y, rtol=0.0, atol=atol))
            assert dedup.chunked_allclose(x, y, rtol=0.0, atol=atol) is want
    assert dedup.chunked_allclose(a, a) is (case % 4 != 3)  # NaN != NaN, as allclose has it


def test_the_pass_deduplicates_with_it() -> None:
    import importlib

    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Program, types
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    const_deduplication = importlib.import_module("coremltools.converters.mil.mil.passes.defs.cleanup.const_deduplication")
    codes = np.random.default_rng(0).integers(-8, 8, (64, 64)).astype(np.float32)
    calls: list[int] = []

    def counting(*args: object, **kwargs: object) -> bool:
        calls.append(1)
        return dedup.chunked_allclose(*args, **kwargs)  # type: ignore[arg-type]

    @mb.program(input_specs=[mb.TensorSpec(shape=(64, 64), dtype=types.fp32)])
    def prog(x: object) -> object:
        return mb.add(x=mb.add(x=x, y=codes.copy()), y=codes.copy())

    assert isinstance(prog, Program)
    with dedup.consts_compared_in_chunks():
        assert isinstance(const_deduplication.np, dedup._NumpyWithChunkedAllclose)
        const_deduplication.np.allclose = counting  # type: ignore[attr-defined]
        PASS_REGISTRY["common::const_deduplication"](prog)
    assert const_deduplication.np is np
    consts = [op for op in prog.functions["main"].operations if op.op_type == "const" and op.outputs[0].shape == (64, 64)]
    assert len(consts) == 1 and calls
