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
import mmap
import os
import sys
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
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


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


@dataclass(frozen=True)
class _Array:
    """A metadata array left in the file: its element type, first byte, length and end."""

    item_type: Any
    start: int
    count: int
    end: int


def _string_walk(buf: memoryview, start: int, count: int, size: int, order: str, keep: bool) -> tuple[int, list[str]]:
    """The end of `count` GGUF strings (u64 length + bytes) from `start`, and the strings
    themselves when `keep`; a length running past the file is a ValueError."""
    pos, out = start, []
    for _ in range(count):
        if pos + 8 > size:
            raise ValueError(f"a string array runs past the end of the file at byte {pos}")
        n = int.from_bytes(buf[pos:pos + 8], order)  # type: ignore[arg-type]
        pos += 8
        if n > size - pos:
            raise ValueError(f"a string of {n} bytes at byte {pos} runs past the end of the file")
        if keep:
            out.append(str(buf[pos:pos + n], "utf-8"))
        pos += n
    return pos, out


def _validated_reader(path: Path, size: int) -> Any:
    """A `gguf.GGUFReader` whose header parsing refuses counts, shapes and offsets the file
    cannot hold, naming the tensor. Metadata arrays of strings or numbers are not split into
    a view per entry (`gguf.GGUFReader` makes one, a few hundred bytes each: a 150k-token
    vocabulary cost a few hundred MB): their place is recorded in `arrays` (by the offset of
    the value) and `GGUFFile.value` decodes them when asked."""
    import gguf
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

    class Reader(gguf.GGUFReader):
        arrays: dict[int, _Array]

        def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
            if raw_type != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            alen = self._get(orig_offs + 4, np.uint64)
            if len(raw_itype) != 1 or len(alen) != 1:
                raise ValueError(f"the metadata array at byte {orig_offs} is truncated")
            item = GGUFValueType(int(raw_itype[0]))
            count, start = int(alen[0]), orig_offs + 12
            if item == GGUFValueType.STRING:
                if count > (size - start) // 8:
                    raise GGUFFormatError(f"{path}: the metadata array at byte {orig_offs} claims {count} strings; the"
                                          f" file's {size} bytes cannot hold them")
                order = sys.byteorder if self.byte_order == "I" else ("big" if sys.byteorder == "little" else "little")
                end, _ = _string_walk(np.asarray(self.data).data, start, count, size, order, keep=False)
            else:
                nptype = self.gguf_scalar_to_np.get(item)
                if nptype is None:  # arrays of arrays: as gguf reads them
                    return super()._get_field_parts(orig_offs, raw_type)
                end = start + count * np.dtype(nptype).itemsize
                if end > size:
                    raise GGUFFormatError(f"{path}: the metadata array at byte {orig_offs} claims {count} {item.name}"
                                          f" entries; the file's {size} bytes cannot hold them")
            if not hasattr(self, "arrays"):
                self.arrays = {}
            self.arrays[orig_offs] = _Array(item, start, count, end)
            return end - orig_offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, item]

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


class GGUFFile:
    """A GGUF file's metadata (`value(key)`) and tensors (`tensor(name)`), memory-mapped.

    Metadata arrays (the tokenizer's tokens, merges, scores, types) stay in the file until
    `value` decodes one: parsing the header of a 150k-token vocabulary allocates nothing per
    entry.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        stream, size = open_regular_file(self.path, "GGUF file")  # FIFOs, devices, folders refused
        stream.close()
        self.size = size
        if size < 24:
            raise GGUFFormatError(f"{self.path}: {size} bytes is too short for a GGUF header (truncated?)")
        with open(self.path, "rb") as f:
            magic, version_bytes = f.read(4), f.read(4)
        if magic != b"GGUF":
            raise GGUFFormatError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        version = int.from_bytes(version_bytes, "little")
        if version & 0xFFFF == 0:  # a big-endian file, as gguf's reader detects it
            version = int.from_bytes(version_bytes, "big")
        if version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: GGUF version {version}; rlx_mil reads GGUF versions 2 and 3")
        try:
            reader = _validated_reader(self.path, size)
        except GGUFFormatError:
            raise
        except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError, TypeError) as err:
            duplicate = str(err.args[0]) if isinstance(err, KeyError) and err.args else ""
            if duplicate.startswith("Duplicate "):  # gguf's reader: "Duplicate NAME already in list at offset N"
                name = duplicate[len("Duplicate "):].split(" already in list")[0]
                raise GGUFFormatError(f"{self.path}: {name!r} appears twice (a metadata key or tensor name)") from None
            if str(err).startswith("Found duplicated tensor with name "):
                name = str(err)[len("Found duplicated tensor with name "):]
                raise GGUFFormatError(f"{self.path}: tensor {name!r} appears twice", tensor=name) from None
            if "alignment" in str(err):
                raise GGUFFormatError(f"{self.path}: general.alignment must be a power of two ({err})") from None
            raise GGUFFormatError(f"{self.path}: not a readable GGUF file ({type(err).__name__}: {err}); truncated or corrupt") from None
        arrays: dict[int, _Array] = getattr(reader, "arrays", {})
        self._arrays: dict[str, _Array] = {}
        for key, field in reader.fields.items():
            if len(field.parts) >= 3:  # key length, key, value type, then the value
                at = int(field.offset) + sum(int(p.nbytes) for p in field.parts[:3])
                if at in arrays:
                    self._arrays[key] = arrays[at]
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
        return key in self._reader.fields

    def value(self, key: str, default: Any = None) -> Any:
        """The metadata value under `key` (a str, int, float, bool or list), or `default`."""
        field = self._reader.fields.get(key)
        if field is None:
            return default
        try:
            array = self._arrays.get(key)
            return field.contents() if array is None else self._decode(array)
        except (UnicodeDecodeError, IndexError, ValueError) as err:
            raise GGUFFormatError(f"{self.path}: metadata {key!r} is unreadable ({err})") from None

    def _decode(self, array: _Array) -> list[Any]:
        from gguf.constants import GGUFValueType

        data = self._reader.data
        swapped = self._reader.byte_order != "I"
        if array.item_type == GGUFValueType.STRING:
            order = sys.byteorder if not swapped else ("big" if sys.byteorder == "little" else "little")
            return _string_walk(np.asarray(data).data, array.start, array.count, self.size, order, keep=True)[1]
        dtype = np.dtype(self._reader.gguf_scalar_to_np[array.item_type])
        values = np.asarray(data[array.start:array.end]).view(dtype.newbyteorder("S") if swapped else dtype)
        return values.tolist()

    def array_length(self, key: str) -> int:
        """Entries of an array value without decoding them (0 when absent)."""
        array = self._arrays.get(key)
        if array is not None:
            return array.count
        field = self._reader.fields.get(key)
        return 0 if field is None else len(field.data)

    # ------------------------------------------------------------------ tensors
    def tensor(self, name: str) -> GGUFTensor:
        return self.tensors[name]

    def release_pages(self, name: str) -> None:
        """Drop the pages of tensor `name` from the process (`madvise(MADV_DONTNEED)` on the
        read-only file map: the bytes stay in the file and a later read faults them in again),
        so a conversion that has taken a tensor's codes does not keep the file resident."""
        t = self.tensors.get(name)
        mapping = getattr(getattr(self._reader, "data", None), "_mmap", None)
        if t is None or mapping is None or _DONTNEED is None or t.n_bytes == 0:
            return
        begin = t.offset - t.offset % mmap.PAGESIZE
        end = min(self.size, t.offset + t.n_bytes)
        try:
            mapping.madvise(_DONTNEED, begin, end - begin)
        except (OSError, ValueError):  # a platform or map that refuses: the pages just stay
            pass

    @property
    def tensor_bytes(self) -> int:
        """Bytes of tensor data the file holds (what a package's weights are compared with)."""
        return sum(t.n_bytes for t in self.tensors.values())

    def close(self) -> None:
        """Drop the map (views handed out keep it alive until they go)."""
        self.tensors = {}
        self._reader = None
