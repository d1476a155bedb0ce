"""A conversion-scoped, file-backed home for large compressed-weight codes.

coremltools keeps every constant of a MIL program in memory until it serialises the program,
and holds sub-byte codes (`types.np_int4_dtype` & co., int8/uint8 with metadata) one byte per
code: an 8B-parameter model compressed to int4 holds 8 GB of codes although its package stores
4 GB. `CodeStore` writes each large code tensor (and scale/offset table) to an unnamed
temporary file at a page-aligned offset and hands the program a read-only view of a shared
mapping of that file instead, so the codes sit in the page cache, not in process memory:

* the file is `tempfile.TemporaryFile` in `tempfile.gettempdir()` (honours TMPDIR): O_TMPFILE or
  unlinked at once, so nothing is left behind even on a crash. It lives while a mapping does:
  the mappings belong to the views the program's consts hold, i.e. to the converted model.
* bytes go in with `pwrite` (page cache, never mapped writable): whole arrays (`hold`) or, from
  the encoders, a slab of rows at a time (`writer`), so a large weight's codes are never whole in
  memory. The file is mapped in segments of `SEGMENT_BYTES`, so a model needs a handful of
  mappings (and file descriptors), not one per weight.
* pages a read faults in count in the process's RSS for as long as they stay mapped, so reading
  every const at serialisation would bring the codes back into RSS. `SpilledArray.flatten()`
  (what coremltools' serialiser calls on each const) returns a plain copy and drops the view's
  pages from the mapping (`madvise(MADV_DONTNEED)`: safe on a shared file mapping, the data stays
  in the file and a later read faults it in again). Inside rlx_mil's blob-writer hook
  (`rlx_mil.coreml.weight_writes`, `writing_without_copies`) it is a plain view of the file
  instead, and the pages are dropped once the const is written, whichever way coremltools read
  it; a spilled array that is dropped (a duplicate a pass removed) drops its pages too.
* comparing a spilled array with itself (coremltools' check that value inference did not change
  a const) does not read it.
* tensors below `SPILL_MIN_BYTES` (64 KiB) stay in memory (the view and its page rounding are
  not free; a 135M-parameter model's matrices are each under 1 MiB, so a higher threshold
  kept all of its codes in memory). Where the temporary directory is a memory filesystem (tmpfs,
  ramfs) a file gives no saving, so the store keeps everything in memory; so it does when the
  platform lacks shared mappings with madvise, or when writing the file fails (a full disk):
  the conversion then needs the memory it would have needed without the store.

The bytes a spilled array holds are exactly the bytes it was given, so a package written from
spilled codes is byte-identical to one written from in-memory codes.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

#: Arrays smaller than this stay in memory.
SPILL_MIN_BYTES = 1 << 16
#: The file is mapped this many bytes at a time (larger arrays get a segment of their own).
SEGMENT_BYTES = 1 << 30
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})

_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_ALIGN = mmap.ALLOCATIONGRANULARITY


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def filesystem_type(path: str | os.PathLike[str]) -> str | None:
    """The type of the filesystem holding `path` from /proc/self/mountinfo (None where there
    is no such file, e.g. macOS)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, tail.split()[0]
    return best_type


class _Region:
    """A page-aligned byte range of one segment mapping."""

    def __init__(self, segment: mmap.mmap, start: int, length: int, address: int) -> None:
        self.segment = segment
        self.start = start
        self.length = length
        self.address = address

    def contains(self, address: int) -> bool:
        return self.address <= address < self.address + max(self.length, 1)

    def release(self) -> None:
        if _DONTNEED is not None and self.length and not self.segment.closed:
            self.segment.madvise(_DONTNEED, self.start, self.length)


class SpilledArray(np.ndarray):
    """A read-only ndarray over a region of a `CodeStore` file. Views keep the type (and the
    region); results of arithmetic are plain ndarrays in memory."""

    _region: _Region | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self._region = getattr(obj, "_region", None)

    def __array_wrap__(self, obj: Any, context: Any = None, return_scalar: bool = False) -> Any:
        out = np.asarray(obj).view(np.ndarray)
        return out[()] if return_scalar else out

    def release_pages(self) -> None:
        """Drop this array's pages from the process (they stay in the file; reading again
        faults them back in). A no-op for arrays not backed by the store's mapping."""
        region = self._region
        if region is not None and self.size and region.contains(self.ctypes.data):
            region.release()

    def flatten(self, order: Any = "C") -> np.ndarray:
        """A flat copy in memory (a plain ndarray); the mapped pages are dropped afterwards.
        Inside `writing_without_copies` (the serialiser's hook, which drops the pages once the
        const is written), a flat plain view of the file instead."""
        if getattr(_WRITING, "depth", 0) and order in ("C", "K", "A") and self.flags.c_contiguous:
            return self.view(np.ndarray).reshape(-1)
        flat = np.ndarray.flatten(self.view(np.ndarray), order)
        self.release_pages()
        return flat

    # coremltools re-runs value inference on every op (reduce_transposes does, for the whole
    # program) and checks the new value against the old one with `np.any(new != old)`, both the
    # same array: answered without reading the codes (or allocating a mask of their size).
    def __eq__(self, other: Any) -> Any:
        if other is self:
            return np.broadcast_to(np.True_, self.shape)
        return np.ndarray.__eq__(self, other)

    def __ne__(self, other: Any) -> Any:
        if other is self:
            return np.broadcast_to(np.False_, self.shape)
        return np.ndarray.__ne__(self, other)

    def __reduce__(self) -> Any:  # pickles (and deep copies) as plain in-memory arrays
        return np.ndarray.__reduce__(np.array(self.view(np.ndarray)))


_WRITING = threading.local()  # .depth: inside writing_without_copies on this thread


def release_pages(value: Any) -> None:
    """`SpilledArray.release_pages` for a value that may be one."""
    if isinstance(value, SpilledArray):
        value.release_pages()


@contextmanager
def writing_without_copies(value: Any) -> Iterator[None]:
    """While a blob writer reads `value`: its `flatten()` is a view of the file (no copy of the
    codes in memory); its pages are dropped when the block ends."""
    _WRITING.depth = getattr(_WRITING, "depth", 0) + 1
    try:
        yield
    finally:
        _WRITING.depth -= 1
        release_pages(value)


class CodeStore:
    """Large code tensors of one conversion, in an unnamed temporary file (see the module doc)."""

    def __init__(self, directory: str | None = None, min_bytes: int | None = None) -> None:
        self.directory = directory or tempfile.gettempdir()
        self.min_bytes = SPILL_MIN_BYTES if min_bytes is None else min_bytes
        fs = filesystem_type(self.directory)
        self.why_in_memory: str | None = None
        if _DONTNEED is None or os.name != "posix":
            self.why_in_memory = "this platform has no madvise(MADV_DONTNEED) on shared mappings"
        elif fs in MEMORY_FILESYSTEMS:
            self.why_in_memory = f"{self.directory} is on {fs} (memory); set TMPDIR to a disk directory"
        self._file: Any = None
        self._segment: mmap.mmap | None = None
        self._segment_start = 0  # file offset of the current segment
        self._segment_used = 0
        self._segment_size = 0
        self._file_end = 0
        self.spilled_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.why_in_memory is None

    def hold(self, array: np.ndarray, dtype: Any = None) -> np.ndarray:
        """`array` as `dtype` (same item size: a sub-byte coremltools dtype over int8/uint8
        codes), from the file when it is large, else `array.astype(dtype)` in memory."""
        dtype = np.dtype(array.dtype if dtype is None else dtype)
        if dtype.itemsize != array.dtype.itemsize:
            return array.astype(dtype)
        if isinstance(array, SpilledArray) and array.base is not None:  # already in the file (a writer's result)
            return array.view(dtype)
        if not self.enabled or array.nbytes < self.min_bytes:
            return array.astype(dtype)
        try:
            return self._spill(np.ascontiguousarray(array), dtype)
        except OSError as err:
            self._fail(err)
            return array.astype(dtype)

    def _fail(self, err: OSError) -> None:
        self.why_in_memory = f"writing {self.directory} failed ({err})"
        warnings.warn(
            f"rlx_mil: compressed weights stay in memory: {self.why_in_memory}; set TMPDIR to a directory with"
            " free space to keep them on disk during conversion", RuntimeWarning, stacklevel=3,
        )

    def writer(self, shape: tuple[int, ...], dtype: Any) -> CodeWriter:
        """Where an encoder puts a code tensor of `shape` rows by rows: the file when the
        tensor is large (it is then never whole in memory), else an in-memory array."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.enabled and nbytes >= self.min_bytes and shape:
            try:
                return _FileWriter(self, shape, dtype, self._reserve(nbytes))
            except OSError as err:
                self._fail(err)
        return CodeWriter(shape, dtype)

    def _reserve(self, nbytes: int) -> tuple[mmap.mmap, int, int]:
        """(segment, offset in it, offset in the file) of `nbytes` new page-aligned bytes."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self.directory)
            weakref.finalize(self, self._file.close)  # a store dropped unclosed closes quietly
        if self._segment is None or self._segment_used + nbytes > self._segment_size:
            self._new_segment(nbytes)
        assert self._segment is not None
        start = self._segment_used
        self._segment_used = _round_up(start + nbytes, _ALIGN)
        return self._segment, start, self._segment_start + start

    def _spill(self, array: np.ndarray, dtype: np.dtype[Any]) -> SpilledArray:
        segment, start, file_offset = self._reserve(array.nbytes)
        self._write(array.reshape(-1).view(np.uint8).data, file_offset)
        self.spilled_bytes += array.nbytes
        return self._view(segment, start, array.shape, dtype)

    def _view(self, segment: mmap.mmap, start: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> SpilledArray:
        view = np.ndarray(shape, dtype=dtype, buffer=segment, offset=start).view(SpilledArray)
        nbytes = view.nbytes
        region = view._region = _Region(segment, start, nbytes, view.ctypes.data)
        region.release()  # nothing was read through the mapping yet; keep it that way
        # A const a pass drops (a duplicate const_deduplication compared in full) is never
        # written: its pages go when its last view does.
        weakref.finalize(view, region.release)
        return view

    def _new_segment(self, nbytes: int) -> None:
        size = max(SEGMENT_BYTES, _round_up(nbytes, _ALIGN))
        start = self._file_end
        os.ftruncate(self._file.fileno(), start + size)  # sparse: blocks come with the writes
        self._segment = mmap.mmap(self._file.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=start)
        self._segment_start, self._segment_size, self._segment_used = start, size, 0
        self._file_end = start + size

    def _write(self, data: memoryview, offset: int) -> None:
        fd = self._file.fileno()
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)

    def close(self) -> None:
        """Close the store's own handle; the mappings (and with them the file) live on while a
        spilled array does."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._segment = None


class CodeWriter:
    """An encoder's output for one code tensor, filled a block of rows at a time (in memory)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.shape = shape
        self.dtype = dtype
        self._data: np.ndarray | None = np.empty(shape, dtype)

    def put(self, row: int, rows: np.ndarray) -> None:
        """Rows `row`, `row + 1`, ... of the tensor (axis 0), cast to its dtype."""
        assert self._data is not None
        self._data[row:row + rows.shape[0]] = rows

    def result(self) -> np.ndarray:
        assert self._data is not None
        return self._data


class _FileWriter(CodeWriter):
    """Rows go to the store's file as they come; the result is the file's view of them."""

    def __init__(self, store: CodeStore, shape: tuple[int, ...], dtype: np.dtype[Any],
                 place: tuple[mmap.mmap, int, int]) -> None:
        self.shape, self.dtype = shape, dtype
        self._data = None
        self._store = store
        self._segment, self._start, self._file_offset = place
        self._row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self._rows_done = 0

    def put(self, row: int, rows: np.ndarray) -> None:
        if self._data is not None:  # writing failed earlier: in memory from then on (or done)
            super().put(row, rows)
            return
        chunk = np.ascontiguousarray(rows, dtype=self.dtype)
        try:
            self._store._write(chunk.reshape(-1).view(np.uint8).data, self._file_offset + row * self._row_bytes)
        except OSError as err:
            self._store._fail(err)
            self._data = np.empty(self.shape, self.dtype)  # rows written so far come back from the file
            self._data[:self._rows_done] = self._view()[:self._rows_done]
            super().put(row, rows)
            return
        self._rows_done = max(self._rows_done, row + rows.shape[0])

    def _view(self) -> SpilledArray:
        return self._store._view(self._segment, self._start, self.shape, self.dtype)

    def result(self) -> np.ndarray:
        if self._data is None:
            self._data = self._view()
            self._store.spilled_bytes += self._data.nbytes
        return self._data


#: Makes the writer of a code tensor from its (shape, dtype): `CodeWriter` (in memory) or
#: `CodeStore.writer`.
WriterFactory = Callable[[tuple[int, ...], np.dtype[Any]], CodeWriter]
