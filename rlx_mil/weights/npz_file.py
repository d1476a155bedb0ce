"""`.npz`: a zip of `.npy` members, each checked from its zip entry and `.npy` header before
any of its data is read.

`numpy.load` trusts the archive: a member whose header claims `(2**40,)` is allocated before
anything is read, a deflated member is expanded without bound (a zip bomb), encrypted and
non-`.npy` members raise assorted builtin errors or come back as bytes. Here every member
must be an unencrypted stored/deflated `.npy` whose header declares a numeric dtype and a
shape within the tensor limit, whose declared sizes agree with the zip entry, and whose
compressed bytes are really in the file; data is then read into an array of exactly the
declared size, never more.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from rlx_mil.errors import WeightsFormatError
from rlx_mil.fileio import open_regular_file
from rlx_mil.weights.base import LazyTensors, TensorHeader, check_shape, short_repr

#: numpy's own bound on a `.npy` header (`max_header_size`).
MAX_NPY_HEADER_BYTES = 10_000
#: Deflate can expand about 1000:1; real weights compress barely at all. A member expanding
#: more than this, and to more than `ZIP_BOMB_MIN_BYTES`, is refused as a zip bomb.
MAX_COMPRESSION_RATIO = 100
ZIP_BOMB_MIN_BYTES = 16 << 20
MAX_MEMBERS = 1_000_000
_READ_CHUNK = 16 << 20
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError,
               NotImplementedError, RuntimeError, KeyError)
_HEADER_READERS: dict[tuple[int, int], Callable[..., tuple[tuple[int, ...], bool, np.dtype[Any]]]] = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _numeric_dtype(where: str, dtype: np.dtype[Any]) -> np.dtype[Any]:
    if dtype.hasobject or dtype.kind not in "biuf" or (dtype.kind == "f" and dtype.itemsize not in (2, 4, 8)):
        hint = "; .npy cannot record bfloat16 (it becomes raw void bytes): use .safetensors" if dtype.kind == "V" else ""
        raise WeightsFormatError(
            f"{where}: dtype {dtype.str!r} is not a supported numeric dtype (bool, int, uint, float){hint}"
        )
    return dtype


class NpzFile(LazyTensors):
    """A `.npz` archive whose members are validated at open and read on access."""

    def __init__(self, path: str | os.PathLike[str], what: str = "weights file") -> None:
        p = Path(path)
        stream, size = open_regular_file(p, what)
        self._stream: BinaryIO | None = stream
        self._zip: zipfile.ZipFile | None = None
        self._infos: dict[str, zipfile.ZipInfo] = {}
        try:
            self._zip = self._open_zip(p, stream)
            headers = self._validate(p, self._zip, size)
        except BaseException:
            self.close()
            raise
        super().__init__(p, headers, {})

    @staticmethod
    def _open_zip(path: Path, stream: BinaryIO) -> zipfile.ZipFile:
        try:
            return zipfile.ZipFile(stream)
        except _ZIP_ERRORS as err:
            stream.seek(0)
            if stream.read(6) == b"\x93NUMPY":
                raise WeightsFormatError(f"{path}: a single .npy array, not an .npz archive (save with np.savez)") from None
            raise WeightsFormatError(f"{path}: not a readable .npz (zip) archive: {err}") from None

    def _validate(self, path: Path, archive: zipfile.ZipFile, size: int) -> dict[str, TensorHeader]:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            raise WeightsFormatError(f"{path}: {len(infos)} members, more than the limit of {MAX_MEMBERS}")
        for info in infos:
            where = f"{path}: member {short_repr(info.filename)}"
            if info.is_dir() or not info.filename.endswith(".npy"):
                raise WeightsFormatError(f"{where}: not a .npy array (an .npz holds only .npy members)")
            name = info.filename[: -len(".npy")]
            if name in self._infos:
                raise WeightsFormatError(f"{where}: appears twice in the archive")
            if info.flag_bits & 0x1:
                raise WeightsFormatError(f"{where}: encrypted; rlx_mil reads only unencrypted archives")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise WeightsFormatError(
                    f"{where}: compression method {info.compress_type} (only stored and deflated, as numpy writes)"
                )
            if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
                raise WeightsFormatError(f"{where}: stored with {info.compress_size} bytes but declares {info.file_size}")
            if info.file_size > ZIP_BOMB_MIN_BYTES and info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
                raise WeightsFormatError(
                    f"{where}: {info.compress_size} compressed bytes expand to {info.file_size}"
                    f" (more than {MAX_COMPRESSION_RATIO}x); refused as a likely zip bomb"
                )
            self._infos[name] = info
        # Each member's compressed bytes must be its own and inside the file: overlapping
        # entries are how a small archive claims many large members.
        ordered = sorted(infos, key=lambda i: i.header_offset)
        for at, info in enumerate(ordered):
            limit = ordered[at + 1].header_offset if at + 1 < len(ordered) else size
            if info.header_offset + info.compress_size > limit:
                raise WeightsFormatError(
                    f"{path}: member {short_repr(info.filename)}: its {info.compress_size} compressed bytes"
                    " overlap the next member or run past the end of the file"
                )
        return {name: self._npy_header(path, archive, name, info) for name, info in self._infos.items()}

    def _npy_header(self, path: Path, archive: zipfile.ZipFile, name: str, info: zipfile.ZipInfo) -> TensorHeader:
        where = f"{path}: member {short_repr(info.filename)}"
        try:
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                reader = _HEADER_READERS.get(version)
                if reader is None:
                    raise WeightsFormatError(f"{where}: unsupported .npy format version {version}")
                shape, fortran_order, dtype = reader(member, max_header_size=MAX_NPY_HEADER_BYTES)
                data_start = member.tell()
        except WeightsFormatError:
            raise
        except _ZIP_ERRORS as err:
            raise WeightsFormatError(f"{where}: not a readable .npy array: {err}") from None
        dims = check_shape(where, shape)
        dtype = _numeric_dtype(where, np.dtype(dtype))
        nbytes = dtype.itemsize * int(np.prod(dims, dtype=object))
        if info.file_size != data_start + nbytes:
            raise WeightsFormatError(
                f"{where}: holds {info.file_size - data_start} data bytes, but its header declares"
                f" {dtype.str}{list(dims)} ({nbytes} bytes)"
            )
        order = "F" if fortran_order else "C"
        return TensorHeader(name, dtype.newbyteorder("="), dims, f"{dtype.str}:{order}", data_start, data_start + nbytes)

    def _read(self, header: TensorHeader) -> np.ndarray:
        if self._zip is None:
            raise WeightsFormatError(f"{self.path}: closed; cannot read tensor {header.name!r}")
        info = self._infos[header.name]
        stored = np.dtype(header.format_dtype.split(":")[0])
        where = f"{self.path}: member {info.filename!r}"
        flat = np.empty(header.size, dtype=stored)
        buffer = memoryview(flat.reshape(-1).view(np.uint8).data)
        try:
            with self._zip.open(info) as member:
                member.read(header.begin)
                filled = 0
                while filled < header.nbytes:
                    got = member.readinto(buffer[filled: filled + _READ_CHUNK])  # type: ignore[attr-defined]
                    if not got:
                        raise WeightsFormatError(f"{where}: truncated after {filled} of {header.nbytes} data bytes")
                    filled += got
                if member.read(1):  # also where zipfile checks the CRC
                    raise WeightsFormatError(f"{where}: more data than its header declares")
        except WeightsFormatError:
            raise
        except _ZIP_ERRORS as err:
            raise WeightsFormatError(f"{where}: cannot be read: {err}") from None
        if not stored.isnative:
            flat = flat.byteswap(inplace=True).view(stored.newbyteorder("="))
        order: Literal["C", "F"] = "F" if header.format_dtype.endswith(":F") else "C"
        return self._checked(header, flat.reshape(header.shape, order=order))

    def close(self) -> None:
        archive, self._zip = getattr(self, "_zip", None), None
        stream, self._stream = getattr(self, "_stream", None), None
        if archive is not None:
            archive.close()
        if stream is not None:
            stream.close()

    def __del__(self) -> None:
        self.close()


def open_npz(path: str | os.PathLike[str], what: str = "weights file") -> NpzFile:
    """Open an `.npz` lazily: every member validated now, each array read on access."""
    return NpzFile(path, what)
