"""Token generation with a stateful LLM package (see docs/llm.md for the package contract).

`Session(package)` opens a package made by `rlx_mil.convert(..., kv_cache=)` or
`rlx_mil.convert_functions(...)`, keeps its KV-cache state and the write position, and runs
prompts and decode steps through Core ML (`make_state` / `predict(..., state=)`, macOS 15+) or,
anywhere else, through the MIL executor (`rlx_mil.milexec`), which runs the converted program
itself. A prompt is fed in chunks whose lengths are the package's functions (prefill buckets,
largest first). A tail that fits no bucket goes through the decode function one token at a
time, or, when the masks are causal, the model keeps no recurrent state and the tail is longer
than two tokens, through the smallest larger bucket padded at the end, followed by one decode
call for the last token's logits.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx_mil.coreml import metadata
from rlx_mil.coreml.manifest import check_is_package, open_model
from rlx_mil.coreml.metadata import (
    FunctionTable,
    LLMContract,
    PackageMetadataError,
    SplitOutputs,
    read_io_names,
)
from rlx_mil.coreml.output_pieces import OutputPieces, assemble
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.fileio import check_package_tree
from rlx_mil.llm.generation_stats import GenerationStats
from rlx_mil.llm.sampling import GenerationError, check_sampling, pick_token
from rlx_mil.lowering.state.kv_cache import POSITION_INPUT
from rlx_mil.milexec.executor import PrecisionModel
from rlx_mil.milexec.prepared import MEMORY_MODES, MemoryMode
from rlx_mil.units import counted

if TYPE_CHECKING:
    from rlx_mil.llm.text import TextTokenizer

ENGINES = ("auto", "coreml", "milexec", "coreai")


@dataclass(frozen=True)
class FunctionInfo:
    """One function of the package as the session calls it."""

    name: str | None  # None: the single function of a one-function package
    query_len: int
    inputs: frozenset[str]
    logits: str
    vocab: int
    #: logits rows a call returns: 1 (the last position's), or query_len (every position's).
    rows: int = 1


def _logits_output(outputs: Any, pieces: dict[str, OutputPieces]) -> tuple[str, int, int]:
    """(name, vocabulary size, rows) of a function's logits output: `logits` (whole, or in
    pieces, taken as one row), else the first output; rows is the second-to-last dimension."""
    if "logits" in pieces:
        return "logits", pieces["logits"].width, 1
    names = [o.name for o in outputs]
    logits = "logits" if "logits" in names else names[0]
    shape = [int(d) for d in next(o for o in outputs if o.name == logits).type.multiArrayType.shape]
    return logits, shape[-1], shape[-2] if len(shape) >= 2 else 1


def _query_lengths(contract: LLMContract, spec: Any) -> dict[str | None, int]:
    """Function -> tokens per call: the contract's, or for a package keeping only recurrent
    states (no KV cache, so no query length in the contract) each function's `input_ids` width."""
    if contract.max_context is not None:
        return contract.query_lengths()
    names: list[str | None] = list(contract.functions) if contract.functions else [None]
    out: dict[str | None, int] = {}
    for name in names:
        inputs, _ = _features(spec, name)
        ids = next(i for i in inputs if i.name == "input_ids")
        out[name] = int(list(ids.type.multiArrayType.shape)[-1])
    return out


def _position_limit(meta: dict[str, Any], lengths: dict[str | None, int]) -> int:
    """How many tokens a package without a KV cache can take: one more than the largest
    `position_ids` its functions declare (rlx_mil.input_ranges), else no limit."""
    from rlx_mil.input_contract import read_ranges

    limits = [read_ranges(meta, name or "main").get("position_ids") for name in lengths]
    found = [bounds[1] + 1 for bounds in limits if bounds is not None]
    return min(found) if found else sys.maxsize


def _features(spec: Any, function: str | None) -> tuple[Any, Any]:
    if function is None:
        return spec.description.input, spec.description.output
    for desc in spec.description.functions:
        if desc.name == function:
            return desc.input, desc.output
    raise GenerationError(f"the package has no function {function!r}")


class Session:
    """Greedy (or sampled) generation over a stateful package; see the module docstring."""

    def __init__(
        self,
        package: str | os.PathLike[str] | Any,
        *,
        engine: str = "auto",
        precision_model: PrecisionModel = "declared",
        compute_units: str = "ALL",
        memory: MemoryMode = "auto",
    ) -> None:
        import coremltools as ct

        started, started_cpu = time.perf_counter(), time.process_time()
        if engine not in ENGINES:
            raise InvalidOptionError(f"engine must be one of {ENGINES}, got {engine!r}")
        if memory not in MEMORY_MODES:
            raise InvalidOptionError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")
        from rlx_mil.llm.runner import coreml_available

        if engine == "coreml" and not coreml_available():
            raise InvalidOptionError(
                f"engine 'coreml' needs macOS with the Core ML runtime (this is {sys.platform}); use engine 'milexec'"
                " (or 'auto')"
            )
        in_memory: Any = None
        from rlx_mil.llm.chunk_session import open_chunked

        #: A chunked set (docs/deploying.md) runs chunk by chunk; its last chunk gives the logits.
        self._chunks = open_chunked(package)
        from rlx_mil.coreai.asset import AssetHandle, is_asset

        #: An rlx_mil Core AI asset (.aimodel) runs on Apple's Core AI runtime.
        self._asset_path = str(package) if isinstance(package, (str, os.PathLike)) and is_asset(package) else None
        if self._asset_path is not None:
            if engine not in ("auto", "coreai"):
                raise InvalidOptionError(f"a Core AI asset runs with engine 'coreai', not {engine!r}")
            engine = "coreai"
            if not os.path.isdir(self._asset_path):
                raise GenerationError(f"no Core AI asset at {self._asset_path}")
            from rlx_mil.coreai.asset import check_asset

            path = str(check_asset(self._asset_path))
            in_memory = AssetHandle(path)
        elif self._chunks is not None:
            path = str(self._chunks.last_package)
        elif isinstance(package, (str, os.PathLike)):
            check_is_package(Path(package))  # a checkpoint folder or GGUF file: the command converting it
            if not os.path.isdir(package):
                raise GenerationError(f"no model package at {package}")
            path = str(check_package_tree(package))
        else:
            path = str(getattr(package, "package_path", "") or "")
            if not path or not callable(getattr(package, "get_spec", None)):
                raise InvalidOptionError(f"Session takes a .mlpackage path or a converted MLModel, got {type(package).__name__}")
            # The model as converted: its metadata and program are the object's own (the
            # temporary package coremltools wrote predates rlx_mil's metadata).
            in_memory = package
        self.path = str(package) if self._chunks is not None else path
        try:
            handle = in_memory if in_memory is not None else open_model(path, skip_model_load=True)
        except RlxMilError:
            raise
        except Exception as err:
            raise GenerationError(f"cannot open {path} as a Core ML model: {err}") from err
        meta = dict(handle.user_defined_metadata)
        # The contract is the package's own metadata, but a package is user input: any malformed
        # part of it is one typed error, never a raw KeyError/TypeError from deep inside.
        try:
            contract = self._chunks.contract if self._chunks is not None else LLMContract.read(meta)
            if contract is None:
                raise GenerationError(
                    f"{path} is not a stateful LLM package (no '{metadata.LLM}' metadata); convert the checkpoint"
                    " again without --graph-only (`rlx-mil convert-hf` / `convert-gguf` write one by default), or in"
                    " Python with convert_functions(..., kv_cache=\"auto\") (docs/llm.md)"
                )
            #: Recurrent state (conv windows, gated delta-net): every token fed enters it.
            self._recurrent = bool(contract.recurrent_states)
            if contract.max_context is None and not self._recurrent:
                raise PackageMetadataError(f"metadata {metadata.LLM!r} has no max_context and no recurrent states")
            self.contract = contract
            self._mask_kinds = set(contract.mask_kinds)
            spec = handle.get_spec()
            lengths = _query_lengths(contract, spec)
            #: Tokens a session holds: the KV cache's length, or for a package keeping only
            #: recurrent states, the positions its `position_ids` may take (else unbounded).
            self.max_context = contract.max_context or _position_limit(meta, lengths)
            table = FunctionTable.read(meta)
            io_tables = table.io_names if table is not None else {}
            self.functions: list[FunctionInfo] = []
            self._io_names: dict[str | None, Any] = {}
            split = SplitOutputs.read(meta)
            #: Outputs the package returns in pieces (the Neural Engine form's LM head), joined
            #: after each call (`rlx_mil.coreml.output_pieces`).
            self._pieces: dict[str | None, dict[str, OutputPieces]] = {}
            for name, query_len in lengths.items():
                inputs, outputs = _features(spec, name)
                pieces = self._pieces[name] = split.of(name)
                logits, vocab, rows = _logits_output(outputs, pieces)
                names = self._chunks.inputs(name) if self._chunks is not None else frozenset(i.name for i in inputs)
                self.functions.append(FunctionInfo(name, query_len, names, logits, vocab, rows))
                self._io_names[name] = io_tables.get(name) if name is not None else read_io_names(meta)
        except PackageMetadataError as err:
            raise GenerationError(f"{path}: its LLM metadata is malformed ({err}); re-convert the package") from None
        except (ValueError, KeyError, TypeError, AttributeError, StopIteration, IndexError, RecursionError) as err:
            raise GenerationError(
                f"{path}: its LLM metadata is malformed ({type(err).__name__}: {err}); re-convert the package"
            ) from None
        self.functions.sort(key=lambda f: -f.query_len)
        if min(f.query_len for f in self.functions) != 1:
            raise GenerationError(f"{path} has no decode function (one taking a single token); functions: {lengths}")
        self.vocab = self.functions[0].vocab
        self.engine = ("coreml" if sys.platform == "darwin" else "milexec") if engine == "auto" else engine
        self.precision_model = precision_model
        #: the executor's memory mode ("fast", "compact" or "lean"; see rlx_mil.milexec.prepared).
        self.memory: str = memory
        self._tokenizer: TextTokenizer | None = None
        self.stats = GenerationStats()
        units = getattr(ct.ComputeUnit, compute_units, None) if self.engine == "coreml" else None
        if self.engine == "coreml" and units is None:
            raise InvalidOptionError(f"unknown compute_units {compute_units!r}")
        if self._chunks is not None:
            if self.engine == "coreai":
                raise InvalidOptionError("engine 'coreai' runs one package, not a chunked set; use engine 'milexec'")
            self._chunks.open(self.engine, units, memory, precision_model)
            self.memory = self._chunks.memory
        elif self._asset_path is not None:
            from rlx_mil.coreai.asset import AssetProgram

            self._coreai: Any = AssetProgram(self._asset_path)
        elif self.engine == "coreai":
            from rlx_mil.coreai.engine import CoreAIProgram

            # Every function in one Core AI asset (equal weights stored once), fp32 compute.
            self._coreai = CoreAIProgram(path, [f.name for f in self.functions if f.name] or None)
        elif self.engine == "coreml":
            self._models = {
                f.name: ct.models.MLModel(path, compute_units=units, function_name=f.name) for f in self.functions
            }
        else:
            from rlx_mil.milexec.prepared import prepare

            # Prepared once: weights mapped from the package and, in "fast" memory, widened
            # once; every call then runs the plan and writes the KV cache in place.
            program = getattr(in_memory, "_mil_program", None)
            self._prepared = prepare(program if program is not None else path, memory=memory, precision_model=precision_model)
            self.memory = self._prepared.memory
        self.reset()
        #: wall and CPU seconds opening the package took (reading it, preparing the executor).
        self.open_seconds = time.perf_counter() - started
        self.open_cpu_seconds = time.process_time() - started_cpu

    @property
    def chunked(self) -> bool:
        """Whether the package is a chunked set (several packages run one after another)."""
        return self._chunks is not None

    @property
    def executor_program(self) -> Any:
        """The program the MIL executor runs (weights mapped from the package); None for another engine."""
        prepared = getattr(self, "_prepared", None)
        return None if prepared is None else prepared.program

    def io_names_of(self, function: str | None) -> Any:
        """The interface-name mapping of `function` that runs of it take (None: names as stored)."""
        return self._io_names.get(function) or None

    # -- state -----------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Tokens in the cache: the slot the next token is written to."""
        return self._position

    def reset(self) -> None:
        """Forget every token: a fresh (zeroed) cache state."""
        self._position = 0
        #: (function, tokens) of every call since the reset, for inspection.
        self.calls: list[tuple[str, int]] = []
        if self._chunks is not None:
            self._chunks.reset()
        elif self.engine == "coreai":
            self._runtime_states = self._coreai.new_states(self.functions[0].name or None)
        elif self.engine == "coreml":
            any_model = next(iter(self._models.values()))
            self._state = any_model.make_state()
        else:
            self._states: dict[str, np.ndarray] = {}

    def rewind(self, position: int) -> bool:
        """Forget the tokens from `position` on (they are overwritten by the next ones), where
        the package allows it: causal masks and no recurrent state (which has taken them in).
        Returns False, changing nothing, where it does not."""
        if self._recurrent or not self._mask_kinds <= {"Causal", "SlidingWindow"} or self._chunks is not None:
            return False
        if not 0 <= position <= self._position:
            raise InvalidOptionError(f"rewind takes a position in [0, {self._position}], got {position!r}")
        self._position = position
        return True

    # -- calls -----------------------------------------------------------------------------------
    def _feeds(self, fn: FunctionInfo, tokens: Sequence[int]) -> dict[str, np.ndarray]:
        n, pos = len(tokens), self._position
        feeds = {"input_ids": np.asarray([tokens], np.int32)}
        if self.contract.max_context is not None:  # the KV cache's write position
            feeds[POSITION_INPUT] = np.array([pos], np.int32)
        if "position_ids" in fn.inputs:
            feeds["position_ids"] = np.arange(pos, pos + n, dtype=np.int32)[None, :]
        if "attention_mask" in fn.inputs:
            # One key-padding flag per cache slot; slots not written yet are hidden by the model.
            feeds["attention_mask"] = np.ones((1, self.max_context), np.float32)
        unknown = fn.inputs - set(feeds)
        if unknown:
            raise GenerationError(f"function {fn.name or 'main'!r} takes inputs {sorted(unknown)} that a Session cannot fill")
        return feeds

    def _call(self, fn: FunctionInfo, tokens: Sequence[int]) -> np.ndarray:
        """Logits after the last token `[vocab]`; `self._rows` keeps every row returned."""
        feeds = self._feeds(fn, tokens)
        if self._chunks is not None:
            out = self._chunks.run(fn.name, feeds)
        elif self.engine == "coreai":
            out = self._coreai.run(feeds, function_name=fn.name or None, runtime_states=self._runtime_states,
                                   io_names=self._io_names.get(fn.name) or None)
        elif self.engine == "coreml":
            out = self._models[fn.name].predict(feeds, state=self._state)
        else:
            out = self._prepared.run(
                feeds, function_name=fn.name, states=self._states, io_names=self._io_names.get(fn.name) or None
            )
        self._position += len(tokens)
        self.calls.append((fn.name or "main", len(tokens)))
        key = fn.logits
        if self.engine != "coreml":
            key = (self._io_names.get(fn.name) or {}).get("outputs", {}).get(key, key)
        out = assemble(out, self._pieces.get(fn.name, {}))
        logits = np.asarray(out[key], dtype=np.float32)
        self._rows = logits.reshape(-1, logits.shape[-1])
        return self._rows[-1]

    def feed_rows(self, token_ids: Sequence[int]) -> np.ndarray:
        """Write `token_ids` into the cache; return the logits after each of them `[n, vocab]`.
        Buckets whose functions return every position's logits (`all_logits` packages) take a
        chunk per call; every other token goes through the decode function, one call each."""
        tokens = [self._token(t) for t in _token_list(token_ids, "token_ids")]
        if not tokens:
            raise GenerationError("feed_rows needs at least one token id")
        if self._position + len(tokens) > self.max_context:
            raise GenerationError(
                f"the cache holds {self.max_context} tokens: {self._position} are in it and {len(tokens)} more"
                " do not fit (reset() the session, or convert with a larger max_context)"
            )
        whole = [f for f in self.functions if f.query_len == 1 or f.rows == f.query_len]
        rows: list[np.ndarray] = []
        at = 0
        while at < len(tokens):
            fn = next(f for f in whole if f.query_len <= len(tokens) - at)
            self._call(fn, tokens[at:at + fn.query_len])
            rows.append(self._rows)
            at += fn.query_len
        return np.concatenate(rows)

    def feed(self, token_ids: Sequence[int]) -> np.ndarray:
        """Write `token_ids` into the cache; return the logits `[vocab]` after the last one."""
        tokens = [self._token(t) for t in _token_list(token_ids, "token_ids")]
        if not tokens:
            raise GenerationError("feed needs at least one token id")
        if self._position + len(tokens) > self.max_context:
            raise GenerationError(
                f"the cache holds {self.max_context} tokens: {self._position} are in it and {len(tokens)} more"
                " do not fit (reset() the session, or convert with a larger max_context)"
            )
        logits: np.ndarray | None = None
        at = 0
        while at < len(tokens):
            rest = len(tokens) - at
            fn = next(f for f in self.functions if f.query_len <= rest)
            padded = self._padded_bucket(rest) if fn.query_len == 1 and rest > 2 else None
            if padded is not None:
                # The tail fits no bucket exactly: run it padded with copies of its last token
                # (causal masks keep the pads out of the real tokens' rows), then rewrite the
                # last real token with the decode function to get its logits. The pads' slots
                # lie beyond the position and are overwritten by the next tokens.
                self._call(padded, tokens[at:] + [tokens[-1]] * (padded.query_len - rest))
                self._position -= padded.query_len - rest + 1
                logits = self._call(self.functions[-1], tokens[-1:])
                break
            logits = self._call(fn, tokens[at:at + fn.query_len])
            at += fn.query_len
        assert logits is not None
        return logits

    def _padded_bucket(self, rest: int) -> FunctionInfo | None:
        """The smallest prefill bucket that holds `rest` tokens and fits in the cache, when the
        package's masks let a padded call leave the real tokens unchanged (causal ones) and no
        recurrent state would take the pads in."""
        if self._recurrent or not self._mask_kinds <= {"Causal", "SlidingWindow"}:
            return None
        fits = [
            f for f in self.functions
            if f.query_len > rest and self._position + f.query_len <= self.max_context
        ]
        return min(fits, key=lambda f: f.query_len) if fits else None

    def _token(self, token: Any) -> int:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= int(token) < self.vocab:
            raise GenerationError(f"token ids must be ints in [0, {self.vocab}), got {token!r}")
        return int(token)

    def stream(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_ids: Sequence[int] = (),
        until_full: bool = False,
        repeat_penalty: float = 1.0,
        min_p: float | None = None,
    ) -> Iterator[int]:
        """`generate` as an iterator: each new id as soon as it is picked. `until_full` ends
        the stream when the cache is full instead of raising. `self.stats` times the prompt
        and the generated tokens. The prompt continues what the session holds (`reset()`
        starts afresh)."""
        from rlx_mil.llm.sampling import check_penalties, penalize

        check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
        check_penalties(repeat_penalty, min_p)
        prompt = _token_list(prompt_ids, "prompt_ids")
        seen = set(prompt)
        stops = set(_token_list(stop_ids, "stop_ids"))
        rng = np.random.default_rng(seed)
        stats = self.stats = GenerationStats(prompt_tokens=len(prompt))
        start = time.perf_counter()
        try:
            logits = self.feed(prompt)
        finally:  # timed however feeding ends (Ctrl-C: the time spent so far)
            stats.prompt_seconds = time.perf_counter() - start
        stats.prompt_read = True
        start = time.perf_counter()
        for step in range(max_new_tokens):
            token = pick_token(penalize(logits, seen, repeat_penalty), temperature, top_k, rng, top_p, min_p)
            seen.add(token)
            stats.new_tokens += 1
            stats.seconds = time.perf_counter() - start
            yield token
            if token in stops:
                stats.stopped = "stop token"
                return
            if step == max_new_tokens - 1:
                return
            if until_full and self._position >= self.max_context:
                stats.stopped = "context full"
                return
            logits = self.feed([token])

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_ids: Sequence[int] = (),
        repeat_penalty: float = 1.0,
        min_p: float | None = None,
    ) -> list[int]:
        """Feed the prompt, then pick `max_new_tokens` tokens one at a time (greedy when
        `temperature` is 0; otherwise sampled from softmax(logits / temperature), over the
        `top_k` best and the `top_p` nucleus when set). Stops early after a token in
        `stop_ids`. Returns the new ids."""
        return list(self.stream(
            prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
            stop_ids=stop_ids, repeat_penalty=repeat_penalty, min_p=min_p,
        ))

    # -- text ------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> TextTokenizer:
        """The package's tokenizer (its `rlx_mil/tokenizer` item); assign a
        `rlx_mil.llm.text.TextTokenizer` to use another."""
        if self._tokenizer is None:
            from rlx_mil.llm.package_files import tokenizer_folder
            from rlx_mil.llm.text import TextTokenizer

            folder = tokenizer_folder(self._asset_path or self.path)
            if folder is None:
                raise GenerationError(
                    f"{self.path} carries no tokenizer (convert-hf stores the checkpoint's); assign"
                    " session.tokenizer = TextTokenizer(CHECKPOINT_DIR) or use token ids"
                )
            self._tokenizer = TextTokenizer(folder)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: TextTokenizer) -> None:
        self._tokenizer = value

    def stream_text(
        self,
        prompt: str,
        max_new_tokens: int,
        *,
        chat: bool = False,
        system: str | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        repeat_penalty: float = 1.0,
        min_p: float | None = None,
    ) -> Iterator[str]:
        """Generate from the text `prompt` (with `chat`, one user turn rendered by the chat
        template, after a `system` turn when given) from a fresh cache; yield the generated
        text piece by piece. Stops at the tokenizer's stop ids, after `max_new_tokens`, or
        when the cache is full."""
        tokenizer = self.tokenizer
        prompt_ids = tokenizer.prompt_ids(prompt, chat=chat, system=system)
        past = [t for t in prompt_ids if t >= self.vocab]
        if past:
            # a tokenizer.json with more tokens (or added tokens) than the model embeds
            raise GenerationError(
                f"{tokenizer.folder}: the tokenizer encodes the prompt to token id {past[0]}"
                f" ({tokenizer.decode([past[0]], skip_special_tokens=False)!r}), past the model's vocabulary of"
                f" {self.vocab}: the tokenizer does not belong to this model"
            )
        check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
        self.reset()
        ids = self.stream(
            prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
            stop_ids=tokenizer.stop_ids, until_full=True, repeat_penalty=repeat_penalty, min_p=min_p,
        )
        yield from tokenizer.stream_decode(ids)

    def generate_text(
        self,
        prompt: str,
        max_new_tokens: int,
        *,
        chat: bool = False,
        system: str | None = None,
        **sampling: Any,
    ) -> str:
        """`stream_text` joined: the generated text (`sampling`: temperature, top_k, top_p, seed)."""
        return "".join(self.stream_text(prompt, max_new_tokens, chat=chat, system=system, **sampling))


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _token_list(ids: Any, what: str) -> list[int]:
    """`ids` as a list of ints (each range-checked where it is fed), or a typed error."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, np.ndarray)):
        raise InvalidOptionError(f"{what} must be a sequence of token ids (ints), got {type(ids).__name__}")
    bad = [t for t in ids if not _is_int(t)]
    if bad:
        raise InvalidOptionError(f"{what} must hold ints only, got {bad[0]!r}")
    return [int(t) for t in ids]


def new_token_budget(max_context: int, prompt_tokens: int, max_new_tokens: int) -> tuple[int, str | None]:
    """How many new tokens a prompt of `prompt_tokens` leaves room for in a cache of
    `max_context` (the last new token is never fed back): `max_new_tokens` or fewer, and why
    it was capped (None when it was not). A prompt that is empty or does not fit is an error."""
    if prompt_tokens == 0:
        raise GenerationError("the prompt is empty: it encodes to no tokens (this tokenizer adds no BOS token)")
    if prompt_tokens > max_context:
        raise GenerationError(
            f"the prompt has {counted(prompt_tokens, 'token')}, more than the package's context of {max_context};"
            " shorten it (or convert with a larger --max-context)"
        )
    room = max_context - prompt_tokens + 1
    if max_new_tokens <= room:
        return max_new_tokens, None
    return room, (f"-n {max_new_tokens} capped to {room}: the package's context holds {max_context} tokens and the"
                  f" prompt takes {prompt_tokens}")
