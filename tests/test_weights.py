"""Weights files: the lazy safetensors / .npz readers, the writer, and every hostile container
the reliability fuzz found ending in a typed error naming the file and tensor."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hostile_files import HOSTILE_NPZ, HOSTILE_SAFETENSORS, entry, npy_bytes, npz_file, st_bytes
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_mil.errors import (
    IsADirectoryPathError,
    MissingFileError,
    RlxMilError,
    SpecialFileError,
    UnknownTensorError,
    WeightsFormatError,
)
from rlx_mil.weights import LazyTensors, load_params, open_npz, open_safetensors, save_safetensors

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
          np.int64, np.uint64, np.bool_, ml_dtypes.bfloat16]
NAMES = st.text(alphabet="abcdefgh._", min_size=1, max_size=8)


def _arrays(dtypes: list[Any]) -> st.SearchStrategy[dict[str, np.ndarray]]:
    def array(dtype: Any) -> st.SearchStrategy[np.ndarray]:
        shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
        if dtype is ml_dtypes.bfloat16:  # hypothesis has no bfloat16: draw f32 and round
            return hnp.arrays(np.float32, shapes).map(lambda a: a.astype(ml_dtypes.bfloat16))
        return hnp.arrays(dtype, shapes)

    return st.dictionaries(NAMES, st.sampled_from(dtypes).flatmap(array), min_size=1, max_size=4)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()  # bit-exact, NaNs included


@given(arrays=_arrays(DTYPES))
def test_safetensors_round_trip_is_lazy_and_bit_exact(tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, np.ndarray]) -> None:
    path = tmp_path_factory.mktemp("st") / "w.safetensors"
    save_safetensors(arrays, path)
    with load_params(path) as loaded:
        assert isinstance(loaded, LazyTensors)
        assert list(loaded) == list(arrays)
        for name, value in arrays.items():
            assert loaded.shape_of(name) == value.shape and loaded.dtype_of(name) == value.dtype
            _same(loaded[name], value)


@given(arrays=_arrays([d for d in DTYPES if d is not ml_dtypes.bfloat16]))
def test_npz_round_trip(tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, np.ndarray]) -> None:
    folder = tmp_path_factory.mktemp("npz")
    np.savez(folder / "w.npz", **arrays)  # type: ignore[arg-type]
    np.savez_compressed(folder / "c.npz", **arrays)  # type: ignore[arg-type]
    for path in (folder / "w.npz", folder / "c.npz"):
        with load_params(path) as loaded:
            assert set(loaded) == set(arrays)
            for name, value in arrays.items():
                _same(loaded[name], value)


def test_npz_big_endian_and_fortran_order(tmp_path: Path) -> None:
    arrays = {"be": np.arange(6, dtype=">i4").reshape(2, 3), "f": np.asfortranarray(np.arange(6.0).reshape(2, 3))}
    np.savez(tmp_path / "w.npz", **arrays)  # type: ignore[arg-type]
    loaded = open_npz(tmp_path / "w.npz")
    np.testing.assert_array_equal(loaded["be"], arrays["be"])
    assert loaded["be"].dtype == np.dtype("=i4")
    np.testing.assert_array_equal(loaded["f"], arrays["f"])


def test_interop_with_the_safetensors_library(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.array([1, -2, 3], np.int8),
               "h": np.array([1.5, -2.25], ml_dtypes.bfloat16)}
    save_file(tensors, str(tmp_path / "a.safetensors"), metadata={"format": "np"})
    ours = open_safetensors(tmp_path / "a.safetensors")
    assert ours.metadata == {"format": "np"}
    for name, value in tensors.items():
        _same(ours[name], value)
    save_safetensors(tensors, tmp_path / "b.safetensors", metadata={"k": "v"})
    for name, value in load_file(str(tmp_path / "b.safetensors")).items():
        _same(value, tensors[name])


def test_bf16_stays_bf16(tmp_path: Path) -> None:
    values = np.array([1.0, -2.5, 3.140625], np.float32)  # exactly representable in bf16
    raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, len(raw)]}}).encode()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw)
    got = load_params(tmp_path / "b.safetensors")["x"]
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.astype(np.float32), values)


def test_metadata_without_reading_and_unknown_names(tmp_path: Path) -> None:
    save_safetensors({"a": np.zeros((2, 5), np.float16)}, tmp_path / "w.safetensors")
    lazy = open_safetensors(tmp_path / "w.safetensors")
    header = lazy.header("a")
    assert (header.shape, header.dtype, header.format_dtype, header.nbytes) == ((2, 5), np.float16, "F16", 20)
    assert lazy.get("b") is None and "b" not in lazy
    with pytest.raises(UnknownTensorError, match="no tensor named 'b'") as info:
        lazy["b"]
    assert isinstance(info.value, KeyError)
    lazy.close()
    with pytest.raises(WeightsFormatError, match="closed"):
        lazy["a"]


def test_save_refuses_without_littering(tmp_path: Path) -> None:
    dest = tmp_path / "w.safetensors"
    save_safetensors({"a": np.ones(2, np.float32)}, dest)
    before = dest.read_bytes()
    with pytest.raises(WeightsFormatError, match="complex64 has no safetensors name"):
        save_safetensors({"a": np.ones(2, np.float32), "z": np.ones(2, np.complex64)}, dest)
    with pytest.raises(WeightsFormatError, match="__metadata__"):
        save_safetensors({"__metadata__": np.ones(2, np.float32)}, dest)
    assert dest.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


# --------------------------------------------------------------------------- hostile safetensors


@pytest.mark.parametrize("label, payload, message", HOSTILE_SAFETENSORS, ids=[c[0] for c in HOSTILE_SAFETENSORS])
def test_hostile_safetensors_headers_raise_typed_errors(tmp_path: Path, label: str, payload: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(payload)
    with pytest.raises(WeightsFormatError, match=message) as info:
        load_params(path)
    assert str(path) in str(info.value)


def test_bool_bytes_other_than_0_and_1_are_refused_when_read(tmp_path: Path) -> None:
    path = tmp_path / "b.safetensors"
    path.write_bytes(st_bytes({"ok": entry("BOOL", (2,), (0, 2)), "flags": entry("BOOL", (3,), (2, 5))}, b"\x01\x00\x00\x02\x01"))
    lazy = load_params(path)
    np.testing.assert_array_equal(lazy["ok"], [True, False])
    with pytest.raises(WeightsFormatError, match="'flags': BOOL data holds bytes other than 0 and 1"):
        lazy["flags"]


# --------------------------------------------------------------------------- hostile .npz


@pytest.mark.parametrize("label, make, message, error", HOSTILE_NPZ, ids=[c[0] for c in HOSTILE_NPZ])
def test_hostile_npz_raise_typed_errors(tmp_path: Path, label: str, make: Any, message: str, error: type[RlxMilError]) -> None:
    path = make(tmp_path)
    with pytest.raises(error, match=message) as info:
        lazy = load_params(path)
        for name in lazy:
            lazy[name]
    assert str(path) in str(info.value)


def test_zip_bomb_is_refused_before_expanding(tmp_path: Path) -> None:
    # 64 MiB of zeros deflates to ~64 KiB: refused from the zip entry's sizes alone.
    path = npz_file(tmp_path, {"bomb.npy": npy_bytes((16 << 20,), data=bytes(64 << 20))}, compression=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(WeightsFormatError, match=r"'bomb.npy': .* refused as a likely zip bomb"):
        load_params(path)


# --------------------------------------------------------------------------- special files


def test_special_files_are_refused_up_front(tmp_path: Path) -> None:
    fifo = tmp_path / "w.safetensors"
    os.mkfifo(fifo)  # opening it for reading the ordinary way would block forever
    with pytest.raises(SpecialFileError, match="a FIFO, not a regular file"):
        load_params(fifo)
    npz_fifo = tmp_path / "w.npz"
    os.mkfifo(npz_fifo)
    with pytest.raises(SpecialFileError, match="a FIFO"):
        load_params(npz_fifo)
    (tmp_path / "d.npz").mkdir()
    with pytest.raises(IsADirectoryPathError, match="a directory"):
        load_params(tmp_path / "d.npz")
    if Path("/dev/zero").exists():
        with pytest.raises(SpecialFileError, match="character device"):
            open_safetensors("/dev/zero")


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"")
    with pytest.raises(WeightsFormatError, match=r"unknown weights file format '\.bin'"):
        load_params(tmp_path / "w.bin")
    with pytest.raises(MissingFileError, match="no such weights file") as info:
        load_params(tmp_path / "missing.npz")
    assert isinstance(info.value, FileNotFoundError)
