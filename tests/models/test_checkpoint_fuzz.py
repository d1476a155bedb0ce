"""Hostile or careless checkpoint folders and config.json files: a typed error naming the file,
field or tensor, or a model that is exactly the checkpoint's; sizes from the config are checked
before anything is built from them (nothing large is allocated before a refusal)."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from rlx_mil.errors import CheckpointError, InvalidOptionError, RlxMilError
from rlx_mil.models import from_pretrained
from rlx_mil.models.budget import MAX_BUILD_BYTES, build_cost
from rlx_mil.models.checkpoint import INDEX_FILE, SINGLE_FILE, Checkpoint
from rlx_mil.models.families import model_spec
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

CFG = TINY_CONFIGS["llama"]
#: What a refusal may allocate (the issue's bound is "a few hundred MB"; tiny models need ~1).
REFUSAL_BYTES = 64 * 2**20


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("llama") / "llama", CFG, seed=3)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory, llama: Path) -> Path:
    dest = tmp_path_factory.mktemp("scratch") / "llama"
    shutil.copytree(llama, dest)
    return dest


def _traced(call: Any) -> tuple[Any, BaseException | None, int]:
    tracemalloc.start()
    try:
        return call(), None, tracemalloc.get_traced_memory()[1]
    except RlxMilError as err:
        return None, err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(("edit", "kwargs", "message"), [
    ({"hidden_size": 3 * 10**9}, {}, r"'model\.embed_tokens\.weight' the shape \[96, 3000000000\]"),
    ({"num_hidden_layers": 10**5}, {}, r"num_hidden_layers is 100,000, but the checkpoint's tensors hold 2 layers"),
    ({"head_dim": 2 * 10**7}, {}, r"head_dim 20,000,000, hidden_size 32 give .model\.layers\.0\.self_attn\.q_proj"),
    ({"max_position_embeddings": 2 * 10**9}, {"variant": "decode", "cache_len": 1, "max_positions": 2 * 10**9},
     r"would allocate about 312\.9 GiB .*RoPE tables of 2,000,000,000 positions"),
])
def test_huge_sizes_are_refused_before_anything_is_built(scratch: Path, edit: dict[str, int], kwargs: dict[str, Any],
                                                          message: str) -> None:
    (scratch / "config.json").write_text(json.dumps({**CFG, **edit}))
    _, err, peak = _traced(lambda: from_pretrained(scratch, **kwargs))
    assert isinstance(err, (CheckpointError, InvalidOptionError)), err
    assert peak < REFUSAL_BYTES, f"{peak} bytes allocated before refusing {edit}"
    import re

    assert re.search(message, str(err)), str(err)
    assert str(scratch / "config.json") in str(err)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 10**9}, r"batch_size 1,000,000,000 x 128 positions x vocab_size \(logits\) 96"),
    ({"seq_len": 200, "batch_size": 10**8, "last_logits": True}, r"x 200 positions x intermediate_size 64"),
])
def test_activations_beyond_core_ml_are_refused_before_building(scratch: Path, kwargs: dict[str, Any],
                                                                  message: str) -> None:
    (scratch / "config.json").write_text(json.dumps(CFG))
    _, err, peak = _traced(lambda: from_pretrained(scratch, **kwargs))
    assert isinstance(err, InvalidOptionError) and peak < REFUSAL_BYTES, (err, peak)
    import re

    assert re.search(message, str(err)), str(err)


def test_the_estimate_covers_a_real_long_context_model() -> None:
    spec = model_spec({**CFG, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                       "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
                       "max_position_embeddings": 131072})
    assert build_cost(spec, table_rows=131072).total < MAX_BUILD_BYTES


def test_from_pretrained_of_not_a_path_is_typed() -> None:
    for bad in (None, 5, ["a"]):
        with pytest.raises(InvalidOptionError, match="a checkpoint folder is a path"):
            from_pretrained(bad)  # type: ignore[arg-type]


def _shards(folder: Path, groups: list[dict[str, np.ndarray]], index: dict[str, str] | None = None) -> None:
    for p in folder.glob("*.safetensors"):
        p.unlink()
    weight_map: dict[str, str] = {}
    for i, tensors in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(tensors, str(folder / file))
        for name in tensors:
            weight_map.setdefault(name, file)
    (folder / INDEX_FILE).write_text(json.dumps({"weight_map": index if index is not None else weight_map}))


def test_a_tensor_in_two_shards_with_different_values_is_refused(llama: Path, tmp_path: Path) -> None:
    tensors = load_file(str(llama / SINGLE_FILE))
    folder = tmp_path / "dup"
    folder.mkdir()
    shutil.copy(llama / "config.json", folder)
    names = sorted(tensors)
    first = {n: tensors[n] for n in names[: len(names) // 2]}
    second = {n: tensors[n] for n in names[len(names) // 2:]}
    second["model.norm.weight"] = tensors["model.norm.weight"] + 1  # also in the first shard? make sure
    first["model.norm.weight"] = tensors["model.norm.weight"]
    _shards(folder, [first, second])
    with pytest.raises(CheckpointError, match=r"tensor 'model\.norm\.weight': in model-0000\d-of-00002\.safetensors"
                                              r" \(where .* places it\) and in model-0000\d-of-00002\.safetensors,"
                                              r" with different values"):
        from_pretrained(folder)
    second["model.norm.weight"] = tensors["model.norm.weight"].copy()  # the same bytes twice: one tensor
    _shards(folder, [first, second])
    _, params = from_pretrained(folder)
    np.testing.assert_array_equal(params["model.norm.weight"], tensors["model.norm.weight"])


@pytest.mark.parametrize("kind", ["fifo", "dangling link", "folder", "link to a folder"])
def test_a_broken_modules_json_is_refused_not_treated_as_absent(tmp_path: Path, kind: str) -> None:
    folder = write_random_checkpoint(tmp_path / "bert", TINY_CONFIGS["bert"], seed=2)
    target = folder / "modules.json"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dangling link":
        target.symlink_to(folder / "gone.json")
    elif kind == "folder":
        target.mkdir()
    else:
        (folder / "elsewhere").mkdir()
        target.symlink_to(folder / "elsewhere")
    with pytest.raises(RlxMilError, match=r"modules\.json"):
        from_pretrained(folder, seq_len=4)


def test_a_pooling_path_leaving_the_folder_is_refused(tmp_path: Path) -> None:
    folder = write_random_checkpoint(tmp_path / "bert", TINY_CONFIGS["bert"], seed=2)
    (folder / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Pooling", "path": "../x"}]))
    with pytest.raises(CheckpointError, match="leaves the checkpoint folder"):
        from_pretrained(folder, seq_len=4)


# ---------------------------------------------------------------- config.json fuzz
_FIELDS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
           "intermediate_size", "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps",
           "tie_word_embeddings", "rope_scaling", "model_type", "partial_rotary_factor", "sliding_window",
           "layer_types", "attention_bias", "hidden_act"]
_VALUES = st.one_of(
    st.integers(-3, 3), st.sampled_from([16, 32, 64, 96, 2**31, 3 * 10**9, 10**5, 2 * 10**7, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(), st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.sampled_from(["rope_type", "factor", "type"]),
                                                              st.one_of(st.text(max_size=6), st.floats(-2, 10)), max_size=2),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(edit=st.dictionaries(st.sampled_from(_FIELDS), _VALUES, min_size=1, max_size=3),
       max_positions=st.sampled_from([None, 64, 2**31]))
def test_config_fuzz_typed_error_or_the_checkpoint(scratch: Path, llama: Path, edit: dict[str, Any],
                                                   max_positions: int | None) -> None:
    config = {**CFG, **edit}
    (scratch / "config.json").write_text(json.dumps(config))
    kwargs: dict[str, Any] = {"seq_len": 4}
    if max_positions is not None:
        kwargs = {"variant": "decode", "seq_len": 1, "cache_len": 1, "max_positions": max_positions}
    result, err, peak = _traced(lambda: from_pretrained(scratch, **kwargs))
    assert peak < REFUSAL_BYTES, f"{peak} bytes allocated for {edit}"
    if err is not None:
        assert str(scratch) in str(err) or "max_positions" in str(err) or "positions" in str(err), str(err)
        return
    _graph, params = result
    reference = Checkpoint(llama)
    for name in reference:
        if name in params:
            np.testing.assert_array_equal(params[name], reference[name])


# ---------------------------------------------------------------- shard fuzz
_OPS = st.sampled_from(["duplicate same", "duplicate different", "drop from shard", "index wrong shard",
                        "index missing shard", "index extra name", "unlisted tensor", "reshape"])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(_OPS, st.integers(0, 10**6)), min_size=1, max_size=3))
def test_shard_fuzz_typed_error_or_the_checkpoint(llama: Path, tmp_path_factory: pytest.TempPathFactory,
                                                  ops: list[tuple[str, int]]) -> None:
    tensors = load_file(str(llama / SINGLE_FILE))
    names = sorted(tensors)
    folder = tmp_path_factory.mktemp("shards")
    shutil.copy(llama / "config.json", folder)
    groups: list[dict[str, np.ndarray]] = [{}, {}, {}]
    for i, n in enumerate(names):
        groups[i % 3][n] = tensors[n]
    index = {n: f"model-{i % 3 + 1:05d}-of-00003.safetensors" for i, n in enumerate(names)}
    changed_values = False
    for op, k in ops:
        name = names[k % len(names)]
        home = names.index(name) % 3
        other = (home + 1 + k % 2) % 3
        if op == "duplicate same":
            groups[other][name] = tensors[name].copy()
        elif op == "duplicate different":
            groups[other][name] = tensors[name] + 1
        elif op == "drop from shard":
            groups[home].pop(name, None)
        elif op == "index wrong shard":
            index[name] = f"model-{other + 1:05d}-of-00003.safetensors"
        elif op == "index missing shard":
            index[name] = "model-00009-of-00009.safetensors"
        elif op == "index extra name":
            index[f"extra.{k}"] = index[name]
        elif op == "unlisted tensor":
            groups[other][f"unlisted.{k}"] = np.zeros(2, np.float32)
        else:
            groups[home][name] = tensors[name].reshape(-1)[:1].copy()
            changed_values = True
    _shards(folder, groups, index)
    try:
        _, params = from_pretrained(folder, seq_len=4)
    except RlxMilError as err:
        assert str(folder) in str(err), str(err)
        return
    assert not changed_values
    for name in names:
        np.testing.assert_array_equal(params[name], tensors[name])
