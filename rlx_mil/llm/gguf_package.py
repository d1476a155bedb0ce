"""The text side of a package converted from a GGUF file: the tokenizer files made from its
`tokenizer.ggml.*` metadata (stored as the package's `rlx_mil/tokenizer` item, as for a
Hugging Face checkpoint) and Core ML's model description from its `general.*` metadata."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from rlx_mil.coreml.metadata import ModelSource
from rlx_mil.coreml.scratch import scratch_dir
from rlx_mil.llm.package_files import ModelDescription, _text, add_text_files
from rlx_mil.models.gguf.metadata import ARCHITECTURES
from rlx_mil.models.gguf.reader import GGUFFile
from rlx_mil.models.gguf.tokenizer import has_tokenizer, write_tokenizer_files


def describe_gguf(file: GGUFFile) -> ModelDescription:
    """Author (`general.author`, else `general.organization`), license, version and a short
    description (`general.description`, else the model's name and architecture)."""
    value = file.value
    given = _text(value("general.name"))
    name = given or file.path.stem
    arch = _text(value("general.architecture"))
    kind = f" ({ARCHITECTURES.get(arch, arch)}, GGUF)" if arch else " (GGUF)"
    named_by = "GGUF general.name" if given else "GGUF file name"
    return ModelDescription(
        author=_text(value("general.author")) or _text(value("general.organization")),
        license=_text(value("general.license")),
        short_description=_text(value("general.description")) or f"{name}{kind}, converted to Core ML by rlx_mil",
        version=_text(value("general.version")),
        source=ModelSource(name, named_by, ARCHITECTURES.get(arch, arch) if arch else ""),
    )


def prepare_gguf_package(model: Any, path: str | os.PathLike[str], overrides: Mapping[str, str | None] | None = None) -> list[str]:
    """Before saving `model` converted from GGUF file `path`: set its model description (with
    `overrides`) and add the tokenizer files item. Returns the names of the files added."""
    file = GGUFFile(path)
    describe_gguf(file).merged(overrides or {}).apply(model)
    if not has_tokenizer(file):
        return []
    with tempfile.TemporaryDirectory(prefix="rlx_mil_gguf_text_", dir=scratch_dir()) as folder:
        write_tokenizer_files(file, folder)
        return add_text_files(model, folder)
