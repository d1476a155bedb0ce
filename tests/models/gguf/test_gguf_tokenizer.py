"""`tokenizer.ggml.*` metadata -> a `tokenizers` tokenizer: byte-level BPE vocabularies
written from tokenizers trained by the test (the encodings must match the original's), and a
SentencePiece vocabulary checked against llama.cpp's merge-by-score algorithm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from models.gguf.gguf_files import CORPUS, TEMPLATE, bpe_metadata, trained_bpe, write_metadata_only
from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.llm.text import TextTokenizer
from rlx_mil.models.gguf.reader import GGUFFile
from rlx_mil.models.gguf.tokenizer import gguf_tokenizer, write_tokenizer_files

TEXTS = [
    "The lazy fox's 31415 jumps!", "  leading spaces and\ttabs\nnew lines\n\n", "café 🙂 isn't 2718 naïve",
    "<|im_start|>user\nhello<|im_end|>", "",
]

@pytest.mark.parametrize("kind", ["smollm", "gpt2", "llama-bpe"])
def test_byte_level_bpe_matches_the_original(tmp_path: Path, kind: str) -> None:
    original = trained_bpe(kind)
    write_metadata_only(tmp_path / "t.gguf", "llama", bpe_metadata(original, kind))
    tok, config, generation = gguf_tokenizer(GGUFFile(tmp_path / "t.gguf"))
    for text in TEXTS + CORPUS[:4]:
        want = original.encode(text).ids
        assert tok.encode(text).ids == want, text
        assert tok.decode(want, skip_special_tokens=False) == original.decode(want, skip_special_tokens=False)
    assert config["chat_template"] == TEMPLATE
    assert generation["eos_token_id"] == [original.token_to_id("<|im_end|>")]


def test_text_tokenizer_reads_the_written_files(tmp_path: Path) -> None:
    original = trained_bpe("smollm")
    write_metadata_only(tmp_path / "t.gguf", "llama", bpe_metadata(original, "smollm", add_bos_token=True))
    folder = tmp_path / "files"
    folder.mkdir()
    write_tokenizer_files(GGUFFile(tmp_path / "t.gguf"), folder)
    text = TextTokenizer(folder)
    bos = original.token_to_id("<|im_start|>")
    assert text.encode("hello 42") == [bos, *original.encode("hello 42").ids]
    chat = text.prompt_ids("hi", chat=True)
    assert chat == original.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n").ids
    assert text.stop_ids == (original.token_to_id("<|im_end|>"),)


def _spm_reference(text: str, vocab: dict[str, int], scores: list[float], prefix: bool = True) -> list[int]:
    """llama.cpp's llm_tokenizer_spm: characters, then repeatedly the best-scoring adjacent
    pair whose concatenation is a token (leftmost on ties); unknown characters as bytes."""
    s = ("▁" if prefix else "") + text.replace(" ", "▁")
    symbols = list(s)
    while True:
        best = None
        for i in range(len(symbols) - 1):
            merged = symbols[i] + symbols[i + 1]
            if merged in vocab and (best is None or scores[vocab[merged]] > scores[vocab[best[1]]]):
                best = (i, merged)
        if best is None:
            break
        i, merged = best
        symbols[i:i + 2] = [merged]
    out = []
    for sym in symbols:
        if sym in vocab:
            out.append(vocab[sym])
        else:
            out += [vocab[f"<0x{b:02X}>"] for b in sym.encode("utf-8")]
    return out


def test_sentencepiece_vocabulary_matches_merge_by_score(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    base = list("▁abcdefghijklmnopqrstuvwxyz.,")
    words = ["▁the", "▁quick", "▁brown", "▁fox", "▁lazy", "▁dog", "th", "he", "▁t", "qu", "ick", "ow", "own", "▁b",
             "br", "▁f", "ox", "az", "zy", "▁l", "▁d", "og", "▁q", "uick", "▁br", "row", "la", "do"]
    pieces += base + [w for w in words if w not in base]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(pieces) - 259)
    scores = [0.0] * 259 + [float(-i) for i in range(len(base))] + list(rng.uniform(-20, 0, len(pieces) - 259 - len(base)))

    def add(w: Any) -> None:
        w.add_tokenizer_model("llama")
        w.add_token_list(pieces)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)

    write_metadata_only(tmp_path / "s.gguf", "llama", add)
    tok, config, _ = gguf_tokenizer(GGUFFile(tmp_path / "s.gguf"))
    vocab = {p: i for i, p in enumerate(pieces)}
    for text in ["the quick brown fox", "a lazy dog.", "the quick, brown dog jumps", "Zürich 42"]:
        want = _spm_reference(text, vocab, scores)
        assert tok.encode(text, add_special_tokens=False).ids == want, text
        assert tok.decode(want) == text
    assert tok.encode("fox").ids[0] == 1  # add_bos_token defaults to true for SentencePiece vocabularies
    assert config["bos_token"] == "<s>"


def test_unknown_vocabularies_are_refused(tmp_path: Path) -> None:
    original = trained_bpe("gpt2")
    write_metadata_only(tmp_path / "t.gguf", "llama", bpe_metadata(original, "deepseek-coder"))
    with pytest.raises(UnsupportedConfigError, match=r"tokenizer\.ggml\.pre") as err:
        gguf_tokenizer(GGUFFile(tmp_path / "t.gguf"))
    assert err.value.value == "deepseek-coder"
