"""The one module that touches Apple's `coreai-core` package.

Everything the translator and the runtime wrapper need of Core AI goes through here: the raw
op builders (`ops`, from the unversioned `coreai._compiler`), tensor types, constants (sub-byte
ones bit-packed LSB-first, as `coreai-torch` stores them: the public constant path stores a
byte per value and runs with wrong results), graphs with KV state (a graph input marked with
the `MutableBuffers.buffer_mutation` attribute, which the pre-compilation rewrite turns into a
handle), saving an asset, and running one with `coreai.runtime`. A new beta of `coreai-core`
should need changes here only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import CoreAITranslationError, CoreAIUnavailableError

#: The `coreai-core` version this adapter is written against.
PINNED_VERSION = "1.0.0b3"
INSTALL_HINT = 'pip install -e ".[coreai]" (or pip install "rlx-mil[coreai]"; Python >= 3.11)'
#: The graph-input attribute that declares a state (how `coreai-torch` marks a mutated buffer).
_STATE_ATTRIBUTE = "MutableBuffers.buffer_mutation"


def available() -> bool:
    """True when `coreai-core` can be imported here (without importing it)."""
    return sys.version_info >= (3, 11) and importlib.util.find_spec("coreai") is not None


def require(feature: str | None = None) -> None:
    """Raise `CoreAIUnavailableError`, naming `feature` (the option or call that asked for Core
    AI, e.g. '--verify --engine coreai') and saying how to install it, unless Core AI is
    importable."""
    if not available():
        raise CoreAIUnavailableError(f"{feature or 'this'} needs Apple's Core AI (coreai-core=={PINNED_VERSION}):"
                                     f" {INSTALL_HINT}")
    try:
        import coreai.authoring  # noqa: F401  (must precede coreai._compiler: circular imports)
    except Exception as err:  # pragma: no cover - a broken install
        raise CoreAIUnavailableError(f"coreai-core is installed but does not import ({err}): {INSTALL_HINT}") from err


def _ops() -> Any:
    require()
    from coreai._compiler.dialects import coreai as raw_ops

    return raw_ops


class _LazyOps:
    """`ops.softmax(...)` etc.: the raw Core AI op builders, imported on first use."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_ops(), name)


ops: Any = _LazyOps()

_SUB_BYTE_BITS = {"int1": 1, "uint1": 1, "int2": 2, "uint2": 2, "int3": 3, "uint3": 3, "int4": 4, "uint4": 4,
                  "int6": 6, "uint6": 6}


def element_type(dtype: Any) -> Any:
    """The MLIR element type of a numpy dtype, or of a sub-byte name ('int4', 'uint3'...)."""
    require()
    from coreai._compiler.ir import IntegerType
    from coreai._compiler.type_mapping import _NUMPY_TO_MLIR_DTYPE

    if isinstance(dtype, str) and dtype in _SUB_BYTE_BITS:
        bits = _SUB_BYTE_BITS[dtype]
        return IntegerType.get_signed(bits) if dtype.startswith("int") else IntegerType.get_unsigned(bits)
    return _NUMPY_TO_MLIR_DTYPE[np.dtype(dtype).type]()


def tensor_type(shape: Sequence[int], dtype: Any) -> Any:
    require()
    from coreai._compiler.ir import RankedTensorType

    dims = [int(d) if int(d) >= 0 else RankedTensorType.get_dynamic_size() for d in shape]
    return RankedTensorType.get(dims, element_type(dtype))


def shape_of(value: Any) -> tuple[int, ...]:
    """Static dims of a Core AI value (-1 for a dynamic dim)."""
    return tuple(int(d) if int(d) >= 0 else -1 for d in value.type.shape)


def dtype_name(value: Any) -> str:
    """'f32', 'si32', 'i1', ... of a Core AI value."""
    return str(value.type.element_type)


def is_value(obj: Any) -> bool:
    from coreai._compiler.ir import Value

    return isinstance(obj, Value)


def constant(array: np.ndarray) -> Any:
    """A dense constant holding `array` (bool, integer or float up to 64 bits)."""
    # (np.ascontiguousarray would make a rank-0 array rank 1.)
    array = np.array(array, order="C", copy=not array.flags.c_contiguous)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    if array.dtype == np.int64:
        array = array.astype(np.int32)
    if array.size >= 16 and array.dtype != np.bool_:
        return _resource_constant(array, array, array.dtype)
    return ops.constant(array)


#: content digest -> resource attribute: equal constants (in any graph of the module) share one
#: blob, so a prefill + decode asset stores its weights once.
_RESOURCES: dict[tuple[Any, ...], Any] = {}


def _resource_constant(buffer: np.ndarray, like: np.ndarray, dtype: Any) -> Any:
    """A constant whose bytes are stored as a blob resource (how large weights are kept)."""
    import hashlib

    from coreai._compiler.ir import DenseResourceElementsAttr

    data = np.ascontiguousarray(buffer)
    key = (str(dtype), like.shape, hashlib.sha256(data.data.cast("B")).hexdigest())
    attr = _RESOURCES.get(key)
    if attr is None:
        attr = DenseResourceElementsAttr.get_from_buffer(data, f"rlx_mil_w{len(_RESOURCES)}",
                                                          tensor_type(like.shape, dtype))
        _RESOURCES[key] = attr
    return ops.ConstantOp(value=attr).result


def packed_constant(codes: np.ndarray, kind: str) -> Any:
    """A sub-byte integer constant (`kind` 'uint4', 'int4', 'uint3'...) of the values `codes`,
    stored bit-packed row-major, least-significant bit first."""
    bits = _SUB_BYTE_BITS[kind]
    flat = np.ascontiguousarray(codes).reshape(-1).astype(np.int64)
    encoded = (flat & ((1 << bits) - 1)).astype(np.uint8)
    packed = np.packbits(((encoded[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).reshape(-1), bitorder="little")
    return _resource_constant(packed, np.empty(codes.shape, np.uint8), kind)


class ModuleBuilder:
    """An MLIR module under construction: add graphs (entry points), then save the asset."""

    def __init__(self) -> None:
        require()
        from coreai._compiler.ir import Location, Module
        from coreai.authoring import Context

        _RESOURCES.clear()  # attributes belong to one MLIR context: a new module starts afresh
        self._context = Context()
        self._mlir = self._context._mlir_context
        with self._mlir, Location.unknown():
            self.module = Module.create()

    @contextmanager
    def active(self) -> Iterator[None]:
        from coreai._compiler.ir import Location

        with self._mlir, Location.unknown():
            yield

    @contextmanager
    def graph(self, name: str, inputs: Sequence[tuple[str, Sequence[int], Any]]) -> Iterator[GraphScope]:
        """A graph named `name` taking `inputs` ((name, shape, dtype)); the body is built in the
        `with` block, which must call `GraphScope.finish`."""
        from coreai._compiler.ir import InsertionPoint

        with self.active(), InsertionPoint(self.module.body):
            graph = ops.GraphOp(name=name, input_types=[tensor_type(s, d) for _, s, d in inputs], result_types=[],
                                input_names=[n for n, _, _ in inputs])
            scope = GraphScope(graph, [n for n, _, _ in inputs])
            try:
                with graph.block:
                    yield scope
            except BaseException:
                graph.operation.erase()  # a graph left half built would spoil the module's other graphs
                raise

    def nested(self, block_builder: Any) -> Any:
        return block_builder.block

    def save(self, path: Path, metadata: Mapping[str, str] | None = None) -> None:
        """Run Core AI's pre-compilation rewrite and write the `.aimodel` asset at `path`."""
        from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import run_pre_compilation_rewrite
        from coreai.authoring import AIProgram

        with self.active():
            try:
                run_pre_compilation_rewrite(module=self.module)
                program = AIProgram._from_mlir_module(self.module)
                program.save_asset(Path(path))
            except RuntimeError as err:
                raise CoreAITranslationError(f"Core AI refused the translated program: {err}") from err
        if metadata:
            write_metadata(Path(path), metadata)

    def text(self) -> str:
        return str(self.module)


class GraphScope:
    """The body of one graph: its arguments, and `finish` to name its outputs and states."""

    def __init__(self, graph: Any, input_names: list[str]) -> None:
        self.graph = graph
        self.input_names = input_names

    @property
    def arguments(self) -> list[Any]:
        return list(self.graph.arguments)

    def finish(self, outputs: Mapping[str, Any], state_updates: Mapping[str, tuple[str, Any]]) -> None:
        """`outputs`: name -> value. `state_updates`: state input name -> (output name, final
        value); the input becomes a state the runtime keeps, updated to that value."""
        from coreai._compiler.ir import ArrayAttr, DictAttr, StringAttr

        ordered: OrderedDict[str, Any] = OrderedDict(outputs)
        for output_name, value in state_updates.values():
            ordered[output_name] = value
        self.graph.set_outputs_spec_from_dict(ordered)
        if state_updates:
            attrs = []
            for name, existing in zip(self.input_names, list(self.graph.arg_attrs), strict=True):
                entries = {a.name: a.attr for a in existing}
                if name in state_updates:
                    entries[_STATE_ATTRIBUTE] = StringAttr.get(state_updates[name][0])
                attrs.append(DictAttr.get(entries))
            self.graph.arg_attrs = ArrayAttr.get(attrs)


def _result_list(results: Any, count: int) -> list[Any]:
    if count == 1 and not isinstance(results, (list, tuple)) and hasattr(results, "type"):
        return [results]
    return list(results)


def if_(result_types: Sequence[Any], condition: Any) -> tuple[list[Any], Any, Any]:
    """(results, then-builder, else-builder) of a Core AI `if`."""
    results, (then_builder, else_builder) = ops.if_(list(result_types), condition)
    return _result_list(results, len(result_types)), then_builder, else_builder


def while_(result_types: Sequence[Any], inits: Sequence[Any]) -> tuple[list[Any], Any, Any]:
    """(results, condition-builder, body-builder) of a Core AI `while`."""
    results, (before, after) = ops.while_(list(result_types), list(inits))
    return _result_list(results, len(result_types)), before, after


def scatter_along_axis(data: Any, indices: Any, updates: Any, axis: int, mode: str) -> Any:
    """Core AI's scatter_along_axis (`mode`: update, add, sub, mul, div, max, min)."""
    from coreai._compiler.ir import Attribute

    return ops.ScatterAlongAxisOp(data.type, data, indices, updates, constant(np.asarray(axis, np.int32)),
                                  scatter_mode=Attribute.parse(f"#coreai.scatter_mode<{mode}>")).result


def maxpool2d(x: Any, result_shape: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
              ceil_mode: bool) -> Any:
    return ops.maxpool2d(tensor_type(result_shape, np.float32 if dtype_name(x) == "f32" else np.float16), x,
                         np.asarray(kernel, np.uint32), np.asarray(stride, np.uint32), np.ones(2, np.uint32),
                         np.bool_(ceil_mode))


# -- metadata ----------------------------------------------------------------------------------
_METADATA_FILE = "rlx_mil_metadata.json"


def write_metadata(path: Path, metadata: Mapping[str, str]) -> None:
    """rlx_mil's metadata (LLM contract, io names, tokenizer...) kept beside the program in the
    asset directory, as a JSON file Core AI's runtime ignores."""
    import json

    (path / _METADATA_FILE).write_text(json.dumps(dict(metadata), indent=1, sort_keys=True))


#: Largest rlx_mil JSON side file of an asset read (metadata, entry points).
MAX_SIDE_FILE_BYTES = 64 << 20


def read_side_json(file: Path) -> Any:
    """An asset's JSON side file, bounded and parsed; anything malformed (not UTF-8, not
    JSON, nested past the parser's depth, a FIFO...) is one typed error naming it."""
    import json

    from rlx_mil.errors import RlxMilError
    from rlx_mil.fileio import read_regular_file

    data = read_regular_file(file, MAX_SIDE_FILE_BYTES, RlxMilError, "Core AI asset file")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as err:
        raise RlxMilError(f"{file}: malformed ({type(err).__name__}: {' '.join(str(err).split())[:200]});"
                          " write the asset again") from None


def read_metadata(path: Path) -> dict[str, str]:
    file = Path(path) / _METADATA_FILE
    if not file.exists():
        return {}
    data = read_side_json(file)
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


# -- runtime -----------------------------------------------------------------------------------
#: What the runtime writes to file descriptor 2 for every function it loads (not a diagnostic).
_LOADING_NOTE = "Loading function '"


@contextmanager
def _loading_notes_dropped() -> Iterator[None]:
    """The runtime's native code prints "ODIE [default]: Loading function 'NAME'" on fd 2 for
    each function it loads; those lines are dropped, anything else it writes is passed on."""
    import os
    import tempfile

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (a daemon): nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode("utf-8", errors="replace")
            kept = [line for line in text.splitlines() if _LOADING_NOTE not in line]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")


class LoadedAsset:
    """A saved `.aimodel` loaded by `coreai.runtime` (on Linux: Apple's CPU runtime). Calls are
    synchronous; the asset stays loaded until `close`."""

    def __init__(self, path: Path) -> None:
        require()
        from coreai.authoring import AIModelAsset

        self.path = Path(path)
        self._loop = asyncio.new_event_loop()
        try:
            self._asset = AIModelAsset.load(self.path)
            self._context = self._asset.executable()
            self._model = self._loop.run_until_complete(self._context.__aenter__())
        except (RuntimeError, ValueError, OSError) as err:  # the runtime's own refusal of a damaged asset
            self._loop.close()
            from rlx_mil.errors import RlxMilError

            raise RlxMilError(f"{self.path}: Core AI's runtime cannot load it ({' '.join(str(err).split())[:200]});"
                              " write the asset again") from None
        self._functions: dict[str, Any] = {}

    @property
    def function_names(self) -> list[str]:
        return list(self._model.function_names)

    def function(self, name: str) -> Any:
        if name not in self._functions:
            with _loading_notes_dropped():
                self._functions[name] = self._model.load_function(name)
        return self._functions[name]

    def describe(self, name: str) -> tuple[list[str], list[str], list[str]]:
        """(input names, output names, state names) of function `name`."""
        desc = self.function(name).desc
        return list(desc.input_names), list(desc.output_names), list(desc.state_names)

    def state_spec(self, function: str, state: str) -> tuple[tuple[int, ...], np.dtype]:
        from coreai._compiler.type_mapping import _MLIR_TO_NUMPY_DTYPE

        descriptor = self.function(function).desc.state_descriptor(name=state)
        dtype = str(descriptor.dtype)
        numpy_dtype = np.dtype(_MLIR_TO_NUMPY_DTYPE.get(dtype, np.float32)) if dtype in _MLIR_TO_NUMPY_DTYPE else \
            np.dtype(dtype)
        return tuple(int(d) for d in descriptor.shape), numpy_dtype

    def new_state(self, array: np.ndarray) -> Any:
        from coreai.runtime import NDArray

        return NDArray(np.ascontiguousarray(array))

    @staticmethod
    def state_value(state: Any) -> np.ndarray:
        return np.array(state.numpy(), copy=True)

    def call(self, name: str, inputs: Mapping[str, np.ndarray], states: Mapping[str, Any] | None = None
             ) -> dict[str, np.ndarray]:
        """Run function `name`; `states` are runtime arrays from `new_state`, updated in place."""
        from coreai.runtime import NDArray

        feeds = {k: NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()}
        result = self._loop.run_until_complete(self.function(name)(inputs=feeds, state=dict(states or {})))
        return {k: np.array(v.numpy(), copy=True) for k, v in result.items()}

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._functions.clear()
        self._loop.run_until_complete(self._context.__aexit__(None, None, None))
        self._loop.close()

    def __enter__(self) -> LoadedAsset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
