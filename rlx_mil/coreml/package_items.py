"""Package items: folders beside the program that a `.mlpackage` registers in its
`Manifest.json` (by name and author). Core ML reads only its own items, so rlx_mil's travel
with the package without changing how it loads."""

from __future__ import annotations

import os
from pathlib import Path

#: The author every rlx_mil item is registered under.
ITEM_AUTHOR = "rlx_mil"
#: The item holding the source checkpoint's text files (`rlx_mil.llm.package_files`).
TEXT_ITEM = "tokenizer"


def add_item(package: str | os.PathLike[str], folder: str | os.PathLike[str], name: str, description: str) -> None:
    """Copy `folder` into the (unsaved) package as the item `name` (no-op if it has one)."""
    from coremltools.libmodelpackage import ModelPackage

    item = ModelPackage(str(package))
    if item.findItemByNameAuthor(name, ITEM_AUTHOR) is None:
        item.addItem(str(folder), name, ITEM_AUTHOR, description)
    del item  # the manifest is written when the package object goes


def item_folder(package: str | os.PathLike[str], name: str) -> Path | None:
    """The folder of the package's rlx_mil item `name`, or None when it has none."""
    from rlx_mil.coreml.manifest import ManifestReader

    root = Path(package)
    if not (root / "Manifest.json").is_file():
        return None
    try:  # read-only: coremltools' ModelPackage would rewrite the manifest
        info = ManifestReader(root).findItemByNameAuthor(name, ITEM_AUTHOR)
    except Exception:  # a damaged manifest: the package has no usable item
        return None
    if info is None:
        return None
    folder = Path(info.path())
    return folder if folder.is_dir() else None
