"""Tokenizer folders made with the `tokenizers` library itself (no download): a byte-level
BPE with a ChatML chat template (Qwen / SmolLM style) and a BERT-style WordPiece whose template
uses the BOS/EOS tokens; `chat_checkpoint` adds one to a tiny random decoder checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "What is the capital of France? Paris is the capital of France.",
    "Hello, how are you? I am fine, thank you. Café, naïve, déjà vu.",
    "Models read tokens; tokenizers turn text into tokens and tokens back into text.",
    "system: be brief. user: hello! assistant: hi.",
] * 4

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

BERT_CHAT = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def write_bpe_tokenizer(folder: Path, vocab_size: int = 300) -> Path:
    """Byte-level BPE, special tokens <|endoftext|> <|im_start|> <|im_end|>, ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(folder / "tokenizer.json"))
    _write(folder / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": CHATML, "clean_up_tokenization_spaces": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    })
    return folder


def write_wordpiece_tokenizer(folder: Path, vocab_size: int = 96) -> Path:
    """BERT-style WordPiece ([CLS] text [SEP]) with a template writing bos/eos tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(folder / "tokenizer.json"))
    _write(folder / "tokenizer_config.json", {
        "tokenizer_class": "BertTokenizerFast", "bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]",
        "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]",
        "chat_template": [{"name": "default", "template": BERT_CHAT}, {"name": "other", "template": "x"}],
    })
    return folder


def chat_checkpoint(folder: Path, kind: str = "bpe", family: str = "qwen3", seed: int = 3, layers: int | None = None) -> Path:
    """A tiny random decoder with a real tokenizer folder, a generation config and a model card
    (`layers`: its decoder layers, default the tiny config's)."""
    from tokenizers import Tokenizer

    tokenizer_dir = folder / "_tok"
    (write_bpe_tokenizer if kind == "bpe" else write_wordpiece_tokenizer)(tokenizer_dir)
    vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()
    config: dict[str, Any] = {**TINY_CONFIGS[family], "vocab_size": vocab, "_name_or_path": "acme/tiny-chat"}
    if layers is not None:
        config["num_hidden_layers"] = layers
    write_random_checkpoint(folder, config, seed=seed)
    for path in tokenizer_dir.iterdir():
        path.rename(folder / path.name)
    tokenizer_dir.rmdir()
    stop = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id("<|im_end|>" if kind == "bpe" else "[SEP]")
    _write(folder / "generation_config.json", {"eos_token_id": [stop, 0], "do_sample": False})
    (folder / "README.md").write_text("---\nlicense: apache-2.0\nversion: 1.2\ntags: [chat]\n---\n# Tiny chat\n")
    return folder


def _write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2))
