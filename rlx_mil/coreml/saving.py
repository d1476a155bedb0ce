"""Writing a package so that no crash, full disk or `kill -9` leaves a broken or half-written
one at the destination, and no litter survives the next save.

A save stages the package in a hidden folder beside the destination, named
`.NAME.mlpackage.rlx-staging-PID-HOST-XXXX`: the name, made atomically with the folder, proves
it is ours and says which process on which host (a hash of the host name) owns it. The staged package is fsynced (files, then folders), then swapped with the old
package in one atomic `renameat2(RENAME_EXCHANGE)` (Linux) / `renamex_np(RENAME_SWAP)`
(macOS) where the file system offers it, or by two renames otherwise; the staging folder,
holding the old package, is then deleted. The next save to the same destination (or the next
conversion to it, before it starts) deletes staging folders of this host whose owner process is gone, first putting a package back at the
destination if a crash fell between the two fallback renames.

The weight files of a model's temporary package (what `convert` returns) are hard-linked into
the staged package rather than copied where the file system allows it: no byte of the weights
is written twice, and the temporary package is never written again, only deleted (which leaves
the saved package's link). Every other file is copied, so coremltools rewriting the staged
model spec in place cannot touch the temporary package.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlx_mil import interrupts
from rlx_mil.coreml import patches
from rlx_mil.coreml.weight_writes import package_weights_folder
from rlx_mil.errors import (
    ConversionError,
    ExistingFileError,
    FileAccessError,
    InvalidOptionError,
    NotADirectoryPathError,
    RlxMilError,
    file_access_error,
)
from rlx_mil.fileio import apply_default_modes
from rlx_mil.progress import BYTES, count_bytes, detail, stage_running, tick

#: Written in the staging folder once the staged package is complete and synced.
COMPLETE_FILE = "complete"
STAGED_OLD = "old"


def host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def staging_prefix(dest: Path, pid: int | None = None) -> str:
    """`.NAME.mlpackage.rlx-staging-` (any save), or with `PID-HOST-` (one process's)."""
    base = f".{dest.name}.rlx-staging-"
    return base if pid is None else f"{base}{pid}-{host_tag()}-"


def _staging_owner(dest: Path, folder: Path) -> int | None:
    """The process id in `folder`'s name if it is one of this host's staging folders for
    `dest` (the name is created atomically with the folder, so it is proof from the start)."""
    match = re.fullmatch(re.escape(staging_prefix(dest)) + r"(\d+)-([0-9a-f]{8})-[A-Za-z0-9_]+", folder.name)
    if match is None or match.group(2) != host_tag():
        return None
    return int(match.group(1))


def _fsync_path(path: Path) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        return  # some platforms cannot open folders; nothing more can be done there
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.EISDIR):
            raise
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Every file, then every folder (deepest first) under `root`, then `root` itself."""
    folders: list[Path] = []
    for current, _dirs, files in os.walk(root):
        folders.append(Path(current))
        for name in files:
            _fsync_path(Path(current) / name)
    for folder in reversed(folders):
        _fsync_path(folder)


def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap paths `a` and `b` (both must exist); False if the OS or file system
    has no such call, so the caller falls back to two renames."""
    libc = _libc()
    if libc is None:
        return False
    src, dst = os.fsencode(a), os.fsencode(b)
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        at_fdcwd, rename_exchange = -100, 2
        result = libc.renameat2(at_fdcwd, src, at_fdcwd, dst, rename_exchange)
    elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        rename_swap = 2
        result = libc.renamex_np(src, dst, rename_swap)
    else:
        return False
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(code, os.strerror(code), os.fspath(a))


def process_gone(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists, owned by another user
    return False


def remove_stale_staging(dest: Path) -> list[Path]:
    """Delete the staging folders of killed saves to `dest` (ours by name and owner.json,
    owner process gone), restoring a package at `dest` first if a crash left none. Returns
    the folders removed."""
    removed: list[Path] = []
    try:
        siblings = list(dest.parent.iterdir())
    except OSError:
        return removed
    for folder in siblings:
        if not folder.name.startswith(staging_prefix(dest)) or folder.is_symlink() or not folder.is_dir():
            continue
        pid = _staging_owner(dest, folder)
        if pid is None or not process_gone(pid):
            continue
        if not dest.exists():
            staged, old = folder / dest.name, folder / STAGED_OLD
            if (folder / COMPLETE_FILE).exists() and staged.is_dir():
                os.replace(staged, dest)  # the save had finished writing: complete it
            elif old.exists():
                os.replace(old, dest)  # it had moved the old package aside: put it back
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _describe(err: OSError) -> str:
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        first = err.args[0][0]  # copytree collects (source, destination, reason) per file
        more = f" (and {len(err.args[0]) - 1} more files)" if len(err.args[0]) > 1 else ""
        return f"{first[-1]}{more}"
    return err.strerror or str(err)


class _LinkingShutil:
    """`shutil` as coremltools' `MLModel.save` sees it while saving: `copytree` links the
    files of `linked_folder` (falling back to a copy) and copies the rest."""

    def __init__(self, real: Any, linked_folder: Path) -> None:
        self._real, self._linked_folder = real, linked_folder

    def _copy(self, src: str, dst: str) -> str:
        if Path(src).parent == self._linked_folder:
            try:
                os.link(src, dst)
                return dst
            except OSError:
                pass  # another file system, or one without hard links
            if stage_running():  # the weights copied: the running stage's bar counts their bytes
                count_bytes(sum(f.stat().st_size for f in self._linked_folder.iterdir() if f.is_file()))
                copy_counting_bytes(Path(src), Path(dst))
                self._real.copystat(src, dst)
                return dst
        return str(self._real.copy2(src, dst))

    def copytree(self, src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("copy_function", self._copy)
        return self._real.copytree(src, dst, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def copy_counting_bytes(src: Path, dst: Path, block: int = 8 << 20) -> None:
    """Copy file `src` to `dst`, a block at a time, each block counted on the running stage."""
    buffer = bytearray(block)
    view = memoryview(buffer)
    with open(src, "rb") as source, open(dst, "wb") as target:
        while True:
            n = source.readinto(buffer)
            if not n:
                break
            target.write(view[:n])
            tick(BYTES, n)


@contextmanager
def weights_linked_on_save(model: Any) -> Iterator[None]:
    """While active, `model.save` hard-links the weight files of `model`'s temporary package."""
    package = getattr(model, "package_path", None)
    weights = package_weights_folder(Path(package)) if package and getattr(model, "is_temp_package", False) else None
    if weights is None:
        yield
        return
    from coremltools.models import model as ct_model

    real = ct_model._shutil
    if isinstance(real, _LinkingShutil):  # a save in progress installed it
        yield
        return
    with patches.replaced("coremltools.models.model:_shutil", _LinkingShutil(real, weights)):
        yield


def sweep_killed_saves(dest: Path) -> None:
    """`remove_stale_staging` before a conversion to `dest` starts (nothing if its folder is
    not there yet), its failures a typed error."""
    if not dest.parent.is_dir():
        return
    try:
        remove_stale_staging(dest)
    except OSError as err:
        raise file_access_error(
            err, f"cannot save to {dest}: cannot clean up an earlier interrupted save: {err.strerror or err}"
        ) from err


def check_destination(dest: Path, overwrite: bool) -> None:
    """Refuse, before any work, a destination `save_package` would refuse after it. The
    staging folders of killed saves to `dest` are swept first, so that a conversion which
    then fails (a full disk, bad weights) does not leave them for a later save."""
    if dest.suffix not in (".mlpackage", ".aimodel"):
        raise InvalidOptionError(
            f"a Core ML ML Program is saved as a .mlpackage folder (or a Core AI .aimodel asset), got {str(dest)!r}")
    sweep_killed_saves(dest)
    if (dest.exists() or dest.is_symlink()) and not overwrite:
        raise ExistingFileError(f"{dest} exists; pass overwrite=True (--overwrite) to replace it")


def _install(staged: Path, dest: Path, staging: Path, exists: bool) -> None:
    """Move the finished package `staged` to `dest`, swapping out an existing one atomically
    where the file system can (else by two renames, undone if the second fails)."""
    interrupts.check()  # the last moment a Ctrl-C a library swallowed can still stop the save
    if exists and dest.is_dir() and not dest.is_symlink() and exchange(staged, dest):
        return  # the old package is now at `staged`, deleted with the staging folder
    if exists:
        os.replace(dest, staging / STAGED_OLD)
    try:
        os.replace(staged, dest)
    except OSError:
        if exists:
            os.replace(staging / STAGED_OLD, dest)
        raise


def save_package(model: Any, dest: Path, *, overwrite: bool) -> Path:
    """Write `model` (an MLModel) to `dest` as described in the module doc."""
    where = f"cannot save to {dest}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:  # a file where a folder of the path should be
        raise NotADirectoryPathError(f"{where}: a file stands where {dest.parent} needs a folder") from err
    except OSError as err:
        raise file_access_error(err, f"{where}: cannot create folder {dest.parent}: {err.strerror or err}") from err
    if not dest.parent.is_dir():
        raise NotADirectoryPathError(f"{where}: {dest.parent} is not a folder")
    try:
        remove_stale_staging(dest)
    except OSError as err:
        raise file_access_error(err, f"{where}: cannot clean up an earlier interrupted save: {err.strerror or err}") from err
    exists = dest.exists() or dest.is_symlink()
    if exists and not overwrite:
        raise ExistingFileError(f"{dest} exists; pass overwrite=True (--overwrite) to replace it")
    try:
        staging = Path(tempfile.mkdtemp(prefix=staging_prefix(dest, os.getpid()), dir=dest.parent))
    except OSError as err:
        raise file_access_error(err, f"{where}: {err.strerror or err}") from err
    try:
        staged = staging / dest.name
        try:
            detail("coremltools writes the program")  # beside the running stage's bar, if any
            with weights_linked_on_save(model):
                model.save(os.fspath(staged))
        except OSError:
            raise
        except Exception as err:
            raise ConversionError(f"{where}: coremltools could not write the package: {type(err).__name__}: {err}") from err
        apply_default_modes(staged)  # coremltools' temporary folders are 0700, their files 0600
        detail("syncing the package to disk")
        fsync_tree(staged)
        (staging / COMPLETE_FILE).write_bytes(b"")
        _fsync_path(staging)
        try:
            _install(staged, dest, staging, exists)
        except OSError as err:
            # Another save to `dest` finished between our check and our rename.
            if exists or not (dest.exists() or dest.is_symlink()):
                raise
            if not overwrite:
                raise ExistingFileError(
                    f"{dest} exists (another save wrote it meanwhile); pass overwrite=True (--overwrite)"
                    " to replace it") from err
            _install(staged, dest, staging, True)
        _fsync_path(dest.parent)
    except RlxMilError:
        raise
    except OSError as err:
        if isinstance(err, FileAccessError):
            raise
        raise file_access_error(err, f"{where}: {_describe(err)}") from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
