"""GGUF files (llama.cpp's model format) read through the `gguf` package's memory-mapped
`GGUFReader`, with every count, offset, shape and type checked before it is trusted.

The file is mapped, never read whole: a tensor's bytes are a view of the map, paged in only
when something reads them. A file that lies — a header claiming more key/values or tensors
than its bytes can hold, tensor data past the end of the file, a shape that is not a whole
number of its type's blocks, an unknown type number, a truncated file — is a typed
`GGUFFormatError` naming the file (and the tensor at fault), raised while the header is
parsed, before any tensor data is touched or any array allocated.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import GGUFFormatError
from rlx_mil.fileio import open_regular_file

#: The smallest possible key/value entry: key length (u64), an empty key, type (u32), one byte.
_MIN_KV_BYTES = 8 + 4 + 1
#: The smallest possible tensor info: name length (u64), n_dims (u32), type (u32), offset (u64).
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
#: ggml tensors have at most 4 dimensions.
MAX_DIMS = 4


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its llama.cpp type, its logical shape in NumPy order (rows
    first: a `[out, in]` matrix is `(out, in)`, the reverse of ggml's `ne`), and its stored
    bytes (a read-only view of the file's map)."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    n_bytes: int
    offset: int
    #: Elements per block and bytes per block of `type_name` (1 and the item size for F32...).
    block: tuple[int, int]
    raw: np.ndarray

    @property
    def quantized(self) -> bool:
        return self.block[0] > 1 or self.type_name == "BF16"


def _validated_reader(path: Path, size: int) -> Any:
    """A `gguf.GGUFReader` whose header parsing refuses counts, shapes and offsets the file
    cannot hold, naming the tensor."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    class Reader(gguf.GGUFReader):
        def _build_fields(self, offs: int, count: int) -> int:
            count = int(count)
            if count * _MIN_KV_BYTES > size - offs:
                raise GGUFFormatError(f"{path}: the header claims {count} metadata entries; the file's {size} bytes cannot hold them")
            return int(super()._build_fields(offs, count))

        def _build_tensor_info(self, offs: int, count: int) -> Any:
            count = int(count)
            if count * _MIN_TENSOR_INFO_BYTES > size - offs:
                raise GGUFFormatError(f"{path}: the header claims {count} tensors; the file's {size} bytes cannot hold their descriptions")
            return super()._build_tensor_info(offs, count)

        def _get_tensor_info_field(self, offs: int) -> Any:
            try:
                name = bytes(self._get_str(offs)[1]).decode("utf-8", errors="replace")
            except (ValueError, IndexError) as err:
                raise GGUFFormatError(f"{path}: a tensor description at byte {offs} is unreadable ({err})") from None
            try:
                field = super()._get_tensor_info_field(offs)
            except (ValueError, IndexError, UnicodeDecodeError) as err:
                raise GGUFFormatError(f"{path}: the description of tensor {name!r} is truncated or corrupt ({err})", tensor=name) from None
            if len(field.parts[2]) != 1 or len(field.parts[1]) != int(field.parts[0][0]):
                raise GGUFFormatError(f"{path}: the description of tensor {name!r} is truncated", tensor=name)
            claimed, dims = int(field.parts[2][0]), field.parts[3]
            if claimed > MAX_DIMS or len(dims) != claimed or len(field.parts[4]) != 1 or len(field.parts[5]) != 1:
                raise GGUFFormatError(f"{path}: tensor {name!r}: its description is truncated or claims {claimed} dimensions"
                                      f" (ggml tensors have at most {MAX_DIMS})", tensor=name)
            return field

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            for field in fields:
                name = bytes(field.parts[1]).decode("utf-8", errors="replace")
                dims = [int(d) for d in field.parts[3]]
                raw_type = int(field.parts[4][0])
                try:
                    ggml_type = GGMLQuantizationType(raw_type)
                except ValueError:
                    raise GGUFFormatError(f"{path}: tensor {name!r} has unknown ggml type number {raw_type}", tensor=name) from None
                elems, type_size = GGML_QUANT_SIZES[ggml_type]
                count = math.prod(dims)
                if not dims or min(dims) < 1 or count >= 1 << 62:
                    raise GGUFFormatError(f"{path}: tensor {name!r} has shape {dims[::-1]} (dimensions must be >= 1)", tensor=name)
                if dims[0] % elems:
                    raise GGUFFormatError(
                        f"{path}: tensor {name!r} {ggml_type.name} has rows of {dims[0]} elements, not a whole number of its"
                        f" {elems}-element blocks", tensor=name)
                n_bytes = count // elems * type_size
                offset = int(field.parts[5][0])
                begin = int(start_offs) + offset
                if offset % self.alignment:
                    raise GGUFFormatError(f"{path}: tensor {name!r} data offset {offset} is not aligned to {self.alignment}", tensor=name)
                if begin + n_bytes > size:
                    raise GGUFFormatError(
                        f"{path}: tensor {name!r} ({ggml_type.name} {dims[::-1]}, {n_bytes} bytes at {begin}) runs past the end"
                        f" of the {size}-byte file (truncated or lying header)", tensor=name)
            super()._build_tensors(start_offs, fields)

    return Reader(path)


#: Metadata arrays longer than this are dropped by `GGUFFile(..., large_arrays=False)`.
LARGE_ARRAY = 4096


class GGUFFile:
    """A GGUF file's metadata (`value(key)`) and tensors (`tensor(name)`), memory-mapped.

    `gguf.GGUFReader` keeps a NumPy view per entry of every metadata array: a 150k-token
    vocabulary costs a few hundred MB. With `large_arrays=False` those arrays (the tokenizer's
    tokens, merges, scores, types) are dropped once the header is parsed; `array_length` still
    answers for them, `value` gives None (open the file again with them to read a tokenizer).
    """

    def __init__(self, path: str | os.PathLike[str], *, large_arrays: bool = True) -> None:
        self.path = Path(path)
        stream, size = open_regular_file(self.path, "GGUF file")  # FIFOs, devices, folders refused
        stream.close()
        self.size = size
        if size < 24:
            raise GGUFFormatError(f"{self.path}: {size} bytes is too short for a GGUF header (truncated?)")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise GGUFFormatError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            reader = _validated_reader(self.path, size)
        except GGUFFormatError:
            raise
        except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError, TypeError) as err:
            raise GGUFFormatError(f"{self.path}: not a readable GGUF file ({type(err).__name__}: {err}); truncated or corrupt") from None
        self._dropped: dict[str, int] = {}
        if not large_arrays:
            for key, field in list(reader.fields.items()):
                if len(field.data) > LARGE_ARRAY:
                    self._dropped[key] = len(field.data)
                    del reader.fields[key]
        self._reader = reader
        self.alignment = int(reader.alignment)
        self.tensors: dict[str, GGUFTensor] = {}
        from gguf.constants import GGML_QUANT_SIZES

        for t in reader.tensors:
            ggml_type = t.tensor_type
            raw = t.data
            raw.flags.writeable = False
            self.tensors[t.name] = GGUFTensor(
                name=t.name, type_name=ggml_type.name, shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                n_bytes=int(t.n_bytes), offset=int(t.data_offset), block=GGML_QUANT_SIZES[ggml_type], raw=raw,
            )

    # ------------------------------------------------------------------ metadata
    def keys(self) -> Iterator[str]:
        return (k for k in self._reader.fields if not k.startswith("GGUF."))

    def has(self, key: str) -> bool:
        return key in self._reader.fields or key in self._dropped

    def value(self, key: str, default: Any = None) -> Any:
        """The metadata value under `key` (a str, int, float, bool or list), or `default`."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (UnicodeDecodeError, IndexError, ValueError) as err:
            raise GGUFFormatError(f"{self.path}: metadata {key!r} is unreadable ({err})") from None

    def array_length(self, key: str) -> int:
        """Entries of an array value without decoding them (0 when absent)."""
        field = self._reader.fields.get(key)
        return self._dropped.get(key, 0) if field is None else len(field.data)

    # ------------------------------------------------------------------ tensors
    def tensor(self, name: str) -> GGUFTensor:
        return self.tensors[name]

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data the file holds (what a package's weights are compared with)."""
        return sum(t.n_bytes for t in self.tensors.values())

    def close(self) -> None:
        """Drop the map (views handed out keep it alive until they go)."""
        self.tensors = {}
        self._reader = None
