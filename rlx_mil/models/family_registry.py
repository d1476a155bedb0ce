"""The records of the model families and the decorators that register them.

A family module (`rlx_mil/models/families/<name>.py`) imports `decoder_family` /
`encoder_family` from here, never from its package: the package (`rlx_mil.models.families`)
finds and imports its modules, so taking names from it would tie each family back to the
package that loads it. This module imports no family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from rlx_mil.models.hf_config import Fields, ModelSpec

#: The transformers release the defaults tables were read from.
TRANSFORMERS_VERSION = "5.23.0"


@dataclass(frozen=True)
class FamilyRecord:
    model_type: str
    #: "Llama", "Gemma 3", ...: how messages and docs name the architecture.
    name: str
    #: "decoder", "encoder" or "speech".
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


def speech_family(model_type: str, *, name: str, defaults: Mapping[str, Any], config_class: str,
                  tiny: Mapping[str, Any], legacy: tuple[str, ...] = ()) -> Callable[[Reader], Reader]:
    """Register the decorated `read(fields)` as the reader of a speech model's `model_type`
    (Whisper): its packages are a folder of several (`rlx_mil.speech`), so it stays out of the
    single-graph tables (`tiny_configs`, the demo)."""
    return _family("speech", model_type, name=name, defaults=defaults, config_class=config_class, tiny=tiny,
                   legacy=legacy)


def registered() -> dict[str, FamilyRecord]:
    """The families registered so far by model_type (`rlx_mil.models.families.records` imports
    every family module first)."""
    return _RECORDS
