"""Quality of a stateful LLM package on a text: perplexity, and against a reference the mean
KL divergence, top-1 agreement and perplexity ratio (`rlx-mil eval`).

The text is encoded with the package's tokenizer (special tokens as the tokenizer adds them,
e.g. one BOS at the start) and cut into windows of the package's context (`max_context`
tokens). Each window runs teacher-forced from an empty cache, one token per decode call; every
token of a window but its first is predicted from the ones before it, so a text of `T` tokens
in `W` windows scores `T - W` tokens. Perplexity is exp(mean negative log-likelihood) of the
scored tokens. A reference (another package, or the checkpoint folder or GGUF file evaluated by
the NumPy reference interpreter in float32) sees the same windows; per scored position `KL(reference ||
package)` of the next-token distributions is averaged, top-1 agreement is the fraction of
positions where both pick the same most likely token, and the ratio is package perplexity /
reference perplexity (1.0: no loss). Every one of these is computed by `rlx_mil.compress.quality`
(`DecoderTally`, `total_nll`), the definitions the conversion's quality check and the speech
eval use, over blocks of `BLOCK_POSITIONS` positions.

With a token limit only as much of the text is read and encoded as the first tokens need: a
prefix of the text, encoded, keeps its first `max_tokens` ids once it yields `PREFIX_MARGIN`
more than that (the ids near the cut, which may change with what follows, are never kept); a
prefix that yields fewer grows fourfold, up to the whole text. A megabyte on one line is then
as quick to start scoring as a paragraph.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.compress.quality import DecoderTally, total_nll
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.units import counted

#: Tokens `rlx-mil eval` scores when --max-tokens is not given (a warning says so when the text
#: has more): minutes on the NumPy executor for a 135M model, not hours for a long file.
DEFAULT_EVAL_TOKENS = 512
#: Ids past the limit an encoded prefix must yield before its first `max_tokens` are kept.
PREFIX_MARGIN = 64
#: Largest text file read as a whole (a bounded prefix is read under a token limit).
MAX_TEXT_BYTES = 1 << 30

#: Positions judged together (both sides' logits held for this many positions at a time).
BLOCK_POSITIONS = 64

#: (window ids) -> an iterator of next-token logits rows, one per predicted position.
LogitSource = Callable[[Sequence[int]], Iterator[np.ndarray]]


@dataclass
class EvalResult:
    """What `evaluate_text` measured (reference fields None without a reference)."""

    tokens: int
    scored: int
    windows: int
    window: int
    perplexity: float
    mean_nll: float
    reference: str | None = None
    reference_perplexity: float | None = None
    perplexity_ratio: float | None = None
    mean_kl: float | None = None
    top1_agreement: float | None = None
    #: Top-1 agreement where the reference's best logit beats its second by >= 0.5 (raw top-1
    #: on a small model is dominated by near-ties), and how many positions those were.
    confident_top1_agreement: float | None = None
    confident_positions: int | None = None
    #: Whether the text had more tokens than were scored (a token limit cut it).
    truncated: bool = False

    def to_text(self) -> str:
        lines = [
            f"tokens:      {self.tokens} in {counted(self.windows, 'window')} of up to {self.window}; {self.scored} scored",
            f"perplexity:  {self.perplexity:.4f} (mean NLL {self.mean_nll:.5f} nats)",
        ]
        if self.reference is not None:
            lines += [
                f"reference:   {self.reference}",
                f"  perplexity {self.reference_perplexity:.4f}, ratio {self.perplexity_ratio:.5f}",
                f"  mean KL(reference || package) {self.mean_kl:.6g} nats",
                f"  top-1 agreement {self.top1_agreement:.4%}",
                f"  confident top-1 agreement {self.confident_top1_agreement:.4%}"
                f" ({counted(self.confident_positions or 0, 'position')} with a top-2 gap >= 0.5)",
            ]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def windows(ids: Sequence[int], size: int) -> list[list[int]]:
    """`ids` cut into consecutive windows of `size` tokens (a last window of one token, which
    predicts nothing, is dropped)."""
    if size < 2:
        raise InvalidOptionError(f"a window holds at least 2 tokens, got {size}")
    parts = [list(ids[i:i + size]) for i in range(0, len(ids), size)]
    return [p for p in parts if len(p) >= 2]


def session_logits(
    session: Any, progress: Callable[[], None] | None = None, *, chunked: bool = True
) -> LogitSource:
    """Teacher-forced next-token logits of a `Session`, from an empty cache at the start of
    every window: whole buckets per call where the package returns every position's logits
    (`chunked`), else one decode call per token."""

    def rows(window: Sequence[int]) -> Iterator[np.ndarray]:
        session.reset()
        if chunked and any(f.query_len > 1 and f.rows == f.query_len for f in session.functions):
            for row in session.feed_rows(window[:-1]):
                yield row
                if progress is not None:
                    progress()
            return
        for token in window[:-1]:
            yield session.feed([token])
            if progress is not None:
                progress()

    return rows


def checkpoint_logits(model_dir: str | os.PathLike[str], loader: Any = None) -> LogitSource:
    """Next-token logits of the checkpoint's plain graph (`loader`, default `from_pretrained`;
    `from_gguf` for a GGUF file: llama.cpp's decode of its tensors), run by the NumPy reference
    in float32 over each whole window (one graph per window length)."""
    from rlx_mil.models.pretrained import from_pretrained
    from rlx_mil.reference import evaluate

    load = loader or from_pretrained

    def rows(window: Sequence[int]) -> Iterator[np.ndarray]:
        graph, params = load(model_dir, "prefill", seq_len=len(window) - 1)
        out = evaluate(graph, {"input_ids": np.asarray([window[:-1]], np.int32)}, params)
        logits = np.asarray(out["logits"], np.float32)
        yield from logits.reshape(-1, logits.shape[-1])

    return rows


def evaluate_text(
    package_rows: LogitSource,
    ids: Sequence[int],
    window: int,
    reference_rows: LogitSource | None = None,
    reference: str | None = None,
) -> EvalResult:
    """Perplexity of `ids` under `package_rows` (and the comparison with `reference_rows`),
    windowed to `window` tokens; see the module docstring."""
    parts = windows(ids, window)
    if not parts:
        raise InvalidOptionError(f"the text has {counted(len(ids), 'token')}; perplexity needs at least 2")
    tally = DecoderTally()
    nll = 0.0  # without a reference, the package's own NLL (with one, the tally holds it)
    scored = 0
    for part in parts:
        targets = part[1:]
        ref_iter = reference_rows(part) if reference_rows is not None else None
        block: list[np.ndarray] = []
        ref_block: list[np.ndarray] = []
        for i, row in enumerate(package_rows(part)):
            block.append(np.array(row).reshape(-1))  # a copy: a session may reuse its buffer
            vocab = block[-1].size
            if not 0 <= targets[i] < vocab:
                raise RlxMilError(f"token id {targets[i]} is outside the package's vocabulary of {vocab}")
            if ref_iter is not None:
                ref_block.append(np.array(next(ref_iter)).reshape(-1))
                if ref_block[-1].size != vocab:
                    raise RlxMilError(f"the reference's vocabulary ({ref_block[-1].size}) differs from the package's ({vocab})")
            if len(block) == BLOCK_POSITIONS or i == len(targets) - 1:
                next_ids = targets[i + 1 - len(block):i + 1]
                if ref_iter is not None:
                    tally.add(np.stack(ref_block), np.stack(block), next_ids)
                else:
                    nll += total_nll(np.stack(block), next_ids)
                scored += len(block)
                block, ref_block = [], []
    if reference_rows is not None and tally.nll_compressed is not None:
        nll = tally.nll_compressed
    mean_nll = nll / scored
    result = EvalResult(
        tokens=len(ids), scored=scored, windows=len(parts), window=window, perplexity=math.exp(mean_nll),
        mean_nll=mean_nll,
    )
    if reference_rows is not None:
        judged = tally.result()
        result.reference = reference
        result.reference_perplexity = judged.perplexity_reference
        result.perplexity_ratio = judged.perplexity_ratio
        result.mean_kl = judged.mean_kl
        result.top1_agreement = judged.top1
        result.confident_top1_agreement = judged.top1_confident
        result.confident_positions = judged.confident_positions
    return result


def evaluate_package(
    package: str | os.PathLike[str],
    text: str | Path,
    *,
    reference: str | os.PathLike[str] | None = None,
    max_tokens: int | None = None,
    engine: str = "auto",
    compute_units: str = "ALL",
    progress: Callable[[int], Callable[[], None]] | None = None,
    warn_cut: bool = False,
) -> EvalResult:
    """`rlx-mil eval` from Python: perplexity of `text` (a string, or a `Path` to a UTF-8 text
    file) under the package (its own tokenizer), with `reference` (a package, a Hugging Face
    checkpoint folder or a GGUF file) the comparison too. Only the first `max_tokens` tokens are used when
    given (and only the part of the text they need is read and encoded); `warn_cut` warns
    before scoring when that leaves tokens out. `progress(total)` returns the callback called
    once per scored token."""
    from rlx_mil.llm.generate import Session

    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2):
        raise InvalidOptionError(f"max_tokens must be an int >= 2, got {max_tokens!r}")
    read = _file_prefix(text) if isinstance(text, Path) else _string_prefix(text)
    start, whole = read(4096)  # an empty or binary file fails here, before the package loads
    if whole and not start:
        raise InvalidOptionError("the text is empty; perplexity needs at least 2 tokens")
    if reference is not None and not Path(reference).exists():  # before the package loads
        raise InvalidOptionError(f"reference {reference}: no such checkpoint folder or package")
    session = Session(package, engine=engine, compute_units=compute_units)
    ids, cut = encode_limited(session.tokenizer.encode, read, max_tokens)
    if cut and warn_cut:
        warnings.warn(f"scoring the first {counted(max_tokens or 0, 'token')} of {'the text' if isinstance(text, str) else text};"
                      " it has more (--max-tokens N scores N, --max-tokens all the whole text)", UserWarning,
                      stacklevel=2)
    window = session.max_context
    ref_rows: LogitSource | None = None
    ref_vocab: int | None
    if reference is not None:
        ref = Path(reference)
        if ref.is_file() and ref.suffix.lower() == ".gguf":  # the float model its codes decode to
            from rlx_mil.models.gguf import from_gguf
            from rlx_mil.models.gguf.metadata import decoder_spec
            from rlx_mil.models.gguf.reader import GGUFFile

            ref_vocab = int(decoder_spec(GGUFFile(ref)).vocab_size)
            ref_rows = checkpoint_logits(ref, loader=from_gguf)
        elif (ref / "config.json").is_file():
            ref_vocab = _checkpoint_vocab(ref)
            ref_rows = checkpoint_logits(ref)
        else:
            ref_session = Session(ref, engine=engine, compute_units=compute_units)
            ref_vocab = ref_session.vocab
            window = min(window, ref_session.max_context)
            ref_rows = session_logits(ref_session)
        if ref_vocab is not None and ref_vocab != session.vocab:  # before any window is scored
            raise RlxMilError(f"{ref}: the reference's vocabulary ({ref_vocab}) differs from the package's"
                              f" ({session.vocab}): it is not a checkpoint or package of this model")
    total = sum(len(p) - 1 for p in windows(ids, window))
    tick = progress(total) if progress is not None else None
    result = evaluate_text(session_logits(session, tick), ids, window, ref_rows,
                           None if reference is None else str(reference))
    result.truncated = cut
    return result


#: (characters or bytes wanted, None for all) -> (that much of the text, whether it is all of it).
TextPrefix = Callable[[int | None], tuple[str, bool]]


def encode_limited(encode: Callable[[str], list[int]], read: TextPrefix,
                   max_tokens: int | None) -> tuple[list[int], bool]:
    """The first `max_tokens` ids of the encoded text (all without a limit) and whether the text
    has more, reading and encoding growing prefixes (see the module docstring)."""
    if max_tokens is None:
        return list(encode(read(None)[0])), False
    size = 16 * max_tokens + 4096
    while True:
        part, whole = read(size)
        ids = list(encode(part))
        if whole:
            return ids[:max_tokens], len(ids) > max_tokens
        if len(ids) >= max_tokens + PREFIX_MARGIN:
            return ids[:max_tokens], True
        size *= 4


def _string_prefix(text: str) -> TextPrefix:
    if not isinstance(text, str):
        raise InvalidOptionError(f"the text must be a str or a Path, got {type(text).__name__}")
    return lambda size: (text, True) if size is None or size >= len(text) else (text[:size], False)


def _file_prefix(path: Path) -> TextPrefix:
    """Prefixes of a UTF-8 text file: its first `size` bytes (a character cut at the end is
    left out), all of it (at most MAX_TEXT_BYTES) for None."""
    from rlx_mil.fileio import open_regular_file

    stream, _ = open_regular_file(path, "text file")
    stream.close()  # opened once up front: a missing file or a FIFO is refused before the package loads

    def read(size: int | None) -> tuple[str, bool]:
        limit = MAX_TEXT_BYTES if size is None else min(size, MAX_TEXT_BYTES)
        stream, now = open_regular_file(path, "text file")
        with stream:
            data = stream.read(limit + 1)
        whole = len(data) <= limit
        if not whole and size is None:
            raise RlxMilError(f"{path}: text file has {now} bytes, more than the limit of {MAX_TEXT_BYTES}"
                              " (give --max-tokens to score its beginning)")
        try:
            decoder = codecs.getincrementaldecoder("utf-8")()
            text = decoder.decode(data if whole else data[:limit], final=whole)
        except UnicodeDecodeError as err:
            raise RlxMilError(f"{path}: not UTF-8 text ({err})") from None
        return text, whole

    return read


def _checkpoint_vocab(folder: Path) -> int | None:
    """The vocabulary size a checkpoint folder's config.json declares (None when unreadable:
    the reference's own loading then says why)."""
    from rlx_mil.models.families import model_spec
    from rlx_mil.models.hf_config import read_config

    try:
        vocab = getattr(model_spec(read_config(folder)), "vocab_size", None)
    except RlxMilError:
        return None
    return vocab if isinstance(vocab, int) else None
