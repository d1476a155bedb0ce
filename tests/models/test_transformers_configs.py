"""The config reader against transformers' own config classes (no model, no weights, no
network): every family's tiny config, rebuilt by its config class and written by `to_dict()`,
reads to the same architecture; and a config naming only its `model_type` reads to the
architecture of the config class's defaults, so every defaults table holds transformers' values
(the release the tables name: docs/models.md)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.families import model_spec, records
from rlx_mil.models.random_checkpoint import TINY_CONFIGS

#: transformers is in the benchmark extra only (never a runtime or test dependency).
transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[bench]')")

#: Importing transformers takes seconds (it loads PyTorch when installed): one worker pays it.
pytestmark = pytest.mark.xdist_group("transformers-configs")

#: Composite configs: their sub-config left empty takes the sub-config class's defaults.
SUB_CONFIG = {"gemma3": "text_config", "qwen3_5": "text_config", "siglip": "vision_config",
              "siglip2": "vision_config"}


def as_transformers_writes(config: dict[str, Any]) -> dict[str, Any]:
    """`config` through its transformers config class and back, as `save_pretrained` writes it."""
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written: dict[str, Any] = transformers.AutoConfig.for_model(config["model_type"], **kwargs).to_dict()
    return written


def without_unread_tensors(spec: Any) -> Any:
    """An image encoder's spec without the text tower's tensor list (an empty text_config has none)."""
    import dataclasses

    return dataclasses.replace(spec, unread_tensors=()) if hasattr(spec, "unread_tensors") else spec


@pytest.mark.parametrize("name", list(TINY_CONFIGS))
def test_tiny_configs_read_as_their_config_class_writes_them(name: str) -> None:
    tiny = TINY_CONFIGS[name]
    assert model_spec(as_transformers_writes(tiny)) == model_spec(tiny)


@pytest.mark.parametrize("model_type", sorted(records()))
def test_a_bare_config_reads_as_the_config_class_defaults(model_type: str) -> None:
    record = records()[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defaults: dict[str, Any] = getattr(transformers, record.config_class)().to_dict()
    bare: dict[str, Any] = {"model_type": model_type}
    if model_type in SUB_CONFIG:
        bare[SUB_CONFIG[model_type]] = {}
    if model_type == "granitemoehybrid":  # GraniteMoeHybridConfig's default layers are Mamba: refused
        for config in (bare, defaults):
            with pytest.raises(UnsupportedConfigError) as info:
                model_spec(config)
            assert info.value.field == "layer_types"
        return
    assert without_unread_tensors(model_spec(bare)) == without_unread_tensors(model_spec(defaults))
