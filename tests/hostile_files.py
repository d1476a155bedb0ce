"""Hostile weights containers found by the reliability fuzz: (label, bytes or maker, expected
message[, error]). Shared by the weights tests and the CLI tests."""

from __future__ import annotations

import json
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import RlxMilError, WeightsFormatError


def st_bytes(header: object, data: bytes = b"", *, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype: object = "F32", shape: object = (1,), offsets: object = (0, 4)) -> dict[str, object]:
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape,
            "data_offsets": list(offsets) if isinstance(offsets, tuple) else offsets}


HOSTILE_SAFETENSORS: list[tuple[str, bytes, str]] = [
    ("too short", b"\x01\x02", "too short"),
    ("header past the end", struct.pack("<Q", 10**6) + b"{}", "exceeds the file"),
    ("huge header length", struct.pack("<Q", 2**63) + b"{}", "more than the limit"),
    ("not JSON", st_bytes(None, raw=b"nope"), "not valid JSON"),
    ("not UTF-8", st_bytes(None, raw=b'{"\xff":1}'), "not UTF-8"),
    ("not an object", st_bytes([]), "not a JSON object"),
    ("deep JSON", st_bytes(None, raw=b"[" * 100_000 + b"]" * 100_000), "nests 100000 levels"),
    ("deep inside an entry", st_bytes(None, raw=b'{"x":{"dtype":"F32","shape":[[[[1]]]],"data_offsets":[0,4]}}'), "nests 6 levels"),
    ("Infinity dim", st_bytes(None, raw=b'{"x":{"dtype":"F32","shape":[Infinity],"data_offsets":[0,4]}}'), "Infinity"),
    ("NaN offset", st_bytes(None, raw=b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,NaN]}}'), "NaN"),
    ("2**64 dim", st_bytes({"x": entry(shape=(2**64,))}), "larger than the tensor size limit"),
    ("10000-digit dim", st_bytes(None, raw=b'{"x":{"dtype":"F32","shape":[' + b"9" * 10000 + b'],"data_offsets":[0,4]}}'), "not valid JSON"),
    ("negative dim", st_bytes({"x": entry(shape=(-1, -4))}, b"\0" * 16), "negative dim"),
    ("product wraps", st_bytes({"x": entry(dtype="U8", shape=(2**32, 2**32), offsets=(0, 0))}), "larger than the tensor size limit"),
    ("product wraps in int64", st_bytes({"x": entry(dtype="U8", shape=(2**31 - 1,) * 3, offsets=(0, 0))}), "more than the limit"),
    ("product beyond the limit", st_bytes({"x": entry(dtype="U8", shape=(2**16, 2**16), offsets=(0, 0))}), "4294967296 elements"),
    ("string shape", st_bytes({"x": entry(shape="22")}, b"\0" * 16), "shape must be a list"),
    ("float dim", st_bytes({"x": entry(shape=[1.0])}, b"\0" * 4), "shape must be a list"),
    ("bool dim", st_bytes({"x": entry(shape=[True])}, b"\0" * 4), "shape must be a list"),
    ("string offsets", st_bytes({"x": entry(offsets=["0", "4"])}, b"\0" * 4), "data_offsets must be"),
    ("three offsets", st_bytes({"x": entry(offsets=[0, 2, 4])}, b"\0" * 4), "data_offsets must be"),
    ("reversed offsets", st_bytes({"x": entry(offsets=(4, 0))}, b"\0" * 4), "end before they begin"),
    ("list dtype", st_bytes({"x": entry(dtype=["F32"])}, b"\0" * 4), "dtype must be a string"),
    ("unknown dtype", st_bytes({"x": entry(dtype="Q9")}, b"\0" * 4), "unsupported dtype 'Q9'"),
    ("F8 dtype", st_bytes({"x": entry(dtype="F8_E4M3", offsets=(0, 1))}, b"\0"), "unsupported dtype 'F8_E4M3'"),
    ("size mismatch", st_bytes({"x": entry(shape=(3,), offsets=(0, 4))}, b"\0" * 4), "hold 4 bytes, but F32 \\[3\\] needs 12"),
    ("past the data", st_bytes({"x": entry(shape=(4,), offsets=(0, 16))}), "run past the end"),
    ("overlap", st_bytes({"a": entry(dtype="U8", shape=(2,), offsets=(0, 2)), "b": entry(dtype="U8", shape=(2,), offsets=(1, 3))}, b"\0" * 3), "'b': data \\[1, 3\\) overlaps tensor 'a'"),
    ("same bytes twice", st_bytes({"a": entry(), "b": entry()}, b"\0" * 4), "overlaps tensor"),
    ("gap", st_bytes({"a": entry(dtype="U8", shape=(1,), offsets=(1, 2))}, b"\0" * 2), "belong to no tensor"),
    ("trailing bytes", st_bytes({"a": entry()}, b"\0" * 8), "4 bytes after the last tensor"),
    ("duplicate names", st_bytes(None, raw=b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', data=b"\0\0"), "the key 'a' twice"),
    ("entry not an object", st_bytes({"x": [1, 2]}), "entry must be an object"),
    ("missing fields", st_bytes({"x": {"dtype": "F32"}}), "missing \\['shape', 'data_offsets'\\]"),
    ("unknown fields", st_bytes({"x": {**entry(), "scale": 2}}, b"\0" * 4), "unknown fields \\['scale'\\]"),
    ("bad metadata", st_bytes({"__metadata__": {"a": 1}}), "__metadata__ must map strings to strings"),
]


def npz_file(tmp_path: Path, members: dict[str, bytes], *, compression: int = zipfile.ZIP_STORED) -> Path:
    path = tmp_path / "bad.npz"
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def npy_bytes(shape: tuple[int, ...], dtype: str = "<f4", data: bytes | None = None) -> bytes:
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + (data if data is not None else b"")


def _encrypted(tmp_path: Path) -> Path:
    path = npz_file(tmp_path, {"a.npy": npy_bytes((1,), data=b"\0" * 4)})
    raw = bytearray(path.read_bytes())
    # Set the "encrypted" flag bit in the local header and the central directory entry.
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.find(signature)
        raw[at + flag_at] |= 0x1
    path.write_bytes(bytes(raw))
    return path


def _corrupt_crc(tmp_path: Path) -> Path:
    path = npz_file(tmp_path, {"a.npy": npy_bytes((4,), data=b"\1" * 16)})
    raw = path.read_bytes()
    at = raw.rfind(b"\1" * 16)
    path.write_bytes(raw[:at] + b"\2" + raw[at + 1:])
    return path


def _overlapping(tmp_path: Path) -> Path:
    """Two central-directory entries pointing at one member's bytes (the overlapped zip bomb)."""
    path = npz_file(tmp_path, {"a.npy": npy_bytes((4,), data=b"\0" * 16), "b.npy": npy_bytes((4,), data=b"\0" * 16)})
    raw = bytearray(path.read_bytes())
    first = raw.find(b"PK\x01\x02")
    second = raw.find(b"PK\x01\x02", first + 1)
    raw[second + 42: second + 46] = raw[first + 42: first + 46]  # b's local header offset := a's
    path.write_bytes(bytes(raw))
    return path


def _duplicated(tmp_path: Path) -> Path:
    path = tmp_path / "bad.npz"
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name, and writes it
        archive.writestr("a.npy", npy_bytes((1,), data=b"\0" * 4))
        archive.writestr("a.npy", npy_bytes((1,), data=b"\1" * 4))
    return path


HOSTILE_NPZ: list[tuple[str, Any, str, type[RlxMilError]]] = [
    ("garbage", lambda t: (t / "bad.npz", (t / "bad.npz").write_bytes(b"not a zip at all"))[0], "not a readable .npz", WeightsFormatError),
    ("truncated zip", lambda t: (t / "bad.npz", (t / "bad.npz").write_bytes(npz_file(t, {"a.npy": npy_bytes((1,), data=b"\0" * 4)}).read_bytes()[:40]))[0], "not a readable .npz", WeightsFormatError),
    ("a .npy under an .npz name", lambda t: (t / "bad.npz", np.save(t / "bad.npy", np.ones(3)), (t / "bad.npz").write_bytes((t / "bad.npy").read_bytes()))[0], "a single .npy array", WeightsFormatError),
    ("member that is not .npy", lambda t: npz_file(t, {"readme.txt": b"hello"}), "'readme.txt': not a .npy array", WeightsFormatError),
    ("member that is a pickle", lambda t: npz_file(t, {"a.npy": npy_bytes((1,), "|O", b"\0" * 8)}), "'\\|O' is not a supported numeric dtype", WeightsFormatError),
    ("encrypted member", _encrypted, "encrypted", WeightsFormatError),
    ("header claims 2**40 floats", lambda t: npz_file(t, {"a.npy": npy_bytes((2**40,), data=b"\0" * 16)}), "larger than the tensor size limit", WeightsFormatError),
    ("header claims more than its data", lambda t: npz_file(t, {"a.npy": npy_bytes((2**20,), data=b"\0" * 16)}), "holds 16 data bytes", WeightsFormatError),
    ("negative dim", lambda t: npz_file(t, {"a.npy": npy_bytes((-4,), data=b"")}), "negative dim", WeightsFormatError),
    ("structured dtype", lambda t: npz_file(t, {"a.npy": npy_bytes((1,), "|V4", b"\0" * 4)}), "not a supported numeric dtype", WeightsFormatError),
    ("complex dtype", lambda t: npz_file(t, {"a.npy": npy_bytes((1,), "<c8", b"\0" * 8)}), "not a supported numeric dtype", WeightsFormatError),
    ("bad magic", lambda t: npz_file(t, {"a.npy": b"\x93NUMPY\x09\x00garbage"}), "not a readable .npy|unsupported .npy", WeightsFormatError),
    ("huge .npy header", lambda t: npz_file(t, {"a.npy": b"\x93NUMPY\x02\x00" + struct.pack("<I", 10**6) + b" " * 10**6}), "not a readable .npy", WeightsFormatError),
    ("corrupt CRC", _corrupt_crc, "Bad CRC-32", WeightsFormatError),
    ("overlapping members", _overlapping, "overlap the next member", WeightsFormatError),
    ("duplicate members", lambda t: _duplicated(t), "appears twice", WeightsFormatError),
]
