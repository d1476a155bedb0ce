"""The built-in calibration text for autoN when the user gives none.

A decoder checkpoint with a tokenizer is calibrated on the built-in English text's
*calibration* part (`rlx_mil.compress.builtin_text`; the quality check measures on the other,
held-out part): its token ids run through the checkpoint's plain (stateless) graph, whatever
graph the conversion builds (a stateful decode step takes one token), so autoN's sensitivities
are the mean KL of real next-token distributions and its activation statistics those of text,
not of generated token ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Calibration tokens autoN's measurements score (each measurement is one reference run).
CALIBRATION_TOKENS = 128
#: Token positions a fit (`fit=`) sees of the built-in calibration text, at most: the
#: calibration's positions before the plan's measuring part, then whole sequences of the text
#: after it, each run alone (`fit_sequences`; `rlx_mil.compress.moments` gathers them in bounded
#: memory). The measurements keep scoring `CALIBRATION_TOKENS`. For one layer, more tokens of
#: the same kind of text fit better on held-out text (SmolLM2-135M layer 29's `down_proj`: 0.0033
#: on 128 tokens, 0.0026 on 317); end to end, SmolLM2-135M's Neural Engine `auto4` fitted on 640
#: (docs/compression.md, "The fit gathers its statistics one sequence at a time"). 0: the fit
#: sees the calibration's positions only.
FIT_TOKENS = 640


def calibration_tokens(config: Any) -> int:
    """The built-in calibration's length for `config` (a `CompressionConfig` as its deployment
    form makes it; None: none): `CALIBRATION_TOKENS`, and as many again before them when autoN
    fits codes (`fit=`): the fit sees those, the measurements score the others
    (`rlx_mil.compress.sensitivity.held_apart`)."""
    from rlx_mil.compress.sensitivity import FIT_SHARE

    if config is not None and config.auto is not None and config.fit not in (None, "off"):
        return round(CALIBRATION_TOKENS / (1 - FIT_SHARE))
    return CALIBRATION_TOKENS


def _token_row(ids: Sequence[int]) -> dict[str, np.ndarray]:
    row = np.asarray([list(ids)], np.int32)
    return {"input_ids": row, "attention_mask": np.ones_like(row), "token_type_ids": np.zeros_like(row)}


def fit_sequences(ids: Sequence[int], length: int, seen: int, tokens: int | None = None) -> tuple[dict[str, np.ndarray], ...]:
    """The fit's own sequences of a tokenized text (`CompressionConfig.fit_calibration`): the
    whole `length`-token runs of `ids` after its first `length` (the calibration, of which the fit
    sees `seen` positions), as many as bring the fit to `tokens` positions (`FIT_TOKENS`) and
    the text holds."""
    wanted = max(0, -(-((FIT_TOKENS if tokens is None else tokens) - seen) // length))
    held = max(0, (len(ids) - length) // length)
    return tuple(_token_row(ids[length * (i + 1):length * (i + 2)]) for i in range(min(wanted, held)))


def _plain_calibration(ids: Sequence[int], load: Callable[[int], tuple[Any, Any]], logits: bool = True,
                       ) -> tuple[dict[str, np.ndarray], Any, Any] | None:
    """(the row of `ids`, the plain graph `load(len(ids))` gives, its params); None below 2
    tokens, when `load` finds no plain token graph or (`logits`) it has no logits output."""
    from rlx_mil.errors import RlxMilError
    from rlx_mil.ir.naming import output_names

    if len(ids) < 2:
        return None
    try:
        graph, params = load(len(ids))
    except RlxMilError:  # not a checkpoint with a plain token graph (e.g. a vision model): as before
        if not logits:
            raise
        return None
    if logits and not any("logits" in name for name in output_names(graph)):
        return None
    return _token_row(ids), graph, params


def _with_calibration(config: Any, ids: Sequence[int], load: Callable[[int], tuple[Any, Any]], logits: bool = True) -> Any:
    """`config` (as its deployment form makes it) calibrated on text `ids`: its first
    `calibration_tokens` through the plain graph, and where codes are fitted (`fit=`) the fit's
    own sequences of the text after them (`fit_sequences`); `config` itself without a graph."""
    import dataclasses

    from rlx_mil.compress.sensitivity import held_apart

    found = _plain_calibration(ids[:calibration_tokens(config)], load, logits)
    if found is None:
        return config
    inputs, graph, params = found
    more: tuple[dict[str, np.ndarray], ...] = ()
    if config.fit not in (None, "off"):
        length = inputs["input_ids"].shape[-1]
        first = held_apart(graph, inputs) if config.auto is not None else None
        more = fit_sequences(ids, length, length if first is None else first)
    return dataclasses.replace(config, calibration=inputs, calibration_graph=graph, calibration_params=params,
                               fit_calibration=more)


def _builtin_ids(model_dir: str | os.PathLike[str]) -> list[int] | None:
    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.llm.text import TextTokenizer

    if not (Path(model_dir) / "tokenizer.json").is_file():
        return None
    return list(TextTokenizer(model_dir).encode(builtin_text("calibration")))


def _prefill(model_dir: str | os.PathLike[str], loader: Any) -> Callable[[int], tuple[Any, Any]]:
    if loader is None:
        from rlx_mil.models.pretrained import from_pretrained as loader
    return lambda n: loader(model_dir, "prefill", seq_len=n)


def builtin_calibration(
    model_dir: str | os.PathLike[str], tokens: int = CALIBRATION_TOKENS, loader: Any = None,
) -> tuple[dict[str, np.ndarray], Any, Any] | None:
    """(calibration inputs, the plain graph they feed, its params) for the decoder checkpoint
    in `model_dir`: the built-in calibration text tokenized by its tokenizer (at most `tokens`
    ids) and its stateless graph over them (`loader`, default `from_pretrained`; of its params
    only those shaped for its length, the RoPE tables, are read: the conversion's own weights
    are measured). None without a tokenizer, when the checkpoint has no plain token graph, or
    when the graph has no logits output."""
    ids = _builtin_ids(model_dir)
    return None if ids is None else _plain_calibration(ids[:tokens], _prefill(model_dir, loader))


def with_builtin_calibration(config: Any, formed: Any, model_dir: str | os.PathLike[str], loader: Any = None) -> Any:
    """`config` calibrated on the built-in calibration text as `builtin_calibration` gives it,
    `calibration_tokens(formed)` long (`formed`: `config` as its deployment form makes it), and
    when `formed` fits codes with the fit's own sequences of the text after them
    (`fit_sequences`, `CompressionConfig.fit_calibration`). `config` itself where
    `builtin_calibration` gives None."""
    import dataclasses

    ids = _builtin_ids(model_dir)
    found = formed if ids is None else _with_calibration(formed, ids, _prefill(model_dir, loader))
    if found is formed:
        return config
    return dataclasses.replace(config, calibration=found.calibration, calibration_graph=found.calibration_graph,
                               calibration_params=found.calibration_params, fit_calibration=found.fit_calibration)


def _gguf_ids(path: str | os.PathLike[str], text: str | None) -> list[int] | None:
    import tempfile

    from rlx_mil.compress.builtin_text import builtin_text
    from rlx_mil.coreml.scratch import scratch_dir
    from rlx_mil.llm.text import TextTokenizer
    from rlx_mil.models.gguf.reader import GGUFFile
    from rlx_mil.models.gguf.tokenizer import has_tokenizer, write_tokenizer_files

    file = GGUFFile(path)
    if not has_tokenizer(file):
        return None
    with tempfile.TemporaryDirectory(prefix="rlx_mil_calibration_", dir=scratch_dir()) as folder:
        write_tokenizer_files(file, folder)
        return list(TextTokenizer(folder).encode(builtin_text("calibration") if text is None else text))


def _gguf_prefill(path: str | os.PathLike[str]) -> Callable[[int], tuple[Any, Any]]:
    from rlx_mil.models.gguf import from_gguf
    from rlx_mil.models.gguf.requantize import COMPRESS

    return lambda n: from_gguf(path, "prefill", seq_len=n, requantize=COMPRESS)


def gguf_calibration(
    path: str | os.PathLike[str], text: str | None = None, tokens: int = CALIBRATION_TOKENS,
) -> tuple[dict[str, np.ndarray], Any, Any] | None:
    """`builtin_calibration` for a GGUF file: `text` (else the built-in calibration text)
    tokenized by the tokenizer the file carries, at most `tokens` ids, and the file's plain
    graph over them (its quantized tensors read as float weights, `requantize="compress"`: of
    its params only the RoPE tables are read). None when the file has no tokenizer or the text
    gives fewer than 2 tokens."""
    ids = _gguf_ids(path, text)
    return None if ids is None else _plain_calibration(ids[:tokens], _gguf_prefill(path), logits=False)


def gguf_compress(compress: Any, path: str | os.PathLike[str], *, deploy: str = "plain", text: str | None = None) -> Any:
    """`compress` (any form `rlx_mil.convert` takes; `4bit` / `auto4` as `deploy`'s) with the
    GGUF file's calibration (`gguf_calibration`) when it measures or fits codes (`autoN`,
    `fit=`) and brings none of its own: with `from_gguf(path, ..., requantize="compress")`,
    `convert(graph, params, deploy="ane", compress=gguf_compress("auto4", path, deploy="ane"))`
    is `convert-gguf --deploy ane`. Codes fitted on the built-in text also get the fit's own
    sequences of it (`fit_sequences`); a user's `text` is split as given (`held_apart`).
    Without such a need (or a tokenizer in the file) the config is returned without calibration."""

    from rlx_mil.compress import parse_compress
    from rlx_mil.coreml.deploy import DeployForm
    from rlx_mil.coreml.deploy.compression import form_compression

    config = parse_compress(form_compression(compress, DeployForm.parse(deploy)))
    if config is None or config.calibration is not None or (config.auto is None and config.fit in (None, "off")):
        return config
    ids = _gguf_ids(path, text)
    if ids is None:
        return config
    if text is not None:  # the user's text: its first tokens, split as today
        ids = ids[:calibration_tokens(config)]
    return _with_calibration(config, ids, _gguf_prefill(path), logits=False)
