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
from rlx_mil.progress import BYTES, count_bytes, counting, stage_running, tick

#: The manifest description coremltools gives the weights folder of an ML Program package.
WEIGHTS_ITEM_DESCRIPTION = "CoreML Model Weights"


def _writer(original: Any) -> Any:
    from coremltools.converters.mil.mil import types

    def write(output_var: Any, blob_writer: Any) -> Any:
        val = output_var.val
        if stage_running() and not counting(BYTES):
            # The first weight of a one-function conversion: its stage's bar counts the weight
            # file's bytes from here (a joined package's stage counts them already, `join_programs`).
            count_bytes(function_blob_bytes(output_var))
        try:
            with writing_without_copies(val):
                offset = _write(output_var, val, blob_writer)
            if counting(BYTES):
                tick(BYTES, blob_bytes(output_var))
            return offset
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


def blob_bytes(var: Any) -> int:
    """About the bytes the weight file takes for const `var` (sub-byte codes packed; the
    blob's 64-byte header and alignment left out)."""
    from coremltools.converters.mil.mil import types

    val = var.val
    if not isinstance(val, np.ndarray):
        return 0
    dtype = var.dtype
    if types.is_sub_byte(dtype):
        return (val.size * int(dtype.get_bitwidth()) + 7) // 8
    return int(val.nbytes)


#: coremltools writes consts of at least this many elements to the weight file.
BLOB_MIN_ELEMENTS = 10


def program_blob_bytes(functions: Any) -> int:
    """About the bytes of the weight file the blocks `functions` are written to (a const shared
    across them by `weight_id` counted once)."""
    total, seen = 0, set()
    for function in functions:
        for op in function.operations:
            if op.op_type != "const":
                continue
            value = op.outputs[0].val
            if not isinstance(value, np.ndarray) or value.size < BLOB_MIN_ELEMENTS:
                continue
            weight_id = getattr(op, "weight_id", None)
            key = weight_id if weight_id is not None else id(op)
            if key not in seen:
                seen.add(key)
                total += blob_bytes(op.outputs[0])
    return total


def function_blob_bytes(var: Any) -> int:
    """`program_blob_bytes` of the function holding const `var` (0 if it is in none)."""
    block = getattr(var.op, "enclosing_block", None)
    while block is not None and getattr(block, "outer_op", None) is not None:
        block = block.outer_op.enclosing_block
    return program_blob_bytes([block]) if block is not None else 0


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
