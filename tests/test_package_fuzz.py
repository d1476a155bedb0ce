"""Corrupted and truncated .mlpackage folders given to every reader of packages: the CLI
(`inspect`, `run`, `generate`), `milexec.run`, `package_info`, `verify_package` and
`generate.Session`. Each case ends in a typed rlx_mil error (exit 1 with one line on the CLI)
or in a result; never a raw exception, an internal error or a hang."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil import milexec
from rlx_mil.cli import EXIT_ERROR, EXIT_OK, main
from rlx_mil.coreml.package_info import package_info
from rlx_mil.errors import RlxMilError, SpecialFileError
from rlx_mil.generate import Session
from rlx_mil.models import from_pretrained
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.models.verify import verify_package

CONFIG = {**TINY_CONFIGS["qwen3"], "num_hidden_layers": 1}
SEQ = 4


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("package_fuzz")
    checkpoint = write_random_checkpoint(root / "ck", CONFIG, seed=1)
    plain, llm = root / "plain.mlpackage", root / "llm.mlpackage"
    # (-q also silences the warning that the tiny state dims are not Neural Engine friendly)
    assert main(["convert-hf", str(checkpoint), "-o", str(llm), "--stateful", "--max-context", "8",
                 "--prefill", "4", "-q"]) == EXIT_OK
    assert main(["convert-hf", str(checkpoint), "-o", str(plain), "--seq-len", str(SEQ), "-q"]) == EXIT_OK
    np.savez(root / "inputs.npz", input_ids=np.arange(SEQ, dtype=np.int32)[None])
    return {"plain": plain, "llm": llm, "checkpoint": checkpoint, "inputs": root / "inputs.npz"}


def _files(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*") if p.is_file())


MUTATIONS = ["truncate", "flip", "delete", "empty", "garbage", "folder", "fifo", "device", "delete manifest entry"]


def _mutate(target: Path, kind: str, data: Any) -> None:
    raw = target.read_bytes()
    if kind == "truncate":
        target.write_bytes(raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))])
    elif kind == "flip":
        out = bytearray(raw)
        for at in data.draw(st.lists(st.integers(0, max(len(raw) - 1, 0)), min_size=1, max_size=8)):
            if out:
                out[at] = data.draw(st.integers(0, 255))
        target.write_bytes(bytes(out))
    elif kind == "delete":
        target.unlink()
    elif kind == "empty":
        target.write_bytes(b"")
    elif kind == "garbage":
        target.write_bytes(data.draw(st.binary(min_size=1, max_size=200)))
    elif kind == "folder":
        target.unlink()
        target.mkdir()
    elif kind == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif kind == "device":
        target.unlink()
        target.symlink_to("/dev/zero")
    else:  # the manifest names an item that is not there
        manifest = target.parent / "Manifest.json"
        if manifest.is_file():
            text = manifest.read_text(errors="replace")
            manifest.write_text(text.replace("model.mlmodel", "absent.mlmodel").replace("weights", "absent"))


def _cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def _typed_or_result(call: Callable[[], object]) -> None:
    try:
        call()
    except RlxMilError:
        pass


@given(data=st.data(), which=st.sampled_from(["plain", "llm"]), kind=st.sampled_from(MUTATIONS))
def test_corrupted_packages_end_in_typed_errors(
    packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, data: Any, which: str, kind: str
) -> None:
    package = tmp_path_factory.mktemp("mutated") / "m.mlpackage"
    shutil.copytree(packages[which], package)
    target = data.draw(st.sampled_from(_files(package)))
    _mutate(target, kind, data)
    inputs = {"input_ids": np.arange(SEQ, dtype=np.int32)[None]}
    if which == "plain":
        argvs = [["inspect", str(package)], ["run", str(package), "--inputs", str(packages["inputs"])]]
        graph, params = from_pretrained(packages["checkpoint"], seq_len=SEQ)
        _typed_or_result(lambda: milexec.run(package, inputs))
        _typed_or_result(lambda: verify_package(graph, params, package, inputs, "fp16"))
    else:
        argvs = [["inspect", str(package)], ["generate", str(package), "--prompt-ids", "1,2", "-n", "2"]]
        _typed_or_result(lambda: Session(package).generate([1, 2], 2))
    _typed_or_result(lambda: package_info(package))
    for argv in argvs:
        code, err = _cli(argv)
        assert code in (EXIT_OK, EXIT_ERROR), f"{argv[0]} after {kind} of {target.name}: exit {code}: {err}"
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_special_files_inside_a_package_are_refused_without_reading(packages: dict[str, Path], tmp_path: Path, kind: str) -> None:
    package = tmp_path / "m.mlpackage"
    shutil.copytree(packages["plain"], package)
    weights = next(p for p in _files(package) if p.name == "weight.bin")
    weights.unlink()
    if kind == "fifo":
        os.mkfifo(weights)
    else:
        weights.symlink_to("/dev/zero")
    message = "a FIFO inside the model package" if kind == "fifo" else "a character device inside the model package"
    for call in (lambda: package_info(package), lambda: milexec.run(package, {"input_ids": np.zeros((1, SEQ), np.int32)})):
        with pytest.raises(SpecialFileError, match=message):
            call()
    code, err = _cli(["inspect", str(package)])
    assert code == EXIT_ERROR and "weight.bin" in err and message in err
