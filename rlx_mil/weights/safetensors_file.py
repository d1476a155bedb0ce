"""`.safetensors`: the header validated as a schema at open, tensors read lazily.

The format is an 8-byte little-endian header length, a JSON header mapping names to
`{"dtype", "shape", "data_offsets"}` (plus an optional `__metadata__` of strings), then the
raw little-endian data. The header is checked here in full before the `safetensors` package
(which reads the data through a memory map) is asked for anything, so every defect gets a
typed error naming the file and tensor, and nothing proportional to a declared size is
allocated first.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import ml_dtypes
import numpy as np

from rlx_mil.errors import FileAccessError, WeightsFormatError, file_access_error
from rlx_mil.fileio import apply_default_modes, nesting_depth, open_regular_file
from rlx_mil.weights.base import LazyTensors, TensorHeader, check_shape, is_int, short_repr

#: safetensors' own limit on the JSON header.
MAX_HEADER_BYTES = 100_000_000
#: A valid header nests three levels (header, tensor entry, shape list).
MAX_HEADER_DEPTH = 3

_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16), "U32": np.dtype("<u4"), "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"), "U64": np.dtype("<u8"), "I64": np.dtype("<i8"), "F64": np.dtype("<f8"),
}
_NAMES: dict[np.dtype[Any], str] = {dtype.newbyteorder("="): name for name, dtype in _DTYPES.items()}
_ENTRY_KEYS = ("dtype", "shape", "data_offsets")


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a number safetensors headers may hold")


def parse_header(path: Path, raw: bytes) -> dict[str, Any]:
    """The header's JSON object: depth-bounded, UTF-8, no duplicate keys, no NaN/Infinity."""
    depth = nesting_depth(raw)
    if depth > MAX_HEADER_DEPTH:
        raise WeightsFormatError(f"{path}: header nests {depth} levels deep; a safetensors header has {MAX_HEADER_DEPTH}")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except UnicodeDecodeError as err:
        raise WeightsFormatError(f"{path}: header is not UTF-8 ({err})") from None
    except _DuplicateKey as err:
        raise WeightsFormatError(f"{path}: header holds the key {short_repr(err.args[0])} twice") from None
    except ValueError as err:  # JSONDecodeError, NaN/Infinity, integers of thousands of digits
        raise WeightsFormatError(f"{path}: header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise WeightsFormatError(f"{path}: header is not a JSON object")
    return header


def _entry(path: Path, name: str, info: object, data_bytes: int) -> TensorHeader:
    where = f"{path}: tensor {short_repr(name)}"
    if not isinstance(info, dict):
        raise WeightsFormatError(f"{where}: entry must be an object with {list(_ENTRY_KEYS)}, got {short_repr(info)}")
    missing = [key for key in _ENTRY_KEYS if key not in info]
    unknown = sorted(set(info) - set(_ENTRY_KEYS))
    if missing or unknown:
        detail = "; ".join(
            part for part in (missing and f"missing {missing}", unknown and f"unknown fields {unknown}") if part
        )
        raise WeightsFormatError(f"{where}: {detail}")
    dtype_name = info["dtype"]
    if not isinstance(dtype_name, str):
        raise WeightsFormatError(f"{where}: dtype must be a string, got {short_repr(dtype_name)}")
    if dtype_name not in _DTYPES:
        raise WeightsFormatError(
            f"{where}: unsupported dtype {short_repr(dtype_name)} (supported: {', '.join(_DTYPES)})"
        )
    dtype = _DTYPES[dtype_name]
    shape = check_shape(where, info["shape"])
    offsets = info["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(v) and v >= 0 for v in offsets)):
        raise WeightsFormatError(f"{where}: data_offsets must be [begin, end] non-negative integers, got {short_repr(offsets)}")
    begin, end = offsets
    if begin > end:
        raise WeightsFormatError(f"{where}: data_offsets [{begin}, {end}] end before they begin")
    expected = dtype.itemsize
    for dim in shape:
        expected *= dim
    if end - begin != expected:
        raise WeightsFormatError(
            f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but {dtype_name} {list(shape)}"
            f" needs {expected}"
        )
    if end > data_bytes:
        raise WeightsFormatError(
            f"{where}: data_offsets [{begin}, {end}] run past the end of the file's {data_bytes} data bytes"
        )
    return TensorHeader(name, dtype.newbyteorder("="), shape, dtype_name, begin, end)


def _check_layout(path: Path, headers: list[TensorHeader], data_bytes: int) -> None:
    """Tensors tile the data section exactly: in offset order, no overlap, no gap, no tail."""
    position, previous = 0, None
    for h in sorted(headers, key=lambda h: (h.begin, h.end)):
        if h.begin < position:
            assert previous is not None
            raise WeightsFormatError(
                f"{path}: tensor {h.name!r}: data [{h.begin}, {h.end}) overlaps tensor {previous.name!r}"
                f" [{previous.begin}, {previous.end})"
            )
        if h.begin > position:
            raise WeightsFormatError(
                f"{path}: tensor {h.name!r}: data bytes [{position}, {h.begin}) before it belong to no tensor"
            )
        position, previous = h.end, h
    if position != data_bytes:
        raise WeightsFormatError(f"{path}: {data_bytes - position} bytes after the last tensor belong to no tensor")


def read_safetensors_header(path: str | os.PathLike[str]) -> tuple[dict[str, TensorHeader], dict[str, str]]:
    """Validated (tensor headers in file order, `__metadata__`) of a safetensors file."""
    p = Path(path)
    stream, size = open_regular_file(p, "weights file")
    with stream:
        prefix = stream.read(8)
        if len(prefix) != 8:
            raise WeightsFormatError(f"{p}: {size} bytes, too short for a safetensors file")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES:
            raise WeightsFormatError(f"{p}: header length {header_len} is more than the limit of {MAX_HEADER_BYTES}")
        if header_len > size - 8:
            raise WeightsFormatError(f"{p}: header length {header_len} exceeds the file ({size} bytes)")
        raw = stream.read(header_len)
    if len(raw) != header_len:
        raise WeightsFormatError(f"{p}: header is truncated ({len(raw)} of {header_len} bytes)")
    document = parse_header(p, raw)
    data_bytes = size - 8 - header_len
    metadata: dict[str, str] = {}
    headers: dict[str, TensorHeader] = {}
    for name, info in document.items():
        if name == "__metadata__":
            if not (isinstance(info, dict) and all(isinstance(v, str) for v in info.values())):
                raise WeightsFormatError(f"{p}: __metadata__ must map strings to strings, got {short_repr(info)}")
            metadata = info
            continue
        headers[name] = _entry(p, name, info, data_bytes)
    _check_layout(p, list(headers.values()), data_bytes)
    return headers, metadata


class SafetensorsFile(LazyTensors):
    """A `.safetensors` file checked by `safetensors.safe_open(..., framework="numpy")` too.

    Each tensor is read through a memory map of just its bytes, owned by the array that is
    returned (copy-on-write, so the array is writable and writes never reach the file): the
    mapping, and the page-cache pages it shows, go when the array does. The pages are the
    kernel's cached copy of the file, so a read allocates and fills no new memory of its own
    (casting a BF16 checkpoint to fp16 reads straight from the page cache). Not safe_open's
    map of the whole file: its pages would stay resident (and count in the process's RSS) for
    as long as the file is open, a second copy of the model's bytes until the conversion ends.
    The file's size is checked before each map, so a file truncated since it was opened is a
    typed error, not a fault.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from safetensors import safe_open

        p = Path(path)
        headers, metadata = read_safetensors_header(p)
        super().__init__(p, headers, metadata)
        with p.open("rb") as stream:
            self._data_start = 8 + struct.unpack("<Q", stream.read(8))[0]
        try:
            self._handle: Any = safe_open(os.fspath(p), framework="numpy")
        except Exception as err:  # SafetensorError, OSError: the file changed since it was checked
            raise WeightsFormatError(f"{p}: safetensors cannot open it: {err}") from None
        if set(self._handle.keys()) != set(headers):
            self.close()
            raise WeightsFormatError(f"{p}: tensor names changed while the file was opened")

    def _read(self, header: TensorHeader) -> np.ndarray:
        if self._handle is None:
            raise WeightsFormatError(f"{self.path}: closed; cannot read tensor {header.name!r}")
        start = self._data_start + header.begin
        try:
            with self.path.open("rb") as stream:
                size = os.fstat(stream.fileno()).st_size
                if size < start + header.nbytes:
                    got = max(0, size - start)
                    raise WeightsFormatError(
                        f"{self.path}: tensor {header.name!r}: file ends after {got} of {header.nbytes} bytes"
                    )
                data = _mapped_bytes(stream.fileno(), start, header.nbytes)
        except OSError as err:
            raise WeightsFormatError(f"{self.path}: tensor {header.name!r}: cannot be read: {err}") from None
        dtype = header.dtype
        if sys.byteorder == "little" or dtype.itemsize == 1:
            array = data.view(dtype)
        else:  # safetensors data is little-endian
            array = data.view(dtype.newbyteorder("<")).astype(dtype)
        return self._checked(header, array.reshape(header.shape))

    def close(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            handle.__exit__(None, None, None)

    def __del__(self) -> None:
        self.close()


def _mapped_bytes(fd: int, start: int, nbytes: int) -> np.ndarray:
    """`nbytes` bytes of file `fd` from `start` as a writable uint8 array over a private map."""
    if nbytes == 0:
        return np.empty(0, dtype=np.uint8)
    aligned = start - start % mmap.ALLOCATIONGRANULARITY
    mapping = mmap.mmap(fd, nbytes + start - aligned, access=mmap.ACCESS_COPY, offset=aligned)
    if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
        mapping.madvise(mmap.MADV_SEQUENTIAL)  # read once, front to back: read ahead
    return np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=start - aligned)


def open_safetensors(path: str | os.PathLike[str]) -> SafetensorsFile:
    """Open a `.safetensors` file lazily: header validated now, each tensor read on access.

    BF16 tensors come back as `ml_dtypes.bfloat16` arrays. Every defect raises a typed
    rlx_mil error (WeightsFormatError, MissingFileError, SpecialFileError...) naming the file
    and, where one is at fault, the tensor.
    """
    return SafetensorsFile(path)


def _safetensors_dtype(name: str, dtype: np.dtype[Any]) -> str:
    key = _NAMES.get(dtype.newbyteorder("="))
    if key is None:
        raise WeightsFormatError(
            f"tensor {name!r}: dtype {dtype} has no safetensors name (supported: {', '.join(_DTYPES)})"
        )
    return key


def save_safetensors(
    tensors: Mapping[str, Any], path: str | os.PathLike[str], *, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write `tensors` (name -> array; bfloat16 included) as a `.safetensors` file.

    Tensors are written one at a time (a lazy mapping is read once per tensor, never held
    whole), into a temporary file beside `path` that is synced and renamed into place, so a
    failure leaves any previous file untouched.
    """
    if not isinstance(tensors, Mapping):
        raise WeightsFormatError(f"tensors must be a mapping of names to arrays, got {type(tensors).__name__}")
    dest = Path(path)
    header: dict[str, Any] = {}
    if metadata is not None:
        if not (isinstance(metadata, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            raise WeightsFormatError("metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name in tensors:
        if not isinstance(name, str) or name == "__metadata__":
            raise WeightsFormatError(f"tensor name {short_repr(name)}: must be a str other than '__metadata__'")
        if isinstance(tensors, LazyTensors):
            shape, dtype = tensors.shape_of(name), tensors.dtype_of(name)
        else:
            value = np.asarray(tensors[name])
            shape, dtype = value.shape, value.dtype
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=object))
        header[name] = {"dtype": _safetensors_dtype(name, dtype), "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent if str(dest.parent) else ".")
    except OSError as err:
        raise file_access_error(err, f"{dest}: cannot write there: {err.strerror or err}") from err
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for name in tensors:
                value = np.asarray(tensors[name])
                entry = header[name]
                if list(value.shape) != entry["shape"] or _safetensors_dtype(name, value.dtype) != entry["dtype"]:
                    raise WeightsFormatError(f"tensor {name!r}: changed while it was being written")
                little = value.astype(value.dtype.newbyteorder("<"), copy=False) if value.dtype.itemsize > 1 else value
                f.write(np.ascontiguousarray(little).reshape(-1).view(np.uint8).data)
            f.flush()
            os.fsync(f.fileno())
        apply_default_modes(tmp_name)  # mkstemp makes it 0600
        os.replace(tmp_name, dest)
    except OSError as err:
        Path(tmp_name).unlink(missing_ok=True)
        if isinstance(err, FileAccessError):
            raise
        raise file_access_error(err, f"{dest}: cannot write the weights file: {err.strerror or err}") from err
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return dest
