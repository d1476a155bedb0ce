"""`rlx-mil inspect --estimate`: the bytes a decode step streams, counted from the package's
program, against the checkpoint's own tensor sizes; the tokens/s bounds from the bandwidth table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_llm_package import CFG, MAX_CONTEXT, tiny_checkpoint, tiny_stateful_package

from rlx_mil.cli import main
from rlx_mil.errors import InvalidOptionError
from rlx_mil.llm.estimate import CHIPS, estimate_decode
from rlx_mil.models.checkpoint import Checkpoint


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("estimate")
    checkpoint = tiny_checkpoint(work, seed=2)
    return checkpoint, tiny_stateful_package(checkpoint, work)


def test_decode_bytes_follow_the_checkpoint(package: tuple[Path, Path]) -> None:
    checkpoint, path = package
    tensors = Checkpoint(checkpoint)
    hidden, layers = CFG["hidden_size"], CFG["num_hidden_layers"]
    kv_width = CFG["num_key_value_heads"] * hidden // CFG["num_attention_heads"]
    # fp32 package: every tensor but the embedding table (read one row a token) at 4 bytes
    streamed = sum(int(np.prod(tensors.shape_of(n))) for n in tensors if n != "model.embed_tokens.weight") * 4
    got = estimate_decode(path)
    # plus the program's own small constants (the zero biases of its linear ops, RoPE tables, masks)
    assert streamed <= got.weight_bytes <= streamed * 1.05 + 1024
    head_dim = hidden // CFG["num_attention_heads"]
    rope_rows = 2 * (head_dim // 2) * 4  # cos and sin rows at the position
    assert got.lookup_bytes == hidden * 4 + rope_rows
    # K and V caches (fp16 states): MAX_CONTEXT slots read, one written
    cache = 2 * layers * kv_width * 2
    assert got.state_bytes == cache * (MAX_CONTEXT + 1)
    half = estimate_decode(path, context=8)
    assert half.state_bytes == cache * (8 + 1) and half.weight_bytes == got.weight_bytes
    for chip, rate in got.bounds():
        assert rate == pytest.approx(chip.bandwidth_gbs * 1e9 / got.bytes_per_token)
    with pytest.raises(InvalidOptionError, match="max_context"):
        estimate_decode(path, context=MAX_CONTEXT + 1)


def test_cli_prints_the_bound_and_its_sources(package: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _checkpoint, path = package
    assert main(["inspect", str(path), "--estimate"]) == 0
    text = capsys.readouterr().out
    assert "UPPER BOUND" in text and "A18 Pro" in text and "M4 Max (16-core CPU)" in text
    assert main(["inspect", str(path), "--estimate", "--json", "--context", "4"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["context"] == 4 and len(info["upper_bound_tokens_per_s"]) == len(CHIPS)
    assert all(row["source"] for row in info["upper_bound_tokens_per_s"])
    assert main(["inspect", str(path), "--context", "4"]) == 1
    assert "--context goes with --estimate" in capsys.readouterr().err


def test_compressed_weights_count_at_their_stored_size(package: tuple[Path, Path], tmp_path: Path) -> None:
    """A saved package holds constexpr ops' storage inline: it streams at its compressed size."""
    import warnings

    from tiny_llm_package import BUCKET

    from rlx_mil.llm.package import convert_llm_checkpoint

    checkpoint, fp32_package = package  # the module's fp32 package of this checkpoint
    out = tmp_path / "int8.mlpackage"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert_llm_checkpoint(checkpoint, out, max_context=MAX_CONTEXT, prefill=[BUCKET], precision="fp16",
                               compress="int8")
    tensors = Checkpoint(checkpoint)
    # int8 codes (a byte a weight) plus one fp16 scale per row or block, for every weight but
    # the embedding table (read one row a token; the tiny model's head is its own matrix)
    codes = sum(int(np.prod(tensors.shape_of(n))) for n in tensors
                if n != "model.embed_tokens.weight" and len(tensors.shape_of(n)) == 2)
    got = estimate_decode(out)
    stored = sum(p.stat().st_size for p in out.rglob("weight.bin"))
    embedding = int(np.prod(tensors.shape_of("model.embed_tokens.weight")))
    # everything the weight file holds but the embedding table's codes, plus the program's
    # own small constants (RoPE tables, masks); small weights stay fp16
    assert codes <= got.weight_bytes <= stored - embedding + 4096, (codes, got.weight_bytes, stored, embedding)
    fp32 = estimate_decode(fp32_package)
    assert got.weight_bytes < 0.4 * fp32.weight_bytes  # fp32 package: 4 bytes a weight


def test_the_mixture_of_experts_note_only_where_it_may_apply(package: tuple[Path, Path], tmp_path: Path) -> None:
    """The note that every expert is counted was printed for dense models too; it now shows
    only when the package's config.json has experts, or when there is no config to tell."""
    import shutil

    from rlx_mil.llm.package_files import package_text_folder

    _checkpoint, path = package
    note = "mixture-of-experts models read only their routed experts"
    assert not any(note in n for n in estimate_decode(path).notes)
    moe = tmp_path / "moe.mlpackage"
    shutil.copytree(path, moe)
    text = package_text_folder(moe)
    assert text is not None
    config = json.loads((text / "config.json").read_text())
    (text / "config.json").write_text(json.dumps({**config, "text_config": {"num_local_experts": 8}}))
    assert any(note in n for n in estimate_decode(moe).notes)
    (text / "config.json").unlink()
    assert any(note in n for n in estimate_decode(moe).notes)
