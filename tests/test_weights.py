"""Weights files: .npz and our own safetensors reader/writer."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_mil.weights import WeightsFormatError, load_params, load_safetensors, save_safetensors

DTYPES = [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64, np.int16, np.bool_]


@given(
    arrays=st.dictionaries(
        st.text(alphabet="abcdefgh._", min_size=1, max_size=8),
        st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4))),
        min_size=1, max_size=4,
    )
)
def test_safetensors_round_trip(tmp_path_factory: pytest.TempPathFactory, arrays: dict[str, np.ndarray]) -> None:
    path = tmp_path_factory.mktemp("st") / "w.safetensors"
    save_safetensors(arrays, path)
    loaded = load_params(path)
    assert set(loaded) == set(arrays)
    for name, value in arrays.items():
        assert loaded[name].dtype == value.dtype
        np.testing.assert_array_equal(loaded[name], value)


def test_safetensors_agrees_with_the_reference_library(tmp_path: Path) -> None:
    safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="safetensors not installed")
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "i": np.array([1, -2, 3], np.int8)}
    safetensors_numpy.save_file(tensors, str(tmp_path / "a.safetensors"))
    for name, value in load_safetensors(tmp_path / "a.safetensors").items():
        np.testing.assert_array_equal(value, tensors[name])
    save_safetensors(tensors, tmp_path / "b.safetensors")
    for name, value in safetensors_numpy.load_file(str(tmp_path / "b.safetensors")).items():
        np.testing.assert_array_equal(value, tensors[name])


def test_bf16_is_widened_exactly(tmp_path: Path) -> None:
    values = np.array([1.0, -2.5, 3.140625], np.float32)  # exactly representable in bf16
    raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, len(raw)]}}).encode()
    (tmp_path / "b.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw)
    np.testing.assert_array_equal(load_params(tmp_path / "b.safetensors")["x"], values)


def test_npz(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", a=np.ones((2, 2), np.float32))
    assert load_params(tmp_path / "w.npz")["a"].shape == (2, 2)


def _with_header(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 10**9) + b"{}", "exceeds the file"),
        (struct.pack("<Q", 4) + b"nope", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (_with_header(b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'), "outside the file"),
        (_with_header(b'{"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,0]}}'), "unsupported dtype"),
        (_with_header(b'{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,4]}}') + b"\0" * 4, "4 bytes for F32"),
        (_with_header(b'{"x":{"dtype":"F32"}}'), "bad header entry"),
    ],
)
def test_malformed_safetensors_raise_a_typed_error(tmp_path: Path, payload: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(payload)
    with pytest.raises(WeightsFormatError, match=message):
        load_params(path)


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(b"")
    with pytest.raises(WeightsFormatError, match="unknown weights format"):
        load_params(tmp_path / "w.bin")
    with pytest.raises(WeightsFormatError, match="no such weights file"):
        load_params(tmp_path / "missing.npz")
