"""`rlx-mil convert-gguf --stateful --chunk-bytes`: a quantized GGUF decoder as a chunked set
whose chunks keep the file's codes, verified on the executor against the reference on the
same codes (`--verify`: greedy steps against the NumPy reference of the whole model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.gguf.gguf_files import tiny_chat_gguf
from rlx_mil.cli import main
from rlx_mil.llm.chunk_plan import planned_param_bytes, smallest_limit
from rlx_mil.llm.chunked import read_chunked_set
from rlx_mil.models.gguf import from_gguf


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_chat_gguf(tmp_path_factory.mktemp("gguf_chunks") / "two.gguf", layers=2, seed=5)


def test_a_gguf_set_keeps_its_codes_and_verifies(gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph, _ = from_gguf(gguf, "decode", seq_len=1, cache_len=1, max_positions=32, last_logits=True)
    # codes planned at their float size (an upper bound); the smallest limit: a layer per chunk
    limit = smallest_limit(graph, planned_param_bytes(graph, precision="fp16"))
    folder = tmp_path / "set"
    assert main(["convert-gguf", str(gguf), "-o", str(folder), "--stateful", "--max-context", "32", "--prefill", "4",
                 "--chunk-bytes", str(limit), "--verify", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "2 chunks" in printed and "verify: compared 8 greedy steps" in printed and printed.rstrip().endswith(": ok")
    chunked = read_chunked_set(folder)
    assert [c.layers for c in chunked.chunks] == [["model.layers.0"], ["model.layers.1"]]
    assert "gguf-Q8_0" in chunked.metadata()["rlx_mil.compression"]
