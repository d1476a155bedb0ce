"""An asset's program is loaded by Apple's Core AI runtime in a separate process before this
one loads it.

The runtime does not report a program it cannot read: it ends the process (an abort from an
uncaught C++ exception, or a segmentation fault in its bytecode reader) for an unknown op, an op
with the wrong operands, a weight blob that does not fit its tensor, or bytes that are not
Core AI bytecode. The SHA-256 beside the program (`check_asset`) catches a damaged file, not a
program rewritten together with its hash. So before `AssetProgram` loads an asset, a child
process loads it the same way (every entry point) and compares what the runtime declares with
the asset's own entry points (names, state shapes); a child that dies or disagrees is a typed
error naming the program, and nothing reaches this process's runtime.

A program that passed is remembered by its SHA-256 together with the entry points it was
checked against (`check_key`; in this process, and as an empty file in the user's cache folder),
so the cost, one extra load of the asset, is paid once per program. A program rlx_mil itself
has just written (`save_aimodel`, through Core AI's own builder) is remembered the same way once
the asset is in place (`remember_written`), so it is not loaded twice; any later change to the
program or to its entry points changes the key, and the changed asset is checked.

    python -m rlx_mil.coreai.program_check ASSET   (the child: "ok", or one line, exit 1)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import RlxMilError

#: Seconds the child may take to load the asset (a large model compiles for a while).
CHECK_SECONDS = 900
#: Environment variable naming the folder that remembers checked programs (default: the user's
#: cache folder); an empty value remembers them in this process only.
CACHE_ENV = "RLX_MIL_COREAI_CHECKED"
_PASSED: set[str] = set()


def _cache_folder() -> Path | None:
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlx_mil" / "coreai-programs-checked"


def _remembered(key: str) -> bool:
    folder = _cache_folder()
    return key in _PASSED or (folder is not None and (folder / key).is_file())


def _remember(key: str) -> None:
    _PASSED.add(key)
    folder = _cache_folder()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / key).touch()
    except OSError:  # a read-only home: checked again next time
        pass


def remember_written(asset: Path, entries: Mapping[str, Any]) -> None:
    """Trust the program of `asset` with its entry points `entries` (as read back from the
    asset), which `save_aimodel` has just written and put in place: the child check is for
    programs from elsewhere (Core AI's builder verified this one)."""
    _remember(check_key(program_digest(asset), entries))


def _expected(entries: Mapping[str, Any]) -> dict[str, Any]:
    """What the child compares with the runtime's declarations, per entry point."""
    return {name: {"inputs": sorted(e.inputs), "outputs": sorted(e.outputs),
                   "states": {k: [list(shape), np.dtype(dtype).name] for k, (shape, dtype) in e.states.items()}}
            for name, e in entries.items()}


def check_key(digest: str, entries: Mapping[str, Any]) -> str:
    """What a checked asset is remembered by: the SHA-256 (hex) of its program's SHA-256
    `digest` and the entry points it was checked against (edited entry points are checked
    again, as an edited program is)."""
    import hashlib

    return hashlib.sha256((digest + json.dumps(_expected(entries), sort_keys=True)).encode()).hexdigest()


def program_digest(asset: Path) -> str:
    """The SHA-256 (hex) of `asset`'s program: its `main.hash` (which `check_asset` compared
    with the program), or computed when the asset has none."""
    import hashlib

    stored = asset / "main.hash"
    if stored.is_file():
        return stored.read_bytes()[:64].hex()
    digest = hashlib.sha256()
    with open(asset / "main.mlirb", "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_program(asset: Path, digest: str, entries: Mapping[str, Any]) -> None:
    """Raise a typed error unless Apple's runtime loads `asset` (whose program has the SHA-256
    `digest`, hex) in a child process and declares the asset's entry points `entries` (name ->
    `EntryPoint`: the inputs, outputs and states, with the states' shapes and dtypes)."""
    key = check_key(digest, entries)
    if _remembered(key):
        return
    expected = _expected(entries)
    program = asset / "main.mlirb"
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    # A malformed program kills the child every time; an intact one was seen killed once by
    # SIGABRT in a busy test run (other processes loading programs at the same moment). So a
    # child killed by a signal is tried once more before the program is called malformed.
    for _attempt in range(2):
        # The child's own scratch folder: the runtime's temporary files stay behind when it dies.
        with tempfile.TemporaryDirectory(prefix="rlx_mil_coreai_check_") as scratch:
            try:
                done = subprocess.run([sys.executable, "-m", "rlx_mil.coreai.program_check", str(asset)],
                                      env={**env, "TMPDIR": scratch}, input=json.dumps(expected),
                                      capture_output=True, text=True, timeout=CHECK_SECONDS)
            except subprocess.TimeoutExpired:
                raise RlxMilError(f"{program}: Apple's Core AI runtime did not load it within {CHECK_SECONDS} s") from None
        if done.returncode >= 0:
            break
    if done.returncode == 0 and done.stdout.strip().endswith("ok"):
        _remember(key)
        return
    if done.returncode < 0:
        try:
            how = signal.Signals(-done.returncode).name
        except ValueError:
            how = f"signal {-done.returncode}"
        raise RlxMilError(f"{program}: Apple's Core AI runtime cannot read this program (loading it ended the"
                          f" process by {how}): the program is malformed or was edited; write the asset again")
    lines = done.stdout.strip().splitlines()
    raise RlxMilError(lines[-1] if lines else f"{program}: checking the program failed (exit {done.returncode})")


def _check_in_this_process(asset: Path, expected: Mapping[str, Any]) -> str:
    """The child's work: load every entry point and compare the runtime's declarations with the
    asset's entry points `expected`. Returns a problem, or '' when there is none."""
    from rlx_mil.coreai.adapter import LoadedAsset

    program = asset / "main.mlirb"
    with LoadedAsset(asset) as loaded:
        missing = sorted(set(expected) - set(loaded.function_names))
        if missing:
            return f"{program}: the program has no entry point {missing[0]!r} (it has {sorted(loaded.function_names)})"
        for name, entry in expected.items():
            inputs, outputs, states = loaded.describe(name)
            for kind, declared in (("inputs", inputs), ("outputs", outputs), ("states", states)):
                if sorted(declared) != sorted(entry[kind]):
                    return (f"{program}: entry point {name!r} has {kind} {sorted(declared)}, the asset's entry points"
                            f" say {sorted(entry[kind])}")
            for state, (shape, dtype) in entry["states"].items():
                found, found_dtype = loaded.state_spec(name, state)
                if (list(found), np.dtype(found_dtype).name) != (shape, dtype):
                    return (f"{program}: entry point {name!r} state {state!r} is {list(found)} {np.dtype(found_dtype).name}"
                            f" in the program, {shape} {dtype} in the entry points")
    return ""


def _main(argv: list[str]) -> int:
    try:
        problem = _check_in_this_process(Path(argv[0]), json.loads(sys.stdin.read()))
    except RlxMilError as err:
        problem = str(err).splitlines()[0]
    except Exception as err:  # anything the runtime raises instead of ending the process
        problem = f"{argv[0]}/main.mlirb: Apple's Core AI runtime refused it ({type(err).__name__}: {err})"
    print(" ".join(problem.split()) if problem else "ok", flush=True)
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
