"""Every `rlx_mil.*` key rlx_mil writes into a package's user-defined metadata, and the typed
records behind the structured ones.

A package is user input when it is read back: every reader goes through `read` methods here,
which turn any malformed value into one `PackageMetadataError` naming the key, never a raw
KeyError or TypeError from deep inside a reader.

| key | value |
|---|---|
| `rlx_mil.io_names` | `{"inputs": {interface: IR name}, "outputs": {...}}` (`rlx_mil.ir.naming`) |
| `rlx_mil.graph`, `.target`, `.precision`, `.version` | plain strings |
| `rlx_mil.llm` | the `LLMContract` of a stateful LLM package (docs/llm.md) |
| `rlx_mil.functions` | `FunctionTable`: the default function and each function's IO names |
| `rlx_mil.compression` | the `CompressionReport` (`rlx_mil.compress.report`) |
| `rlx_mil.input_ranges` | `{function: {input: [min, max]}}`: value ranges of integer inputs (`rlx_mil.input_contract`) |
| `rlx_mil.split_outputs` | `{function: {output: {"axis", "pieces", "sizes"}}}`: outputs computed as pieces (`SplitOutputs`) |
| `rlx_mil.deploy` | the deployment form, `"gpu"` or `"ane"` (`rlx_mil.coreml.deploy`); absent: `"plain"` |
| `rlx_mil.source` | `{"name", "named_by", "architecture", "parameters"}`: the source model's name, where that name came from, its architecture and parameter count (`ModelSource`) |
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from typing import Any

from rlx_mil.compress.report import METADATA_KEY as COMPRESSION
from rlx_mil.coreml.deploy.forms import DeployForm
from rlx_mil.coreml.output_pieces import OutputPieces
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.input_contract import INPUT_RANGES_METADATA_KEY
from rlx_mil.ir.naming import IO_NAMES_METADATA_KEY as IO_NAMES

#: Every key of rlx_mil's starts with this.
PREFIX = "rlx_mil."

GRAPH = "rlx_mil.graph"
TARGET = "rlx_mil.target"
PRECISION = "rlx_mil.precision"
VERSION = "rlx_mil.version"
LLM = "rlx_mil.llm"
FUNCTIONS = "rlx_mil.functions"
INPUT_RANGES = INPUT_RANGES_METADATA_KEY
DEPLOY = "rlx_mil.deploy"
SPLIT_OUTPUTS = "rlx_mil.split_outputs"
SOURCE = "rlx_mil.source"

#: Every key rlx_mil writes.
KEYS = (IO_NAMES, GRAPH, TARGET, PRECISION, VERSION, LLM, FUNCTIONS, COMPRESSION, INPUT_RANGES, DEPLOY, SPLIT_OUTPUTS,
        SOURCE)
#: Keys that describe one function and are merged per function when functions are joined.
PER_FUNCTION_KEYS = (IO_NAMES, LLM, INPUT_RANGES, SPLIT_OUTPUTS)

#: How deep a metadata JSON value may nest (a hostile package could nest it past the stack).
MAX_DEPTH = 8


class PackageMetadataError(RlxMilError):
    """A package's `rlx_mil.*` metadata is malformed."""


def _depth(text: str) -> int:
    deepest = level = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped = not escaped and ch == "\\"
            if ch == '"' and not escaped:
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def read_json(metadata: Mapping[str, Any], key: str) -> Any:
    """The JSON value stored under `key`, or None where the key is absent."""
    text = metadata.get(key)
    if text is None:
        return None
    if not isinstance(text, str):
        raise PackageMetadataError(f"metadata {key!r} must be a JSON string, got {type(text).__name__}")
    if _depth(text) > MAX_DEPTH:
        raise PackageMetadataError(f"metadata {key!r} nests deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except ValueError as err:
        raise PackageMetadataError(f"metadata {key!r} is not valid JSON: {err}") from None


def _want(value: Any, kind: type | tuple[type, ...], key: str, what: str) -> Any:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise PackageMetadataError(f"metadata {key!r}: {what} must be {_kind_name(kind)}, got a bool")
    if not isinstance(value, kind):
        raise PackageMetadataError(f"metadata {key!r}: {what} must be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def _str_map(value: Any, key: str, what: str) -> dict[str, str]:
    _want(value, dict, key, what)
    for k, v in value.items():
        _want(v, str, key, f"{what}[{k!r}]")
    return dict(value)


@dataclass
class FunctionContract:
    """What one function of a stateful LLM package takes per call (None: the package keeps
    only recurrent states, whose functions take the graph's own token count)."""

    query_len: int | None


@dataclass
class LLMContract:
    """The contract of a stateful LLM package: how its KV cache (and recurrent) states are laid
    out and fed. Written by `rlx_mil.convert(..., kv_cache=)` / `convert_functions`, read by
    `rlx_mil.generate.Session`, `rlx-mil inspect` and Swift callers (docs/llm.md)."""

    cache_position: str | None
    max_context: int | None
    query_len: int | None
    layout: str
    layers: int
    states: dict[str, list[int]] = field(default_factory=dict)
    caches: dict[str, str] = field(default_factory=dict)
    neural_engine_notes: list[str] = field(default_factory=list)
    mask_kinds: list[str] = field(default_factory=lambda: ["None"])
    recurrent_states: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Set on a multifunction package: the function Core ML runs by default, and each one's
    #: query length (`query_len` above is then the default function's).
    default_function: str | None = None
    functions: dict[str, FunctionContract] | None = None
    #: Keys a newer rlx_mil wrote that this one does not know, kept as they are.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Any, key: str = LLM) -> LLMContract:
        _want(raw, dict, key, "the contract")
        known = {f.name for f in fields(cls)} - {"extra"}
        for required in ("layout", "layers"):
            if required not in raw:
                raise PackageMetadataError(f"metadata {key!r} has no {required!r}")
        functions = raw.get("functions")
        if functions is not None:
            _want(functions, dict, key, "functions")
            functions = {
                str(name): FunctionContract(_want(_want(f, dict, key, f"functions[{name!r}]").get("query_len"),
                                                  (int, type(None)), key, f"functions[{name!r}].query_len"))
                for name, f in functions.items()
            }
        states = _want(raw.get("states", {}), dict, key, "states")
        for name, shape in states.items():
            _want(shape, list, key, f"states[{name!r}]")
            for d in shape:
                _want(d, int, key, f"states[{name!r}] dims")
        recurrent = _want(raw.get("recurrent_states", {}), dict, key, "recurrent_states")
        contract = cls(
            cache_position=_want(raw.get("cache_position"), (str, type(None)), key, "cache_position"),
            max_context=_want(raw.get("max_context"), (int, type(None)), key, "max_context"),
            query_len=_want(raw.get("query_len"), (int, type(None)), key, "query_len"),
            layout=_want(raw["layout"], str, key, "layout"),
            layers=_want(raw["layers"], int, key, "layers"),
            states={str(k): list(v) for k, v in states.items()},
            caches=_str_map(raw.get("caches", {}), key, "caches"),
            neural_engine_notes=[str(n) for n in _want(raw.get("neural_engine_notes", []), list, key, "neural_engine_notes")],
            mask_kinds=[str(k) for k in _want(raw.get("mask_kinds", ["None"]), list, key, "mask_kinds")],
            recurrent_states={str(k): _str_map(v, key, f"recurrent_states[{k!r}]") for k, v in recurrent.items()},
            default_function=_want(raw.get("default_function"), (str, type(None)), key, "default_function"),
            functions=functions,
            extra={k: v for k, v in raw.items() if k not in known},
        )
        return contract

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> LLMContract | None:
        """The contract in a package's metadata, None where the package has none."""
        raw = read_json(metadata, LLM)
        return None if raw is None else cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cache_position": self.cache_position, "max_context": self.max_context, "query_len": self.query_len,
            "layout": self.layout, "layers": self.layers, "states": self.states, "caches": self.caches,
            "neural_engine_notes": self.neural_engine_notes, "mask_kinds": self.mask_kinds,
            "recurrent_states": self.recurrent_states,
        }
        if self.functions is not None:
            out["default_function"] = self.default_function
            out["functions"] = {name: {"query_len": f.query_len} for name, f in self.functions.items()}
        return {**self.extra, **out}

    def write(self, metadata: MutableMapping[str, str]) -> None:
        metadata[LLM] = json.dumps(self.to_dict())

    def query_lengths(self) -> dict[str | None, int]:
        """Function name (None: the package's only function) -> tokens it takes per call."""
        lengths: dict[str | None, int | None] = (
            {name: f.query_len for name, f in self.functions.items()} if self.functions else {None: self.query_len}
        )
        missing = sorted(str(name) for name, n in lengths.items() if n is None)
        if missing:
            raise PackageMetadataError(
                f"metadata {LLM!r} gives no query length for {', '.join(missing)} (a package without a KV cache)"
            )
        return {name: n for name, n in lengths.items() if n is not None}

    def joined(self, default_function: str, lengths: Mapping[str, int | None]) -> LLMContract:
        """This (the default function's) contract as the contract of a multifunction package."""
        from dataclasses import replace

        return replace(self, query_len=None, default_function=default_function,
                       functions={name: FunctionContract(n) for name, n in lengths.items()})


@dataclass
class FunctionTable:
    """`rlx_mil.functions`: the default function of a multifunction package and the IO names
    of each function."""

    default: str
    io_names: dict[str, dict[str, dict[str, str]]]

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> FunctionTable | None:
        raw = read_json(metadata, FUNCTIONS)
        if raw is None:
            return None
        _want(raw, dict, FUNCTIONS, "the table")
        default = _want(raw.get("default"), str, FUNCTIONS, "default")
        tables = _want(raw.get("io_names", {}), dict, FUNCTIONS, "io_names")
        io_names = {}
        for name, table in tables.items():
            _want(table, dict, FUNCTIONS, f"io_names[{name!r}]")
            io_names[str(name)] = {d: _str_map(table.get(d, {}), FUNCTIONS, f"io_names[{name!r}].{d}")
                                   for d in ("inputs", "outputs")}
        return cls(default, io_names)

    def write(self, metadata: MutableMapping[str, str]) -> None:
        metadata[FUNCTIONS] = json.dumps({"default": self.default, "io_names": self.io_names})


def read_io_names(metadata: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """`rlx_mil.io_names` (interface name -> IR name, per direction); empty where absent."""
    raw = read_json(metadata, IO_NAMES)
    if raw is None:
        return {}
    _want(raw, dict, IO_NAMES, "the table")
    return {d: _str_map(raw.get(d, {}), IO_NAMES, d) for d in ("inputs", "outputs")}


def write_io_names(metadata: MutableMapping[str, str], inputs: Mapping[str, str], outputs: Mapping[str, str]) -> None:
    metadata[IO_NAMES] = json.dumps({"inputs": dict(inputs), "outputs": dict(outputs)})


def write_deploy(metadata: MutableMapping[str, str], form: DeployForm) -> None:
    """Record `form` (nothing for the plain form: its packages are what rlx_mil always wrote)."""
    if form is not DeployForm.PLAIN:
        metadata[DEPLOY] = form.value


def read_deploy(metadata: Mapping[str, Any]) -> DeployForm:
    """The form a package was shaped for (`DeployForm.PLAIN` where the key is absent)."""
    raw = metadata.get(DEPLOY)
    if raw is None:
        return DeployForm.PLAIN
    try:
        return DeployForm.parse(_want(raw, str, DEPLOY, "the form"))
    except InvalidOptionError:
        raise PackageMetadataError(f"metadata {DEPLOY!r}: unknown deployment form {raw!r}") from None


@dataclass(frozen=True)
class ModelSource:
    """`rlx_mil.source`: the converted model's name, where the name came from (`named_by`: e.g.
    `config.json _name_or_path`, or `folder name` when the checkpoint carries none) and its
    architecture (`Llama (LlamaForCausalLM)`; empty when not known)."""

    name: str
    named_by: str
    architecture: str = ""
    #: The checkpoint's stored parameters (0: not known).
    parameters: int = 0

    def write(self, metadata: MutableMapping[str, str]) -> None:
        metadata[SOURCE] = json.dumps({"name": self.name, "named_by": self.named_by, "architecture": self.architecture,
                                       "parameters": self.parameters})

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> ModelSource | None:
        """The record in a package's metadata (None where the package has none)."""
        raw = read_json(metadata, SOURCE)
        if raw is None:
            return None
        _want(raw, dict, SOURCE, "the record")
        texts = {k: _want(raw.get(k, ""), str, SOURCE, repr(k)) for k in ("name", "named_by", "architecture")}
        return cls(**texts, parameters=_want(raw.get("parameters", 0), int, SOURCE, "'parameters'"))

    def to_text(self) -> str:
        kind = f", {self.architecture}" if self.architecture else ""
        if self.parameters > 0:
            kind += f", {_count_text(self.parameters)} parameters"
        if self.named_by == "folder name":
            return f"{self.name}{kind}; the checkpoint carries no name: named after its folder"
        return f"{self.name}{kind}; name from {self.named_by}"


def _count_text(count: int) -> str:
    """134515008 -> '134.5M' (as model cards say a size)."""
    for power, unit in ((9, "B"), (6, "M"), (3, "K")):
        if count >= 10**power:
            return f"{count / 10**power:.1f}{unit}"
    return str(count)


@dataclass
class SplitOutputs:
    """`rlx_mil.split_outputs`: per function ("main" for a one-function package), the outputs
    (by IR name) that the package returns as pieces. Readers concatenate the pieces back
    (`rlx_mil.coreml.output_pieces.assemble`); docs/llm.md has the contract."""

    functions: dict[str, dict[str, OutputPieces]] = field(default_factory=dict)

    @classmethod
    def read(cls, metadata: Mapping[str, Any]) -> SplitOutputs:
        """The table in a package's metadata (empty where the package splits nothing)."""
        raw = read_json(metadata, SPLIT_OUTPUTS)
        if raw is None:
            return cls()
        key = SPLIT_OUTPUTS
        _want(raw, dict, key, "the table")
        functions: dict[str, dict[str, OutputPieces]] = {}
        for function, outputs in raw.items():
            _want(outputs, dict, key, f"{function!r}")
            table = {}
            for name, entry in outputs.items():
                what = f"{function!r}.{name!r}"
                _want(entry, dict, key, what)
                axis = _want(entry.get("axis"), int, key, f"{what}.axis")
                pieces = _want(entry.get("pieces"), list, key, f"{what}.pieces")
                sizes = _want(entry.get("sizes"), list, key, f"{what}.sizes")
                for piece in pieces:
                    _want(piece, str, key, f"{what}.pieces[]")
                for size in sizes:
                    if _want(size, int, key, f"{what}.sizes[]") < 1:
                        raise PackageMetadataError(f"metadata {key!r}: {what}.sizes holds {size}, not a width")
                if not pieces or len(pieces) != len(sizes) or len(set(pieces)) != len(pieces):
                    raise PackageMetadataError(f"metadata {key!r}: {what} needs as many distinct pieces as sizes")
                table[str(name)] = OutputPieces(axis, tuple(pieces), tuple(sizes))
            functions[str(function)] = table
        return cls(functions)

    def of(self, function: str | None) -> dict[str, OutputPieces]:
        """The split outputs of `function` (None: a one-function package's "main")."""
        return self.functions.get(function or "main", {})

    def write(self, metadata: MutableMapping[str, str]) -> None:
        tables = {f: {n: p.to_dict() for n, p in t.items()} for f, t in self.functions.items() if t}
        if tables:
            metadata[SPLIT_OUTPUTS] = json.dumps(tables, sort_keys=True)
        else:
            metadata.pop(SPLIT_OUTPUTS, None)
