"""Loading and saving weights: `.npz` and `.safetensors`.

The safetensors format is small enough (8-byte little-endian header length, a JSON header,
raw little-endian tensor bytes) that reading it here keeps `safetensors` out of the run-time
dependencies. BF16 tensors are widened to float32 (NumPy has no bfloat16).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from rlx_mil.errors import RlxMilError


class WeightsFormatError(RlxMilError):
    """A weights file is unreadable, truncated or inconsistent."""


_ST_DTYPES: dict[str, str] = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?",
}
_ST_NAMES = {np.dtype(v).newbyteorder("=") if v not in ("i1", "u1", "?") else np.dtype(v): k for k, v in _ST_DTYPES.items()}
#: Refuse headers larger than this: real headers are kilobytes.
MAX_HEADER_BYTES = 100 * 1024 * 1024


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    p = Path(path)
    size = p.stat().st_size
    with p.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise WeightsFormatError(f"{p}: too short for a safetensors file")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(MAX_HEADER_BYTES, size - 8):
            raise WeightsFormatError(f"{p}: header length {header_len} exceeds the file")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise WeightsFormatError(f"{p}: header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise WeightsFormatError(f"{p}: header is not a JSON object")
    data = np.memmap(p, dtype=np.uint8, mode="r", offset=8 + header_len)
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
            shape = tuple(int(s) for s in shape)
        except (KeyError, TypeError, ValueError) as err:
            raise WeightsFormatError(f"{p}: tensor {name!r}: bad header entry ({err})") from None
        if not (0 <= start <= end <= data.size):
            raise WeightsFormatError(f"{p}: tensor {name!r}: data offsets {start}..{end} outside the file")
        raw = np.asarray(data[start:end])
        if dtype_name == "BF16":
            count = int(np.prod(shape, dtype=np.int64))
            if raw.size != 2 * count:
                raise WeightsFormatError(f"{p}: tensor {name!r}: {raw.size} bytes for BF16 {list(shape)}")
            widened = raw.view("<u2").astype(np.uint32) << 16
            out[name] = widened.view(np.float32).reshape(shape)
            continue
        np_name = _ST_DTYPES.get(dtype_name)
        if np_name is None:
            raise WeightsFormatError(f"{p}: tensor {name!r}: unsupported dtype {dtype_name!r}")
        dtype = np.dtype(np_name)
        count = int(np.prod(shape, dtype=np.int64))
        if raw.size != count * dtype.itemsize:
            raise WeightsFormatError(
                f"{p}: tensor {name!r}: {raw.size} bytes for {dtype_name} {list(shape)}"
            )
        out[name] = raw.view(dtype).reshape(shape).astype(dtype.newbyteorder("="))
    return out


def save_safetensors(tensors: Mapping[str, np.ndarray], path: str | os.PathLike[str]) -> None:
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, value in tensors.items():
        arr = np.ascontiguousarray(value)
        key = _ST_NAMES.get(arr.dtype.newbyteorder("=") if arr.dtype.itemsize > 1 else arr.dtype)
        if key is None:
            raise WeightsFormatError(f"tensor {name!r}: dtype {arr.dtype} has no safetensors name")
        blob = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": key, "shape": list(arr.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with Path(path).open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load_params(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Weights by name from a `.npz` or `.safetensors` file."""
    p = Path(path)
    if not p.is_file():
        raise WeightsFormatError(f"{p}: no such weights file")
    if p.suffix == ".safetensors":
        return load_safetensors(p)
    if p.suffix == ".npz":
        try:
            with np.load(p, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except (OSError, ValueError) as err:
            raise WeightsFormatError(f"{p}: not a readable .npz archive ({err})") from None
    raise WeightsFormatError(f"{p}: unknown weights format (use .npz or .safetensors)")
