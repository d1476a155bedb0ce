"""GGUF's 2-, 3- and 6-bit K-quants (Q2_K, Q3_K, Q6_K) before iOS26: the codes held as an index
of their own width (uint2, uint3, uint6) into a table of their integer values
(`constexpr_lut_to_dense`), then llama.cpp's block scale (and Q2_K's min) at run time. In fp32
the package's weights are the `gguf` package's dequantization bit for bit (hostile block fields
included); the executor (plain and prepared runs), `StoredWeights` and Core AI run the form;
preflight flags it for the Neural Engine; the package holds the codes' own bits, not 4- or
8-bit containers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from models.gguf.test_gguf_quant import _config, _converted, _cycling, _ids
from rlx_mil import milexec, reference
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.compress.code_store import CodeWriter
from rlx_mil.lowering.target import Target
from rlx_mil.milexec.prepared import prepare
from rlx_mil.milexec.stored_weights import StoredWeights
from rlx_mil.models import from_gguf
from rlx_mil.models.gguf.codes import encode
from rlx_mil.models.gguf.reader import GGUFFile

KINDS = ("Q2_K", "Q3_K", "Q6_K")
BITS = {"Q2_K": 2, "Q3_K": 3, "Q6_K": 6}
#: The table each type's indices point into (the integer codes, llama.cpp's q - 32 for Q6_K).
TABLES = {"Q2_K": range(0, 4), "Q3_K": range(-4, 4), "Q6_K": range(-32, 32)}
#: Block bytes; the byte offsets of the fp16 fields (d, and dmin).
BLOCKS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q6_K": (210, (208,))}
#: Package bytes per 256 weights (fp16 program: codes, an fp16 scale per 16, Q2_K an fp16 bias
#: per 16) against the file's: docs/gguf.md, "Size".
RATIOS = {"Q2_K": (64 + 32 + 32) / 84, "Q3_K": (96 + 32) / 110, "Q6_K": (192 + 32) / 210}


def _gguf_decode(raw: np.ndarray, kind: str, shape: tuple[int, int]) -> np.ndarray:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(raw, GGMLQuantizationType[kind]).reshape(shape)


def _blocks(kind: str, rows: int, blocks: int, seed: int, zero_scale: bool) -> np.ndarray:
    """Random block bytes: any codes and sub-scales, finite fp16 d / dmin of every magnitude."""
    nbytes, fields = BLOCKS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows * blocks, nbytes), dtype=np.uint8)
    for at in fields:
        raw[:, at:at + 2] = (rng.standard_normal(rows * blocks) * 10.0 ** rng.integers(-6, 4, rows * blocks)
                             ).astype("<f2")[:, None].view(np.uint8)
    if zero_scale:  # d = 0 (Q2_K: with a non-zero min, every weight of the block is -dmin * m)
        at = fields[0]
        raw[0, at:at + 2] = 0
    return raw.reshape(rows, -1)


@settings(max_examples=20, deadline=None)
@given(kind=st.sampled_from(KINDS), rows=st.integers(1, 3), blocks=st.integers(1, 2), seed=st.integers(0, 2**32 - 1),
       zero_scale=st.booleans())
def test_codes_decode_to_gguf_bit_for_bit(kind: str, rows: int, blocks: int, seed: int, zero_scale: bool) -> None:
    raw = _blocks(kind, rows, blocks, seed, zero_scale)
    shape = (rows, blocks * 256)
    codes = encode(raw, kind, shape, np.float32, CodeWriter, Target.IOS18)
    assert codes.split and codes.high is None and codes.bits == BITS[kind]  # type: ignore[union-attr]
    assert list(codes.lut) == list(TABLES[kind])  # type: ignore[union-attr]
    assert codes.indices.dtype == np.uint8 and int(codes.indices.max()) < 1 << BITS[kind]  # type: ignore[union-attr]
    assert (codes.bias is not None) == (kind == "Q2_K")  # type: ignore[union-attr]
    want = _gguf_decode(raw, kind, shape)
    np.testing.assert_array_equal(codes.dequantize(), want)
    assert codes.max_error == 0.0


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1))
def test_fp16_tables_round_once(kind: str, seed: int) -> None:
    """In an fp16 program the scale, the product and the sum round to fp16: within a few fp16
    ulps of the largest weight of llama.cpp's decode (fields of a real file's range)."""
    raw = _blocks(kind, 2, 2, seed, False)
    nbytes, fields = BLOCKS[kind]
    blocks = raw.reshape(-1, nbytes)
    rng = np.random.default_rng(seed)
    for at in fields:
        blocks[:, at:at + 2] = (rng.random(blocks.shape[0]) * 1e-3 + 1e-4).astype("<f2")[:, None].view(np.uint8)
    codes = encode(blocks.reshape(2, -1), kind, (2, 512), np.float16, CodeWriter, Target.IOS18)
    want = _gguf_decode(blocks.reshape(2, -1), kind, (2, 512))
    got = codes.dequantize()
    assert got.dtype == np.float32 and np.array_equal(got, got.astype(np.float16).astype(np.float32))
    assert 0 < codes.max_error <= 4e-3 * float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-3 * float(np.abs(want).max()))


@pytest.fixture(scope="module")
def ksplit_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Any, Any, dict[str, Any]]:
    """A 1-layer Llama whose matrices cycle through Q2_K, Q3_K and Q6_K, its graph and params,
    and its packages (fp32, fp16), converted once."""
    return _converted(tmp_path_factory.mktemp("ksplit"), _cycling(list(KINDS)))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_package_holds_split_codes_and_runs(ksplit_file: Any, precision: str) -> None:
    path, cfg, graph, params, held = ksplit_file
    model, saved = held[precision]
    function = milexec.load_program(saved).functions["main"]
    tables = [op for op in function.operations if op.op_type == "constexpr_lut_to_dense"]
    assert sorted({op.inputs["indices"].dtype.get_bitwidth() for op in tables}) == [2, 3, 6]
    assert not [op for op in function.operations if op.op_type == "constexpr_blockwise_shift_scale"]
    report = report_of(model)
    assert report is not None and len(report.weights) == len(params.prequantized_weights()) == len(tables)
    dequantized = dequantized_params(params, model)
    file = GGUFFile(path)
    kinds = set()
    for w in report.weights:
        tensor = file.tensors[params.names[w.name]]
        kinds.add(tensor.type_name)
        if precision == "fp32":  # llama.cpp's decode bit for bit (the reference's view of the file)
            np.testing.assert_array_equal(dequantized[w.name], params[w.name])
            assert w.max_error == 0.0
        else:  # the codes' own bits, an fp16 scale (and bias) per 16, the fp16 table
            table = 2 * (1 << BITS[tensor.type_name])
            assert w.bytes_after == round(RATIOS[tensor.type_name] * tensor.raw.nbytes) + table, w.name
    assert kinds == set(KINDS)
    ids = {"input_ids": _ids(cfg["vocab_size"])}
    want = reference.evaluate(graph, ids, dequantized)["logits"]
    exact = reference.evaluate(graph, ids, params)["logits"]
    got = milexec.run(saved, ids)["logits"]
    tol = 1e-4 if precision == "fp32" else 5e-2
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, atol=tol * scale, rtol=tol)
    np.testing.assert_allclose(got, exact, atol=tol * scale, rtol=tol)
    for memory in ("fast", "lean"):
        prepared = prepare(saved, memory=memory)  # type: ignore[arg-type]
        np.testing.assert_array_equal(prepared.run(ids)["logits"], got, err_msg=memory)
        runs = prepared._resolved["main"].function.operations
        decoded = sum(id(op) in prepared._plans["main"].precomputed for op in runs if op.op_type == "constexpr_lut_to_dense")
        # no run decodes a split weight op by op: "fast" decodes it once, "lean" streams it
        assert decoded == len(tables), (memory, decoded, len(tables))
    # the package's own codes, decoded by the fidelity checks: the reference's weights
    stored = StoredWeights(saved, report.weights)
    declared = StoredWeights(saved, report.weights, precision_model="declared")
    for w in report.weights:
        np.testing.assert_array_equal(declared[w.name], dequantized[w.name], err_msg=w.name)
        if precision == "fp32":
            np.testing.assert_array_equal(stored[w.name], params[w.name], err_msg=w.name)
    if precision == "fp16":
        package = (saved / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
        # was 1.37-2.29x the file's tensor bytes with int8 / 4-bit containers
        assert 1.0 <= package / sum(int(t.raw.nbytes) for t in file.tensors.values()) <= 1.3
        # The Neural Engine holds no per-block scale: preflight says so of each split weight.
        split = [f for f in rlx_mil.preflight(saved, device="ane") if f.rule == "ane-per-block-int"]
        assert sorted(f.why for f in split) == sorted(f"{BITS[file.tensors[params.names[w.name]].type_name]}-bit codes"
                                                      " as a table, then a per-block scale at run time"
                                                      for w in report.weights)
        assert not rlx_mil.preflight(saved, device="gpu")


def test_core_ai_runs_the_split_form(ksplit_file: Any) -> None:
    pytest.importorskip("coreai", reason="needs the coreai extra: pip install -e \".[coreai]\" (Python >= 3.11)")
    from rlx_mil.coreai.crosscheck import crosscheck

    _, cfg, _, _, held = ksplit_file
    for precision, tol in (("fp32", 1e-4), ("fp16", 2e-2)):
        report = crosscheck(held[precision][1], [(None, {"input_ids": _ids(cfg["vocab_size"])})])
        assert report.outputs and not report.failures(rtol=tol, atol=tol), (precision, report.failures())


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer chat GGUF (trained BPE tokenizer) whose matrices cycle through the three types."""
    from models.gguf.gguf_files import bpe_metadata, trained_bpe, write_gguf
    from rlx_mil.models.checkpoint import Checkpoint
    from rlx_mil.models.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("ksplit_chat")
    tok = trained_bpe("smollm")
    cfg = _config("llama", rope_parameters=None, vocab_size=tok.get_vocab_size(), tie_word_embeddings=False,
                  num_hidden_layers=2)
    weights = Checkpoint(write_random_checkpoint(root / "hf", cfg, seed=3))
    write_gguf(root / "chat.gguf", cfg, {k: weights[k] for k in weights}, types=_cycling(list(KINDS)),
               tokenizer=bpe_metadata(tok, "smollm"))
    return root / "chat.gguf"


def test_chunked_stateful_set_verifies(chat_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`convert-gguf --stateful --chunk-bytes --verify` on iOS18: each chunk's prefill and decode
    functions hold the split weights, and the executor's greedy steps over the set equal the
    reference's on the same codes."""
    from rlx_mil.cli import main
    from rlx_mil.llm.chunk_plan import planned_param_bytes, smallest_limit
    from rlx_mil.llm.chunked import read_chunked_set

    graph, _ = from_gguf(chat_gguf, "decode", seq_len=1, cache_len=1, max_positions=32, last_logits=True)
    limit = smallest_limit(graph, planned_param_bytes(graph, precision="fp16"))  # a layer per chunk
    out = tmp_path / "set"
    assert main(["convert-gguf", str(chat_gguf), "-o", str(out), "--stateful", "--max-context", "32", "--prefill", "4",
                 "--chunk-bytes", str(limit), "--verify", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "2 chunks" in printed and "verify: compared 8 greedy steps" in printed and printed.rstrip().endswith(": ok")
    widths: set[int] = set()
    for chunk in read_chunked_set(out).chunks:
        program = milexec.load_program(out / chunk.package)
        assert set(program.functions) == {"decode", "prefill_4"}
        for function in program.functions.values():
            ops = function.operations
            assert not [op for op in ops if op.op_type == "constexpr_blockwise_shift_scale"]
            widths |= {op.inputs["indices"].dtype.get_bitwidth() for op in ops if op.op_type == "constexpr_lut_to_dense"}
    assert widths == {2, 3, 6}


def test_kept_codes_in_the_neural_engine_form(ksplit_file: Any, tmp_path: Path) -> None:
    """`deploy="ane"` of kept codes (no re-quantization): the Neural Engine form holds them split
    as the GPU form does (its 1x1-conv rewrite takes constexpr weights only, so the projections
    stay matmuls of the run-time weight, as for the 5-bit split), the executor and
    `StoredWeights` read them, and preflight flags each one's run-time block scale."""
    _, cfg, graph, params, _ = ksplit_file
    model = rlx_mil.convert(graph, params, precision="fp32", deploy="ane")
    saved = Path(rlx_mil.save(model, tmp_path / "ane.mlpackage"))
    report = report_of(model)
    assert report is not None and len(report.weights) == len(params.prequantized_weights())
    function = milexec.load_program(saved).functions["main"]
    assert sorted({op.inputs["indices"].dtype.get_bitwidth() for op in function.operations
                   if op.op_type == "constexpr_lut_to_dense"}) == [2, 3, 6]
    stored = StoredWeights(saved, report.weights)
    for w in report.weights:
        np.testing.assert_array_equal(stored[w.name], params[w.name], err_msg=w.name)  # llama.cpp's decode
    ids = {"input_ids": _ids(cfg["vocab_size"])}
    want = reference.evaluate(graph, ids, params)["logits"]
    got = milexec.run(saved, ids)["logits"]
    np.testing.assert_allclose(got, want, atol=1e-4 * float(np.abs(want).max()), rtol=1e-4)
    split = [f for f in rlx_mil.preflight(saved, device="ane") if f.rule == "ane-per-block-int"]
    assert len(split) == len(report.weights) and all("as a table, then a per-block scale" in f.why for f in split)
