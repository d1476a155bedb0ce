"""Chunked packages: one decoder as consecutive `.mlpackage`s cut at layer boundaries, each
weight file under a byte limit (iOS maps at most about 1 GB per file), plus one JSON manifest
(docs/deploying.md, "Chunked packages").

`convert_chunked` plans the chunks from the graph (`rlx_mil.llm.chunk_plan`), cuts every
function's graph at the same boundaries (`rlx_mil.ir.cut`) and converts each chunk as a
stateful multifunction package with the same functions (prefill buckets and decode): the
first chunk embeds the token ids, each later one receives the hidden states of the chunks
before it, the last returns the logits, and each keeps the states of its own layers. The set
is written to a staging folder beside `DIR` and renamed into place only when every chunk is
written, so a failure leaves no half-written `DIR`:

    DIR/<name>_chunk_00.mlpackage ... DIR/<name>_chunk_NN.mlpackage
    DIR/chunks.json     # MANIFEST_FORMAT: order, the IO contract between chunks, the LLM contract

The checkpoint's tokenizer and text files travel once, as the first chunk's package item.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlx_mil import interrupts
from rlx_mil.coreml.metadata import LLMContract, PackageMetadataError
from rlx_mil.errors import ExistingFileError, InvalidOptionError, RlxMilError
from rlx_mil.ir import Graph
from rlx_mil.llm.chunk_plan import (
    TOKEN_INPUT,
    ChunkingError,
    check_same_cut,
    data_inputs,
    plan_chunks,
    planned_param_bytes,
    state_inputs,
)
from rlx_mil.llm.chunk_seal import manifest_digest, package_fingerprint, sealed
from rlx_mil.progress import Progress
from rlx_mil.units import counted, human_bytes, parse_bytes

MANIFEST = "chunks.json"
MANIFEST_FORMAT = "rlx_mil.chunked/1"
_MAX_MANIFEST = 16 << 20


@dataclass(frozen=True)
class ChunkEntry:
    """One chunk of a set, as the manifest records it."""

    package: str
    layers: list[str]
    #: Values received from earlier chunks: name -> index of the chunk that outputs it.
    receives: dict[str, int]
    #: Values later chunks read, output after the chunk's own outputs.
    passes: list[str]
    #: The package's Core ML states (name -> shape).
    states: dict[str, list[int]]
    weight_bytes: int
    planned_bytes: int
    #: Shapes of the passed and received values per function (function -> name -> shape).
    shapes: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    logits: bool = False
    #: The package's fingerprint (`rlx_mil.llm.chunk_seal`); empty in sets written before seals.
    fingerprint: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ChunkedSet:
    """A chunked set read from (or written to) its folder."""

    folder: Path
    name: str
    chunks: list[ChunkEntry]
    functions: dict[str, int]
    default_function: str
    contract: LLMContract
    chunk_bytes: int
    text_chunk: int | None

    def package(self, index: int) -> Path:
        return self.folder / self.chunks[index].package

    def metadata(self) -> dict[str, str]:
        """The first chunk's metadata with the compression reports of every chunk merged (a
        weight stored in two chunks, such as a tied embedding, listed once)."""
        from rlx_mil.compress.report import METADATA_KEY, CompressionReport
        from rlx_mil.coreml.package_info import package_info

        metas = [package_info(self.package(i)).metadata for i in range(len(self.chunks))]
        merged = dict(metas[0])
        reports = [CompressionReport.from_json(m[METADATA_KEY]) for m in metas if METADATA_KEY in m]
        if reports:
            first = reports[0]
            weights: dict[str, Any] = {}
            for report in reports:
                first.kept.update(report.kept)
                for w in report.weights:
                    weights.setdefault(w.name, w)
            first.weights = list(weights.values())
            merged[METADATA_KEY] = first.to_json()
        return merged

    def summary(self) -> dict[str, Any]:
        """What `rlx-mil inspect DIR` shows: the manifest with each chunk's functions and bytes."""
        from rlx_mil.coreml.package_info import package_info

        out = self.to_dict()
        for i, chunk in enumerate(out["chunks"]):
            info = package_info(self.package(i))
            chunk["package_bytes"] = info.package_bytes
            chunk["function_names"] = list(info.functions)
            chunk["inputs"] = sorted({t.name for f in info.functions.values() for t in f["inputs"]})
            chunk["outputs"] = sorted({t.name for f in info.functions.values() for t in f["outputs"]})
        return out

    def to_text(self) -> str:
        info = self.summary()
        llm = self.contract
        lines = [
            f"chunked set: {self.folder} ({counted(len(self.chunks), 'chunk')}, limit {human_bytes(self.chunk_bytes)} per weight file)",
            f"functions: {', '.join(n + ' (' + counted(q, 'token') + ')' for n, q in self.functions.items())}; default {self.default_function}",
            f"LLM contract: {counted(llm.layers, 'layer')}, max_context {llm.max_context}, cache layout {llm.layout},"
            f" masks {', '.join(llm.mask_kinds)}"
            + (f", recurrent states {len(llm.recurrent_states)}" if llm.recurrent_states else ""),
        ]
        for i, chunk in enumerate(info["chunks"]):
            states = ", ".join(f"{n}{v}" for n, v in chunk["states"].items()) or "none"
            lines.append(f"  {i:02d} {chunk['package']}: layers {', '.join(chunk['layers'])};"
                         f" weights {human_bytes(chunk['weight_bytes'])} (planned {human_bytes(chunk['planned_bytes'])})")
            lines.append(f"     functions {', '.join(chunk['function_names'])}; states {states}")
            if chunk["receives"]:
                lines.append("     receives " + ", ".join(f"{n} from chunk {c:02d}" for n, c in chunk["receives"].items()))
            lines.append("     passes " + (", ".join(chunk["passes"]) if chunk["passes"] else "nothing (returns the logits)"))
        if self.text_chunk is not None:
            lines.append(f"text files: the tokenizer item of chunk {self.text_chunk:02d}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT, "name": self.name, "chunk_bytes": self.chunk_bytes,
            "default_function": self.default_function, "functions": self.functions,
            "chunks": [c.to_dict() for c in self.chunks], "llm": self.contract.to_dict(),
            "text": None if self.text_chunk is None else {"chunk": self.text_chunk, "item": "tokenizer"},
        }


def is_chunked_set(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a folder holding a chunked set's manifest."""
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def package_files(path: str | os.PathLike[str]) -> list[Path]:
    """The `.mlpackage`s of `path`: itself, or a chunked set's in order."""
    if not is_chunked_set(path):
        return [Path(path)]
    chunked = read_chunked_set(path)
    return [chunked.package(i) for i in range(len(chunked.chunks))]


def _bad(folder: Path, why: str) -> RlxMilError:
    return RlxMilError(f"{folder / MANIFEST}: not a valid chunked-set manifest ({why}); re-convert the set")


def read_chunked_set(folder: str | os.PathLike[str]) -> ChunkedSet:
    """The manifest of the chunked set in `folder`, checked (every chunk package present,
    every received value passed by an earlier chunk); a typed error naming the fault."""
    from rlx_mil.fileio import read_regular_file

    root = Path(folder)
    raw_bytes = read_regular_file(root / MANIFEST, _MAX_MANIFEST, RlxMilError, "chunked-set manifest")
    try:
        raw = json.loads(raw_bytes.decode("utf-8"))
        if not isinstance(raw, dict) or raw.get("format") != MANIFEST_FORMAT:
            raise _bad(root, f"format is not {MANIFEST_FORMAT!r}")
        if raw.get("digest") is not None and raw["digest"] != manifest_digest(raw):
            raise _bad(root, "edited after the set was written: its digest does not match its content")
        chunks: list[ChunkEntry] = []
        for i, c in enumerate(raw["chunks"]):
            entry = ChunkEntry(
                package=str(c["package"]), layers=[str(x) for x in c["layers"]],
                receives={str(k): int(v) for k, v in c["receives"].items()}, passes=[str(x) for x in c["passes"]],
                states={str(k): [int(d) for d in v] for k, v in c["states"].items()},
                weight_bytes=int(c["weight_bytes"]), planned_bytes=int(c["planned_bytes"]),
                shapes={str(f): {str(k): [int(d) for d in v] for k, v in m.items()} for f, m in c["shapes"].items()},
                logits=bool(c["logits"]), fingerprint=str(c.get("fingerprint") or ""),
            )
            if Path(entry.package).name != entry.package or not entry.package.endswith(".mlpackage"):
                raise _bad(root, f"chunk {i} names package {entry.package!r}, not a .mlpackage in the folder")
            if not (root / entry.package).is_dir():
                raise RlxMilError(f"{root}: chunk {i} package {entry.package} is missing")
            if entry.fingerprint and package_fingerprint(root / entry.package) != entry.fingerprint:
                raise RlxMilError(
                    f"{root}: chunk {i} ({entry.package}) is not the package this set was written with: swapped with"
                    " another chunk, taken from another model, or edited; re-convert the set"
                )
            for name, source in entry.receives.items():
                if not 0 <= source < i or name not in chunks[source].passes:
                    raise _bad(root, f"chunk {i} receives {name!r} from chunk {source}, which does not pass it")
            chunks.append(entry)
        if not chunks or not chunks[-1].logits:
            raise _bad(root, "the last chunk does not return the logits")
        text = raw.get("text")
        contract = LLMContract.from_dict(raw["llm"], f"{MANIFEST} llm")
        return ChunkedSet(
            folder=root, name=str(raw["name"]), chunks=chunks,
            functions={str(k): int(v) for k, v in raw["functions"].items()},
            default_function=str(raw["default_function"]), contract=contract, chunk_bytes=int(raw["chunk_bytes"]),
            text_chunk=None if text is None else int(text["chunk"]),
        )
    except PackageMetadataError as err:  # (an RlxMilError that does not name the folder)
        raise _bad(root, str(err)) from None
    except RlxMilError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise _bad(root, f"{type(err).__name__}: {err}") from None


def check_output_folder(output: Path, overwrite: bool) -> None:
    """Refuse a bad output folder for a chunked set before any work."""
    if output.suffix == ".mlpackage":
        raise InvalidOptionError(f"a chunked set is written to a folder (-o DIR), not a .mlpackage: {str(output)!r}")
    if (output.exists() or output.is_symlink()) and not overwrite:
        raise ExistingFileError(f"{output} exists; pass overwrite=True (--overwrite) to replace it")
    if output.exists() and not output.is_dir():
        raise InvalidOptionError(f"{output} exists and is not a folder")


def _merged_contract(contracts: list[LLMContract], functions: Mapping[str, int], default: str) -> LLMContract:
    from dataclasses import replace

    with_cache = [c for c in contracts if c.max_context is not None]
    base = with_cache[0] if with_cache else contracts[0]
    return replace(
        base, layers=sum(c.layers for c in contracts), states={},
        caches={k: v for c in contracts for k, v in c.caches.items()},
        recurrent_states={k: v for c in contracts for k, v in c.recurrent_states.items()},
        mask_kinds=sorted({k for c in with_cache for k in c.mask_kinds}) or base.mask_kinds,
        neural_engine_notes=sorted({n for c in contracts for n in c.neural_engine_notes}),
        query_len=None, default_function=default,
    ).joined(default, dict(functions))


def convert_chunked(
    graphs: Mapping[str, Graph],
    params: Mapping[str, Any],
    output: str | os.PathLike[str],
    *,
    chunk_bytes: int | str,
    max_context: int,
    overwrite: bool = False,
    name: str | None = None,
    prepare_first: Callable[[Any], Any] | None = None,
    progress: Progress | None = None,
    **convert_options: Any,
) -> ChunkedSet:
    """Write `graphs` (function name -> decode graph; "decode" among them) as a chunked set in
    the folder `output` (see the module docstring). `prepare_first(model)` adds the text items
    and model description to the first chunk before it is saved (its description is copied to
    the others). `convert_options` are `rlx_mil.convert_functions`' (precision, compress, ...)."""
    from rlx_mil.api import convert_functions, save
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.ir.cut import cut_graph

    limit = parse_bytes(chunk_bytes, "chunk_bytes")
    out = Path(output)
    check_output_folder(out, overwrite)
    if "decode" not in graphs:
        raise InvalidOptionError(f"a chunked set needs a 'decode' function, got {sorted(graphs)}")
    stages = progress or Progress(enabled=False)
    decode = graphs["decode"]
    sizes = planned_param_bytes(decode, precision=convert_options.get("precision", "fp16"),
                                compress=convert_options.get("compress"), target=convert_options.get("target", "iOS18"))
    plan = plan_chunks(decode, sizes, limit)
    for fn, graph in graphs.items():
        check_same_cut(plan, fn, graph)
    count = len(plan.groups)
    stages.note(f"  {counted(count, 'chunk')} of {', '.join(str(g) for g in plan.groups)} layer segments, planned at"
                f" {', '.join(human_bytes(b) for b in plan.planned_bytes)} (limit {human_bytes(limit)})")
    pieces = {fn: cut_graph(g, data_inputs(g), plan.groups, shared_inputs={TOKEN_INPUT}) for fn, g in graphs.items()}
    stem = name or out.name
    out.parent.mkdir(parents=True, exist_ok=True)
    from rlx_mil.coreml.saving import remove_stale_staging, staging_prefix

    remove_stale_staging(out)  # what a killed conversion left (its set completed or dropped)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(out, os.getpid()), dir=out.parent))
    try:
        folder = staging / out.name
        folder.mkdir()
        entries: list[ChunkEntry] = []
        contracts: list[LLMContract] = []
        description: dict[str, Any] = {}
        for c in range(count):
            package = f"{stem}_chunk_{c:02d}.mlpackage"
            functions = {fn: parts[c].graph for fn, parts in pieces.items()}
            stateful = bool(state_inputs(functions["decode"]))
            options = dict(convert_options, kv_cache="auto", max_context=max_context) if stateful else \
                {k: v for k, v in convert_options.items() if k != "cache_layout"}
            stages.note(f"  chunk {c + 1}/{count}: {', '.join(plan.layers(c))}")
            needed = frozenset().union(*(parts[c].params for parts in pieces.values()))
            model = convert_functions(functions, ParamsView(params, needed), default_function="decode", progress=stages,
                                      **options)
            if c == 0 and prepare_first is not None:
                prepare_first(model)
                description = {k: getattr(model, k) for k in ("author", "license", "short_description", "version")}
            else:
                for key, value in description.items():
                    if value:
                        setattr(model, key, value)
            stages.begin(f"writing chunk {c + 1}/{count}")
            save(model, folder / package)
            del model
            info = package_info(folder / package)
            stages.end(f"{package}: {human_bytes(info.weight_bytes)} of weights")
            if info.weight_bytes >= limit:
                raise ChunkingError(
                    f"chunk {c} ({', '.join(plan.layers(c))}) has a weight file of {info.weight_bytes} bytes, not under"
                    f" the limit {limit}: the plan's estimate ({plan.planned_bytes[c]} bytes) was too low"
                )
            contract = LLMContract.read(info.metadata)
            if contract is not None:
                contracts.append(contract)
            decode_piece = pieces["decode"][c]
            shapes = {
                fn: {n: list(parts[c].graph.shape_of(_named(parts[c].graph, n)).sizes())
                     for n in [*parts[c].received, *parts[c].passed]}
                for fn, parts in pieces.items()
            }
            entries.append(ChunkEntry(
                package=package, layers=plan.layers(c), receives=dict(decode_piece.received),
                passes=list(decode_piece.passed), states=dict(contract.states) if contract is not None else {},
                weight_bytes=info.weight_bytes, planned_bytes=plan.planned_bytes[c], shapes=shapes,
                logits=c == count - 1, fingerprint=package_fingerprint(folder / package),
            ))
        if not contracts:
            raise ChunkingError("no chunk keeps a state: a chunked set is made of stateful decoder packages")
        lengths = {fn: _query_len(g) for fn, g in graphs.items()}
        chunked = ChunkedSet(out, stem, entries, lengths, "decode", _merged_contract(contracts, lengths, "decode"),
                             limit, 0 if prepare_first is not None else None)
        (folder / MANIFEST).write_text(json.dumps(sealed(chunked.to_dict()), indent=2) + "\n", encoding="utf-8")
        _move_into_place(folder, out, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return read_chunked_set(out)


class ParamsView(Mapping[str, Any]):
    """The entries `names` of a params mapping, read through (no copy); prequantized weights
    (a GGUF file's) restricted the same way."""

    def __init__(self, params: Mapping[str, Any], names: frozenset[str]) -> None:
        self._params = params
        self._names = [n for n in params if n in names]

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        return self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def prequantized_weights(self) -> Mapping[str, Any]:
        get = getattr(self._params, "prequantized_weights", None)
        carried = get() if callable(get) else {}
        return {k: v for k, v in carried.items() if k in self._names}


def _named(graph: Graph, name: str) -> int:
    from rlx_mil.ir.ops import Input

    for node in graph:
        if node.name == name or (isinstance(node.op, Input) and node.op.name == name):
            return node.id
    raise ChunkingError(f"graph {graph.name!r} has no value {name!r}")


def _query_len(graph: Graph) -> int:
    return int(graph.shape_of(_named(graph, TOKEN_INPUT)).sizes()[-1])


def _move_into_place(folder: Path, out: Path, staging: Path) -> None:
    """As `rlx_mil.save` does for one package: the staged set marked complete, then swapped
    (or renamed) into place, so a crash leaves the old set or the new one."""
    from rlx_mil.coreml.saving import COMPLETE_FILE, STAGED_OLD, exchange, fsync_tree
    from rlx_mil.fileio import apply_default_modes

    apply_default_modes(folder)
    fsync_tree(folder)
    (staging / COMPLETE_FILE).write_bytes(b"")
    interrupts.check()  # a Ctrl-C a library swallowed: nothing is installed
    if out.is_dir() and not out.is_symlink() and exchange(folder, out):
        return  # the old set is now in the staging folder, removed with it
    if out.exists() or out.is_symlink():
        os.replace(out, staging / STAGED_OLD)
    try:
        os.replace(folder, out)
    except OSError:
        if (staging / STAGED_OLD).exists():
            os.replace(staging / STAGED_OLD, out)
        raise
