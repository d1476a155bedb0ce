"""`rlx_mil.save`: typed errors, staging folders of killed saves cleaned by the next save,
data synced before the swap, coremltools' temporary packages released, and `kill -9` at any
moment leaving the old or the new package."""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil.api import release
from rlx_mil.coreml import saving
from rlx_mil.coreml.weight_writes import package_weights_folder
from rlx_mil.errors import (
    ConversionError,
    ExistingFileError,
    FileAccessError,
    NotADirectoryPathError,
    RlxMilError,
)
from rlx_mil.ir.graph import Graph


def _graph(width: int = 4) -> Graph:
    g = Graph("save")
    x = g.input("x", [2, width])
    g.set_outputs([g.matmul(x, g.param("w", [width, width]), name="y")])
    return g


def _model(seed: int, width: int = 4) -> Any:
    w = np.random.default_rng(seed).standard_normal((width, width)).astype(np.float32)
    return rlx_mil.convert(_graph(width), {"w": w}, precision="fp32")


def _digest(package: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


class _Raising:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def save(self, path: str) -> None:
        Path(path).mkdir()
        (Path(path) / "Manifest.json").write_text("{}")
        raise self.error


def test_typed_errors_that_are_also_the_builtin_os_errors(tmp_path: Path) -> None:
    model = _model(0)
    dest = rlx_mil.save(model, tmp_path / "m.mlpackage")
    with pytest.raises(ExistingFileError, match="exists; pass overwrite=True") as exists:
        rlx_mil.save(model, dest)
    assert isinstance(exists.value, FileExistsError) and isinstance(exists.value, RlxMilError)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryPathError) as not_dir:
        rlx_mil.save(model, tmp_path / "file" / "m.mlpackage")
    assert isinstance(not_dir.value, NotADirectoryError)
    full = shutil.Error([("a", "b", "[Errno 28] No space left on device")])
    with pytest.raises(FileAccessError, match="No space left on device"):
        rlx_mil.save(_Raising(full), tmp_path / "full.mlpackage")
    with pytest.raises(FileAccessError, match="No space left") as enospc:
        rlx_mil.save(_Raising(OSError(errno.ENOSPC, "No space left on device")), dest, overwrite=True)
    assert enospc.value.errno == errno.ENOSPC
    with pytest.raises(ConversionError, match="coremltools could not write the package: ValueError"):
        rlx_mil.save(_Raising(ValueError("bad")), dest, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "m.mlpackage"]
    np.testing.assert_array_equal(rlx_mil.milexec.run(dest, {"x": np.zeros((2, 4), np.float32)})["y"], 0)


def _stale(tmp_path: Path, dest: Path, pid: int | None, suffix: str, *, host: str | None = None) -> Path:
    """A staging folder as a save by `pid` (None: a name that is not ours) leaves it."""
    prefix = saving.staging_prefix(dest, pid) if pid is not None else saving.staging_prefix(dest)
    if host is not None:
        prefix = prefix.replace(saving.host_tag(), host)
    folder = tmp_path / (prefix + suffix)
    (folder / dest.name).mkdir(parents=True)
    (folder / dest.name / "weights.bin").write_bytes(b"\0" * 1000)
    return folder


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_next_save_removes_only_provably_ours_and_dead_staging_folders(tmp_path: Path) -> None:
    dest = tmp_path / "m.mlpackage"
    dead = _stale(tmp_path, dest, _dead_pid(), "dead")
    alive = _stale(tmp_path, dest, os.getppid(), "alive")
    unnamed = _stale(tmp_path, dest, None, "someone_elses")
    other_host = _stale(tmp_path, dest, _dead_pid(), "remote", host="0badc0de")
    other_dest = _stale(tmp_path, tmp_path / "n.mlpackage", _dead_pid(), "x")
    rlx_mil.save(_model(0), dest)
    assert not dead.exists()
    assert alive.exists() and unnamed.exists() and other_host.exists() and other_dest.exists()


def test_a_conversion_sweeps_killed_saves_before_it_starts(tmp_path: Path) -> None:
    """The destination check a conversion makes before any work removes the staging folders
    of killed saves, so one that then fails (a full disk) leaves none of them behind."""
    dest = tmp_path / "m.mlpackage"
    dead = _stale(tmp_path, dest, _dead_pid(), "dead")
    alive = _stale(tmp_path, dest, os.getppid(), "alive")
    saving.check_destination(dest, overwrite=False)
    assert not dead.exists() and alive.exists() and not dest.exists()
    finished = _stale(tmp_path, dest, _dead_pid(), "finished")
    (finished / saving.COMPLETE_FILE).write_bytes(b"")
    with pytest.raises(ExistingFileError):  # the killed save had finished: it is completed first
        saving.check_destination(dest, overwrite=False)
    assert (dest / "weights.bin").is_file() and not finished.exists()


def test_a_crash_between_the_fallback_renames_is_repaired_by_the_next_save(tmp_path: Path) -> None:
    dest = tmp_path / "m.mlpackage"
    owner = _dead_pid()
    folder = _stale(tmp_path, dest, owner, "crashed")
    (folder / saving.COMPLETE_FILE).write_bytes(b"")
    saving.remove_stale_staging(dest)
    assert (dest / "weights.bin").is_file() and not folder.exists()
    shutil.rmtree(dest)
    folder = _stale(tmp_path, dest, owner, "crashed_early")
    os.replace(folder / dest.name, folder / saving.STAGED_OLD)  # old moved aside, new incomplete
    saving.remove_stale_staging(dest)
    assert (dest / "weights.bin").is_file() and not folder.exists()


def test_package_is_synced_before_it_is_swapped_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "m.mlpackage"
    model = _model(0)
    rlx_mil.save(model, dest)
    events: list[tuple[str, str]] = []
    real_fsync, real_exchange = os.fsync, saving.exchange

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def exchange(a: Path, b: Path) -> bool:
        events.append(("swap", str(a)))
        return real_exchange(a, b)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name synced descriptors")
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(saving, "exchange", exchange)
    rlx_mil.save(model, dest, overwrite=True)
    swap = next(i for i, (kind, _) in enumerate(events) if kind == "swap")
    staged = Path(events[swap][1])
    synced = {Path(path) for kind, path in events[:swap] if kind == "fsync"}
    # The package now at `dest` is the one that was staged: every file and folder of it synced.
    assert {staged / p.relative_to(dest) for p in dest.rglob("*")} <= synced
    assert staged in synced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage"]


def test_temporary_package_is_deleted_with_the_model() -> None:
    model = _model(0)
    package = Path(model.package_path)
    assert package.is_dir()
    del model
    gc.collect()
    assert not package.exists()


@pytest.mark.parametrize("atomic_swap", [True, False], ids=["exchange", "two-renames"])
def test_kill_9_at_any_point_of_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, atomic_swap: bool) -> None:
    """Saves killed at moments spread over a whole save: the destination holds the old or the
    new package (with two renames, after the next save's repair), and after the next save
    nothing else is left in the folder."""
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    if not atomic_swap:
        monkeypatch.setattr(saving, "exchange", lambda a, b: False)
    old, new = _model(1, 256), _model(2, 256)
    dest = tmp_path / "m.mlpackage"
    known = {}
    for model in (new, old):
        rlx_mil.save(model, dest, overwrite=True)
        known[_digest(dest)] = model
    start = time.perf_counter()
    rlx_mil.save(old, dest, overwrite=True)
    duration = time.perf_counter() - start
    trials = 12
    for trial in range(trials):
        pid = os.fork()
        if pid == 0:
            try:
                rlx_mil.save(new if trial % 2 else old, dest, overwrite=True)
            finally:
                os._exit(0)
        time.sleep(duration * 1.5 * trial / trials)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if atomic_swap:
            assert _digest(dest) in known, f"trial {trial}: the destination is neither package"
        else:
            saving.remove_stale_staging(dest)
            assert _digest(dest) in known, f"trial {trial}: not repaired to either package"
    rlx_mil.save(new, dest, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage"]
    assert _digest(dest) in known and known[_digest(dest)] is new


def _weight_file(package: Path) -> Path:
    folder = package_weights_folder(package)
    assert folder is not None
    return folder / "weight.bin"


def test_the_weight_file_is_moved_into_the_package_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    from coremltools.models import utils as ct_utils

    added: list[int] = []  # bytes in each folder coremltools copies into the package
    real_package = ct_utils._ModelPackage

    class Recording:
        def __init__(self, path: str) -> None:
            self._package = real_package(path)

        def addItem(self, folder: str, *args: Any) -> Any:
            added.append(sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()))
            return self._package.addItem(folder, *args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._package, name)

    monkeypatch.setattr(ct_utils, "_ModelPackage", Recording)
    width = 64
    model = _model(7, width)
    monkeypatch.undo()
    assert added == [0]  # an empty weights folder; the weight file was renamed in afterwards
    assert _weight_file(Path(model.package_path)).stat().st_size > width * width * 4
    x = np.random.default_rng(1).standard_normal((2, width)).astype(np.float32)
    w = np.random.default_rng(7).standard_normal((width, width)).astype(np.float32)
    np.testing.assert_allclose(rlx_mil.milexec.run(model.package_path, {"x": x})["y"], x @ w, rtol=1e-5, atol=1e-5)
    release(model)


def test_save_links_the_weight_file_and_the_package_outlives_the_model(tmp_path: Path) -> None:
    model = _model(3, 32)
    source = _weight_file(Path(model.package_path))
    dest = rlx_mil.save(model, tmp_path / "m.mlpackage")
    saved = _weight_file(dest)
    assert saved.stat().st_ino == source.stat().st_ino and saved.stat().st_nlink == 2
    spec = dest / "Data" / "com.apple.CoreML" / "model.mlmodel"
    assert spec.stat().st_ino != (Path(model.package_path) / "Data" / "com.apple.CoreML" / "model.mlmodel").stat().st_ino
    before = _digest(dest)
    release(model)
    assert _digest(dest) == before and saved.stat().st_nlink == 1
    x = np.ones((2, 32), np.float32)
    w = np.random.default_rng(3).standard_normal((32, 32)).astype(np.float32)
    np.testing.assert_allclose(rlx_mil.milexec.run(dest, {"x": x})["y"], x @ w, rtol=1e-5, atol=1e-5)


def test_save_copies_where_links_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(4, 32)
    linked = rlx_mil.save(model, tmp_path / "linked.mlpackage")

    def no_links(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    copied = rlx_mil.save(model, tmp_path / "copied.mlpackage")
    assert _weight_file(copied).stat().st_nlink == 1
    assert _weight_file(copied).read_bytes() == _weight_file(linked).read_bytes()
    assert _digest(copied) == _digest(linked)


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_large_consts_are_handed_over_to_the_weight_file(precision: str) -> None:
    """Once written, a large weight's const reads its value from the weight file (a read-only
    map) and the array is freed; small consts keep theirs; the package and the program agree."""
    width = 1024
    w = np.random.default_rng(5).standard_normal((width, width)).astype(np.float32)
    g = Graph("hand_over")
    x = g.input("x", [2, width])
    g.set_outputs([g.add(g.matmul(x, g.param("w", [width, width])), g.param("b", [width]), name="y")])
    b = np.arange(width, dtype=np.float32)
    model = rlx_mil.convert(g, {"w": w, "b": b}, precision=precision)
    dtype = np.float16 if precision == "fp16" else np.float32
    consts = {tuple(op.outputs[0].shape): op for op in model._mil_program.functions["main"].operations if op.op_type == "const"}
    weight = consts[(width, width)]
    for holder in (weight.outputs[0], weight.val):
        assert isinstance(holder.val, np.memmap) and not holder.val.flags.writeable
    held = np.asarray(weight.outputs[0].val)
    assert held.dtype == dtype
    assert np.array_equal(held, w.T.astype(dtype)) or np.array_equal(held, w.astype(dtype))  # `linear` or `matmul` layout
    bias = consts[(width,)].outputs[0].val
    assert not isinstance(bias, np.memmap)  # 2-4 KB: kept in memory
    xs = np.random.default_rng(6).standard_normal((2, width)).astype(np.float32)
    got = rlx_mil.milexec.run(model.package_path, {"x": xs})["y"]
    tol = 5e-2 if precision == "fp16" else 1e-3
    np.testing.assert_allclose(got, xs @ w + b, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_save_that_lands_first_meanwhile_is_refused_or_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  overwrite: bool) -> None:
    """Two saves to one new destination: the second to rename finds the first's package.
    Without overwrite it is an ExistingFileError naming the path (the first package stays
    whole); with overwrite it replaces it. Either way no staging folder is left."""
    dest = tmp_path / "m.mlpackage"
    first, second = _model(1), _model(2)
    real_fsync_tree = saving.fsync_tree

    def other_save_lands(root: Path) -> None:
        real_fsync_tree(root)
        monkeypatch.setattr(saving, "fsync_tree", real_fsync_tree)
        rlx_mil.save(first, dest)

    monkeypatch.setattr(saving, "fsync_tree", other_save_lands)
    if overwrite:
        rlx_mil.save(second, dest, overwrite=True)
        expected = _model(2)
    else:
        with pytest.raises(ExistingFileError, match=r"m\.mlpackage exists"):
            rlx_mil.save(second, dest)
        expected = _model(1)
    reference = tmp_path / "ref" / "m.mlpackage"
    rlx_mil.save(expected, reference)
    assert _weight_file(dest).read_bytes() == _weight_file(reference).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlpackage", "ref"]
