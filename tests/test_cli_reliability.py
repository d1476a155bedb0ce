"""Command-line and library manners: outputs written exactly where asked (atomically, never
over an existing file without --overwrite), flags that would be ignored refused, warnings and
problem lists on stderr as lines, the environment and file modes left as the user has them,
and no temporary files left behind by failed, full-disk or killed conversions."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil.cli import main
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

ROOT = Path(__file__).resolve().parent.parent
CFG = TINY_CONFIGS["llama"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("ck") / "llama", CFG, seed=11)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = rlx_mil.Graph("tiny")
    x = g.input("x", [2, 3])
    g.set_outputs([g.add(x, x, name="y")])
    return rlx_mil.save(rlx_mil.convert(g, {}), tmp_path_factory.mktemp("pkg") / "tiny.mlpackage")


def _env(tmpdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    return {**env, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir)}


def _stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


# ---------------------------------------------------------------- run -o
def test_run_writes_exactly_the_given_path(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "in.npz"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.savez(inputs, x=x)
    out = tmp_path / "out"
    assert main(["run", str(package), "--inputs", str(inputs), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.is_file() and not (tmp_path / "out.npz").exists()
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["y"], 2 * x)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out"]


def test_run_refuses_to_overwrite_without_overwrite(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((2, 3), np.float32))
    before = inputs.read_bytes()
    assert main(["run", str(package), "--inputs", str(inputs), "-o", str(inputs)]) == 1
    err = _stderr_lines(capsys)
    assert len(err) == 1 and "exists (it is the command's own input" in err[0] and "--overwrite" in err[0], err
    assert inputs.read_bytes() == before
    other = tmp_path / "other.npz"
    other.write_bytes(b"keep")
    assert main(["run", str(package), "--inputs", str(inputs), "-o", str(other)]) == 1
    assert other.read_bytes() == b"keep"
    assert main(["run", str(package), "--inputs", str(inputs), "-o", str(other), "--overwrite"]) == 0
    with np.load(other) as saved:
        np.testing.assert_allclose(saved["y"], 2 * np.ones((2, 3)))


def test_run_onto_a_full_disk_leaves_no_file(package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((2, 3), np.float32))

    def full_disk(stream: Any, **arrays: Any) -> None:
        stream.write(b"PK")  # a little, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    assert main(["run", str(package), "--inputs", str(inputs), "-o", str(tmp_path / "out.npz")]) == 1
    err = _stderr_lines(capsys)
    assert len(err) == 1 and "No space left on device" in err[0] and err[0].startswith("rlx-mil run: error: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]


# ---------------------------------------------------------------- convert-hf flags and messages
@pytest.mark.parametrize("flags", [["--prefill", "4"], ["--max-context", "64"], ["--cache-layout", "per_layer"]])
def test_stateful_flags_with_graph_only_are_refused(checkpoint: Path, tmp_path: Path, flags: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.mlpackage"
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "-q", "--graph-only", *flags]) == 1
    err = _stderr_lines(capsys)
    assert len(err) == 1 and f"{flags[0]} shapes the stateful package; drop --graph-only or drop it" in err[0], err
    assert not out.exists()


def test_problem_lists_are_one_per_line(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CFG, "intermediate_size": 48}))
    os.symlink(checkpoint / "model.safetensors", folder / "model.safetensors")
    assert main(["convert-hf", str(folder), "-o", str(tmp_path / "x.mlpackage"), "-q"]) == 1
    err = _stderr_lines(capsys)
    assert err[0].startswith("rlx-mil convert-hf: error: ") and err[0].endswith("config.json:")
    assert len(err) == 1 + 3 * CFG["num_hidden_layers"], err
    assert all(line.startswith("  - tensor 'model.layers.") for line in err[1:]), err


def test_warnings_are_lines_and_follow_quiet(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["convert-hf", str(checkpoint), "--stateful", "--max-context", "16", "--precision", "fp32"]
    assert main([*argv, "-o", str(tmp_path / "a.mlpackage")]) == 0
    # (progress lines start with two spaces; the tmp path in them may spell "warning")
    warned = [line for line in _stderr_lines(capsys) if "warning" in line and not line.startswith("  ")]
    assert warned and all(line.startswith("rlx-mil convert-hf: warning: ") for line in warned), warned
    assert any(line.endswith("(NeuralEngineWarning)") for line in warned)
    assert main([*argv, "-o", str(tmp_path / "b.mlpackage"), "-q"]) == 0
    assert not [line for line in _stderr_lines(capsys) if "warning" in line.lower()]


# ---------------------------------------------------------------- library manners
def test_importing_and_converting_leave_the_environment_alone(tmp_path: Path) -> None:
    script = ("import os; before = dict(os.environ); import rlx_mil;"
              " g = rlx_mil.Graph('t'); x = g.input('x', [2]); g.set_outputs([g.add(x, x)]); rlx_mil.convert(g, {});"
              " assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items()); print('same');"
              # joining functions imports coremltools' TensorFlow frontend, which sets TF_CPP_MIN_LOG_LEVEL itself
              " rlx_mil.convert_functions({'a': g, 'b': g}, {})")
    done = subprocess.run([sys.executable, "-c", script], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same" in done.stdout, done.stderr
    assert "Running MIL" not in done.stderr, "coremltools' pass bars showed during rlx_mil's conversions"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_saved_packages_and_checkpoints_get_umask_modes(package: Path, tmp_path: Path, mask: int) -> None:
    from rlx_mil.weights import save_safetensors

    old = os.umask(mask)
    try:
        model = rlx_mil.convert(_tiny_graph(), {})
        out = rlx_mil.save(model, tmp_path / "p.mlpackage")
        weights = save_safetensors({"w": np.ones(3, np.float32)}, tmp_path / "w.safetensors")
    finally:
        os.umask(old)
    for path in [out, *out.rglob("*"), weights]:
        want = (0o777 if path.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(path.stat().st_mode) == want, f"{path}: {oct(path.stat().st_mode)}"


def _tiny_graph() -> rlx_mil.Graph:
    g = rlx_mil.Graph("tiny")
    x = g.input("x", [2])
    g.set_outputs([g.add(x, x)])
    return g


# ---------------------------------------------------------------- litter
def _stateful_argv(checkpoint: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "rlx_mil.cli", "convert-hf", str(checkpoint), "-o", str(out), "--stateful",
            "--max-context", "16", "--prefill", "4", "-q"]


def _scratch_packages(tmpdir: Path) -> list[Path]:
    """What rlx_mil's scratch folders under `tmpdir` hold: package copies of the model, staged
    package items (none while a folder being listed is deleted under the walk: the running
    conversion removes its temporaries)."""
    try:
        return list(tmpdir.glob("rlx_mil-*/*"))
    except FileNotFoundError:
        return []


_STOP_IN_SAVE = """\
import os, pathlib, signal, sys
import rlx_mil.coreml.saving as saving
from rlx_mil.cli import main

synced = saving.fsync_tree

def fsync_then_stop(root):
    # The package is staged beside the destination, the model's own copy is in the scratch
    # folder: tell the test, and wait there for its kill -9.
    synced(root)
    pathlib.Path(sys.argv[1]).write_text("staged")
    os.kill(os.getpid(), signal.SIGSTOP)

saving.fsync_tree = fsync_then_stop
sys.exit(main(sys.argv[2:]))
"""


def test_killed_and_full_disk_stateful_conversions_leave_nothing(checkpoint: Path, tmp_path: Path) -> None:
    """kill -9 in the middle of saving `convert-hf --stateful` leaves its scratch folder (a
    package copy of the model) and its staging folder beside the destination; the next
    conversion sweeps both, and that one, failing on a full disk, leaves nothing either."""
    tmpdir, out = tmp_path / "tmp", tmp_path / "out" / "llm.mlpackage"
    tmpdir.mkdir()
    out.parent.mkdir()
    marker = tmp_path / "staged"
    # The victim stops itself at a fixed point of its save, so the kill does not race the
    # conversion (which takes a few seconds here).
    victim = subprocess.Popen([sys.executable, "-c", _STOP_IN_SAVE, str(marker), *_stateful_argv(checkpoint, out)[3:]],
                              env=_env(tmpdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while not marker.exists():
            assert victim.poll() is None, "the conversion ended before it reached its save"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert _scratch_packages(tmpdir), "nothing was left in the scratch folder"
    assert [p for p in out.parent.iterdir() if ".rlx-staging-" in p.name], "no staging folder was left"
    assert not out.exists()
    script = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN);"
              " from rlx_mil.cli import main; resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384));"
              f" sys.exit(main({_stateful_argv(checkpoint, out)[3:]!r}))")
    done = subprocess.run([sys.executable, "-c", script], env=_env(tmpdir), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert "rlx-mil convert-hf: error:" in done.stderr and "Traceback" not in done.stderr
    assert list(tmpdir.iterdir()) == [] and list(out.parent.iterdir()) == []


def test_stale_scratch_folders_of_gone_processes_only_are_swept(tmp_path: Path) -> None:
    from rlx_mil.coreml import saving, scratch

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = saving.host_tag()
    gone = tmp_path / f"rlx_mil-{dead.pid}-{tag}-abc"
    alive = tmp_path / f"rlx_mil-{os.getpid()}-{tag}-def"
    other_host = tmp_path / f"rlx_mil-{dead.pid}-00000000-ghi"
    unrelated = tmp_path / "rlx_mil-notes"
    for folder in (gone, alive, other_host, unrelated):
        (folder / "x.mlpackage").mkdir(parents=True)
    assert scratch.sweep_stale(tmp_path) == [gone]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, other_host, unrelated))


class _FullDiskFile:
    """A temporary file's stream whose flush finds the disk full (as coremltools' spec file
    did with TMPDIR on a full disk)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def test_a_full_disk_under_the_spec_file_is_one_typed_line(checkpoint: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The temporary .mlmodel coremltools writes fails to flush: one error line, nothing left in
    the scratch folder, and no "Exception ignored" FileNotFoundError from the temporary file's
    deleter after its folder is gone."""
    import gc
    import tempfile

    import coremltools.models.utils as ct_utils

    from rlx_mil.coreml.scratch import scratch_dir

    real = tempfile.NamedTemporaryFile

    def failing(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        made.file = _FullDiskFile(made.file)
        return made

    monkeypatch.setattr(ct_utils._tempfile, "NamedTemporaryFile", failing)
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    before = sorted(os.listdir(scratch_dir()))
    out = tmp_path / "x.mlpackage"
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "-q"]) == 1
    gc.collect()
    monkeypatch.undo()
    err = _stderr_lines(capsys)
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert not unraisable, [u.exc_value for u in unraisable]
    assert sorted(os.listdir(scratch_dir())) == before and not out.exists()


# ---------------------------------------------------------------- interrupts and concurrency
_INTERRUPT_IN_SAVE = """\
import os, signal, sys
import rlx_mil.coreml.saving as saving
from rlx_mil.cli import main

synced = saving.fsync_tree

def fsync_then_interrupt(root):
    # The package is staged beside the destination, the model's copy is in the scratch folder:
    # the user presses Ctrl-C now.
    synced(root)
    os.kill(os.getpid(), signal.SIGINT)

saving.fsync_tree = fsync_then_interrupt
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_in_the_middle_of_saving_exits_130_leaving_nothing(checkpoint: Path, tmp_path: Path) -> None:
    tmpdir, out = tmp_path / "tmp", tmp_path / "out" / "llm.mlpackage"
    tmpdir.mkdir()
    out.parent.mkdir()
    done = subprocess.run([sys.executable, "-c", _INTERRUPT_IN_SAVE, *_stateful_argv(checkpoint, out)[3:]],
                          env=_env(tmpdir), capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == ["rlx-mil convert-hf: interrupted"], done.stderr
    assert list(out.parent.iterdir()) == [] and list(tmpdir.iterdir()) == []


def test_ctrl_c_wrapped_by_the_code_it_hit_is_still_an_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Python 3.11 wraps what a class's __set_name__ raises in a RuntimeError: a Ctrl-C landing
    while a module defines a dataclass is still exit 130 and one line, not an internal error."""
    import rlx_mil.coreml.package_info

    def interrupted(path: object) -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as err:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'rules'") from err

    monkeypatch.setattr(rlx_mil.coreml.package_info, "package_info", interrupted)
    assert main(["inspect", str(tmp_path), "--json"]) == 130
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["rlx-mil inspect: interrupted"]
    assert json.loads(out) == {"error": "interrupted", "command": "inspect"}


def test_two_conversions_to_one_destination_leave_one_valid_package(tmp_path: Path) -> None:
    tmpdir, out = tmp_path / "tmp", tmp_path / "out" / "m.mlpackage"
    tmpdir.mkdir()
    out.parent.mkdir()
    _tiny_graph().to_json_file(tmp_path / "g.json")
    argv = [sys.executable, "-m", "rlx_mil.cli", "convert", str(tmp_path / "g.json"), "-o", str(out), "-q"]
    for extra in ([], ["--overwrite"]):
        runs = [subprocess.Popen([*argv, *extra], env=_env(tmpdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(2)]
        results = [(run.wait(timeout=300), run.communicate()[1]) for run in runs]
        codes = sorted(code for code, _ in results)
        assert codes == ([0, 0] if extra else [0, 1]), results
        if not extra:
            assert any("exists" in err and err.count("\n") == 1 for _, err in results), results
        assert [p.name for p in out.parent.iterdir()] == ["m.mlpackage"] and list(tmpdir.iterdir()) == []
        assert main(["inspect", str(out), "--json"]) == 0


_PARENT_GONE_IN_SAVE = """\
import shutil, sys
import rlx_mil.coreml.saving as saving
from rlx_mil.cli import main

synced = saving.fsync_tree

def fsync_then_remove_the_parent(root):
    synced(root)
    shutil.rmtree(sys.argv[1])

saving.fsync_tree = fsync_then_remove_the_parent
sys.exit(main(sys.argv[2:]))
"""


def test_a_destination_whose_parent_disappears_fails_cleanly(tmp_path: Path) -> None:
    tmpdir, parent = tmp_path / "tmp", tmp_path / "parent"
    tmpdir.mkdir()
    parent.mkdir()
    _tiny_graph().to_json_file(tmp_path / "g.json")
    argv = ["convert", str(tmp_path / "g.json"), "-o", str(parent / "m.mlpackage"), "-q"]
    done = subprocess.run([sys.executable, "-c", _PARENT_GONE_IN_SAVE, str(parent), *argv], env=_env(tmpdir),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlx-mil convert: error: cannot save to"), lines
    assert not parent.exists() and list(tmpdir.iterdir()) == []
