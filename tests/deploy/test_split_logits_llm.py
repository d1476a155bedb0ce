"""A stateful LLM package in the Neural Engine form returns its LM head in pieces; `Session`,
`rlx-mil eval`'s scoring, `rlx-mil run` and the executor read them as one logits output, with
the unsplit package's numbers and tokens."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil import milexec
from rlx_mil.coreml import metadata
from rlx_mil.coreml.deploy.wide_split import dimension_limit
from rlx_mil.coreml.package_info import package_info
from rlx_mil.llm.evaluate import evaluate_text, session_logits
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint, reference_logits
from rlx_mil.llm.runner import run_package
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

LIMIT = 32  # the tiny vocabulary (96) is cut as a 16,384-limit cuts Llama 3's: into 3 pieces
PROMPT = [5, 17, 33, 64, 80, 2]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("split_llm")
    config = dict(TINY_CONFIGS["llama"], tie_word_embeddings=True, num_hidden_layers=1)
    checkpoint = write_random_checkpoint(root / "llama", config, seed=4)
    out = {"checkpoint": checkpoint}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # fp32: decode and a prefill bucket; fp16: decode only (each conversion costs ~2 s)
        for precision, prefill in (("fp32", [4]), ("fp16", [])):
            out[f"plain_{precision}"] = root / f"plain_{precision}.mlpackage"
            convert_llm_checkpoint(checkpoint, out[f"plain_{precision}"], max_context=32, prefill=prefill,
                                   precision=precision)
            out[f"ane_{precision}"] = root / f"ane_{precision}.mlpackage"
            with dimension_limit(LIMIT):
                convert_llm_checkpoint(checkpoint, out[f"ane_{precision}"], max_context=32, prefill=prefill,
                                       precision=precision, deploy="ane")
    return out


def test_package_records_the_pieces_per_function(packages: dict[str, Path]) -> None:
    info = package_info(packages["ane_fp32"])
    table = metadata.SplitOutputs.read(info.metadata)
    assert sorted(table.functions) == ["decode", "prefill_4"]
    for function in ("decode", "prefill_4"):
        entry = table.of(function)["logits"]
        assert entry.pieces == ("logits_0", "logits_1", "logits_2") and entry.sizes == (32, 32, 32)
    assert metadata.SplitOutputs.read(package_info(packages["plain_fp32"]).metadata).functions == {}
    # the tied embedding's lookup reads the head's pieces: no table wider than they are is left
    program = rlx_mil.milexec.load_program(packages["ane_fp32"])
    tables = [op.inputs["x"] for op in program.functions["decode"].operations if op.op_type == "gather"]
    assert tables and max(int(t.shape[0]) for t in tables) <= LIMIT
    assert info.weight_bytes < package_info(packages["plain_fp32"]).weight_bytes * 1.05
    text = info.to_text()
    assert "split output: decode: logits = concat(logits_0, logits_1, logits_2; axis 2), widths [32, 32, 32]" in text


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_session_reads_the_pieces_as_one_logits_output(packages: dict[str, Path], precision: str) -> None:
    model = "float32" if precision == "fp32" else "declared"
    plain = Session(packages[f"plain_{precision}"], engine="milexec", precision_model=model)
    ane = Session(packages[f"ane_{precision}"], engine="milexec", precision_model=model)
    assert ane.vocab == plain.vocab == 96
    got, want = ane.feed(PROMPT), plain.feed(PROMPT)
    tol = 1e-5 if precision == "fp32" else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if precision == "fp32":  # the independent NumPy reference of the checkpoint's graph
        np.testing.assert_allclose(got, reference_logits(packages["checkpoint"], PROMPT), rtol=1e-4, atol=1e-4)
    plain.reset()
    ane.reset()
    assert ane.generate(PROMPT, 8) == plain.generate(PROMPT, 8)


def test_eval_scores_the_split_package_as_the_plain_one(packages: dict[str, Path]) -> None:
    ids = [1 + (11 * i) % 95 for i in range(20)]
    results = [
        evaluate_text(session_logits(Session(packages[name], engine="milexec", precision_model="float32")), ids, 10)
        for name in ("plain_fp32", "ane_fp32")
    ]
    assert results[0].scored == results[1].scored == 18
    assert results[1].perplexity == pytest.approx(results[0].perplexity, rel=1e-6)


def test_run_and_the_executor_join_the_pieces(packages: dict[str, Path]) -> None:
    feeds: dict[str, Any] = {"input_ids": np.array([[7]], np.int32), "position_ids": np.array([[0]], np.int32),
                             "cache_position": np.array([0], np.int32)}
    got, _ = run_package(packages["ane_fp32"], feeds, engine="milexec", function_name="decode")
    want, _ = run_package(packages["plain_fp32"], feeds, engine="milexec", function_name="decode")
    assert "logits" in got and not any(k.startswith("logits_") for k in got)
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    raw = milexec.run(rlx_mil.milexec.load_program(packages["ane_fp32"]), feeds, function_name="decode")
    assert sorted(k for k in raw if k.startswith("logits")) == ["logits_0", "logits_1", "logits_2"]


def test_ane_form_rounds_the_cache_capacity_up_to_32(packages: dict[str, Path], tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = convert_llm_checkpoint(packages["checkpoint"], None, max_context=20, precision="fp32", deploy="ane")
    contract = metadata.LLMContract.read(model.user_defined_metadata)
    assert contract is not None and contract.max_context == 32
    assert all(shape[-2] == 32 for shape in contract.states.values())
    capacity_axes = {f"dim {len(shape) - 2} " for shape in contract.states.values()}
    assert not [f for f in rlx_mil.preflight(model, device="ane")
                if f.rule == "state-dim-32" and any(axis in f.why for axis in capacity_axes)]
    session = Session(model, engine="milexec", precision_model="float32")
    assert session.max_context == 32
    session.feed(list(range(1, 31)))  # more than the 20 asked for: the cache holds 32
    assert session.position == 30
