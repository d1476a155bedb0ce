"""A vocabulary wider than the Neural Engine's 16,384 (Whisper's 51,865): the TextDecoder looks
tokens up in, and projects onto, pieces of the tied token table (`vocab_pieces`), and runs as
the NumPy forward does; `preflight --device ane` passes it (the `logits [1, 1, V]` that
WhisperKit's contract fixes are only the pieces joined), and the table is stored once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.models.families.whisper import TINY_WHISPER
from rlx_mil.models.random_checkpoint import write_random_checkpoint
from rlx_mil.models.whisper import vocab_pieces
from rlx_mil.models.whisper_checkpoint import open_whisper
from rlx_mil.speech.packages import convert_whisper
from rlx_mil.speech.runner import PackagedWhisper
from tests.speech import whisper_numpy as forward

WIDE = {**TINY_WHISPER, "vocab_size": 40_000, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
        "encoder_ffn_dim": 32, "decoder_ffn_dim": 32}
# pieces (0, 13334), (13334, 13334), (26668, 13332): each edge, from both sides
TOKENS = [90, 0, 13_333, 13_334, 26_667, 26_668, 39_999, 7]


@given(vocab=st.integers(1, 300_000), widest=st.integers(1, 70_000))
def test_vocab_pieces_cover_the_table_in_the_fewest_pieces(vocab: int, widest: int) -> None:
    pieces = vocab_pieces(vocab, widest)
    assert len(pieces) == -(-vocab // widest)
    assert [start for start, _ in pieces] == [0, *np.cumsum([rows for _, rows in pieces])[:-1].tolist()]
    assert sum(rows for _, rows in pieces) == vocab
    assert all(0 < rows <= widest for _, rows in pieces)
    assert max(rows for _, rows in pieces) - min(rows for _, rows in pieces) <= len(pieces)


def test_whispers_vocabulary_is_four_pieces() -> None:
    assert vocab_pieces(51_865) == [(0, 12_967), (12_967, 12_967), (25_934, 12_967), (38_901, 12_964)]


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("whisper_wide")
    hf = write_random_checkpoint(root / "whisper-wide", WIDE, seed=3)
    (hf / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 90, "content": "<|startoftranscript|>"}]}))
    return hf, convert_whisper(hf, root / "out", precision="fp16", cache_len=len(TOKENS)).folder


def test_wide_vocabulary_decoder_runs_as_the_numpy_forward(wide: tuple[Path, Path]) -> None:
    hf, folder = wide
    params = open_whisper(hf).params
    encoded = np.random.default_rng(0).standard_normal((1500, WIDE["d_model"])).astype(np.float32)
    teacher = forward.decode(params, WIDE, TOKENS, encoded)
    logits = PackagedWhisper(folder).decoder(encoded).step(TOKENS)
    assert logits.shape == (len(TOKENS), WIDE["vocab_size"])
    assert np.abs(logits - teacher).max() < 0.02 * np.abs(teacher).max()
    assert (logits.argmax(-1) == teacher.argmax(-1)).all()


def test_wide_vocabulary_decoder_passes_preflight_with_its_logits_joined_from_pieces(wide: tuple[Path, Path]) -> None:
    """No compute op reads or writes a tensor wider than 16,384: the `logits [1, 1, 40000]` the
    contract fixes are only the concatenation of the pieces' logits (the `interface-copy` note,
    the copy's bytes in it)."""
    from rlx_mil.coreml.preflight import preflight

    _, folder = wide
    [note] = preflight(folder / "TextDecoder.mlpackage", "ane")
    assert (note.rule, note.severity, note.var) == ("interface-copy", "note", "logits")
    assert note.why == ("model output fp16[1, 1, 40000] only moved (concat, identity): joined from pieces within 16,384;"
                        " a copy of 80,000 bytes per prediction, no compute op reads or writes it")
    assert preflight(folder / "TextDecoder.mlpackage", "gpu") == []
    table_bytes = WIDE["vocab_size"] * WIDE["d_model"] * 2
    stored = sum(f.stat().st_size for f in (folder / "TextDecoder.mlpackage").rglob("weight.bin"))
    assert table_bytes <= stored < 1.5 * table_bytes  # the pieces are the table, held once
