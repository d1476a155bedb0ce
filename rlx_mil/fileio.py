"""Reading untrusted input: regular files only, through a bounded reader; JSON nesting
measured before a recursive parser sees it.

`st_size` cannot be trusted for devices (`/dev/zero` reports 0 and never ends) and opening a
FIFO for reading blocks until a writer appears, so files are opened non-blocking, checked
with `fstat` on the open descriptor (no race with a path swapped in between), and read with
a hard byte limit.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

from rlx_mil import interrupts
from rlx_mil.errors import (
    IsADirectoryPathError,
    MissingFileError,
    RlxMilError,
    SpecialFileError,
    file_access_error,
)

_KINDS = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular_file(path: str | os.PathLike[str], what: str = "file") -> tuple[BinaryIO, int]:
    """Open `path` for reading if it is a regular file; returns (binary file, size in bytes).

    Raises MissingFileError, SpecialFileError (devices, FIFOs, sockets, directories) or another
    FileAccessError naming `path` and `what` it was meant to be.
    """
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError as err:
        raise MissingFileError(f"{p}: no such {what}") from err
    except OSError as err:
        raise file_access_error(err, f"{p}: cannot open {what}: {err.strerror or err}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryPathError(f"{p}: a directory, not a {what}")
            raise SpecialFileError(f"{p}: {_kind(info.st_mode)}, not a regular file; a {what} must be a file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_bounded(stream: BinaryIO, limit: int, path: str | os.PathLike[str], error: type[RlxMilError], what: str) -> bytes:
    """All of `stream`, refusing (typed `error`) once more than `limit` bytes arrive."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path}: {what} is larger than the limit of {limit} bytes")
    return data


def read_regular_file(path: str | os.PathLike[str], limit: int, error: type[RlxMilError], what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them (else typed `error`)."""
    stream, size = open_regular_file(path, what)
    with stream:
        if size > limit:
            raise error(f"{path}: {what} has {size} bytes, more than the limit of {limit}")
        return read_bounded(stream, limit, path, error, what)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


#: Characters measured per NumPy pass, so measuring a 100 MB header needs a few MB.
_DEPTH_CHUNK = 1 << 20
_DEPTH_STEP = np.zeros(256, np.int8)
_DEPTH_STEP[[ord("{"), ord("[")]] = 1
_DEPTH_STEP[[ord("}"), ord("]")]] = -1


def nesting_depth(text: bytes) -> int:
    """Deepest `{`/`[` nesting of JSON `text` (strings skipped), without recursing."""
    codes = np.frombuffer(_JSON_STRING.sub(b'""', text), dtype=np.uint8)
    deepest = depth = 0
    for start in range(0, codes.size, _DEPTH_CHUNK):
        running = depth + np.cumsum(_DEPTH_STEP[codes[start:start + _DEPTH_CHUNK]], dtype=np.int64)
        deepest = max(deepest, int(running.max()))
        depth = int(running[-1])
    return deepest


#: A Core ML package holds a manifest, a model spec and a weights file or two.
MAX_PACKAGE_ENTRIES = 10_000


def check_package_tree(path: str | os.PathLike[str], what: str = "model package") -> Path:
    """`path` as a Path if it is a regular file (a bare `.mlmodel`) or a folder holding only
    folders and regular files (links followed), so a reader handed the package cannot hang on
    a FIFO or read a device forever.

    Raises MissingFileError, SpecialFileError (naming the entry at fault) or another
    FileAccessError.
    """
    root = Path(path)
    try:
        info = root.stat()
    except FileNotFoundError as err:
        raise MissingFileError(f"{root}: no such {what}") from err
    except OSError as err:
        raise file_access_error(err, f"{root}: cannot open {what}: {err.strerror or err}") from err
    if stat.S_ISREG(info.st_mode):
        return root
    if not stat.S_ISDIR(info.st_mode):
        raise SpecialFileError(f"{root}: {_kind(info.st_mode)}, not a {what}")
    pending, seen = [root], 0
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as err:
            raise file_access_error(err, f"{folder}: cannot list the {what}: {err.strerror or err}") from err
        for entry in entries:
            seen += 1
            if seen > MAX_PACKAGE_ENTRIES:
                raise SpecialFileError(f"{root}: more than {MAX_PACKAGE_ENTRIES} entries; not a {what}")
            try:
                mode = os.stat(entry.path).st_mode  # follows links: what a reader would open
            except OSError as err:
                raise file_access_error(err, f"{entry.path}: in the {what}, cannot be read: {err.strerror or err}") from err
            if stat.S_ISDIR(mode):
                if entry.is_symlink():
                    raise SpecialFileError(f"{entry.path}: a link to a folder inside the {what}")
                pending.append(Path(entry.path))
            elif not stat.S_ISREG(mode):
                raise SpecialFileError(f"{entry.path}: {_kind(mode)} inside the {what}; a package holds only files and folders")
    return root


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask (read by setting and restoring it, under a lock)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def apply_default_modes(root: str | os.PathLike[str]) -> None:
    """Give `root` (a file, or a folder and everything in it) the modes a plain `open` /
    `mkdir` would: 0o666 / 0o777 less the umask. Temporary files and folders are created
    0600 / 0700, and a package or checkpoint staged in them would otherwise keep those."""
    mask = current_umask()
    file_mode, dir_mode = 0o666 & ~mask, 0o777 & ~mask
    top = Path(root)
    if not top.is_dir() or top.is_symlink():
        os.chmod(top, file_mode)
        return
    os.chmod(top, dir_mode)
    for folder, dirs, files in os.walk(top):
        for name in dirs:
            os.chmod(os.path.join(folder, name), dir_mode)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, file_mode)


@contextmanager
def atomic_output_file(path: str | os.PathLike[str], *, overwrite: bool, what: str = "output file") -> Iterator[BinaryIO]:
    """A binary file that becomes exactly `path` once the block succeeds: written under a
    temporary name beside it, synced, given the umask's mode and renamed; any failure (a full
    disk included) removes the temporary and leaves `path` as it was. Refuses an existing
    `path` unless `overwrite` (ExistingFileError), and a folder there always."""
    from rlx_mil.errors import ExistingFileError

    dest = Path(path)
    check_output_path(dest, overwrite=overwrite, what=what)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as err:
        raise file_access_error(err, f"{dest}: cannot write the {what}: {err.strerror or err}") from err
    try:
        with os.fdopen(fd, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        apply_default_modes(tmp_name)
        interrupts.check()  # a Ctrl-C a library swallowed: nothing is installed
        if not overwrite and (dest.exists() or dest.is_symlink()):  # appeared meanwhile
            raise ExistingFileError(f"{dest} exists; pass --overwrite to replace it")
        os.replace(tmp_name, dest)
    except OSError as err:
        _remove_quietly(tmp_name)
        if isinstance(err, RlxMilError):
            raise
        raise file_access_error(err, f"{dest}: cannot write the {what}: {err.strerror or err}") from err
    except BaseException:
        _remove_quietly(tmp_name)
        raise


def check_output_path(dest: Path, *, overwrite: bool, what: str = "output file", inputs: tuple[Path, ...] = ()) -> None:
    """Refuse, before any work, an output path that cannot be written as asked: a folder, a
    missing parent folder, an existing file without `overwrite` (naming it when it is one of
    the command's `inputs`)."""
    from rlx_mil.errors import ExistingFileError, NotADirectoryPathError

    if dest.is_dir():
        raise IsADirectoryPathError(f"{dest}: a directory, not a {what}")
    if not dest.parent.is_dir():
        raise NotADirectoryPathError(f"{dest}: the folder {dest.parent} does not exist")
    if dest.exists():
        mode = dest.stat().st_mode
        if not stat.S_ISREG(mode):
            # The file is written beside it and renamed into place: a device or FIFO there
            # (`--report /dev/null` as root) would be replaced, not written to.
            raise SpecialFileError(f"{dest}: {_kind(mode)}, not a file; give a file path for the {what}")
    if (dest.exists() or dest.is_symlink()) and not overwrite:
        same = [p for p in inputs if p.exists() and dest.exists() and os.path.samefile(p, dest)]
        own = f" (it is the command's own input {same[0]})" if same else ""
        raise ExistingFileError(f"{dest} exists{own}; pass --overwrite to replace it")


def _remove_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
