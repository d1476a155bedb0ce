"""The converted model's name and where it came from: config.json's `_name_or_path`, the
repository of a Hugging Face cache folder, or (SmolLM2's checkpoints carry no name) the
checkpoint folder — which `inspect` and the model description then say, rather than passing a
folder such as `hf` off as the model's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlx_mil.coreml.metadata import SOURCE, ModelSource, PackageMetadataError
from rlx_mil.coreml.package_info import PackageInfo
from rlx_mil.llm.package_files import describe_checkpoint

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576}


class _Model:
    """What `ModelDescription.apply` writes to: an MLModel's description fields and metadata."""

    def __init__(self) -> None:
        self.user_defined_metadata: dict[str, str] = {}


def _folder(path: Path, config: dict[str, Any]) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def _inspect_lines(metadata: dict[str, str]) -> list[str]:
    info = PackageInfo(path="m.mlpackage", target="iOS18", spec_version=9, inputs=[], outputs=[], op_histogram={},
                       weight_bytes=0, package_bytes=0, metadata=metadata)
    return info.to_text().splitlines()


def test_a_checkpoint_without_a_name_is_described_by_its_architecture_and_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "hf", LLAMA)
    description = describe_checkpoint(folder, "Llama")
    assert description.short_description == "Llama model from the folder hf, converted to Core ML by rlx_mil"
    assert description.author is None
    assert description.source == ModelSource("hf", "folder name", "Llama (LlamaForCausalLM)")
    model = _Model()
    description.apply(model)
    model_line = next(line for line in _inspect_lines(model.user_defined_metadata) if line.startswith("model:"))
    assert model_line == "model:    hf, Llama (LlamaForCausalLM); the checkpoint carries no name: named after its folder"


def test_a_named_checkpoint_says_where_its_name_came_from(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "hf", {**LLAMA, "_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    description = describe_checkpoint(folder, "Llama")
    assert description.short_description == "SmolLM2-135M-Instruct (Llama), converted to Core ML by rlx_mil"
    assert description.author == "HuggingFaceTB"
    model = _Model()
    description.merged({"short_description": "mine"}).apply(model)  # overrides keep the source record
    assert "model:    HuggingFaceTB/SmolLM2-135M-Instruct, Llama (LlamaForCausalLM); name from config.json" \
           " _name_or_path" in _inspect_lines(model.user_defined_metadata)


def test_a_hugging_face_cache_snapshot_is_named_after_its_repository(tmp_path: Path) -> None:
    # `convert-hf owner/name` reads models--owner--name/snapshots/<commit>: the folder's name is a hash.
    folder = _folder(tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / "12fd25f7", LLAMA)
    description = describe_checkpoint(folder, "Llama")
    assert description.short_description == "SmolLM2-135M-Instruct (Llama), converted to Core ML by rlx_mil"
    assert description.author == "HuggingFaceTB"
    assert description.source == ModelSource(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "Hugging Face cache folder", "Llama (LlamaForCausalLM)")


def test_the_graph_is_named_as_the_description_says(tmp_path: Path) -> None:
    from rlx_mil.models.pretrained import checkpoint_name

    snapshot = _folder(tmp_path / "models--acme--tiny-chat" / "snapshots" / "abc", LLAMA)
    assert checkpoint_name(snapshot, LLAMA) == "tiny-chat"
    assert checkpoint_name(tmp_path / "hf", {"_name_or_path": "acme/other/"}) == "other"
    assert checkpoint_name(Path(tmp_path / "hf" / "."), LLAMA) == "hf"


@pytest.mark.parametrize("raw", ["[1]", '{"name": 3}', "{", '{"name": "m", "named_by": "x", "parameters": "9"}'])
def test_a_malformed_source_record_is_named_not_raised(raw: str) -> None:
    with pytest.raises(PackageMetadataError, match=r"rlx_mil\.source"):
        ModelSource.read({SOURCE: raw})
    assert any(line.startswith("model:    the 'rlx_mil.source' metadata is malformed") for line in _inspect_lines({SOURCE: raw}))


def test_a_gguf_file_names_its_model_by_general_name_else_its_file_name() -> None:
    from types import SimpleNamespace

    from rlx_mil.llm.gguf_package import describe_gguf

    named = {"general.name": "SmolLM2 135M Instruct", "general.architecture": "llama"}
    file = SimpleNamespace(path=Path("/x/smol.Q4_1.gguf"), value=named.get)
    assert describe_gguf(file).source == ModelSource("SmolLM2 135M Instruct", "GGUF general.name", "llama")  # type: ignore[arg-type]
    file = SimpleNamespace(path=Path("/x/smol.Q4_1.gguf"), value={}.get)
    assert describe_gguf(file).source == ModelSource("smol.Q4_1", "GGUF file name", "")  # type: ignore[arg-type]


def test_the_size_is_the_checkpoints_parameter_count(tmp_path: Path) -> None:
    """A nameless checkpoint is still told apart by its architecture and size (as model cards
    give it: 134.5M for SmolLM2-135M); the count is the stored tensors' elements."""
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    config = {k: v for k, v in TINY_CONFIGS["llama"].items() if k != "_name_or_path"}
    folder = write_random_checkpoint(tmp_path / "hf", config, seed=1)
    from rlx_mil.models.checkpoint import Checkpoint

    stored = Checkpoint(folder)
    count = sum(int(np.prod(stored.shape_of(name))) for name in stored)
    description = describe_checkpoint(folder, "Llama")
    assert description.source is not None and description.source.parameters == count > 0
    model = _Model()
    description.apply(model)
    line = next(line for line in _inspect_lines(model.user_defined_metadata) if line.startswith("model:"))
    assert line == (f"model:    hf, Llama (LlamaForCausalLM), {count / 1e3:.1f}K parameters; the checkpoint carries no"
                    " name: named after its folder")
    assert ModelSource("m", "folder name", "", 134_515_008).to_text().startswith("m, 134.5M parameters;")
    assert ModelSource("m", "folder name", "", 1_235_814_400).to_text().startswith("m, 1.2B parameters;")
