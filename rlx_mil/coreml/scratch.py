"""Where conversions keep their temporary files, and how they never outlive their process.

coremltools writes a converted model as a temporary package (a full copy of the weights), plus
a temporary weights folder and spec file, in the system's temporary folder, and deletes them
only at exit, or not at all when the process is killed. rlx_mil therefore gives each process
one scratch folder, `TMPDIR/rlx_mil-PID-HOST-XXXXXXXX`:

* while rlx_mil converts, `tempfile`'s folder is the scratch folder, so everything coremltools
  creates lands in it (`conversion_temporaries`); whatever a failed conversion created there
  is removed on the way out, whatever the failure (a full disk included);
* the folder goes at exit (`atexit`), and the packages of models that are garbage collected
  go with them (`rlx_mil.api.release_when_collected`);
* the first conversion of a process removes the scratch folders of this host's processes that
  are gone (killed with `kill -9`, or by the OOM killer): their names say whose they are.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import shutil
import tempfile
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlx_mil.coreml.saving import host_tag, process_gone
from rlx_mil.errors import file_access_error

PREFIX = "rlx_mil-"

_lock = threading.Lock()
_scratch: dict[int, Path] = {}


def _pattern() -> re.Pattern[str]:
    return re.compile(re.escape(PREFIX) + r"(\d+)-" + re.escape(host_tag()) + r"-[A-Za-z0-9_]+")


def sweep_stale(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the scratch folders in `root` (default: the temporary folder) of this host's
    processes that no longer run; returns them."""
    folder = Path(root if root is not None else tempfile.gettempdir())
    pattern = _pattern()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None or entry.is_symlink() or not entry.is_dir() or not process_gone(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def scratch_dir() -> Path:
    """This process's scratch folder (created, after sweeping stale ones, on first use)."""
    pid = os.getpid()
    with _lock:
        current = _scratch.get(pid)
        if current is not None and current.is_dir():
            return current
        sweep_stale()
        try:
            created = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{host_tag()}-"))
        except OSError as err:
            raise file_access_error(
                err, f"{tempfile.gettempdir()}: cannot create the conversion's scratch folder: {err.strerror or err}"
            ) from err
        _scratch[pid] = created
        atexit.register(shutil.rmtree, created, True)
        return created


def remove_scratch_dir() -> None:
    """Remove this process's scratch folder now, as its exit would (a process that ends with
    `os._exit`, as a test worker its controller gives up waiting for, runs no `atexit`)."""
    with _lock:
        created = _scratch.pop(os.getpid(), None)
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


@contextmanager
def conversion_temporaries() -> Iterator[Path]:
    """While active, `tempfile` creates everything in the scratch folder; what the block
    created there is removed if it raises."""
    scratch = scratch_dir()
    before = set(os.listdir(scratch))
    saved = tempfile.tempdir
    tempfile.tempdir = str(scratch)
    try:
        yield scratch
    except BaseException as err:
        created = set(os.listdir(scratch)) - before
        # Only a temporary file the block created can be waiting for a collection to delete it.
        _release_frames(err, collect=bool(created))
        for name in created:
            path = scratch / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        raise
    finally:
        tempfile.tempdir = saved


def _release_frames(err: BaseException, collect: bool = True) -> None:
    """Close the temporary files coremltools had open where `err` (or a cause of it) was
    raised, and let go of its frames' locals, so that those `NamedTemporaryFile`s delete
    themselves now, while their folder exists. Kept alive by the traceback, they would try
    later, when the folder is gone, and print an "Exception ignored" FileNotFoundError
    traceback. (A file whose write failed on a full disk is closed here, its error dropped.)"""
    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        _cut_at_temporary_file(current)
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
    if collect:
        gc.collect()


def _cut_at_temporary_file(err: BaseException) -> None:
    """Close the file of a `tempfile` wrapper method `err` was raised in, and cut the traceback
    before that frame: the wrapper function's frame holds the file's deleter."""
    previous, tb = None, err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename == tempfile.__file__:
            stream = getattr(frame.f_locals.get("func"), "__self__", None)
            if stream is not None and hasattr(stream, "close"):
                try:
                    stream.close()
                except OSError:
                    pass  # the disk is full: its buffered bytes cannot be written, and need not be
            if previous is None:
                err.__traceback__ = None
            else:
                previous.tb_next = None
            return
        previous, tb = tb, tb.tb_next
