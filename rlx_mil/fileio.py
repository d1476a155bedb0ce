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
from pathlib import Path
from typing import BinaryIO

import numpy as np

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
