"""GGUF's 5-bit types (Q5_0, Q5_1, Q5_K) before iOS26: the codes held as a 4-bit and a 1-bit
identity table (`constexpr_lut_to_dense`) summed, then llama.cpp's block scale and bias at run
time. In fp32 the package's weights are the `gguf` package's dequantization bit for bit (on
hostile block fields too); the executor (plain and prepared runs) and Core AI run the form; the
package holds about 5.5-6 bits a weight, not 8.5-9."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from models.gguf.test_gguf_quant import _converted, _cycling, _ids
from rlx_mil import milexec, reference
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.compress.code_store import CodeWriter
from rlx_mil.lowering.target import Target
from rlx_mil.milexec.prepared import prepare
from rlx_mil.models.gguf.codes import FORMATS, encode, split_form
from rlx_mil.models.gguf.reader import GGUFFile

Q5 = ("Q5_0", "Q5_1", "Q5_K")
#: Block bytes and elements; the byte offsets of the fp16 fields (d, and m / dmin).
BLOCKS = {"Q5_0": (22, 32, (0,)), "Q5_1": (24, 32, (0, 2)), "Q5_K": (176, 256, (0, 2))}


def _gguf_decode(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> np.ndarray:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(raw, GGMLQuantizationType[kind]).reshape(shape)


def test_split_form_is_the_2_3_5_and_6_bit_types_before_ios26() -> None:
    assert {t for t in FORMATS if split_form(t, Target.IOS18)} == {*Q5, "Q2_K", "Q3_K", "Q6_K"}
    assert not any(split_form(t, Target.IOS26) for t in FORMATS)


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(Q5), rows=st.integers(1, 3), blocks=st.integers(1, 2), seed=st.integers(0, 2**32 - 1),
       zero_scale=st.booleans())
def test_codes_decode_to_gguf_bit_for_bit(kind: str, rows: int, blocks: int, seed: int, zero_scale: bool) -> None:
    """Random block bytes (any codes, any finite fp16 scales and mins, zero scales with a
    non-zero min): the fp32 form's weights are `gguf.quants.dequantize`'s exactly."""
    nbytes, elements, fields = BLOCKS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * blocks, nbytes), dtype=np.uint8)
    for at in fields:  # finite fp16 fields, of every magnitude
        raw[:, at:at + 2] = (rng.standard_normal(rows * blocks) * 10.0 ** rng.integers(-6, 4, rows * blocks)
                             ).astype("<f2")[:, None].view(np.uint8)
    if zero_scale:
        raw[0, 0:2] = 0
    raw = raw.reshape(rows, -1)
    shape = (rows, blocks * elements)
    codes = encode(raw, kind, shape, np.float32, CodeWriter, Target.IOS18)
    assert codes.high is not None and codes.bits == 4  # type: ignore[union-attr]
    want = _gguf_decode(raw, kind, shape)
    np.testing.assert_array_equal(codes.dequantize(), want)
    assert codes.max_error == 0.0


@pytest.fixture(scope="module")
def q5_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Any, Any, dict[str, Any]]:
    """A 1-layer Llama whose matrices cycle through Q5_0, Q5_1 and Q5_K, its graph and params,
    and its packages (fp32, fp16), converted once."""
    return _converted(tmp_path_factory.mktemp("q5"), _cycling(list(Q5)))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_package_holds_split_codes_and_runs(q5_file: Any, precision: str) -> None:
    path, cfg, graph, params, held = q5_file
    model, saved = held[precision]
    program = milexec.load_program(saved)
    tables = [op for op in program.functions["main"].operations if op.op_type == "constexpr_lut_to_dense"]
    assert sorted({op.inputs["indices"].dtype.get_bitwidth() for op in tables}) == [1, 4]
    report = report_of(model)
    assert report is not None and len(report.weights) == len(params.prequantized_weights())
    dequantized = dequantized_params(params, model)
    file = GGUFFile(path)
    kinds = set()
    for w in report.weights:
        tensor = file.tensors[params.names[w.name]]
        kinds.add(tensor.type_name)
        if precision == "fp32":  # llama.cpp's decode bit for bit (the reference's view of the file)
            np.testing.assert_array_equal(dequantized[w.name], params[w.name])
            assert w.max_error == 0.0
        else:  # 5 bits and llama.cpp's fp16 tables: the file's bytes (Q5_K: fp16 scales per 32 for 6-bit ones)
            assert w.bytes_after <= {"Q5_0": 1.0, "Q5_1": 1.0, "Q5_K": 1.091}[tensor.type_name] * tensor.raw.nbytes + 36
    assert kinds == set(Q5)
    ids = {"input_ids": _ids(cfg["vocab_size"])}
    want = reference.evaluate(graph, ids, dequantized)["logits"]
    exact = reference.evaluate(graph, ids, params)["logits"]
    got = milexec.run(saved, ids)["logits"]
    tol = 1e-4 if precision == "fp32" else 5e-2
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, atol=tol * scale, rtol=tol)
    np.testing.assert_allclose(got, exact, atol=tol * scale, rtol=tol)
    if precision == "fp32":
        for memory in ("fast", "lean"):
            prepared = prepare(saved, memory=memory)  # type: ignore[arg-type]
            np.testing.assert_array_equal(prepared.run(ids)["logits"], got)
            tables = [op for op in prepared._resolved["main"].function.operations if op.op_type == "constexpr_lut_to_dense"]
            decoded = sum(id(op) in prepared._plans["main"].precomputed for op in tables)
            # no run decodes a split weight op by op: "fast" decodes it once (within its cache
            # budget), the rest and "lean" stream it a block of rows at a time
            assert decoded == len(tables), (memory, decoded, len(tables))
    else:  # weight.bin: the former int8 codes made it 1.5-1.64x the file's tensor bytes
        package = (saved / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
        assert 1.0 <= package / sum(int(t.raw.nbytes) for t in file.tensors.values()) <= 1.06
        # The Neural Engine holds no per-block scale: preflight says so of each split weight.
        split = [f for f in rlx_mil.preflight(saved, device="ane") if f.rule == "ane-per-block-int"]
        assert len(split) == len(report.weights) and all("two tables summed" in f.why for f in split)
        assert not rlx_mil.preflight(saved, device="gpu")


def test_core_ai_runs_the_split_form(q5_file: Any) -> None:
    pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")
    from rlx_mil.coreai.crosscheck import crosscheck

    _, cfg, _, _, held = q5_file
    report = crosscheck(held["fp32"][1], [(None, {"input_ids": _ids(cfg["vocab_size"])})])
    assert report.outputs and not report.failures(rtol=1e-4, atol=1e-4), report.failures()
