"""A GGUF file's `tokenizer.ggml.*` metadata -> a Hugging Face `tokenizers` tokenizer plus the
files `rlx_mil.llm.text.TextTokenizer` reads (`tokenizer.json`, `tokenizer_config.json` with
the chat template and special tokens, `generation_config.json` with the stop ids), so a
package converted from a GGUF file carries its text side like one from a checkpoint.

Two vocabularies, as llama.cpp has them:

* `gpt2`: byte-level BPE over `tokens` and `merges`, split first by the regular expressions
  llama.cpp uses for the file's `tokenizer.ggml.pre` (llama-bpe, qwen2, smollm, gpt2 and
  their aliases; others are refused by name);
* `llama`: SentencePiece BPE over `tokens` and `scores` (merges ranked by the merged piece's
  score, as transformers' LlamaConverter derives them), `▁` for spaces, byte fallback to the
  `<0xNN>` tokens.

Control tokens (type 3) become special added tokens, user-defined ones (type 4) added tokens;
`add_bos_token` / `add_eos_token` become the post-processor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.gguf.reader import GGUFFile

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: `tokenizer.ggml.pre` -> (the regular expressions llama.cpp splits by, in order; merges
#: ignored for words in the vocabulary).
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {
    **dict.fromkeys(("llama-bpe", "llama3", "dbrx", "smaug-bpe"), ((LLAMA3_SPLIT,), True)),
    **dict.fromkeys(("qwen2", "stablelm2"), ((_QWEN2,), False)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell"), ((r"\p{N}", _GPT2), False)),
    **dict.fromkeys(("gpt-2", "gpt2", "mpt", "olmo", "jais"), ((_GPT2,), False)),
}


def _refuse(file: GGUFFile, key: str, value: object, why: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"{file.path}: {key} = {json.dumps(value, default=str)} is not supported: {why}", field=key, value=value)


def _list(file: GGUFFile, key: str, n: int | None = None) -> list[Any]:
    value = file.value(key)
    if not isinstance(value, list) or (n is not None and len(value) != n):
        raise _refuse(file, key, f"<{type(value).__name__}>", f"expected a list{'' if n is None else f' of {n} entries'}")
    return value


def _added_tokens(tokens: list[str], types: list[int]) -> list[Any]:
    from tokenizers import AddedToken

    return [AddedToken(t, special=k == CONTROL, normalized=False) for t, k in zip(tokens, types, strict=True)
            if k in (CONTROL, USER_DEFINED)]


def _special_id(file: GGUFFile, name: str, vocab: int) -> int | None:
    value = file.value(f"tokenizer.ggml.{name}_token_id")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab:
        raise _refuse(file, f"tokenizer.ggml.{name}_token_id", value, f"expected a token id below {vocab}")
    return value


def _bpe(file: GGUFFile, tokens: list[str], types: list[int]) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = file.value("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise _refuse(file, "tokenizer.ggml.pre", pre, f"implemented pre-tokenizers are {', '.join(sorted(PRE_TOKENIZERS))}")
    regexes, ignore_merges = PRE_TOKENIZERS[pre]
    merges = []
    for line in _list(file, "tokenizer.ggml.merges"):
        left, sep, right = str(line).partition(" ")
        if not sep:
            raise _refuse(file, "tokenizer.ggml.merges", line, "a merge is two tokens separated by one space")
        merges.append((left, right))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm(file: GGUFFile, tokens: list[str], types: list[int]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = [float(s) for s in _list(file, "tokenizer.ggml.scores", len(tokens))]
    vocab = {t: i for i, t in enumerate(tokens)}
    # transformers' LlamaConverter: every split of a piece into two pieces is a merge, ranked
    # by the merged piece's score (SentencePiece BPE merges the best-scoring pair first).
    ranked = []
    for piece, i in vocab.items():
        if types[i] != NORMAL:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], vocab[left], vocab[right], left, right))
    ranked.sort()
    unk = _special_id(file, "unknown", len(tokens))
    tok = Tokenizer(models.BPE(vocab, [(r[3], r[4]) for r in ranked], unk_token=None if unk is None else tokens[unk],
                               fuse_unk=True, byte_fallback=True))
    prefix = file.value("tokenizer.ggml.add_space_prefix", True)
    steps = ([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence(steps)
    parts = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(parts + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def gguf_tokenizer(file: GGUFFile) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The `tokenizers.Tokenizer` of the file, its tokenizer_config and generation_config."""
    from tokenizers import processors

    model = file.value("tokenizer.ggml.model")
    tokens = [str(t) for t in _list(file, "tokenizer.ggml.tokens")]
    n = len(tokens)
    embedding = file.tensors.get("token_embd.weight")
    if embedding is not None and embedding.shape and embedding.shape[0] != n:
        # llama.cpp's converter pads the list to the embedding's rows: ids past the list could
        # not be decoded, ids past the rows not embedded
        raise _refuse(file, "tokenizer.ggml.tokens", f"<{n} entries>",
                      f"token_embd.weight has {embedding.shape[0]} rows, one per token of the vocabulary")
    types = [int(t) for t in file.value("tokenizer.ggml.token_type") or [NORMAL] * n]
    if len(types) != n:
        raise _refuse(file, "tokenizer.ggml.token_type", f"<{len(types)} entries>", f"expected {n}, one per token")
    if model == "gpt2":
        tok = _bpe(file, tokens, types)
        default_bos = False
    elif model == "llama":
        tok = _spm(file, tokens, types)
        default_bos = True
    else:
        raise _refuse(file, "tokenizer.ggml.model", model, "implemented vocabularies are 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)")
    tok.add_special_tokens(_added_tokens(tokens, types))
    ids = {name: _special_id(file, name, n) for name in ("bos", "eos", "unknown", "padding", "eot", "eom")}
    add_bos = bool(file.value("tokenizer.ggml.add_bos_token", default_bos)) and ids["bos"] is not None
    add_eos = bool(file.value("tokenizer.ggml.add_eos_token", False)) and ids["eos"] is not None
    if add_bos or add_eos:
        first = [(tokens[i], i) for i in ([ids["bos"]] if add_bos and ids["bos"] is not None else [])]
        last = [(tokens[i], i) for i in ([ids["eos"]] if add_eos and ids["eos"] is not None else [])]
        single = " ".join([t for t, _ in first] + ["$A"] + [t for t, _ in last])
        pair = " ".join([t for t, _ in first] + ["$A", "$B:1"] + [t for t, _ in last])
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=first + last)
    config: dict[str, Any] = {"add_bos_token": add_bos, "add_eos_token": add_eos}
    for name, key in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"), ("padding", "pad_token")):
        found = ids[name]
        if found is not None:
            config[key] = tokens[found]
    template = file.value("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    stops = [i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None]
    generation: dict[str, Any] = {"eos_token_id": list(dict.fromkeys(stops))} if stops else {}
    if ids["bos"] is not None:
        generation["bos_token_id"] = ids["bos"]
    return tok, config, generation


def has_tokenizer(file: GGUFFile) -> bool:
    return file.has("tokenizer.ggml.tokens")


def write_tokenizer_files(file: GGUFFile, folder: str | os.PathLike[str]) -> list[str]:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json of the file's
    tokenizer into `folder`; returns the names written."""
    tok, config, generation = gguf_tokenizer(file)
    out = Path(folder)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    names = ["tokenizer.json", "tokenizer_config.json"]
    if generation:
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
        names.append("generation_config.json")
    return names
