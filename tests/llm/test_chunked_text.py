"""A chunked set of a chat checkpoint: text generation from the copied folder alone, `rlx-mil
generate DIR --chat` and `rlx-mil eval DIR` against the NumPy forward; a hybrid recurrent
decoder's set against the NumPy reference."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli import main
from rlx_mil.llm.chunk_plan import planned_param_bytes, smallest_limit
from rlx_mil.llm.chunked import read_chunked_set
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint, reference_greedy, reference_logits
from rlx_mil.llm.text import TextTokenizer
from rlx_mil.models.pretrained import from_pretrained
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

from . import test_text_package as single_package
from .text_fixtures import chat_checkpoint

QUESTION = single_package.QUESTION


def one_layer_limit(checkpoint: Path, precision: str, max_context: int) -> int:
    """A chunk limit that holds the largest layer alone (so each layer is a chunk of its own)."""
    graph, _ = from_pretrained(checkpoint, "decode", seq_len=1, cache_len=1, max_positions=max_context, last_logits=True)
    return smallest_limit(graph, planned_param_bytes(graph, precision=precision))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_checkpoint(tmp_path_factory.mktemp("hf") / "tiny-chat")


@pytest.fixture(scope="module")
def chunked(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("set") / "chat"
    argv = ["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "48", "--prefill", "8",
            "--precision", "fp32", "-q", "--chunk-bytes", str(one_layer_limit(checkpoint, "fp32", 48))]
    assert main(argv) == 0
    return out


def test_text_generation_from_the_copied_set_alone(chunked: Path, checkpoint: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert len(read_chunked_set(chunked).chunks) == 2
    moved = tmp_path / "elsewhere" / "chat"
    shutil.copytree(chunked, moved)
    tok = TextTokenizer(checkpoint)
    prompt = tok.encode_chat([{"role": "user", "content": QUESTION}])
    want_ids = reference_greedy(checkpoint, prompt, 10)
    cut = next((i + 1 for i, t in enumerate(want_ids) if t in set(tok.stop_ids)), len(want_ids))
    want = tok.decode(want_ids[:cut])
    session = Session(moved, precision_model="float32")
    assert session.generate_text(QUESTION, 10, chat=True) == want
    assert session.stats.prompt_tokens == len(prompt)
    capsys.readouterr()
    assert main(["generate", str(moved), "--chat", "--prompt", QUESTION, "-n", "10", "--engine", "milexec", "-q"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == want


def test_eval_of_the_set_matches_numpy(chunked: Path, checkpoint: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    text_file = tmp_path / "text.txt"
    text_file.write_text("The capital of France is Paris. Hello, how are you? " * 4)
    ids = TextTokenizer(checkpoint).encode(text_file.read_text())[:60]
    rows = single_package._numpy_scores(checkpoint, ids, 48)
    targets = [ids[s + 1:s + 48] for s in range(0, len(ids), 48) if len(ids[s:s + 48]) >= 2]
    nll = -np.mean(np.concatenate([r[np.arange(len(t)), t] for r, t in zip(rows, targets, strict=True)]))
    capsys.readouterr()
    assert main(["eval", str(chunked), "--text", str(text_file), "--max-tokens", "60", "--json", "-q",
                 "--reference", str(checkpoint), "--engine", "milexec"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["scored"] == 58
    assert got["perplexity"] == pytest.approx(math.exp(nll), rel=1e-3)
    assert got["mean_kl"] == pytest.approx(0.0, abs=1e-4) and got["top1_agreement"] == 1.0


def test_a_hybrid_recurrent_set_matches_the_reference(tmp_path: Path) -> None:
    """Gated delta-net and convolution layers (recurrent states only) between attention layers:
    chunks without a KV cache take no cache_position, and the states stay in their chunks."""
    checkpoint = write_random_checkpoint(tmp_path / "hybrid", TINY_CONFIGS["qwen3_5_text"], seed=1)
    folder = tmp_path / "set"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert_llm_checkpoint(checkpoint, folder, max_context=16, prefill=[4], precision="fp32",
                               chunk_bytes=one_layer_limit(checkpoint, "fp32", 16))
    chunks = read_chunked_set(folder).chunks
    assert [c.layers for c in chunks] == [[f"model.layers.{i}"] for i in range(4)]
    assert "recurrent_state_0" in chunks[0].states and "key_cache" in chunks[3].states
    session = Session(folder, engine="milexec", precision_model="float32")
    prompt = [3, 9, 27, 81, 50, 7]
    np.testing.assert_allclose(session.feed(prompt), reference_logits(checkpoint, prompt), atol=1e-4, rtol=0)
    for token in (11, 40):
        prompt.append(token)
        np.testing.assert_allclose(session.feed([token]), reference_logits(checkpoint, prompt), atol=1e-4, rtol=0)
