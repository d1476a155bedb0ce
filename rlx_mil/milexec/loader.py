"""Turning what the caller hands `run` (MLModel, Program, Function or .mlpackage path) into a
MIL Function plus the model's interface-name mapping."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.coreml.metadata import PackageMetadataError, SplitOutputs
from rlx_mil.coreml.output_pieces import OutputPieces
from rlx_mil.coreml.patches import replaced
from rlx_mil.errors import MilExecError, RlxMilError
from rlx_mil.fileio import check_package_tree, nesting_depth
from rlx_mil.input_contract import read_ranges
from rlx_mil.ir.naming import IO_NAMES_METADATA_KEY
from rlx_mil.mil_walk import iter_ops


@dataclass(frozen=True)
class IONames:
    """Model-interface names (MIL identifiers) -> the original IR names, per direction."""

    inputs: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> IONames | None:
        text = metadata.get(IO_NAMES_METADATA_KEY)
        if text is None:
            return None
        if not isinstance(text, str):
            raise MilExecError(f"model metadata '{IO_NAMES_METADATA_KEY}' must be a JSON string, got {type(text).__name__}")
        # {"inputs": {name: name}, "outputs": {...}} nests two levels; refuse deeper before parsing.
        depth = nesting_depth(text.encode("utf-8", "surrogatepass"))
        if depth > 2:
            raise MilExecError(f"model metadata '{IO_NAMES_METADATA_KEY}' nests {depth} levels deep, expected 2")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise MilExecError(f"model metadata '{IO_NAMES_METADATA_KEY}' is not valid JSON: {exc}") from exc
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: Any) -> IONames:
        if not isinstance(raw, Mapping):
            raise MilExecError(f"'{IO_NAMES_METADATA_KEY}' must be a JSON object, got {type(raw).__name__}")
        parts: dict[str, dict[str, str]] = {}
        for direction in ("inputs", "outputs"):
            table = raw.get(direction, {})
            if not isinstance(table, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in table.items()
            ):
                raise MilExecError(
                    f"'{IO_NAMES_METADATA_KEY}'.{direction} must map interface names to IR names (str -> str)"
                )
            parts[direction] = dict(table)
        return cls(inputs=parts["inputs"], outputs=parts["outputs"])


@dataclass(frozen=True)
class ResolvedSource:
    program: Any  # coremltools Program (None when a bare Function was given)
    function: Any  # coremltools Function
    function_name: str
    io_names: IONames | None
    #: Declared value ranges of integer inputs by interface name (`rlx_mil.input_contract`).
    input_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: Outputs the package returns in pieces, by IR name (`rlx_mil.split_outputs`): the run
    #: returns them joined.
    output_pieces: Mapping[str, OutputPieces] = field(default_factory=dict)


def load_program(path: str | os.PathLike[str], *, packed_4bit: bool = False) -> Any:
    """Reload a saved .mlpackage into a pymil Program (every function of it).

    Constant `np.bool_` scalars that the milproto loader produces are turned into Python bools:
    with numpy >= 2, `np.sum(..., keepdims=np.True_)` raises inside coremltools' own
    value_inference. The Program's `default_function_name` is taken from the spec.

    `packed_4bit=True` (prepared runs only): an int4 / uint4 blob is not unpacked; its const
    holds a `FourBitCodes` stand-in (the codes' shape and dtype, no values) carrying the
    packed bytes. Whoever loads so must replace every stand-in before a kernel reads it.
    """
    return _program_from_model(_open_model(path), path, packed_4bit)


def _open_model(path: str | os.PathLike[str]) -> Any:

    if not Path(path).exists():
        raise MilExecError(f"no model package at {path}")
    check_package_tree(path)
    try:
        from rlx_mil.coreml.manifest import open_model

        model = open_model(path, skip_model_load=True)
    except RlxMilError:
        raise
    except Exception as exc:
        raise MilExecError(f"cannot open {path} as a Core ML model: {exc}") from exc
    from rlx_mil.coreml.package_info import check_weight_files

    check_weight_files(Path(path), model)
    return model


def _program_from_model(model: Any, where: Any, packed_4bit: bool = False) -> Any:
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    spec = model.get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise MilExecError(f"{where} is not an ML Program (model type {spec.WhichOneof('Type')!r})")
    try:
        with _mapped_weights(packed_4bit):
            program = milproto_load(
                spec, specification_version=spec.specificationVersion, file_weights_dir=model.weights_dir
            )
    except Exception as exc:
        raise MilExecError(f"cannot load the MIL program of {where}: {exc}") from exc
    for function in program.functions.values():
        for op in iter_ops(function):
            if op.op_type == "const" and isinstance(op.outputs[0].val, np.bool_):
                op.outputs[0]._sym_val.val = bool(op.outputs[0].val)
    default_name = spec.description.defaultFunctionName
    if default_name:
        program.default_function_name = default_name
    return program


# -- weights read from a memory map of the weight file ----------------------------------------
# coremltools' milproto loader reads every blob into a fresh array (fp16 twice over: a uint16
# array, then a copy of its bytes), and each function of a multifunction package reads its own
# copy of the weights it shares with the others. Mapped instead, a byte-aligned blob is a
# read-only view of the file: loading costs no copy, the functions of a package share one copy
# in the page cache, and a reader can drop a weight's pages once it has used it (`release`).

#: MIL blob storage dtype codes (MILBlob StorageFormat) of the byte-aligned types mapped here.
_BLOB_DTYPES = {1: np.float16, 2: np.float32, 3: np.uint8, 4: np.int8, 6: np.int16, 7: np.uint16}
_BLOB_SENTINEL = 0xDEADBEEF
_INT4, _UINT4 = 8, 11  # StorageFormat codes of the packed 4-bit types
_BLOB_METADATA = struct.Struct("<IIQQ")  # sentinel, dtype code, size in bytes, data offset
_MAP_LOCK = threading.Lock()


class FourBitCodes(np.ndarray):
    """Stand-in value of a 4-bit blob read by `load_program(..., packed_4bit=True)`: shaped and
    typed as its unpacked codes (int8 for int4, uint8 for uint4) but holding no values (every
    stride is 0, over one byte of its own). `packed` is the blob's bytes (a read-only view of
    the mapped weight file, two codes a byte, the first in the low nibble), `signed` is True for
    int4; `unpacked()` gives the codes."""

    packed: np.ndarray
    signed: bool

    def __array_finalize__(self, obj: Any) -> None:
        self.packed = getattr(obj, "packed", np.zeros(0, np.uint8))
        self.signed = getattr(obj, "signed", True)

    def unpacked(self) -> np.ndarray:
        """The codes, one per byte (a new array of this shape and dtype)."""
        out = np.empty(self.size + self.size % 2, dtype=self.dtype)
        _unpack_into(self.packed[: out.size // 2], out, self.signed)
        return out[: self.size].reshape(self.shape)


@contextlib.contextmanager
def _mapped_weights(packed_4bit: bool = False) -> Iterator[None]:
    """Within the block, the milproto loader maps byte-aligned blobs instead of copying them."""
    from coremltools.converters.mil.frontend.milproto import load as milproto

    original = milproto._load_value
    maps: dict[str, mmap.mmap | None] = {}
    # The functions of a multifunction package name the same blobs: each is read once.
    seen: dict[tuple[str, int, bytes], Any] = {}

    def load_value(context: Any, value_spec: Any) -> Any:
        if value_spec.WhichOneof("value") != "blobFileValue":
            return original(context, value_spec)
        blob = value_spec.blobFileValue
        key = (blob.fileName, int(blob.offset), value_spec.type.SerializeToString())
        if key not in seen:
            seen[key] = mapped_value(context, value_spec)
        return seen[key]

    def mapped_value(context: Any, value_spec: Any) -> Any:
        # What coremltools' _load_value does for a tensor held in the weight file, without its
        # copies (frombuffer(...).astype and np.array(...).astype both copy).
        if value_spec.type.WhichOneof("type") == "tensorType" and value_spec.WhichOneof("value") == "blobFileValue":
            valuetype = milproto.proto_to_types(value_spec.type)
            if milproto.types.is_tensor(valuetype) and not value_spec.docString:
                blob = value_spec.blobFileValue
                filename = os.path.join(context.weights_dir, blob.fileName.split("/")[-1])
                value = _mapped_blob(maps, filename, int(blob.offset), valuetype.get_primitive(), packed_4bit)
                shape = tuple(int(d) for d in valuetype.get_shape())
                count = int(np.prod(shape, dtype=np.int64))
                if value is not None and value.size == count + 1 and count % 2:  # 4-bit: one pad nibble
                    value = value[:count]
                if value is not None and value.size == count:
                    return value.reshape(shape)
        return original(context, value_spec)

    with _MAP_LOCK, replaced("coremltools.converters.mil.frontend.milproto.load:_load_value", load_value):
        yield


def _mapped_blob(maps: dict[str, mmap.mmap | None], filename: str, offset: int, dtype: Any,
                 packed_4bit: bool = False) -> np.ndarray | None:
    """The blob at `offset` of `filename` as a read-only array over a map of the file, or None
    (not a byte-aligned type, or anything about the file or the blob unexpected: the loader
    then reads it itself)."""
    from coremltools.converters.mil.mil import types

    if dtype in (types.int4, types.uint4):
        return _unpacked_nibbles(maps, filename, offset, dtype, packed_4bit)
    wanted = {types.fp16: np.float16, types.fp32: np.float32, types.uint8: np.uint8, types.int8: np.int8,
              types.int16: np.int16, types.uint16: np.uint16}.get(dtype)
    if wanted is None:
        return None
    mapped = _mapped_file(maps, filename)
    if mapped is None or offset < 0 or offset + _BLOB_METADATA.size > len(mapped):
        return None
    sentinel, code, size, data_offset = _BLOB_METADATA.unpack_from(mapped, offset)
    itemsize = np.dtype(wanted).itemsize
    if (sentinel != _BLOB_SENTINEL or _BLOB_DTYPES.get(code) is not wanted or size % itemsize
            or data_offset % itemsize or data_offset + size > len(mapped)):
        return None
    return np.frombuffer(mapped, dtype=wanted, count=size // itemsize, offset=data_offset)


def _mapped_file(maps: dict[str, mmap.mmap | None], filename: str) -> mmap.mmap | None:
    if filename not in maps:
        try:
            with open(filename, "rb") as f:
                maps[filename] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            maps[filename] = None
    return maps[filename]


def _unpacked_nibbles(maps: dict[str, mmap.mmap | None], filename: str, offset: int, dtype: Any,
                      packed_4bit: bool = False) -> np.ndarray | None:
    """An int4 / uint4 blob unpacked into a new int8 / uint8 array (the dtype coremltools gives
    it), a chunk at a time: coremltools' own reader expands every bit into a byte first, eight
    times the packed size at once. With `packed_4bit`, a `FourBitCodes` stand-in instead."""
    from coremltools.converters.mil.mil import types

    mapped = _mapped_file(maps, filename)
    if mapped is None or offset < 0 or offset + _BLOB_METADATA.size > len(mapped):
        return None
    sentinel, code, size, data_offset = _BLOB_METADATA.unpack_from(mapped, offset)
    signed = dtype == types.int4
    if sentinel != _BLOB_SENTINEL or code != (_INT4 if signed else _UINT4) or data_offset + size > len(mapped):
        return None
    packed = np.frombuffer(mapped, dtype=np.uint8, count=size, offset=data_offset)
    nptype = np.dtype(types.nptype_from_builtin(dtype))
    if packed_4bit:
        own = np.zeros(1, dtype=nptype)  # one byte of its own: each stand-in has its own address
        stand_in = np.lib.stride_tricks.as_strided(own, (2 * size,), (0,), writeable=False).view(FourBitCodes)
        stand_in.packed, stand_in.signed = packed, signed
        return stand_in
    out = np.empty(2 * size, dtype=nptype)
    _unpack_into(packed, out, signed)
    return out


def _unpack_into(packed: np.ndarray, out: np.ndarray, signed: bool) -> None:
    """Two codes a byte (the first in the low nibble) into `out` (2 * packed.size bytes)."""
    plain = out.view(np.uint8)
    size = packed.size
    step = 1 << 20
    for start in range(0, size, step):
        part = packed[start:start + step]
        low, high = plain[2 * start:2 * (start + part.size):2], plain[2 * start + 1:2 * (start + part.size):2]
        np.bitwise_and(part, 0x0F, out=low)  # the first element of a byte is its low nibble
        np.right_shift(part, 4, out=high)
    if signed:  # two's complement of a nibble: (v ^ 8) - 8, wrapping in uint8
        for start in range(0, plain.size, step):
            chunk = plain[start:start + step]
            np.bitwise_xor(chunk, 8, out=chunk)
            np.subtract(chunk, 8, out=chunk)


def release(value: np.ndarray) -> None:
    """Drop the resident pages of a mapped weight (a view made by `load_program`): the process
    gives them back, the page cache keeps them, the next read maps them in again. No-op for
    any other array."""
    base = mapped_file(value)
    if base is None or not value.size:
        return
    start = value.__array_interface__["data"][0] - _address(base)
    stop = start + value.nbytes
    page = mmap.PAGESIZE
    first = (start // page) * page
    with contextlib.suppress(OSError, ValueError):
        base.madvise(mmap.MADV_DONTNEED, first, min(len(base), stop) - first)


def mapped_file(value: np.ndarray) -> mmap.mmap | None:
    """The open file map `value` is a view of, or None."""
    base: Any = value
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if isinstance(base, mmap.mmap) and not base.closed else None


def _address(mapped: mmap.mmap) -> int:
    return int(np.frombuffer(mapped, np.uint8, count=1).__array_interface__["data"][0])


def resolve_source(
    source: Any, function_name: str | None, io_names: Mapping[str, Any] | IONames | None,
    reader: Callable[[Any, Any], Any] | None = None,
) -> ResolvedSource:
    """Find the Function to run and the interface-name mapping for `source`. `reader(model,
    where)` reads a package's program first (`protoread.read_model`); where it returns None,
    or without one, `load_program`'s loader does."""
    from coremltools.converters.mil.mil import Function, Program

    from rlx_mil.milexec.light import LightProgram

    metadata: Mapping[str, str] = {}
    if isinstance(source, (str, os.PathLike)):
        model = _open_model(source)
        program = (reader(model, source) if reader is not None else None) or _program_from_model(model, source)
        metadata = dict(model.user_defined_metadata)
    elif isinstance(source, (Program, LightProgram)):
        program = source
    elif isinstance(source, Function):
        program = None
    elif hasattr(source, "get_spec") and hasattr(source, "user_defined_metadata"):
        program = getattr(source, "_mil_program", None)
        if program is None:
            package = getattr(source, "package_path", None)
            if not package:
                raise MilExecError("the MLModel has neither a MIL program in memory nor a package path")
            program = (reader(source, package) if reader is not None else None) or _program_from_model(source, package)
        metadata = dict(source.user_defined_metadata)
        if function_name is None:
            function_name = getattr(source, "function_name", None)
    else:
        raise MilExecError(
            f"cannot run a {type(source).__name__}: pass a coremltools MLModel, a MIL Program or "
            "Function, or the path of a saved .mlpackage"
        )

    if program is None:
        function, name = source, function_name or "main"
    else:
        name = function_name or getattr(program, "default_function_name", None) or "main"
        if name not in program.functions:
            raise MilExecError(
                f"the program has no function '{name}' (functions: {sorted(program.functions)})"
            )
        function = program.functions[name]

    if isinstance(io_names, IONames):
        names: IONames | None = io_names
    elif io_names is not None:
        names = IONames.from_mapping(io_names)
    else:
        names = IONames.from_metadata(metadata)
    try:
        pieces = SplitOutputs.read(metadata).of(name)
    except PackageMetadataError as err:
        raise MilExecError(str(err)) from None
    return ResolvedSource(program=program, function=function, function_name=name, io_names=names,
                          input_ranges=read_ranges(metadata, name), output_pieces=pieces)
