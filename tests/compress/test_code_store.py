"""The file-backed store of compressed-weight codes: what it holds, when it falls back to memory,
that spilled conversions give the same packages, and that the codes stay out of the process's
memory through lowering, Core ML's passes and serialisation."""

from __future__ import annotations

import errno
import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlx_mil
import rlx_mil.compress.code_store as code_store
from rlx_mil.compress.code_store import CodeStore, SpilledArray, filesystem_type, writing_without_copies
from tests.compress.helpers import convert_and_verify
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

CONFIG = TinyLM(layers=1)
GRAPH = tiny_lm(CONFIG)
PARAMS = tiny_lm_params(GRAPH, CONFIG)
INPUTS = tiny_lm_inputs(CONFIG)
ROOT = Path(__file__).resolve().parents[2]


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


def _int4() -> np.dtype:
    from coremltools.converters.mil.mil import types

    return np.dtype(types.np_int4_dtype)


def _spilled_consts(model: object) -> int:
    ops = model._mil_program.functions["main"].operations  # type: ignore[attr-defined]
    return sum(isinstance(op.outputs[0].val, SpilledArray) for op in ops if op.op_type == "const")


def test_large_arrays_are_file_backed_small_ones_stay_in_memory() -> None:
    store = CodeStore(min_bytes=4096)
    codes = np.random.default_rng(0).integers(-8, 8, (300, 50), dtype=np.int8)
    small = store.hold(codes[:10], _int4())
    big = store.hold(codes, _int4())
    assert type(small) is np.ndarray and small.dtype.metadata == _int4().metadata
    assert isinstance(big, SpilledArray) and not big.flags.writeable
    # coremltools infers int4 from the dtype's metadata: it must survive the round trip.
    assert big.dtype == np.int8 and big.dtype.metadata == _int4().metadata
    np.testing.assert_array_equal(big, codes)
    scale = np.linspace(0.5, 2, 4000, dtype=np.float16).reshape(40, 100)
    held = store.hold(scale)
    assert isinstance(held, SpilledArray) and held.dtype == np.float16
    np.testing.assert_array_equal(held, scale)
    np.testing.assert_array_equal(big, codes)  # an earlier array is untouched by later writes
    assert store.spilled_bytes == codes.nbytes + scale.nbytes


def test_flatten_is_an_in_memory_copy_and_arithmetic_gives_plain_arrays() -> None:
    store = CodeStore(min_bytes=0)
    codes = np.arange(-8, 8, dtype=np.int8).repeat(1000).reshape(16, 1000)
    big = store.hold(codes, _int4())
    flat = big.flatten()
    assert type(flat) is np.ndarray and flat.flags.writeable and flat.dtype.metadata == _int4().metadata
    np.testing.assert_array_equal(flat, codes.reshape(-1))
    assert type(big + 1) is np.ndarray and type(big.sum()) is not SpilledArray
    assert isinstance(big.reshape(-1), SpilledArray)  # views stay views of the file
    same, other = big != big, big != codes
    assert same.shape == codes.shape and not same.any() and (big == big).all()
    assert type(other) is np.ndarray and not other.any()
    import copy
    import pickle

    table = store.hold(codes.view(np.uint8))  # (coremltools' sub-byte dtypes do not pickle)
    for clone in (pickle.loads(pickle.dumps(table)), copy.deepcopy(table)):
        np.testing.assert_array_equal(clone, codes.view(np.uint8))
        assert clone.flags.writeable


def test_release_drops_the_pages_a_read_brought_in() -> None:
    store = CodeStore()
    codes = np.random.default_rng(1).integers(0, 255, 96 << 20, dtype=np.uint8)
    held = store.hold(codes)
    del codes
    before = _status_bytes("RssFile")
    assert int(held[::4096].astype(np.int64).sum()) >= 0  # faults in every page
    assert _status_bytes("RssFile") - before > 64 << 20
    held.reshape(-1)[:10].release_pages()  # a view releases the whole tensor's pages
    assert _status_bytes("RssFile") - before < 16 << 20
    assert held.flatten().size == 96 << 20  # flatten releases too
    assert _status_bytes("RssFile") - before < 16 << 20
    with writing_without_copies(held):  # the serialiser's hook: flatten is a view, released after
        flat = held.flatten()
        assert type(flat) is np.ndarray and np.shares_memory(flat, held)
        assert int(flat[::4096].astype(np.int64).sum()) >= 0
        assert _status_bytes("RssFile") - before > 64 << 20
    assert _status_bytes("RssFile") - before < 16 << 20
    del flat
    # An array dropped after a full read (a duplicate const a pass removed) takes its pages
    # along, though the mapping lives on for the store's other arrays.
    keep = store.hold(np.ones(1 << 20, np.uint8))
    assert int(held[::4096].astype(np.int64).sum()) >= 0
    assert _status_bytes("RssFile") - before > 64 << 20
    del held
    gc.collect()
    assert _status_bytes("RssFile") - before < 16 << 20
    assert int(keep.sum()) == 1 << 20


def test_writers_put_rows_in_the_file_or_in_memory_and_survive_a_failing_write(monkeypatch: pytest.MonkeyPatch) -> None:
    codes = np.random.default_rng(2).integers(-8, 8, (64, 300)).astype(np.float64)  # as the encoder has them
    store = CodeStore(min_bytes=8192)
    small, large = store.writer((8, 300), np.dtype(np.int8)), store.writer((64, 300), np.dtype(np.int8))
    for writer, rows in ((small, codes[:8]), (large, codes)):
        for r0 in range(0, rows.shape[0], 5):
            writer.put(r0, rows[r0:r0 + 5])
    assert type(small.result()) is np.ndarray and isinstance(large.result(), SpilledArray)
    np.testing.assert_array_equal(large.result(), codes.astype(np.int8))
    np.testing.assert_array_equal(small.result(), codes[:8].astype(np.int8))
    held = store.hold(large.result(), _int4())  # a writer's result is taken as it is, not copied
    assert isinstance(held, SpilledArray) and held.dtype.metadata == _int4().metadata
    assert np.shares_memory(held, large.result()) and store.spilled_bytes == codes.size

    writes = [0]
    original = code_store.os.pwrite

    def fail_third(fd: int, data: object, offset: int) -> int:
        writes[0] += 1
        if writes[0] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(code_store.os, "pwrite", fail_third)
    writer = store.writer((64, 300), np.dtype(np.int8))
    with pytest.warns(RuntimeWarning, match="No space left"):
        for r0 in range(0, 64, 16):
            writer.put(r0, codes[r0:r0 + 16])
    assert type(writer.result()) is np.ndarray and not store.enabled
    np.testing.assert_array_equal(writer.result(), codes.astype(np.int8))


def test_memory_filesystem_full_disk_and_missing_madvise_keep_codes_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    codes = np.ones((64, 64), np.int8)
    monkeypatch.setattr(code_store, "filesystem_type", lambda path: "tmpfs")
    store = CodeStore(min_bytes=0)
    assert not store.enabled and "tmpfs" in str(store.why_in_memory) and "TMPDIR" in str(store.why_in_memory)
    assert type(store.hold(codes)) is np.ndarray
    monkeypatch.undo()

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(code_store.os, "pwrite", full)
    store = CodeStore(min_bytes=0)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        held = store.hold(codes)
    assert type(held) is np.ndarray and not store.enabled
    np.testing.assert_array_equal(held, codes)
    monkeypatch.undo()
    monkeypatch.setattr(code_store, "_DONTNEED", None)
    assert not CodeStore().enabled


def test_filesystem_type_takes_the_longest_mount_point_holding_the_path(tmp_path: Path) -> None:
    kinds = {line.partition(" - ")[2].split()[0] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    assert filesystem_type(tmp_path) in kinds
    assert filesystem_type("/proc/self") == "proc"
    if Path("/dev/shm").is_dir():
        assert filesystem_type("/dev/shm") in ("tmpfs", "ramfs")


@pytest.mark.parametrize(("spec", "target"), [("int4", "iOS18"), ("uint4", "iOS18"), ("lut4-group16", "iOS18"),
                                              ("lut8", "iOS18"), ("int8", "iOS16"), ("lut2", "iOS16")])
def test_spilled_and_in_memory_conversions_write_identical_packages(
    spec: str, target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    blobs = {}
    for mode, threshold in (("memory", 1 << 62), ("file", 0)):
        monkeypatch.setattr(code_store, "SPILL_MIN_BYTES", threshold)
        model = rlx_mil.convert(GRAPH, PARAMS, target=target, compress=spec)
        assert (_spilled_consts(model) > 0) == (mode == "file")
        path = rlx_mil.save(model, tmp_path / f"{mode}.mlpackage")
        blobs[mode] = (path / "Data/com.apple.CoreML/weights/weight.bin").read_bytes()
    assert blobs["file"] == blobs["memory"]


@pytest.mark.parametrize(("spec", "target"), [("int4", "iOS18"), ("lut4", "iOS18"), ("int8", "iOS17")])
def test_spilled_conversions_compute_what_the_dequantized_reference_computes(
    spec: str, target: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(code_store, "SPILL_MIN_BYTES", 0)
    model, _ = convert_and_verify(GRAPH, PARAMS, INPUTS, spec, target=target)
    assert _spilled_consts(model) > 0


def _open_files() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_the_file_lives_as_long_as_the_model_and_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_store, "SPILL_MIN_BYTES", 0)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(code_store.tempfile, "tempdir", None)  # re-read TMPDIR
    before = _open_files()
    model = rlx_mil.convert(GRAPH, PARAMS, compress="int4")
    held = [f for f in _open_files() - before if f.startswith(str(tmp_path))]
    assert held and all(f.endswith("(deleted)") for f in held)  # unnamed: nothing to litter
    # Nothing named but coremltools' own temporary package, in the process's scratch folder
    # (rlx_mil.coreml.scratch; made under this TMPDIR unless an earlier conversion made it).
    assert all(p.name.startswith("rlx_mil-") for p in tmp_path.iterdir())
    assert {p.suffix for p in tmp_path.glob("rlx_mil-*/*")} <= {".mlpackage"}
    from rlx_mil.api import release

    release(model)  # its temporary package
    del model
    gc.collect()
    assert [f for f in _open_files() - before if f.startswith(str(tmp_path))] == []
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == []  # the empty scratch folder goes at exit


_PEAK_CHILD = textwrap.dedent("""
    import json, sys
    from collections.abc import Mapping
    import numpy as np
    import rlx_mil
    from rlx_mil.ir.graph import Graph

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    hidden, layers = int(sys.argv[1]), int(sys.argv[2])
    graph = Graph("chain")
    x = graph.input("x", [1, hidden], "f32")
    for i in range(layers):
        x = graph.matmul(x, graph.param(f"w{i}", [hidden, hidden]), name=f"mm{i}")
    graph.set_outputs([x])
    base = np.random.default_rng(0).standard_normal((hidden, hidden), dtype=np.float32).astype(np.float16)

    class Weights(Mapping):  # each weight made when it is read, as a checkpoint reader would
        def __getitem__(self, name):  # rows rolled: no two weights share their first codes
            return np.roll(base, int(name[1:]), axis=0)
        def __iter__(self):
            return iter(f"w{i}" for i in range(layers))
        def __len__(self):
            return layers

    warm = Graph("warm")  # every module and pass a conversion loads, before the baseline
    warm.set_outputs([warm.matmul(warm.input("x", [1, 64], "f32"), warm.param("w", [64, 64]))])
    rlx_mil.convert(warm, {"w": np.ones((64, 64), np.float32)}, compress="int4")
    start = status("VmRSS")
    model = rlx_mil.convert(graph, Weights(), compress="int4")
    print(json.dumps({"growth": status("VmHWM") - start}))
""")


def test_int4_codes_stay_out_of_the_peak_rss_of_a_conversion() -> None:
    # 20 int4 weights of 4096 x 4096: 320 MiB of codes, which coremltools would hold one byte
    # per code. Spilled, the conversion's peak grows by one weight's working set only.
    hidden, layers = 4096, 20
    codes = hidden * hidden * layers
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    run = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(hidden), str(layers)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    growth = json.loads(run.stdout.strip().splitlines()[-1])["growth"]
    assert growth < codes * 0.75, f"peak RSS grew by {growth / 2**20:.0f} MiB for {codes / 2**20:.0f} MiB of codes"
