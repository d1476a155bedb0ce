"""Hugging Face checkpoint folders: `config.json` plus one `model.safetensors` or shards
listed by `model.safetensors.index.json`.

Every safetensors file is opened through `rlx_mil.weights.open_safetensors`, so its header is
validated in full when the folder is opened (a truncated shard, a header that lies about
offsets or sizes, a hostile dtype or shape: a typed `WeightsFormatError` naming the file and
tensor) and each tensor is read lazily, one at a time, in its stored dtype (BF16 as
`ml_dtypes.bfloat16`, never widened) and layout (`[out, in]` for linear weights). Checking a
checkpoint against an architecture reads only the headers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import CheckpointError, InvalidOptionError, UnknownTensorError
from rlx_mil.models.hf_config import read_config, read_json_file
from rlx_mil.weights import LazyTensors, TensorHeader, open_safetensors

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: Stored dtypes a model's float weights may have.
FLOAT_DTYPES = ("F32", "F16", "BF16")
#: An index names one shard per tensor; real ones are well under a megabyte.
MAX_INDEX_BYTES = 64 * 2**20


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


#: Bytes compared per step when a tensor is stored twice (bounded temporaries).
_COMPARE_CHUNK = 16 * 2**20


def _copies_differ(first: LazyTensors, second: LazyTensors, name: str) -> str:
    """Why two stored copies of tensor `name` are not the same tensor ("" when they are):
    headers first, then the bytes, a chunk at a time (NaNs compare by their bits)."""
    a, b = first.header(name), second.header(name)
    if (a.format_dtype, a.shape) != (b.format_dtype, b.shape):
        return f"with different dtype/shape ({a.format_dtype} {list(a.shape)} vs {b.format_dtype} {list(b.shape)})"
    x = np.ascontiguousarray(first[name]).reshape(-1).view(np.uint8)
    y = np.ascontiguousarray(second[name]).reshape(-1).view(np.uint8)
    for start in range(0, x.size, _COMPARE_CHUNK):
        if not np.array_equal(x[start:start + _COMPARE_CHUNK], y[start:start + _COMPARE_CHUNK]):
            return "with different values (which copy is meant is not knowable)"
    return ""


class Checkpoint(Mapping[str, np.ndarray]):
    """A checkpoint folder's tensors by their stored names; each read on access."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise InvalidOptionError(f"a checkpoint folder is a path (str or os.PathLike), got {type(directory).__name__}")
        self.directory = Path(directory)
        if not self.directory.exists():
            raise CheckpointError(f"{self.directory}: no such checkpoint folder")
        if not self.directory.is_dir():
            raise CheckpointError(f"{self.directory}: not a checkpoint folder (expected config.json and *.safetensors in it)")
        self.config: dict[str, Any] = read_config(self.directory)
        self._where: dict[str, LazyTensors] = {}
        index = self.directory / INDEX_FILE
        single = self.directory / SINGLE_FILE
        # Present at all (a FIFO or device included): opening it gives the typed refusal.
        if _present(index):
            self._open_sharded(index)
        elif _present(single):
            shard = open_safetensors(single)
            self._where = dict.fromkeys(shard, shard)
        else:
            found = sorted(p.name for p in self.directory.glob("*.safetensors"))
            hint = f" (found {', '.join(found)} but no {INDEX_FILE} naming them)" if found else ""
            raise CheckpointError(f"{self.directory}: neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")

    def _open_sharded(self, index: Path) -> None:
        data = read_json_file(index, MAX_INDEX_BYTES)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: expected a 'weight_map' object of tensor name -> shard file")
        problems: list[str] = []
        shards: dict[str, LazyTensors] = {}
        for file in sorted(set(weight_map.values())):
            path = self.directory / file
            if Path(file).name != file or not _present(path):
                problems.append(f"shard {file!r}: listed in {INDEX_FILE} but not a file in the folder")
                continue
            shards[file] = open_safetensors(path)
        for name, file in weight_map.items():
            shard = shards.get(file)
            if shard is None:
                continue
            if name not in shard:
                problems.append(f"tensor {name!r}: {INDEX_FILE} places it in {file}, which does not hold it")
                continue
            self._where[name] = shard
        for file, shard in shards.items():
            for name in shard:
                if name not in weight_map:
                    problems.append(f"tensor {name!r}: in {file} but not listed in {INDEX_FILE}")
                elif weight_map[name] != file and name in self._where:
                    why = _copies_differ(self._where[name], shard, name)
                    if why:
                        problems.append(f"tensor {name!r}: in {weight_map[name]} (where {INDEX_FILE} places it) and"
                                        f" in {file}, {why}")
        if problems:
            raise CheckpointError(f"{index}: the sharded checkpoint is inconsistent", problems)

    # ------------------------------------------------------------------ Mapping
    def __getitem__(self, name: str) -> np.ndarray:
        shard = self._where.get(name)
        if shard is None:
            raise KeyError(name)
        return shard[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    # ------------------------------------------------------------------ metadata
    def header(self, name: str) -> TensorHeader:
        """The validated header of tensor `name` (dtype, shape, stored dtype name), no data read."""
        shard = self._where.get(name)
        if shard is None:
            raise UnknownTensorError(f"{self.directory}: no tensor named {name!r}")
        return shard.header(name)

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.header(name).shape

    def dtype_of(self, name: str) -> np.dtype[Any]:
        return self.header(name).dtype

    def file_of(self, name: str) -> Path:
        self.header(name)
        return self._where[name].path

    def close(self) -> None:
        """Release every shard's file (later reads raise WeightsFormatError)."""
        for shard in {id(s): s for s in self._where.values()}.values():
            shard.close()

    def check(
        self,
        expected: Mapping[str, tuple[int, ...]],
        architecture: str,
        ignorable: Callable[[str], bool] = lambda name: False,
    ) -> None:
        """Every expected tensor present with its shape and a float dtype, and nothing else
        (but names `ignorable` accepts); all problems in one CheckpointError."""
        problems: list[str] = []
        for name, shape in expected.items():
            if name not in self._where:
                problems.append(f"missing tensor {name!r} (shape {list(shape)})")
                continue
            got = self.shape_of(name)
            if got != tuple(shape):
                problems.append(f"tensor {name!r} in {self.file_of(name).name}: shape {list(got)}, expected {list(shape)}")
            dtype = self.header(name).format_dtype
            if dtype not in FLOAT_DTYPES:
                problems.append(f"tensor {name!r} in {self.file_of(name).name}: dtype {dtype}, expected one of {', '.join(FLOAT_DTYPES)}")
        for name in self._where:
            if name not in expected and not ignorable(name):
                problems.append(f"unexpected tensor {name!r} in {self.file_of(name).name} (shape {list(self.shape_of(name))})")
        if problems:
            raise CheckpointError(f"{self.directory}: the checkpoint does not match the {architecture} architecture in its config.json", problems)


@dataclass(frozen=True)
class DerivedTensor:
    """A param made from stored tensors when it is read: mixture-of-experts weights stored one
    tensor per expert become one `[E, K, N]` array (`make(sources)`, in the stored dtype)."""

    sources: tuple[str, ...]
    shape: tuple[int, ...]
    make: Callable[[list[np.ndarray]], np.ndarray]


class ModelParams(Mapping[str, np.ndarray]):
    """The params of one built graph: checkpoint tensors under their stored names (read on
    access, stored dtype), arrays computed by the builder (RoPE tables) and tensors derived from
    stored ones on access (`DerivedTensor`). Param names are the stored names less
    `stored_prefix` (BERT exports differ only by a `bert.` prefix)."""

    def __init__(
        self,
        checkpoint: Mapping[str, np.ndarray],
        names: tuple[str, ...],
        computed: Mapping[str, np.ndarray],
        stored_prefix: str = "",
        derived: Mapping[str, DerivedTensor] | None = None,
    ) -> None:
        self._checkpoint = checkpoint
        self._derived = dict(derived or {})
        sources = {s for d in self._derived.values() for s in d.sources}
        self._names = tuple(n for n in names if n not in sources)
        self._name_set = frozenset(self._names)
        self._computed = dict(computed)
        self._prefix = stored_prefix

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._computed:
            return self._computed[name]
        if name in self._name_set:
            return self._checkpoint[self._prefix + name]
        derived = self._derived.get(name)
        if derived is not None:
            return derived.make([self._checkpoint[self._prefix + s] for s in derived.sources])
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self._names
        yield from self._derived
        yield from self._computed

    def __len__(self) -> int:
        return len(self._names) + len(self._derived) + len(self._computed)

    def __contains__(self, name: object) -> bool:
        return name in self._computed or name in self._name_set or name in self._derived

    # Metadata without reading data, so conversion can check every param before reading one.
    def shape_of(self, name: str) -> tuple[int, ...]:
        if name in self._computed:
            return tuple(self._computed[name].shape)
        if name in self._derived:
            return self._derived[name].shape
        return self._stored_meta(name, "shape_of")

    def dtype_of(self, name: str) -> np.dtype[Any]:
        if name in self._computed:
            return self._computed[name].dtype
        if name in self._derived:
            return self._stored_meta_of(self._derived[name].sources[0], "dtype_of")
        return self._stored_meta(name, "dtype_of")

    def _stored_meta(self, name: str, what: str) -> Any:
        if name not in self._name_set:
            raise KeyError(name)
        return self._stored_meta_of(name, what)

    def _stored_meta_of(self, name: str, what: str) -> Any:
        meta = getattr(self._checkpoint, what, None)
        if meta is not None:
            return meta(self._prefix + name)
        return getattr(np.asarray(self._checkpoint[self._prefix + name]), what[:-3])


def pattern_matcher(*patterns: str) -> Callable[[str], bool]:
    """A predicate true for names matching any of the regular expressions (full match)."""
    compiled = [re.compile(p) for p in patterns]
    return lambda name: any(c.fullmatch(name) for c in compiled)
