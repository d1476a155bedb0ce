"""Reading a `.mlpackage` without writing to it.

coremltools opens a package through `libmodelpackage.ModelPackage`, which rewrites the
package's `Manifest.json` when the object goes, so `inspect`, `preflight` and `generate` changed
the packages they only read (a new mtime, a failure on read-only media). `ManifestReader` answers
the questions coremltools' loaders ask (the root model's path, an item by name and author) from
`Manifest.json` alone; `read_only()` puts it in their place while a package is opened."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

#: The module attributes through which coremltools' loaders reach `ModelPackage`.
LOADER_TARGETS = ("coremltools.models.utils:_ModelPackage", "coremltools.models.model:_ModelPackage")


class ManifestItem:
    """One `itemInfoEntries` entry, with `ModelPackageItemInfo`'s accessors."""

    def __init__(self, root: Path, identifier: str, entry: dict[str, Any]) -> None:
        self._root, self._identifier, self._entry = root, identifier, entry

    def identifier(self) -> str:
        return self._identifier

    def path(self) -> str:
        return str(self._root / "Data" / str(self._entry.get("path", "")))

    def name(self) -> str:
        return str(self._entry.get("name", ""))

    def author(self) -> str:
        return str(self._entry.get("author", ""))

    def description(self) -> str:
        return str(self._entry.get("description", ""))


class ManifestReader:
    """A read-only `ModelPackage`: the package's `Manifest.json`, never written."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._root = Path(path)
        try:
            manifest = json.loads((self._root / "Manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise RuntimeError(f"{self._root}: cannot read its Manifest.json ({err})") from None
        entries = manifest.get("itemInfoEntries") if isinstance(manifest, dict) else None
        if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
            raise RuntimeError(f"{self._root}: its Manifest.json has no itemInfoEntries table")
        self._entries: dict[str, dict[str, Any]] = entries
        self._root_id = manifest.get("rootModelIdentifier")

    @staticmethod
    def isValid(path: str | os.PathLike[str]) -> bool:
        try:
            ManifestReader(path)
        except RuntimeError:
            return False
        return True

    def getRootModel(self) -> ManifestItem:
        entry = self._entries.get(str(self._root_id))
        if entry is None:
            raise RuntimeError(f"{self._root}: its Manifest.json names no root model")
        return ManifestItem(self._root, str(self._root_id), entry)

    def findItemByNameAuthor(self, name: str, author: str) -> ManifestItem | None:
        for identifier, entry in self._entries.items():
            if entry.get("name") == name and entry.get("author") == author:
                return ManifestItem(self._root, identifier, entry)
        return None


@contextmanager
def read_only() -> Iterator[None]:
    """While active, coremltools' package loaders read manifests with `ManifestReader`."""
    from rlx_mil.coreml.patches import replaced

    with ExitStack() as stack:
        for target in LOADER_TARGETS:
            stack.enter_context(replaced(target, ManifestReader))
        yield


def open_model(path: str | os.PathLike[str], **options: Any) -> Any:
    """`ct.models.MLModel(path, **options)` that leaves the package's files as they were. A
    folder without `Manifest.json` is refused by name (a checkpoint folder given where its
    package belongs: with the command that converts it)."""
    import coremltools as ct

    root = Path(path)
    check_is_package(root)
    if root.is_dir() and not (root / "Manifest.json").exists():
        from rlx_mil.errors import MissingFileError

        raise MissingFileError(f"{root}: not a Core ML package (it has no Manifest.json)")
    with read_only():
        return ct.models.MLModel(str(path), **options)


def check_is_package(root: Path) -> None:
    """A typed error when `root` is a model's source given where its converted package belongs
    (a GGUF file, a Hugging Face checkpoint folder: config.json and weights), naming the command
    that converts it; from `open_model`, also for any other folder without `Manifest.json`."""
    from rlx_mil.errors import MissingFileError

    if root.is_file() and root.suffix == ".gguf":
        raise MissingFileError(f"{root}: a GGUF file, not a Core ML package; convert it first:"
                               f" rlx-mil convert-gguf {root} -o model.mlpackage")
    if not root.is_dir() or (root / "Manifest.json").exists():
        return
    weights = any(root.glob("*.safetensors")) or any(root.glob("*.safetensors.index.json")) \
        or any(root.glob("pytorch_model*.bin"))
    if (root / "config.json").is_file() and weights:
        raise MissingFileError(f"{root}: a Hugging Face checkpoint folder, not a Core ML package; convert it first:"
                               f" rlx-mil convert-hf {root} -o model.mlpackage")
