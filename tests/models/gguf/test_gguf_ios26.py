"""GGUF codes on iOS26: the 2-, 3-, 5- and 6-bit types (and IQ4) as `constexpr_lut_to_dense`
with uintN indices into their integer values, then the per-block `constexpr_blockwise_shift_scale`
— an order coremltools keeps in the saved program from iOS26 on. The values are the iOS18
form's (the reference's decode is the same), the executor's outputs equal the reference on them
(plain, cached and streamed runs alike), and the package's weight bytes stay within 1.1x of the
file's tensor bytes for Q8_0 / Q4_0 / Q4_1 / Q6_K and Q4_K_M-style files."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
from models.gguf.test_gguf_quant import SEQ, TYPES, _config, _cycling, _ids, _write
from rlx_mil import milexec, reference
from rlx_mil.compress import dequantized_params, report_of
from rlx_mil.lowering.target import Target
from rlx_mil.milexec.prepared import prepare
from rlx_mil.models import from_gguf
from rlx_mil.models.gguf.codes import FORMATS, lut_form, split_form
from rlx_mil.models.gguf.reader import GGUFFile

#: The index width of each type's iOS26 LUT form.
INDEX_BITS = {"Q2_K": 2, "Q3_K": 3, "Q5_0": 6, "Q5_1": 6, "Q5_K": 6, "Q6_K": 6, "IQ4_NL": 4, "IQ4_XS": 4}
#: The weight.bin / GGUF tensor bytes bound on iOS26 per file kind (docs/gguf.md, Size): 1.1 for
#: the Done-when kinds; Q4_K holds 8 fp16 scales and 8 fp16 offsets per 256 weights on every
#: target (1.111 before any blob header).
BOUNDS = {"Q8_0": 1.1, "Q4_0": 1.1, "Q4_1": 1.1, "Q6_K": 1.1, "Q4_K_M": 1.1, "Q4_K": 1.12}
Q6_TENSORS = ("output.weight", "attn_v.weight", "ffn_down.weight")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A 2-layer Llama whose 16 matrices cycle through every quantized type."""
    cfg = _config("llama", rope_parameters=None)
    path, _ = _write(tmp_path_factory.mktemp("mixed26"), cfg, _cycling(TYPES))
    return path, cfg


def test_lut_form_is_ios26s_for_the_sub_byte_types() -> None:
    assert {t for t in FORMATS if lut_form(t, Target.IOS26)} == set(INDEX_BITS)
    assert {t for t in FORMATS if lut_form(t, Target.IOS18)} == {"IQ4_NL", "IQ4_XS"}


def _chains(program: Any) -> dict[str, Any]:
    """Shift-scale op name -> the op producing its data."""
    return {op.name: op.inputs["data"].op for op in program.functions["main"].operations
            if op.op_type == "constexpr_blockwise_shift_scale"}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_every_type_on_ios26(mixed: Any, precision: str, tmp_path: Path) -> None:
    path, cfg = mixed
    graph, params = from_gguf(path, seq_len=SEQ)
    model = rlx_mil.convert(graph, params, precision=precision, target="iOS26")
    ios18 = rlx_mil.convert(graph, params, precision=precision, target="iOS18")
    saved = rlx_mil.save(model, tmp_path / "m.mlpackage")
    chains = _chains(milexec.load_program(saved))  # the order as saved, after Core ML's passes
    file = GGUFFile(path)
    report, report18 = report_of(model), report_of(ios18)
    assert report is not None and report18 is not None
    errors18 = {w.name: w.max_error for w in report18.weights}
    want_params, params18 = dequantized_params(params, model), dequantized_params(params, ios18)
    seen = set()
    for w in report.weights:
        kind = file.tensors[params.names[w.name]].type_name  # type: ignore[attr-defined]
        seen.add(kind)
        producer = chains[w.name.replace(".", "_")]
        if kind in INDEX_BITS:
            assert producer.op_type == "constexpr_lut_to_dense", (w.name, kind)
            assert producer.inputs["indices"].dtype.get_bitwidth() == INDEX_BITS[kind]
            lut = producer.inputs["lut"].val.reshape(-1)
            assert lut.size == 1 << INDEX_BITS[kind]
            if not kind.startswith("IQ4"):
                np.testing.assert_array_equal(lut, FORMATS[kind].lut_low + np.arange(lut.size))
        else:
            assert producer.op_type == "const", (w.name, kind)
        if split_form(kind, Target.IOS18):  # iOS18 holds the 5-bit codes split (test_gguf_q5.py)
            continue
        # The same values as the iOS18 form, measured against llama.cpp's decode alike.
        assert w.max_error == errors18[w.name]
        np.testing.assert_array_equal(want_params[w.name], params18[w.name])
    assert seen == set(TYPES)
    ids = {"input_ids": _ids(cfg["vocab_size"])}
    want = reference.evaluate(graph, ids, want_params)["logits"]
    got = milexec.run(saved, ids)["logits"]
    tol = 1e-4 if precision == "fp32" else 5e-2
    np.testing.assert_allclose(got, want, atol=tol * float(np.abs(want).max()), rtol=tol)
    for memory in ("fast", "lean"):
        np.testing.assert_array_equal(prepare(saved, memory=memory).run(ids)["logits"], got)  # type: ignore[arg-type]


def _size_ratio(kind: str, root: Path) -> float:
    cfg = _config("llama", rope_parameters=None, num_hidden_layers=1, intermediate_size=768, vocab_size=256)
    pick = (lambda name, shape: "Q6_K" if name.endswith(Q6_TENSORS) else "Q4_K") if kind == "Q4_K_M" else (
        lambda name, shape: kind)
    path, _ = _write(root, cfg, pick)
    graph, params = from_gguf(path, seq_len=4)
    model = rlx_mil.convert(graph, params, target="iOS26")
    out = rlx_mil.save(model, root / "p.mlpackage")
    package = (Path(out) / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").stat().st_size
    return package / sum(int(t.raw.nbytes) for t in GGUFFile(path).tensors.values())


@pytest.mark.parametrize("kind", sorted(BOUNDS))
def test_package_bytes_against_the_files_tensor_bytes(kind: str, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ratio = _size_ratio(kind, tmp_path)
    assert 1.0 <= ratio <= BOUNDS[kind], f"{kind}: weight.bin is {ratio:.4f}x the file's tensor bytes"


def test_lut_form_is_smaller_than_ios18s(mixed: Any) -> None:
    """Per tensor, the compression report's bytes: the LUT-then-scale form holds the codes in
    their own width (Q6_K: 7 bits a weight) in constexprs only; iOS18 holds the 2-, 3- and 6-bit
    codes split in the same width but with a float table (larger by the table), the 5-bit ones
    in 5 bits (smaller)."""
    path, _ = mixed
    graph, params = from_gguf(path, seq_len=SEQ)
    sizes = {}
    for target in ("iOS18", "iOS26"):
        report = report_of(rlx_mil.convert(graph, params, target=target))
        assert report is not None
        sizes[target] = {w.name: w.bytes_after for w in report.weights}
    file = GGUFFile(path)
    for name, after in sizes["iOS26"].items():
        tensor = file.tensors[params.names[name]]  # type: ignore[attr-defined]
        kind, count = tensor.type_name, int(np.prod(tensor.shape))
        if kind in INDEX_BITS and not kind.startswith("IQ4"):
            fmt = FORMATS[kind]
            tables = (count // fmt.block) * 2 * (2 if fmt.biased else 1)
            assert after == count * INDEX_BITS[kind] // 8 + tables + (1 << INDEX_BITS[kind]), (name, kind)
            assert split_form(kind, Target.IOS18)
            if fmt.split_bits == 5:  # iOS18 holds 5 bits split, iOS26 6 bits in constexprs only
                assert after > sizes["iOS18"][name], (name, kind)
            else:  # the same bits; iOS18's table of the program's float, iOS26's int8
                assert after == sizes["iOS18"][name] - (1 << INDEX_BITS[kind]), (name, kind)
        else:
            assert after == sizes["iOS18"][name], (name, kind)


def test_stateful_package_on_ios26_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`convert-gguf --stateful --target iOS26 --verify`: prefill and decode share the chained
    weights, and the executor's greedy steps equal the reference's on the same codes."""
    from models.gguf.gguf_files import bpe_metadata, trained_bpe, write_gguf
    from rlx_mil.cli import main
    from rlx_mil.models.checkpoint import Checkpoint
    from rlx_mil.models.random_checkpoint import write_random_checkpoint

    tok = trained_bpe("smollm")
    cfg = _config("llama", rope_parameters=None, vocab_size=tok.get_vocab_size(), tie_word_embeddings=False,
                  num_hidden_layers=1)
    weights = Checkpoint(write_random_checkpoint(tmp_path / "hf", cfg, seed=3))
    path = tmp_path / "chat.gguf"
    write_gguf(path, cfg, {k: weights[k] for k in weights}, types=_cycling(["Q6_K", "Q3_K", "Q5_K", "Q2_K", "IQ4_XS"]),
               tokenizer=bpe_metadata(tok, "smollm"))
    out = tmp_path / "chat.mlpackage"
    assert main(["convert-gguf", str(path), "-o", str(out), "--stateful", "--max-context", "64", "--prefill", "8",
                 "--target", "iOS26", "--verify", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "verify: compared 8 greedy steps" in printed and printed.rstrip().endswith(": ok")
    program = milexec.load_program(out)
    assert set(program.functions) == {"decode", "prefill_8"}
    for function in program.functions.values():
        chained = [op for op in function.operations if op.op_type == "constexpr_blockwise_shift_scale"
                   and op.inputs["data"].op.op_type == "constexpr_lut_to_dense"]
        assert len(chained) == 9  # embedding, LM head, the layer's 7 matrices: every type here has the LUT form
