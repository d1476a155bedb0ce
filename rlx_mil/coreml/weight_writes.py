"""Writing float weights into the package without coremltools' extra copies.

coremltools serialises every fp16 const through `val.flatten().tobytes()` (two full copies of
the array, then a view of them) and every fp32 const through `val.flatten()`: for a 1B-parameter
model that is seconds of copying and, for the largest weight, twice its size in transient
memory. A C-contiguous array's flat view holds exactly those bytes, so while `direct_weight_writes`
is active the fp16/fp32 consts are handed to the blob writer as that view; every other value
goes through coremltools' own function unchanged. Consts held by a
`rlx_mil.compress.code_store.CodeStore` are handed to the blob writer as views of their file
(coremltools' `flatten()` would copy them) and drop their mapped pages once written, so
serialising a model does not bring its spilled codes back into the process's memory.

Once a large fp16/fp32 const is in the weight file, its array is handed over to the file: the
const's value becomes a read-only map of the bytes just written (the blob's metadata read back
and checked first), and the array itself is freed. The file's page-cache pages then reuse the
memory the arrays leave, instead of the conversion needing the weights twice over (the
program's arrays plus the file being written) when the last weight is written; the values stay
readable, from the file.

coremltools then builds the package from a temporary weights folder by copying that folder in
(`ModelPackage.addItem`): the whole weight file written a second time. While
`direct_weight_writes` is active the package is built around an empty weights folder (so its
manifest is the one coremltools writes) and the weight files are then moved into it: a rename
where both folders are on one file system (they are: both are coremltools' temporary folders
unless `package_dir` says otherwise), a copy elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.compress.code_store import writing_without_copies
from rlx_mil.coreml import patches
from rlx_mil.errors import FileAccessError

#: The manifest description coremltools gives the weights folder of an ML Program package.
WEIGHTS_ITEM_DESCRIPTION = "CoreML Model Weights"


def _writer(original: Any) -> Any:
    from coremltools.converters.mil.mil import types

    def write(output_var: Any, blob_writer: Any) -> Any:
        val = output_var.val
        try:
            with writing_without_copies(val):
                return _write(output_var, val, blob_writer)
        except RuntimeError as err:
            # coremltools' C++ file writer reports a failed write (full disk, a file-size
            # limit, an I/O error) as a RuntimeError without the OS's reason.
            if "[MIL FileWriter]" not in str(err):
                raise
            where = _writer_paths.get(id(blob_writer), "the weight file")
            raise FileAccessError(f"{where}: writing the weights failed (is the disk full, or a file-size"
                                  " limit reached?)") from err

    def _write(output_var: Any, val: Any, blob_writer: Any) -> Any:
        if isinstance(val, np.ndarray) and val.flags.c_contiguous:
            if output_var.dtype == types.fp16 and val.dtype == np.float16:
                offset = blob_writer.write_fp16_data(val.reshape(-1).view(np.uint16))
                _hand_over_to_file(output_var, val, blob_writer, offset)
                return offset
            if output_var.dtype == types.fp32 and val.dtype == np.float32:
                offset = blob_writer.write_float_data(val.reshape(-1))
                _hand_over_to_file(output_var, val, blob_writer, offset)
                return offset
        return original(output_var, blob_writer)

    write.rlx_mil_direct = True  # type: ignore[attr-defined]
    return write


#: Consts smaller than this keep their arrays (a map costs a page-rounded region and a mapping).
HAND_OVER_MIN_BYTES = 1 << 20
#: MIL blob storage: each blob's metadata starts with this sentinel, then the data type (u32),
#: the data's size in bytes (u64) and the data's offset in the file (u64).
_BLOB_SENTINEL = 0xDEADBEEF
_BLOB_METADATA = np.dtype([("sentinel", "<u4"), ("dtype", "<u4"), ("size", "<u8"), ("offset", "<u8")])
#: The weight file each blob writer of the running conversion writes (by the writer's id).
_writer_paths: dict[int, str] = {}


def _recording_blob_writer(real: Any) -> Any:
    def make(path: str) -> Any:
        writer = real(path)
        # Every writer the serialiser uses is made here, so the entry for its id is its own.
        _writer_paths[id(writer)] = path
        return writer

    return make


def _hand_over_to_file(output_var: Any, val: np.ndarray, blob_writer: Any, metadata_offset: int) -> None:
    """Point a const at the bytes `blob_writer` just wrote for `val` (see the module doc).
    Anything unexpected (an unknown writer, metadata that does not describe `val`, a file not
    yet holding the data) leaves the const as it is."""
    op = output_var.op
    path = _writer_paths.get(id(blob_writer))
    if path is None or val.nbytes < HAND_OVER_MIN_BYTES or op is None or op.op_type != "const":
        return
    try:
        with open(path, "rb") as stream:
            raw = os.pread(stream.fileno(), _BLOB_METADATA.itemsize, int(metadata_offset))
            size = os.fstat(stream.fileno()).st_size
    except OSError:
        return
    if len(raw) != _BLOB_METADATA.itemsize:
        return
    meta = np.frombuffer(raw, dtype=_BLOB_METADATA)[0]
    start, nbytes = int(meta["offset"]), int(meta["size"])
    if int(meta["sentinel"]) != _BLOB_SENTINEL or nbytes != val.nbytes or start + nbytes > size:
        return
    try:
        view = np.memmap(path, dtype=val.dtype, mode="r", offset=start, shape=val.shape)
    except (OSError, ValueError):
        return
    for holder in (op.val, output_var):  # the const's value input and its output
        if holder._sym_val is not None and holder._sym_val.val is val:
            holder._sym_val.val = view


def package_weights_folder(package: Path) -> Path | None:
    """The weights folder a package's manifest names, or None if it names none."""
    try:
        manifest = json.loads((package / "Manifest.json").read_text())
        entries = manifest["itemInfoEntries"].values()
        path = next(e["path"] for e in entries if e.get("description") == WEIGHTS_ITEM_DESCRIPTION)
    except (OSError, ValueError, KeyError, AttributeError, StopIteration, TypeError):
        return None
    folder = package / "Data" / path
    return folder if folder.is_dir() else None


def _package_creator(original: Any) -> Any:
    def create(proto_spec: Any, weights_dir: str | None = None, package_path: str | None = None) -> Any:
        if weights_dir is None or not os.listdir(weights_dir):
            return original(proto_spec, weights_dir, package_path)
        with tempfile.TemporaryDirectory(dir=os.path.dirname(weights_dir) or None) as empty:
            created = original(proto_spec, empty, package_path)
        target = package_weights_folder(Path(created))
        if target is None or os.listdir(target):  # not the layout this was written for
            shutil.rmtree(created, ignore_errors=True)
            return original(proto_spec, weights_dir, package_path)
        try:
            for name in os.listdir(weights_dir):
                shutil.move(os.path.join(weights_dir, name), target / name)  # a rename on one file system
        except BaseException:
            shutil.rmtree(created, ignore_errors=True)
            raise
        return created

    create.rlx_mil_direct = True  # type: ignore[attr-defined]
    return create


@contextmanager
def direct_weight_writes() -> Iterator[None]:
    from coremltools.converters.mil.backend.mil import helper
    from coremltools.models import model as ct_model

    original = helper._get_offset_by_writing_data
    if getattr(original, "rlx_mil_direct", False):  # a conversion already installed it
        yield
        return
    from coremltools.converters.mil.backend.mil import load

    original_create, original_blob_writer = ct_model._create_mlpackage, load.BlobWriter
    try:
        with ExitStack() as stack:
            stack.enter_context(patches.replaced(
                "coremltools.converters.mil.backend.mil.helper:_get_offset_by_writing_data", _writer(original)))
            stack.enter_context(patches.replaced(
                "coremltools.models.model:_create_mlpackage", _package_creator(original_create)))
            if original_blob_writer is not None:
                stack.enter_context(patches.replaced(
                    "coremltools.converters.mil.backend.mil.load:BlobWriter", _recording_blob_writer(original_blob_writer)))
            yield
    finally:
        _writer_paths.clear()
