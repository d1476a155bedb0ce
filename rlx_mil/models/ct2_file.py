"""CTranslate2's `model.bin` (binary version 6 and earlier), read without CTranslate2.

The layout (OpenNMT/CTranslate2 `python/ctranslate2/specs/model_spec.py`, `ModelSpec._serialize`),
all little-endian: `u32 binary_version`, `string spec_name`, `u32 spec_revision`,
`u32 n_variables`, then per variable `string name`, `u8 rank`, `u32 dims[rank]`,
`u8 dtype` (0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16), `u32 n_bytes`, the
bytes; then `u32 n_aliases` and per alias `string alias`, `string variable`. A string is
`u16 length` (counting a closing NUL) and that many bytes. Variables are read by memory map on
access; every field is checked against the file's size before anything is allocated, and a
malformed file is a `WeightsFormatError` naming the file and the variable.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import WeightsFormatError

#: The newest binary version this reader knows (CTranslate2 4.x writes 6).
MAX_BINARY_VERSION = 6
_DTYPES: tuple[Any, ...] = (np.float32, np.int8, np.int16, np.int32, np.float16, "bfloat16")
_DTYPE_NAMES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
#: A variable name is a path of a few scopes; a model has thousands of variables at most.
_MAX_NAME = 4096
_MAX_VARIABLES = 1_000_000
_MAX_RANK = 8


@dataclass(frozen=True)
class CT2Variable:
    name: str
    shape: tuple[int, ...]
    dtype_name: str
    offset: int
    nbytes: int


class CT2File(Mapping[str, np.ndarray]):
    """The variables of one `model.bin` by name (aliases resolved), each read on access."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():  # a FIFO or device would block or never end
            raise WeightsFormatError(f"{self.path}: not a regular file")
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as err:
            raise WeightsFormatError(f"{self.path}: cannot be read ({err.strerror or err})") from None
        if self._map is None:
            raise WeightsFormatError(f"{self.path}: an empty file, not a CTranslate2 model.bin")
        self._size = size
        self._pos = 0
        self.variables: dict[str, CT2Variable] = {}
        self.aliases: dict[str, str] = {}
        self.binary_version = self._u32("the binary version")
        if not 1 <= self.binary_version <= MAX_BINARY_VERSION:
            raise WeightsFormatError(f"{self.path}: binary version {self.binary_version} is not a CTranslate2 model.bin"
                                     f" this reader knows (1..{MAX_BINARY_VERSION})")
        self.spec_name = self._string("the spec name") if self.binary_version >= 2 else ""
        self.spec_revision = self._u32("the spec revision") if self.binary_version >= 2 else 1
        count = self._u32("the variable count")
        if count > _MAX_VARIABLES:
            raise WeightsFormatError(f"{self.path}: {count} variables, more than a model holds")
        for _ in range(count):
            self._variable()
        if self.binary_version >= 3 and self._pos < self._size:
            for _ in range(self._u32("the alias count")):
                alias = self._string("an alias name")
                target = self._string(f"the variable alias {alias!r} names")
                if target not in self.variables:
                    raise WeightsFormatError(f"{self.path}: alias {alias!r} names {target!r}, which the file does not hold")
                self.aliases[alias] = target

    # ------------------------------------------------------------------ parsing
    def _take(self, n: int, what: str) -> bytes:
        if n < 0 or self._pos + n > self._size:
            raise WeightsFormatError(f"{self.path}: truncated at byte {self._pos} reading {what}")
        assert self._map is not None
        out = self._map[self._pos:self._pos + n]
        self._pos += n
        return out

    def _u32(self, what: str) -> int:
        value: int = struct.unpack("<I", self._take(4, what))[0]
        return value

    def _string(self, what: str) -> str:
        (length,) = struct.unpack("<H", self._take(2, what))
        raw = self._take(length, what)
        if length == 0 or length > _MAX_NAME or raw[-1] != 0:
            raise WeightsFormatError(f"{self.path}: {what} at byte {self._pos - length} is not a NUL-terminated string")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise WeightsFormatError(f"{self.path}: {what} is not UTF-8") from None

    def _variable(self) -> None:
        name = self._string("a variable name")
        (rank,) = self._take(1, f"variable {name!r}'s rank")
        if rank > _MAX_RANK:
            raise WeightsFormatError(f"{self.path}: variable {name!r} has rank {rank}")
        shape = tuple(self._u32(f"variable {name!r}'s shape") for _ in range(rank))
        (code,) = self._take(1, f"variable {name!r}'s dtype")
        if code >= len(_DTYPES):
            raise WeightsFormatError(f"{self.path}: variable {name!r} has dtype code {code}, not one of"
                                     f" {', '.join(f'{i} {n}' for i, n in enumerate(_DTYPE_NAMES))}")
        nbytes = self._u32(f"variable {name!r}'s byte count")
        itemsize = 2 if _DTYPE_NAMES[code] == "bfloat16" else np.dtype(_DTYPES[code]).itemsize
        want = int(np.prod(shape, dtype=np.int64)) * itemsize
        if nbytes != want:
            raise WeightsFormatError(f"{self.path}: variable {name!r} {_DTYPE_NAMES[code]} {list(shape)} needs {want}"
                                     f" bytes, the file gives {nbytes}")
        if self._pos + nbytes > self._size:
            raise WeightsFormatError(f"{self.path}: truncated in variable {name!r} ({nbytes} bytes at byte {self._pos},"
                                     f" the file has {self._size})")
        if name in self.variables:
            raise WeightsFormatError(f"{self.path}: variable {name!r} is stored twice")
        self.variables[name] = CT2Variable(name, shape, _DTYPE_NAMES[code], self._pos, nbytes)
        self._pos += nbytes

    # ------------------------------------------------------------------ Mapping
    def _resolve(self, name: str) -> CT2Variable:
        variable = self.variables.get(self.aliases.get(name, name))
        if variable is None:
            raise KeyError(name)
        return variable

    def __getitem__(self, name: str) -> np.ndarray:
        v = self._resolve(name)
        if self._map is None:
            raise WeightsFormatError(f"{self.path}: closed")
        if v.dtype_name == "bfloat16":
            import ml_dtypes

            dtype: Any = ml_dtypes.bfloat16
        else:
            dtype = _DTYPES[_DTYPE_NAMES.index(v.dtype_name)]
        return np.frombuffer(self._map, dtype=dtype, count=v.nbytes // np.dtype(dtype).itemsize,
                             offset=v.offset).reshape(v.shape)

    def __iter__(self) -> Iterator[str]:
        yield from self.variables
        yield from self.aliases

    def __len__(self) -> int:
        return len(self.variables) + len(self.aliases)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.variables or name in self.aliases)

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self._resolve(name).shape

    def dtype_name_of(self, name: str) -> str:
        return self._resolve(name).dtype_name

    def scalar(self, name: str) -> Any:
        """A rank-0 (or one-element) variable's value (CTranslate2 keeps config numbers so)."""
        value = self[name]
        if value.size != 1:
            raise WeightsFormatError(f"{self.path}: variable {name!r} is {list(value.shape)}, expected one value")
        return value.reshape(()).item()


def write_ct2(path: str | os.PathLike[str], spec_name: str, revision: int,
              variables: Mapping[str, np.ndarray], aliases: Mapping[str, str] | None = None) -> Path:
    """Write a `model.bin` (binary version 6) of `variables` (float32/int8/int16/int32/float16
    arrays): the tests' and benchmarks' CTranslate2 folders."""

    def string(s: str) -> bytes:
        raw = s.encode("utf-8") + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = Path(path)
    with open(out, "wb") as f:
        f.write(struct.pack("<I", MAX_BINARY_VERSION) + string(spec_name) + struct.pack("<II", revision, len(variables)))
        for name, value in variables.items():
            arr = np.ascontiguousarray(value)
            code = _DTYPE_NAMES.index(arr.dtype.name)
            f.write(string(name) + struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}I", *arr.shape))
            f.write(struct.pack("<BI", code, arr.nbytes) + arr.tobytes())
        f.write(struct.pack("<I", len(aliases or {})))
        for alias, target in (aliases or {}).items():
            f.write(string(alias) + string(target))
    return out
