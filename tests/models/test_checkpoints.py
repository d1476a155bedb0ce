"""Checkpoint folders: sharded and BF16 checkpoints, and every way loading one can fail."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import rlx_mil
from models.hf_numpy import qwen3_forward
from rlx_mil import milexec, reference
from rlx_mil.errors import (
    CheckpointError,
    InvalidOptionError,
    RlxMilError,
    SpecialFileError,
    UnknownTensorError,
    UnsupportedConfigError,
    WeightsFormatError,
)
from rlx_mil.models import from_pretrained
from rlx_mil.models.checkpoint import INDEX_FILE, SINGLE_FILE, Checkpoint
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

CFG = TINY_CONFIGS["qwen3"]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("single") / "qwen3", CFG, seed=1)


def copy_of(folder: Path, tmp_path: Path) -> Path:
    dest = tmp_path / folder.name
    shutil.copytree(folder, dest)
    return dest


def ids(length: int = 6) -> np.ndarray:
    return np.random.default_rng(0).integers(0, CFG["vocab_size"], (1, length)).astype(np.int32)


def test_sharded_checkpoint_equals_single_file(single: Path, tmp_path: Path) -> None:
    sharded = write_random_checkpoint(tmp_path / "sharded", CFG, seed=1, shards=3)
    files = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((sharded / INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == set(files)
    g1, p1 = from_pretrained(single, seq_len=6)
    g2, p2 = from_pretrained(sharded, seq_len=6)
    assert set(p1) == set(p2)
    for name in p1:
        np.testing.assert_array_equal(p1[name], p2[name])
    np.testing.assert_array_equal(reference.evaluate(g1, {"input_ids": ids()}, p1)["logits"],
                                  reference.evaluate(g2, {"input_ids": ids()}, p2)["logits"])


def test_bf16_checkpoint_stays_bf16_and_converts(tmp_path: Path) -> None:
    folder = write_random_checkpoint(tmp_path / "bf16", CFG, seed=2, dtype="bfloat16", shards=2)
    graph, params = from_pretrained(folder, seq_len=6)
    weight = params["model.layers.0.self_attn.q_proj.weight"]
    assert weight.dtype == ml_dtypes.bfloat16  # never widened
    assert weight.shape == (CFG["num_attention_heads"] * CFG["head_dim"], CFG["hidden_size"])  # [out, in] as stored
    want, _ = qwen3_forward(Checkpoint(folder), CFG, ids())
    got = reference.evaluate(graph, {"input_ids": ids()}, params)["logits"]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    model = rlx_mil.convert(graph, params, precision="fp32")
    out = milexec.run(model, {"input_ids": ids()})["logits"]
    np.testing.assert_allclose(out, got, rtol=1e-4, atol=1e-4 * np.abs(got).max())


def test_f16_checkpoint(tmp_path: Path) -> None:
    folder = write_random_checkpoint(tmp_path / "f16", CFG, seed=3, dtype="float16")
    graph, params = from_pretrained(folder, seq_len=6)
    assert params["model.embed_tokens.weight"].dtype == np.float16
    want, _ = qwen3_forward(Checkpoint(folder), CFG, ids())
    got = reference.evaluate(graph, {"input_ids": ids()}, params)["logits"]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


def test_params_are_read_lazily(single: Path) -> None:
    _, params = from_pretrained(single, seq_len=4)
    assert not isinstance(params, dict)
    assert "rope.cos" in params and "model.norm.weight" in params and "lm_head.weight" not in params  # tied


def rewrite(folder: Path, edit: dict[str, np.ndarray | None]) -> None:
    """Replace (array) or drop (None) tensors of a single-file checkpoint."""
    tensors = load_file(str(folder / SINGLE_FILE))
    for name, value in edit.items():
        if value is None:
            tensors.pop(name)
        else:
            tensors[name] = value
    save_file(tensors, str(folder / SINGLE_FILE))


def test_missing_unexpected_and_misshaped_tensors_in_one_error(single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    rewrite(folder, {
        "model.layers.1.mlp.up_proj.weight": None,
        "model.layers.0.self_attn.k_norm.weight": np.ones(7, np.float32),
        "model.layers.0.self_attn.q_proj.weight": np.zeros((CFG["hidden_size"], 64), np.float32),
        "model.layers.9.mlp.extra.weight": np.zeros(3, np.float32),
    })
    with pytest.raises(CheckpointError) as info:
        from_pretrained(folder, seq_len=4)
    text = str(info.value)
    assert len(info.value.problems) == 4
    assert "missing tensor 'model.layers.1.mlp.up_proj.weight' (shape [64, 32])" in text
    assert "unexpected tensor 'model.layers.9.mlp.extra.weight'" in text
    assert "tensor 'model.layers.0.self_attn.k_norm.weight' in model.safetensors: shape [7], expected [16]" in text
    assert "'model.layers.0.self_attn.q_proj.weight' in model.safetensors: shape [32, 64], expected [64, 32]" in text
    assert "Qwen3" in text


def test_non_float_tensor_is_refused(single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    rewrite(folder, {"model.norm.weight": np.ones(CFG["hidden_size"], np.int32)})
    with pytest.raises(CheckpointError, match=r"'model.norm.weight'.*dtype I32"):
        from_pretrained(folder, seq_len=4)


def test_tolerated_extras_are_not_errors(single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    rewrite(folder, {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32),
                     "lm_head.weight": np.zeros((CFG["vocab_size"], CFG["hidden_size"]), np.float32)})
    _, params = from_pretrained(folder, seq_len=4)
    assert "lm_head.weight" not in params  # tied: the embedding is the head


def test_no_weights_file(single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    (folder / SINGLE_FILE).rename(folder / "weights-1.safetensors")
    with pytest.raises(CheckpointError, match=r"neither model.safetensors nor model.safetensors.index.json \(found weights-1"):
        from_pretrained(folder)


def test_not_a_folder_and_no_config(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="absent: no such checkpoint folder"):
        from_pretrained(tmp_path / "absent")
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        from_pretrained(tmp_path / "file")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        from_pretrained(tmp_path)


def test_corrupt_config_and_weights(single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: not readable JSON"):
        from_pretrained(folder)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match=r"config\.json: not readable JSON \(nests 100000 levels"):
        from_pretrained(folder)
    folder = copy_of(single, tmp_path / "b")
    (folder / SINGLE_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(WeightsFormatError, match=r"model\.safetensors: header length 16 exceeds the file"):
        from_pretrained(folder)


def test_truncated_weights_are_refused_before_reading(single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    data = (folder / SINGLE_FILE).read_bytes()
    (folder / SINGLE_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsFormatError, match=r"model\.safetensors: tensor '[^']+': data_offsets .* run past the end"):
        Checkpoint(folder)


def _header_of(path: Path) -> tuple[dict[str, dict[str, object]], bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def _write_with_header(path: Path, header: dict[str, dict[str, object]], data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_a_truncated_shard_names_the_shard(tmp_path: Path) -> None:
    folder = write_random_checkpoint(tmp_path / "sharded", CFG, seed=1, shards=3)
    shard = folder / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(WeightsFormatError, match=r"model-00002-of-00003\.safetensors: tensor '[^']+'"):
        from_pretrained(folder, seq_len=4)


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        ("shape", r"tensor 'model.norm.weight': data_offsets \[\d+, \d+\] hold \d+ bytes, but F32 \[64\] needs 256"),
        ("dtype", r"tensor 'model.norm.weight': data_offsets \[\d+, \d+\] hold 128 bytes, but F16 \[32\] needs 64"),
        ("overlap", r"overlaps tensor"),
        ("unknown dtype", r"tensor 'model.norm.weight': unsupported dtype 'F8_E5M2'"),
        ("string shape", r"tensor 'model.norm.weight': shape must be a list"),
    ],
)
def test_headers_that_lie_are_typed_errors_naming_file_and_tensor(single: Path, tmp_path: Path, lie: str, message: str) -> None:
    folder = copy_of(single, tmp_path)
    header, data = _header_of(folder / SINGLE_FILE)
    entry = header["model.norm.weight"]
    if lie == "shape":
        entry["shape"] = [64]
    elif lie == "dtype":
        entry["dtype"] = "F16"
    elif lie == "overlap":
        begin, end = entry["data_offsets"]  # type: ignore[misc]
        entry["data_offsets"] = [begin - 4, end - 4]  # type: ignore[operator]
    elif lie == "unknown dtype":
        entry["dtype"] = "F8_E5M2"
    else:
        entry["shape"] = "32"
    _write_with_header(folder / SINGLE_FILE, header, data)
    with pytest.raises(WeightsFormatError, match=message) as info:
        from_pretrained(folder, seq_len=4)
    assert str(folder / SINGLE_FILE) in str(info.value)


def test_special_files_in_a_checkpoint_are_refused_without_hanging(single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    (folder / SINGLE_FILE).unlink()
    os.mkfifo(folder / SINGLE_FILE)
    with pytest.raises(SpecialFileError, match=r"model\.safetensors: a FIFO"):
        from_pretrained(folder)
    (folder / SINGLE_FILE).unlink()
    (folder / SINGLE_FILE).symlink_to("/dev/zero")
    with pytest.raises(SpecialFileError, match="a character device"):
        from_pretrained(folder)
    folder = copy_of(single, tmp_path / "b")
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with pytest.raises(SpecialFileError, match=r"config\.json: a FIFO"):
        from_pretrained(folder)


def test_a_huge_or_hostile_index_is_refused(tmp_path: Path) -> None:
    folder = write_random_checkpoint(tmp_path / "sharded", CFG, seed=1, shards=2)
    (folder / INDEX_FILE).write_text("{" * 50_000)
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: not readable JSON \(nests"):
        from_pretrained(folder)
    (folder / INDEX_FILE).unlink()
    (folder / INDEX_FILE).symlink_to("/dev/zero")
    with pytest.raises(SpecialFileError, match=r"index\.json: a character device"):
        from_pretrained(folder)
    (folder / INDEX_FILE).unlink()
    (folder / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.norm.weight": "../model.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"shard '\.\./model\.safetensors': listed in .* but not a file in the folder"):
        from_pretrained(folder)


def test_stored_dtype_differs_from_the_config_dtype(single: Path, tmp_path: Path) -> None:
    """config.json's torch_dtype is the dtype transformers loads into; what rlx_mil reads is
    each tensor's stored dtype (checked: a float one), cast one tensor at a time. So an F32
    checkpoint whose config says bfloat16 converts to the F32 tensors' values, and a
    non-float tensor is refused whatever the config says."""
    folder = copy_of(single, tmp_path)
    (folder / "config.json").write_text(json.dumps({**CFG, "torch_dtype": "bfloat16"}))
    graph, params = from_pretrained(folder, seq_len=6)
    assert params["model.norm.weight"].dtype == np.float32
    want, _ = qwen3_forward(Checkpoint(folder), CFG, ids())
    got = reference.evaluate(graph, {"input_ids": ids()}, params)["logits"]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())
    rewrite(folder, {"model.layers.0.mlp.down_proj.weight": np.zeros((CFG["hidden_size"], CFG["intermediate_size"]), np.int8)})
    with pytest.raises(CheckpointError, match=r"'model.layers.0.mlp.down_proj.weight' in model.safetensors: dtype I8, expected one of F32, F16, BF16"):
        from_pretrained(folder, seq_len=4)


def test_metadata_comes_from_headers(single: Path) -> None:
    checkpoint = Checkpoint(single)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert checkpoint.shape_of(name) == (CFG["num_attention_heads"] * CFG["head_dim"], CFG["hidden_size"])
    assert checkpoint.dtype_of(name) == np.float32 and checkpoint.header(name).format_dtype == "F32"
    assert checkpoint.file_of(name) == single / SINGLE_FILE
    with pytest.raises(UnknownTensorError, match="no tensor named 'nope'"):
        checkpoint.header("nope")
    _, params = from_pretrained(single, seq_len=4)
    assert params.shape_of(name) == checkpoint.shape_of(name)  # type: ignore[attr-defined]
    assert params.dtype_of("rope.cos") == np.float32  # type: ignore[attr-defined]
    checkpoint.close()
    with pytest.raises(WeightsFormatError, match="closed"):
        checkpoint[name]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"model_type": "gpt2"}, "model_type"),
        ({"rope_scaling": {"rope_type": "mrope", "factor": 4.0}}, "rope_scaling.rope_type"),
        ({"use_qk_clip": True}, "use_qk_clip"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),  # incomplete llama3 block
        ({"hidden_act": "relu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"partial_rotary_factor": 0.1}, "partial_rotary_factor"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
    ],
)
def test_unimplemented_config_values_are_typed_errors(edit: dict[str, object], field: str, single: Path, tmp_path: Path) -> None:
    folder = copy_of(single, tmp_path)
    config = {**CFG, **edit}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedConfigError) as info:
        from_pretrained(folder)
    assert info.value.field == field
    assert field in str(info.value)


def test_keys_a_rope_type_does_not_use_warn_and_load(single: Path, tmp_path: Path) -> None:
    """`mrope_section` under a yarn block is not a yarn key: transformers logs it as unused and
    loads the model, so the checkpoint loads with a warning naming the key (it was refused)."""
    from rlx_mil.errors import IgnoredConfigKeyWarning

    folder = copy_of(single, tmp_path)
    edit = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "mrope_section": [2, 2]}}
    (folder / "config.json").write_text(json.dumps({**CFG, **edit}))
    with pytest.warns(IgnoredConfigKeyWarning, match=r"\['mrope_section'\]"):
        from_pretrained(folder, seq_len=4)


def test_bad_build_options(single: Path) -> None:
    for kwargs in ({"variant": "generate"}, {"variant": "decode"}, {"seq_len": 0}, {"variant": "decode", "cache_len": 0},
                   {"cache_len": 4}, {"seq_len": 10_000}, {"batch_size": True}, {"pooling": "mean"}):
        with pytest.raises(InvalidOptionError):
            from_pretrained(single, **kwargs)  # type: ignore[arg-type]


def test_errors_are_rlx_mil_errors() -> None:
    assert issubclass(CheckpointError, RlxMilError) and issubclass(UnsupportedConfigError, RlxMilError)


def test_bf16_reads_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """BF16 needs ml_dtypes registered with NumPy; the reader does that itself."""
    import subprocess
    import sys

    folder = write_random_checkpoint(tmp_path / "bf16", CFG, seed=2, dtype="bfloat16")
    code = ("import sys; from rlx_mil.models import from_pretrained; g, p = from_pretrained(sys.argv[1], seq_len=4);"
            " print(p['model.norm.weight'].dtype)")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "bfloat16"
