"""Text in, text out: a checkpoint's tokenizer, chat template and stop tokens.

`TextTokenizer(folder)` reads what a Hugging Face checkpoint ships beside its weights (and
what `convert-hf` stores inside a package, `rlx_mil.llm.package_files`):

* `tokenizer.json`, run by the `tokenizers` library (encoding, decoding, streamed decoding);
* the chat template: `chat_template.jinja`, else `chat_template` of `tokenizer_config.json`
  (a string, or a list of named templates of which `default` is used), rendered by `jinja2` as
  transformers' `apply_chat_template` renders it: a sandboxed immutable environment with
  `trim_blocks` / `lstrip_blocks`, `raise_exception`, a non-escaping `tojson`, `strftime_now`,
  the `loopcontrols` extension and `{% generation %}` blocks, the variables `messages`,
  `tools`, `documents`, `add_generation_prompt` and the special tokens (`bos_token`,
  `eos_token`, ...). The rendered text is encoded without adding special tokens (the template
  writes them), as transformers does;
* stop ids: `eos_token_id` of `generation_config.json`, else of `config.json` (an int or a
  list), else the tokenizer's `eos_token`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import RlxMilError
from rlx_mil.fileio import read_regular_file

#: The files of a checkpoint that text generation needs (besides the weights).
TEXT_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "generation_config.json", "config.json",
)

#: Special-token attributes transformers passes to a chat template (when set).
SPECIAL_TOKEN_NAMES = (
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
)

_MAX_TEXT_FILE = 256 << 20  # tokenizer.json of a 256k-token vocabulary is ~20 MB


class TokenizerError(RlxMilError):
    """A tokenizer, chat template or generation config is missing, unreadable or fails to render."""


def read_json_file(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from `path` (typed errors naming the file)."""
    data = read_regular_file(path, _MAX_TEXT_FILE, TokenizerError, what)
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise TokenizerError(f"{path}: not a readable {what} ({type(err).__name__}: {err})") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: a {what} must hold a JSON object, got {type(value).__name__}")
    return value


def _optional_json(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    return read_json_file(path, name) if path.exists() else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _id_list(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def compile_chat_template(source: object, where: str = "chat template") -> Any:
    """A jinja2 template compiled in the environment transformers' apply_chat_template uses,
    sandboxed and bounded (`rlx_mil.llm.chat_template`)."""
    import jinja2

    from rlx_mil.llm.chat_template import ChatTemplateBoundError, compile_bounded

    if not isinstance(source, str):
        raise TokenizerError(f"{where}: a chat template must be text, got {type(source).__name__}")
    try:
        return compile_bounded(source)
    except (jinja2.TemplateError, ChatTemplateBoundError, RecursionError, MemoryError) as err:
        raise TokenizerError(f"{where}: not a valid jinja2 template ({type(err).__name__}: {err})") from None


class TextTokenizer:
    """The tokenizer, chat template and stop ids of a checkpoint (or package) folder."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer

        if not isinstance(folder, (str, os.PathLike)):  # e.g. package_text_folder's None: no tokenizer item
            raise TokenizerError(f"TextTokenizer takes a folder holding tokenizer.json, got {folder!r}")
        self.folder = Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{self.folder}: no tokenizer.json (text needs the checkpoint's fast tokenizer)")
        data = read_regular_file(path, _MAX_TEXT_FILE, TokenizerError, "tokenizer.json")
        try:
            self._tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as err:  # the Rust side raises plain Exceptions for malformed files
            raise TokenizerError(f"{path}: not a readable tokenizer ({type(err).__name__}: {err})") from None
        self.config = _optional_json(self.folder, "tokenizer_config.json")
        self.special_tokens = self._special_tokens(_optional_json(self.folder, "special_tokens_map.json"))
        self.chat_template_source = self._chat_template_source()
        self._template: Any = None
        self.stop_ids = self._stop_ids()

    # -- loading ---------------------------------------------------------------------------------
    def _special_tokens(self, tokens_map: Mapping[str, Any]) -> dict[str, Any]:
        """Special-token strings as transformers' special_tokens_map has them (config wins)."""
        out: dict[str, Any] = {}
        for source in (tokens_map, self.config):
            for name in SPECIAL_TOKEN_NAMES:
                text = _token_text(source.get(name))
                if text is not None:
                    out[name] = text
            extra = source.get("additional_special_tokens")
            if isinstance(extra, list):
                texts = [t for t in (_token_text(v) for v in extra) if t is not None]
                if texts:
                    out["additional_special_tokens"] = texts
        return out

    def _chat_template_source(self) -> str | None:
        jinja_file = self.folder / "chat_template.jinja"
        if jinja_file.exists():
            data = read_regular_file(jinja_file, _MAX_TEXT_FILE, TokenizerError, "chat template")
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise TokenizerError(f"{jinja_file}: not UTF-8 text ({err})") from None
        template = self.config.get("chat_template")
        if template is None or isinstance(template, str):
            return template
        if isinstance(template, list):
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            chosen = named.get("default")
            if isinstance(chosen, str):
                return chosen
        raise TokenizerError(
            f"{self.folder / 'tokenizer_config.json'}: chat_template must be a string or a list of named"
            " templates with a 'default' one"
        )

    def _stop_ids(self) -> tuple[int, ...]:
        for name in ("generation_config.json", "config.json"):
            ids = _id_list(_optional_json(self.folder, name).get("eos_token_id"))
            if ids is not None:
                return tuple(ids)
        eos = self.special_tokens.get("eos_token")
        token = self._tokenizer.token_to_id(eos) if isinstance(eos, str) else None
        return () if token is None else (int(token),)

    # -- text <-> ids ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def id_limit(self) -> int:
        """One past the largest token id the tokenizer can produce (added tokens included)."""
        return 1 + max(self._tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (with the tokenizer's post-processor, e.g. a BOS, by default)."""
        if not isinstance(text, str):
            raise TokenizerError(f"text to encode must be a str, got {type(text).__name__}")
        return [int(i) for i in self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids]

    def encode_batch(self, texts: Sequence[str], length: int) -> dict[str, np.ndarray]:
        """The inputs of an encoder package for `texts`: `input_ids`, `attention_mask` (1 =
        token, 0 = padding) and `token_type_ids`, int32 `[len(texts), length]`, each text
        encoded with its special tokens, truncated to `length` and padded with the pad token
        (the tokenizer library's own padding and truncation)."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise TokenizerError(f"length must be an int >= 1, got {length!r}")
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TokenizerError("encode_batch takes a sequence of str")
        pad = self.special_tokens.get("pad_token")
        pad_id = self.token_id(pad) if isinstance(pad, str) else None
        tokenizer = self._tokenizer.from_str(self._tokenizer.to_str())  # padding is state: a copy
        tokenizer.enable_truncation(max_length=length)
        tokenizer.enable_padding(length=length, pad_id=pad_id or 0, pad_token=pad if pad_id is not None else "[PAD]")
        rows = tokenizer.encode_batch(list(texts))
        return {
            "input_ids": np.asarray([r.ids for r in rows], np.int32).reshape(len(rows), length),
            "attention_mask": np.asarray([r.attention_mask for r in rows], np.int32).reshape(len(rows), length),
            "token_type_ids": np.asarray([r.type_ids for r in rows], np.int32).reshape(len(rows), length),
        }

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def stream_decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> Iterator[str]:
        """Text pieces as `ids` arrive (a piece once its bytes form whole characters); at the
        end, whatever bytes never completed a character, as `decode` renders them, so the
        pieces join to `decode(ids)`."""
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        seen: list[int] = []
        emitted = 0
        for token in ids:
            seen.append(int(token))
            piece = stream.step(self._tokenizer, int(token))
            if piece:
                emitted += len(piece)
                yield piece
        full = self.decode(seen, skip_special_tokens=skip_special_tokens)
        if len(full) > emitted:
            yield full[emitted:]

    # -- chat ------------------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return self.chat_template_source is not None

    def render_chat(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """`messages` ([{"role": ..., "content": ...}]) rendered by the chat template."""
        import jinja2

        if self.chat_template_source is None:
            raise TokenizerError(
                f"{self.folder}: the tokenizer has no chat template (no chat_template.jinja, no chat_template"
                " in tokenizer_config.json); use a plain prompt"
            )
        if self._template is None:
            self._template = compile_chat_template(self.chat_template_source, f"{self.folder}: chat template")
        context = {**self.special_tokens, **self._missing_tokens(), **variables}
        from rlx_mil.llm.chat_template import ChatTemplateBoundError, render_bounded

        try:
            return render_bounded(self._template, {
                "messages": [dict(m) for m in messages], "tools": None, "documents": None,
                "add_generation_prompt": add_generation_prompt, **context,
            })
        except TokenizerError:
            raise
        except ChatTemplateBoundError as err:
            raise TokenizerError(f"{self.folder}: chat template stopped: {err}") from None
        except jinja2.TemplateError as err:
            raise TokenizerError(f"{self.folder}: the chat template failed: {err}") from None
        except (RecursionError, MemoryError) as err:
            raise TokenizerError(f"{self.folder}: the chat template failed: {type(err).__name__}") from None
        except Exception as err:  # the template's own Python errors: 1/0, 'a' - 1, int('x')...
            raise TokenizerError(f"{self.folder}: the chat template failed: {type(err).__name__}: {err}") from None

    def _missing_tokens(self) -> dict[str, Any]:
        """An undefined value for each special token this tokenizer does not set: false in
        `{% if bos_token %}`, an error when the template writes it (transformers would write
        nothing, and the prompt would silently lack the token)."""
        import jinja2

        folder = self.folder

        class MissingToken(jinja2.Undefined):
            def __str__(self) -> str:
                raise TokenizerError(f"{folder}: the chat template writes {self._undefined_name}, which the"
                                     " tokenizer does not define (tokenizer_config.json / special_tokens_map.json)")

        class AbsentToken(str):
            """A special token the vocabulary lacks: the text would be encoded as plain pieces."""

            def __str__(self) -> str:
                raise TokenizerError(f"{folder}: the chat template writes the special token {str.__str__(self)!r},"
                                     " which the tokenizer's vocabulary does not hold")

        values: dict[str, Any] = {}
        for name in SPECIAL_TOKEN_NAMES:
            text = self.special_tokens.get(name)
            if not isinstance(text, str):
                values[name] = MissingToken(name=name)
            elif self.token_id(text) is None:
                values[name] = AbsentToken(text)
        return values

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, **variables: Any
    ) -> list[int]:
        """Ids of the rendered chat (no special tokens added: the template writes them)."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, **variables)
        return self.encode(text, add_special_tokens=False)

    def prompt_ids(self, prompt: str, *, chat: bool = False, system: str | None = None) -> list[int]:
        """A prompt's ids: plain text encoded as is, or with `chat` one user turn (after an
        optional `system` turn) rendered by the chat template with the generation prompt."""
        if not chat:
            if system is not None:
                raise TokenizerError("a system message needs chat=True (it is a turn of the chat template)")
            return self.encode(prompt)
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": prompt}
        ]
        text = self.render_chat(messages)
        if system is not None and system.strip() not in text:
            raise TokenizerError(f"{self.folder}: the chat template has no system role (it left the system message"
                                 " out of the prompt); drop --system or put it in the prompt")
        return self.encode(text, add_special_tokens=False)
