"""What an app needs beside the program, stored in the `.mlpackage` itself.

`convert-hf` copies the checkpoint's text files (`rlx_mil.llm.text.TEXT_FILES`: tokenizer,
tokenizer config, chat template, generation config, config) into the package as one
*package item*: a folder registered in the package's `Manifest.json` (author `rlx_mil`, name
`tokenizer`), at `Data/rlx_mil/tokenizer/`. Core ML loads the package as before (it reads
only its own items), and the one folder is the whole model. It also fills Core ML's model
description (`author`, `license`, `short_description`, `version`) from the checkpoint: the
model card's front matter (`README.md`) and `config.json`, each overridable.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlx_mil.coreml.metadata import ModelSource
from rlx_mil.coreml.package_items import TEXT_ITEM, add_item, item_folder
from rlx_mil.coreml.scratch import scratch_dir
from rlx_mil.llm.text import TEXT_FILES, TokenizerError, read_json_file

ITEM_NAME = TEXT_ITEM
ITEM_DESCRIPTION = "Tokenizer, chat template and generation config of the source checkpoint"

#: Core ML model-description fields set from the checkpoint.
DESCRIPTION_FIELDS = ("author", "license", "short_description", "version")

_MAX_CARD = 16 << 20


@dataclass(frozen=True)
class ModelDescription:
    """Core ML's model description fields (None: not known, left unset)."""

    author: str | None = None
    license: str | None = None
    short_description: str | None = None
    version: str | None = None
    #: The model's name, where it came from and its architecture (`rlx_mil.source`).
    source: ModelSource | None = None

    def merged(self, overrides: Mapping[str, str | None]) -> ModelDescription:
        """These fields with every non-None override applied."""
        values: dict[str, Any] = {name: getattr(self, name) for name in DESCRIPTION_FIELDS}
        values.update({k: v for k, v in overrides.items() if k in DESCRIPTION_FIELDS and v is not None})
        return ModelDescription(**values, source=self.source)

    def apply(self, model: Any) -> None:
        """Set the known fields on an MLModel (saved with it)."""
        for name in DESCRIPTION_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(model, name, value)
        if self.source is not None:
            self.source.write(model.user_defined_metadata)


def model_card(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The YAML front matter of the checkpoint's `README.md` (empty when absent or unreadable)."""
    import yaml

    from rlx_mil.fileio import read_regular_file

    path = Path(model_dir) / "README.md"
    if not path.is_file():
        return {}
    text = read_regular_file(path, _MAX_CARD, TokenizerError, "model card").decode("utf-8", "replace")
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    try:
        front = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return {}  # a card is documentation: a broken one costs its fields, not the conversion
    return front if isinstance(front, dict) else {}


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return ", ".join(value)
    return None


def describe_checkpoint(model_dir: str | os.PathLike[str], architecture: str | None = None) -> ModelDescription:
    """Author, license, description and version of a checkpoint, from what it ships.

    license: the card's `license` (`license_name` for `other`); author: the card's `author`,
    else the owner in the model's source (`owner/name`: `_name_or_path`, or the repository of a
    Hugging Face cache folder); version: the card's `version`; short_description: the card's
    `description`, else the model's name and architecture (`checkpoint_source`; a checkpoint
    without a name is described by its architecture and folder, not as if the folder's name
    were the model's); source: the name, where it came from and the architecture.
    """
    from rlx_mil.models.pretrained import NAMED_BY_FOLDER, checkpoint_source

    folder = Path(model_dir)
    card = model_card(folder)
    config = read_json_file(folder / "config.json", "config.json") if (folder / "config.json").is_file() else {}
    license_ = _text(card.get("license"))
    if license_ == "other" and _text(card.get("license_name")):
        license_ = _text(card.get("license_name"))
    source, named_by = checkpoint_source(folder, config, _text(card.get("model_name")))
    author = _text(card.get("author"))
    if author is None and "/" in source and not os.path.isabs(source) and named_by != NAMED_BY_FOLDER:
        author = source.split("/", 1)[0]
    name = source.rsplit("/", 1)[-1]
    kind = architecture_text(architecture, config)
    short_kind = architecture or kind
    if named_by == NAMED_BY_FOLDER:
        made = f"{short_kind or 'A'} model from the folder {name}, converted to Core ML by rlx_mil"
    else:
        made = f"{name}{f' ({short_kind})' if short_kind else ''}, converted to Core ML by rlx_mil"
    description = _text(card.get("description")) or made
    version = card.get("version")
    return ModelDescription(
        author=author, license=license_, short_description=description,
        version=str(version) if isinstance(version, (str, int, float)) and str(version).strip() else None,
        source=ModelSource(source, named_by, kind, _parameters(folder)),
    )


def _parameters(folder: Path) -> int:
    """The checkpoint's stored parameter count, from its safetensors headers (0 when they do not
    read: the description is not worth a failed conversion)."""
    from rlx_mil.errors import RlxMilError
    from rlx_mil.models.checkpoint import Checkpoint

    try:
        checkpoint = Checkpoint(folder)
        return sum(math.prod(checkpoint.shape_of(name)) for name in checkpoint)
    except (RlxMilError, OSError, ValueError):
        return 0


def architecture_text(family: str | None, config: Mapping[str, Any]) -> str:
    """`Llama (LlamaForCausalLM)`: the family's name and config.json's first architecture
    (either alone when the other is unknown; empty when both are)."""
    classes = config.get("architectures")
    cls = classes[0] if isinstance(classes, list) and classes and isinstance(classes[0], str) else None
    if family and cls:
        return f"{family} ({cls})"
    return family or cls or ""


def text_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The text files of `model_dir` a package should carry (regular files only)."""
    folder = Path(model_dir)
    return [folder / name for name in TEXT_FILES if (folder / name).is_file()]


def add_text_files(model: Any, model_dir: str | os.PathLike[str]) -> list[str]:
    """Copy the checkpoint's text files into the (not yet saved) package of `model` as the
    `rlx_mil/tokenizer` item; `rlx_mil.save` then writes them with the package. Returns the
    names copied (none: no item is added)."""
    files = text_files(model_dir)
    package = getattr(model, "package_path", None)
    if not files or not package:
        return []
    check_tokenizer(model_dir)
    with tempfile.TemporaryDirectory(prefix="rlx_mil_text_", dir=scratch_dir()) as work:
        staged = Path(work) / ITEM_NAME
        staged.mkdir()
        for path in files:
            shutil.copyfile(path, staged / path.name)
        add_item(package, staged, ITEM_NAME, ITEM_DESCRIPTION)
    return [p.name for p in files]


def check_tokenizer(model_dir: str | os.PathLike[str]) -> None:
    """Before a package carries the checkpoint's tokenizer: it must load (a malformed,
    truncated or wrong-schema tokenizer.json is a TokenizerError naming it), and a vocabulary
    larger than the model's `vocab_size` is warned of (prompts holding those tokens are
    refused when generating)."""
    import warnings

    from rlx_mil.llm.text import TextTokenizer

    folder = Path(model_dir)
    if not (folder / "tokenizer.json").is_file():
        return
    tokenizer = TextTokenizer(folder)
    config = _optional(folder / "config.json")
    text = config.get("text_config")
    vocab = (text if isinstance(text, dict) and "vocab_size" in text else config).get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and tokenizer.id_limit > vocab:
        warnings.warn(
            f"{folder / 'tokenizer.json'}: token ids up to {tokenizer.id_limit - 1} (added tokens included), past the"
            f" model's vocab_size {vocab}: prompts holding those tokens cannot be fed to it",
            UserWarning, stacklevel=2,
        )


def _optional(path: Path) -> dict[str, Any]:
    from rlx_mil.llm.text import read_json_file

    return read_json_file(path, path.name) if path.is_file() else {}


def package_text_folder(package: str | os.PathLike[str]) -> Path | None:
    """The folder of the package's `rlx_mil/tokenizer` item, or None when it has none; a typed
    error when there is no package at `package`."""
    from rlx_mil.errors import MissingFileError

    if not Path(package).is_dir():
        raise MissingFileError(f"no model package at {package}")
    return item_folder(package, ITEM_NAME)


def tokenizer_folder(package: str | os.PathLike[str]) -> Path | None:
    """The tokenizer folder a package, chunked set or Core AI asset carries, found from its files
    alone (no model, no weights opened); None when it carries none or `package` is none of these."""
    from rlx_mil.coreai.asset import TEXT_FOLDER, is_asset
    from rlx_mil.llm.chunked import is_chunked_set, read_chunked_set

    if not os.path.isdir(package):
        return None
    if is_asset(package):
        folder = Path(package, TEXT_FOLDER)
        return folder if folder.is_dir() else None
    if is_chunked_set(package):
        chunks = read_chunked_set(package)
        return None if chunks.text_chunk is None else package_text_folder(chunks.package(chunks.text_chunk))
    return package_text_folder(package)


def prepare_package(
    model: Any, model_dir: str | os.PathLike[str], overrides: Mapping[str, str | None] | None = None
) -> list[str]:
    """Before saving `model` converted from the checkpoint `model_dir`: set its model
    description (the checkpoint's, with `overrides`), store an image encoder's image-processor
    settings in its metadata and add the text files item. Returns the names of the files added."""
    from rlx_mil.errors import UnsupportedConfigError
    from rlx_mil.models.families import family_of_model_type

    folder = Path(model_dir)
    config = read_json_file(folder / "config.json", "config.json") if (folder / "config.json").is_file() else {}
    try:
        architecture: str | None = family_of_model_type(config.get("model_type")).name
    except UnsupportedConfigError:
        architecture = None
    describe_checkpoint(folder, architecture).merged(overrides or {}).apply(model)
    from rlx_mil.models.image_preprocessing import add_preprocessing_metadata, is_image_encoder

    if is_image_encoder(config):  # its resize / normalisation settings (a VLM's text package: not its images')
        add_preprocessing_metadata(model, folder)
    return add_text_files(model, folder)
