"""`rlx-mil convert-gguf --stateful --chunk-bytes`: a quantized GGUF decoder as a chunked set
whose chunks keep the file's codes, verified on the executor against the reference on the
same codes (`--verify`: greedy steps against the NumPy reference of the whole model)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from models.gguf.gguf_files import bpe_metadata, trained_bpe, write_gguf
from rlx_mil.cli import main
from rlx_mil.ir.cut import layer_segments
from rlx_mil.llm.chunk_plan import CHUNK_MARGIN, data_inputs, planned_param_bytes
from rlx_mil.llm.chunked import read_chunked_set
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.models.gguf import from_gguf
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gguf_chunks")
    tok = trained_bpe("smollm")
    cfg: dict[str, Any] = {**copy.deepcopy(TINY_CONFIGS["llama"]), "vocab_size": tok.get_vocab_size(), "rope_scaling": None,
                           "tie_word_embeddings": True, "num_hidden_layers": 2}
    weights = Checkpoint(write_random_checkpoint(root / "hf", cfg, seed=5))
    path = root / "two.gguf"
    write_gguf(path, cfg, {k: weights[k] for k in weights}, types=lambda n, s: "Q8_0", tokenizer=bpe_metadata(tok, "smollm"))
    return path


def test_a_gguf_set_keeps_its_codes_and_verifies(gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, _ = from_gguf(gguf, "decode", seq_len=1, cache_len=1, max_positions=32, last_logits=True)
    sizes = planned_param_bytes(graph, precision="fp16")  # codes planned at their float size: an upper bound
    largest = max(sum(sizes[p] for p in s.params) for s in layer_segments(graph, data_inputs(graph)))
    limit = int(largest * (1 + CHUNK_MARGIN[1])) + CHUNK_MARGIN[0] + 1
    folder = tmp_path / "set"
    assert main(["convert-gguf", str(gguf), "-o", str(folder), "--stateful", "--max-context", "32", "--prefill", "4",
                 "--chunk-bytes", str(limit), "--verify", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "2 chunks" in printed and "verify: compared 8 greedy steps" in printed and printed.rstrip().endswith(": ok")
    chunked = read_chunked_set(folder)
    assert [c.layers for c in chunked.chunks] == [["model.layers.0"], ["model.layers.1"]]
    assert "gguf-Q8_0" in chunked.metadata()["rlx_mil.compression"]
