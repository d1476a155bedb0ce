"""GGUF files that lie: typed `GGUFFormatError`s naming the file and tensor, raised while the
header is parsed (before any tensor data is read or array allocated)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_mil.errors import GGUFFormatError, SpecialFileError
from rlx_mil.models import from_gguf
from rlx_mil.models.gguf.reader import GGUFFile


def _written(path: Path, fill: Any) -> bytes:
    """A llama GGUF file whose writer `fill` gave its metadata and tensors; its bytes."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _valid(path: Path) -> bytes:
    def fill(w: Any) -> None:
        w.add_block_count(1)
        w.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
        w.add_tensor("blk.0.attn_q.weight", np.ones((32, 32), np.float16))

    return _written(path, fill)


def _info_at(data: bytes, name: str) -> int:
    """Offset of the n_dims field of tensor `name`'s description."""
    at = data.index(name.encode()) + len(name)
    return at


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_valid_file_reads(tmp_path: Path) -> None:
    _valid(tmp_path / "m.gguf")
    f = GGUFFile(tmp_path / "m.gguf")
    assert f.tensors["blk.0.attn_q.weight"].shape == (32, 32)
    assert f.value("llama.block_count") == 1


def test_header_claiming_1e12_tensors(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path / "m.gguf"))
    data[8:16] = struct.pack("<Q", 10**12)
    with pytest.raises(GGUFFormatError, match=r"claims 1000000000000 tensors"):
        GGUFFile(_write(tmp_path / "bad.gguf", bytes(data)))


def test_header_claiming_huge_metadata(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path / "m.gguf"))
    data[16:24] = struct.pack("<Q", 2**60)
    with pytest.raises(GGUFFormatError, match=r"metadata entries"):
        GGUFFile(_write(tmp_path / "bad.gguf", bytes(data)))


def test_tensor_data_past_the_end(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path / "m.gguf"))
    at = _info_at(bytes(data), "blk.0.attn_q.weight")
    at += 4 + 8 * 2 + 4  # n_dims, two dims, type -> offset
    data[at:at + 8] = struct.pack("<Q", 1 << 20)
    with pytest.raises(GGUFFormatError, match=r"'blk.0.attn_q.weight'.*past the end") as err:
        GGUFFile(_write(tmp_path / "bad.gguf", bytes(data)))
    assert err.value.tensor == "blk.0.attn_q.weight"


def test_unknown_type(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path / "m.gguf"))
    at = _info_at(bytes(data), "blk.0.attn_q.weight") + 4 + 16
    data[at:at + 4] = struct.pack("<I", 250)
    with pytest.raises(GGUFFormatError, match=r"'blk.0.attn_q.weight' has unknown ggml type number 250"):
        GGUFFile(_write(tmp_path / "bad.gguf", bytes(data)))


def test_shape_type_mismatch(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path / "m.gguf"))
    at = _info_at(bytes(data), "blk.0.attn_q.weight") + 4 + 16
    data[at:at + 4] = struct.pack("<I", 12)  # Q4_K: 256-element blocks; rows of 32 are not whole blocks
    with pytest.raises(GGUFFormatError, match=r"'blk.0.attn_q.weight' Q4_K has rows of 32 elements"):
        GGUFFile(_write(tmp_path / "bad.gguf", bytes(data)))


def test_dimension_count_lie(tmp_path: Path) -> None:
    data = bytearray(_valid(tmp_path / "m.gguf"))
    at = _info_at(bytes(data), "blk.0.attn_q.weight")
    data[at:at + 4] = struct.pack("<I", 2**31)
    with pytest.raises(GGUFFormatError, match=r"blk.0.attn_q.weight"):
        GGUFFile(_write(tmp_path / "bad.gguf", bytes(data)))


@pytest.mark.parametrize("keep", [3, 20, 60, 200, -100, -1])
def test_truncated(tmp_path: Path, keep: int) -> None:
    data = _valid(tmp_path / "m.gguf")
    with pytest.raises(GGUFFormatError):
        from_gguf(_write(tmp_path / "bad.gguf", data[:keep]))


def test_not_gguf_and_fifo(tmp_path: Path) -> None:
    with pytest.raises(GGUFFormatError, match=r"not a GGUF file"):
        GGUFFile(_write(tmp_path / "bad.gguf", b"PK\x03\x04" + bytes(64)))
    import os

    os.mkfifo(tmp_path / "fifo.gguf")
    with pytest.raises(SpecialFileError):
        GGUFFile(tmp_path / "fifo.gguf")


def _with_tokens(path: Path, tokens: list[str]) -> bytes:
    def fill(w: Any) -> None:
        w.add_token_list(tokens)
        w.add_token_scores([float(i) for i in range(len(tokens))])
        w.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))

    return _written(path, fill)


def test_metadata_arrays_decode_when_asked(tmp_path: Path) -> None:
    tokens = [f"t{i}é" for i in range(5000)] + [""]
    _with_tokens(tmp_path / "m.gguf", tokens)
    f = GGUFFile(tmp_path / "m.gguf")
    assert f.array_length("tokenizer.ggml.tokens") == len(tokens)
    assert f.value("tokenizer.ggml.tokens") == tokens
    assert f.value("tokenizer.ggml.scores") == [float(i) for i in range(len(tokens))]


@pytest.mark.parametrize("count", [10**12, 7])
def test_string_array_claiming_more_entries_than_the_file_holds(tmp_path: Path, count: int) -> None:
    data = bytearray(_with_tokens(tmp_path / "m.gguf", ["a", "bb", "ccc"]))
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 4 + 4  # value type (ARRAY), item type (STRING), then the count
    assert struct.unpack_from("<Q", data, at)[0] == 3
    data[at:at + 8] = struct.pack("<Q", count)
    if count == 7:  # the next entries are read as strings of absurd lengths
        data[at + 8 + 3 * 8 + 6:at + 8 + 3 * 8 + 6 + 8] = struct.pack("<Q", 2**50)
    with pytest.raises(GGUFFormatError, match=r"claims 1000000000000 strings|runs past the end"):
        GGUFFile(_write(tmp_path / "bad.gguf", bytes(data)))
