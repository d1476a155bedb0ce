"""One record per Hugging Face model family, from which every per-family table derives.

A family module in this package reads its `config.json` into a `DecoderSpec` / `EncoderSpec`
and registers itself with `@decoder_family(...)` or `@encoder_family(...)` (from
`rlx_mil.models.family_registry`, never from this package), giving its `model_type`, display
name, the table of transformers' config-class defaults (with the transformers version they were
read from), the legacy keys older transformers versions wrote and a tiny config for the demo and
the tests. `model_spec`, the architecture names, the demo's `--family` choices and
`TINY_CONFIGS` all read these records; modules here are found by listing the package, so a new
family is one new module.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.family_registry import TRANSFORMERS_VERSION, FamilyRecord, registered
from rlx_mil.models.hf_config import Fields

if TYPE_CHECKING:
    from rlx_mil.models.hf_config import ModelSpec

__all__ = ["TRANSFORMERS_VERSION", "FamilyRecord", "family", "family_of_model_type", "model_spec", "records",
           "tiny_configs"]

_loaded = False



def records() -> dict[str, FamilyRecord]:
    """Every registered family by model_type (the family modules of this package imported)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            importlib.import_module(f"{__name__}.{info.name}")
    return registered()


def family(name: str) -> FamilyRecord:
    """The record of family `name` (its model_type)."""
    return records()[name]


def family_of_model_type(model_type: object, source: str = "config.json") -> FamilyRecord:
    """The family a config's `model_type` names (aliases included), or a typed refusal."""
    found = records()
    if isinstance(model_type, str):
        if model_type in found:
            return found[model_type]
        for record in found.values():
            if model_type in record.aliases:
                return record
    raise UnsupportedConfigError(
        f"{source}: model_type = {json.dumps(model_type)} is not supported; rlx_mil builds {', '.join(sorted(found))}",
        field="model_type", value=model_type,
    )


def tiny_configs() -> dict[str, dict[str, Any]]:
    """Every single-graph family's tiny config by model_type, decoders first (speech families'
    folders of packages are made by `rlx_mil.speech`)."""
    found = sorted((r for r in records().values() if r.kind != "speech"), key=lambda r: (r.kind != "decoder", r.model_type))
    out: dict[str, dict[str, Any]] = {}
    for record in found:
        out[record.model_type] = json.loads(json.dumps(record.tiny))
        out.update({k: json.loads(json.dumps(v)) for k, v in record.variants.items()})
    return out


def model_spec(config: Mapping[str, Any], source: str = "config.json") -> ModelSpec:
    """The architecture a Hugging Face config describes, by its `model_type`: the family's
    fields checked for unknown ones, missing ones taken from its defaults table."""
    record = family_of_model_type(config.get("model_type"), source)
    fields = Fields(config, record.model_type, source, record.defaults)
    fields.check_known(record.known)
    return record.read(fields)
