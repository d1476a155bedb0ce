"""One record per Hugging Face model family, from which every per-family table derives.

A family module in this package reads its `config.json` into a `DecoderSpec` / `EncoderSpec`
and registers itself with `@decoder_family(...)` or `@encoder_family(...)`, giving its
`model_type`, display name, the table of transformers' config-class defaults (with the
transformers version they were read from), the legacy keys older transformers versions wrote
and a tiny config for the demo and the tests. `model_spec`, the architecture names, the demo's
`--family` choices and `TINY_CONFIGS` all read these records; modules here are found by
listing the package, so a new family is one new module.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.hf_config import Fields

if TYPE_CHECKING:
    from rlx_mil.models.hf_config import ModelSpec

#: The transformers release the defaults tables were read from.
TRANSFORMERS_VERSION = "5.23.0"


@dataclass(frozen=True)
class FamilyRecord:
    model_type: str
    #: "Llama", "Gemma 3", ...: how messages and docs name the architecture.
    name: str
    #: "decoder" or "encoder".
    kind: str
    read: Callable[[Fields], ModelSpec]
    #: transformers' config-class defaults: every field a config may omit, with its value.
    defaults: Mapping[str, Any]
    #: the config class they were read from, e.g. "LlamaConfig".
    config_class: str
    #: a tiny config (as `to_dict()` writes one) for `rlx-mil demo` and the tests.
    tiny: Mapping[str, Any]
    #: fields outside `defaults` the family reads too (written by older transformers versions).
    legacy: frozenset[str] = field(default_factory=frozenset)
    #: other model_type values read as this family.
    aliases: tuple[str, ...] = ()
    #: more tiny configs of this model_type under their own demo names (e.g. Phi-4-mini's shape of phi3).
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: the transformers release `defaults` were read from, when not `TRANSFORMERS_VERSION`.
    read_from: str | None = None

    @property
    def known(self) -> frozenset[str]:
        return frozenset(self.defaults) | self.legacy

    @property
    def transformers_version(self) -> str:
        return self.read_from or TRANSFORMERS_VERSION


_RECORDS: dict[str, FamilyRecord] = {}
_loaded = False

Reader = TypeVar("Reader", bound=Callable[..., Any])


def _family(kind: str, model_type: str, *, name: str, defaults: Mapping[str, Any], config_class: str,
            tiny: Mapping[str, Any], legacy: tuple[str, ...] = (), aliases: tuple[str, ...] = (),
            variants: Mapping[str, Mapping[str, Any]] | None = None,
            transformers_version: str | None = None) -> Callable[[Reader], Reader]:
    def register(read: Reader) -> Reader:
        if model_type in _RECORDS:
            raise ValueError(f"model family {model_type!r} is registered twice")
        shaped = {k: {**v, "model_type": model_type} for k, v in (variants or {}).items()}
        _RECORDS[model_type] = FamilyRecord(model_type, name, kind, read, dict(defaults), config_class,
                                            {**tiny, "model_type": model_type}, frozenset(legacy), aliases, shaped,
                                            transformers_version)
        return read

    return register


def decoder_family(model_type: str, *, name: str, defaults: Mapping[str, Any], config_class: str,
                   tiny: Mapping[str, Any], legacy: tuple[str, ...] = (), aliases: tuple[str, ...] = (),
                   variants: Mapping[str, Mapping[str, Any]] | None = None) -> Callable[[Reader], Reader]:
    """Register the decorated `read(fields) -> DecoderSpec` as the reader of `model_type`."""
    return _family("decoder", model_type, name=name, defaults=defaults, config_class=config_class, tiny=tiny,
                   legacy=legacy, aliases=aliases, variants=variants)


def encoder_family(model_type: str, *, name: str, defaults: Mapping[str, Any], config_class: str,
                   tiny: Mapping[str, Any], legacy: tuple[str, ...] = (),
                   aliases: tuple[str, ...] = (), transformers_version: str | None = None) -> Callable[[Reader], Reader]:
    """Register the decorated `read(fields) -> EncoderSpec` (or `VisionSpec`) as the reader of
    `model_type`; `transformers_version`: the release its defaults were read from, when not
    `TRANSFORMERS_VERSION`."""
    return _family("encoder", model_type, name=name, defaults=defaults, config_class=config_class, tiny=tiny,
                   legacy=legacy, aliases=aliases, transformers_version=transformers_version)


def records() -> dict[str, FamilyRecord]:
    """Every registered family by model_type (the family modules of this package imported)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            importlib.import_module(f"{__name__}.{info.name}")
    return _RECORDS


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
    """Every family's tiny config by model_type, decoders first."""
    found = sorted(records().values(), key=lambda r: (r.kind != "decoder", r.model_type))
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
