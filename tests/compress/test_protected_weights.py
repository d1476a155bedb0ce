"""Norm scales and RoPE tables stay float by default, and are compressed when a rule asks for
them (a per-tensor selector, or a rule matching every weight): the rules that would fold them
into their ops take them as the compressed constexpr ops instead, verified through the executor
against the reference on the dequantized weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlx_mil.models.pretrained import from_pretrained
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from tests.compress.helpers import convert_and_verify, op_types

SEQ = 6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("protected")
    return {family: write_random_checkpoint(root / family, TINY_CONFIGS[family], seed=4) for family in ("qwen3", "bert")}


def _ids(family: str) -> dict[str, np.ndarray]:
    return {"input_ids": np.random.default_rng(1).integers(0, TINY_CONFIGS[family]["vocab_size"], (1, SEQ)).astype(np.int32)}


def _norms_and_tables(params: object) -> set[str]:
    return {n for n in params if "norm" in n.lower() or n.startswith("rope.")}  # type: ignore[attr-defined]


def test_defaults_keep_norms_and_rope_tables_float(checkpoints: dict[str, Path]) -> None:
    graph, params = from_pretrained(checkpoints["qwen3"], seq_len=SEQ)
    _, report = convert_and_verify(graph, params, _ids("qwen3"), "int8;min_size=0", roundtrip=False)
    assert not _norms_and_tables(params) & {w.name for w in report.weights}
    assert report.kept["model.norm.weight"] == "norm" and report.kept["rope.cos"] == "RoPE table"


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize(
    ("compress", "scheme"),
    [(r"int4;re:norm\.weight$=int8;re:^rope\.=int8-asym-channel", None),  # per-tensor selectors
     ("glob:*=int8", "int8-sym-channel")],  # everything
)
def test_norms_and_rope_tables_compress_when_asked(
    checkpoints: dict[str, Path], compress: str, scheme: str | None, precision: str
) -> None:
    graph, params = from_pretrained(checkpoints["qwen3"], seq_len=SEQ)
    model, report = convert_and_verify(graph, params, _ids("qwen3"), compress, precision=precision, roundtrip=False)
    by_name = {w.name: w for w in report.weights}
    asked = _norms_and_tables(params)
    assert asked <= set(by_name), sorted(asked - set(by_name))
    assert {by_name[n].role for n in asked} == {"norm", "rope"}
    if scheme is None:
        assert by_name["rope.cos"].scheme == "int8-asym-channel" and by_name["model.norm.weight"].scheme == "int8-sym-channel"
    else:
        assert {w.scheme for w in report.weights} == {scheme} and not report.kept
    assert all(0 < by_name[n].relative_error < 0.02 for n in asked)  # really quantized, and close
    # each compressed tensor once, as a constexpr op: tables shared by every layer's q and k
    assert op_types(model).count("constexpr_blockwise_shift_scale") == len(report.weights)


def test_layer_norm_weights_and_biases_of_an_encoder(checkpoints: dict[str, Path]) -> None:
    graph, params = from_pretrained(checkpoints["bert"], seq_len=SEQ)
    feeds = {**_ids("bert"), "attention_mask": np.ones((1, SEQ), np.int32)}
    feeds = {k: v for k, v in feeds.items() if k in {n.op.name for n in graph if n.op.type_name == "Input"}}
    _, report = convert_and_verify(graph, params, feeds, r"re:LayerNorm=int8", roundtrip=False)
    names = {w.name for w in report.weights}
    layer_norms = {n for n in params if "LayerNorm" in n}
    assert layer_norms and names == layer_norms  # gamma and beta of every LayerNorm, nothing else
