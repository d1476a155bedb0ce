"""Tokenizers and chat templates through `tokenizers` and `jinja2` (rlx_mil.llm.text): the
rendering transformers' apply_chat_template gives, special tokens, stop ids, streamed decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlx_mil.llm.text import TextTokenizer, TokenizerError

from .text_fixtures import write_bpe_tokenizer, write_wordpiece_tokenizer

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bpe_tokenizer(tmp_path_factory.mktemp("tok") / "bpe")


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wordpiece_tokenizer(tmp_path_factory.mktemp("tok") / "wp")


def test_chatml_renders_as_transformers_does(bpe: Path) -> None:
    tok = TextTokenizer(bpe)
    want = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert tok.render_chat(CHAT) == want
    assert tok.render_chat(CHAT, add_generation_prompt=False) == want[: -len("<|im_start|>assistant\n")]
    ids = tok.encode_chat(CHAT)
    # The template writes the special tokens; they encode as single ids and nothing is added.
    start, end = tok.token_id("<|im_start|>"), tok.token_id("<|im_end|>")
    assert ids[0] == start and ids.count(start) == 3 and ids.count(end) == 2
    assert ids == tok.encode(want, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == want
    assert tok.prompt_ids("What is the capital of France?", chat=True, system="Be brief.") == ids
    assert tok.stop_ids == (end,)  # no generation config: the eos_token


def test_wordpiece_template_sees_bos_and_eos(wordpiece: Path) -> None:
    tok = TextTokenizer(wordpiece)
    # chat_template is a list of named templates: "default" is the one used.
    assert tok.render_chat(CHAT[1:]) == "[CLS]user: What is the capital of France?[SEP]assistant:"
    plain = tok.encode("hello paris")
    assert plain[0] == tok.token_id("[CLS]") and plain[-1] == tok.token_id("[SEP]")  # post-processor
    assert tok.decode(plain) == "hello paris"
    assert tok.encode_chat(CHAT[1:])[0] == tok.token_id("[CLS]")


def test_template_helpers_and_errors(bpe: Path, tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((bpe / name).read_bytes())
    # chat_template.jinja wins over tokenizer_config.json, as in transformers.
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}{{ strftime_now('%Y') | length }}"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}!{% endfor %}"
    )
    tok = TextTokenizer(folder)
    got = tok.render_chat([{"role": "user", "content": "<b>é</b>"}, {"role": "user", "content": "x"}])
    # tojson neither escapes HTML nor non-ASCII; strftime_now gives a 4-digit year; loopcontrols work.
    assert got == '{"role": "user", "content": "<b>é</b>"}{"role": "user", "content": "x"}4!'
    with pytest.raises(TokenizerError, match="no tools"):
        tok.render_chat([{"role": "tool", "content": "x"}])
    (folder / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(TokenizerError, match="not a valid jinja2 template"):
        TextTokenizer(folder).render_chat(CHAT)
    (folder / "chat_template.jinja").unlink()
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    with pytest.raises(TokenizerError, match="no chat template"):
        TextTokenizer(folder).render_chat(CHAT)
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        TextTokenizer(tmp_path)
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a readable tokenizer"):
        TextTokenizer(folder)


def test_stop_ids_come_from_the_generation_config_then_the_config(bpe: Path, tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((bpe / name).read_bytes())
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert TextTokenizer(folder).stop_ids == (7,)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert TextTokenizer(folder).stop_ids == (2, 0)


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_streamed_pieces_join_to_the_decoded_text(kind: str, bpe: Path, wordpiece: Path) -> None:
    tok = TextTokenizer(bpe if kind == "bpe" else wordpiece)
    text = "Café, naïve: déjà vu! tokens back into text." if kind == "bpe" else "hello, how are you? paris."
    ids = tok.encode(text)
    pieces = list(tok.stream_decode(ids))
    assert "".join(pieces) == tok.decode(ids)
    assert len(pieces) > 1
    if kind == "bpe":
        assert tok.decode(ids) == text  # byte-level BPE round-trips exactly, multi-byte characters included
