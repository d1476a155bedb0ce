"""Random checkpoints in the Hugging Face layout: `config.json` + `model.safetensors` (or
shards with `model.safetensors.index.json`), tensors under the names transformers uses.

Used by `rlx-mil demo`, the tests and the benchmarks, so every path from a checkpoint folder
to a verified package runs without downloading a model.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import InvalidOptionError
from rlx_mil.models.checkpoint import INDEX_FILE, SINGLE_FILE
from rlx_mil.models.families import model_spec, tiny_configs
from rlx_mil.models.hf_config import DecoderSpec, VisionSpec

#: Tiny configs of every family (from the family records), with the family's characteristic fields set.
TINY_CONFIGS: dict[str, dict[str, Any]] = tiny_configs()

#: The mixture-of-experts and hybrid families.
ROUND2_FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "lfm2", "qwen3_5", "qwen3_5_text")




def resized_round2_config(family: str, *, hidden: int, heads: int, kv_heads: int, layers: int, vocab: int,
                          max_positions: int) -> dict[str, Any]:
    """The tiny config of a round-2 family with other sizes (the demo's): layer patterns
    follow transformers' defaults (LFM2 attention on odd layers, Qwen3.5 every fourth)."""
    import copy

    config = copy.deepcopy(TINY_CONFIGS[family])
    text = config["text_config"] if family == "qwen3_5" else config
    text.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
                vocab_size=vocab, max_position_embeddings=max_positions)
    if "head_dim" in text:
        text["head_dim"] = hidden // heads
    if family in ("qwen3_moe", "qwen2_moe"):
        text.update(intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2)
    elif family == "olmoe":
        text["intermediate_size"] = hidden // 2
    elif family == "lfm2":
        text.update(intermediate_size=3 * hidden, layer_types=["full_attention" if i % 2 else "conv" for i in range(layers)])
    elif family == "qwen3_5_text":
        text["intermediate_size"] = 2 * hidden
    else:
        text.update(intermediate_size=2 * hidden,
                    layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)])
    return config

#: Qwen3-0.6B's architecture (random weights): the benchmark's large case.
QWEN3_0_6B: dict[str, Any] = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}

_DTYPES = ("float32", "float16", "bfloat16")


def _numpy_dtype(dtype: str) -> Any:
    if dtype not in _DTYPES:
        raise InvalidOptionError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _random_tensor(name: str, shape: tuple[int, ...], spec: Any, rng: np.random.Generator) -> np.ndarray:
    """Values at realistic scales, so activations stay near unit size through the layers."""
    norm_offset = getattr(spec, "norm_offset", 0.0)
    if "norm" in name.lower() and name.endswith(".weight"):
        # Qwen3.5's gated delta-net norm scales by w, beside (1 + w) norms.
        base = 0.0 if norm_offset and not name.endswith("linear_attn.norm.weight") else 1.0
        return base + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if name.endswith(".bias") or name.endswith("LayerNorm.beta"):
        return 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if "embed" in name:
        width = shape[-1]
        scale = 1.0 / math.sqrt(width) if isinstance(spec, DecoderSpec) and spec.embed_scale else 0.5
        return scale * rng.standard_normal(shape, dtype=np.float32)
    # a convolution kernel [out, in, *k] sums over in * k taps
    fan_in = math.prod(shape[1:]) if len(shape) == 4 else shape[-1]
    return rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(fan_in))


def write_random_checkpoint(
    directory: str | os.PathLike[str],
    config: Mapping[str, Any],
    *,
    dtype: str = "float32",
    shards: int = 1,
    seed: int = 0,
) -> Path:
    """Write `config.json` and random weights for `config` into `directory` (created).

    `shards > 1` splits the tensors over `model-0000i-of-0000n.safetensors` files with a
    `model.safetensors.index.json`, as transformers does for large models. Tensors are made
    and written one shard at a time.
    """
    from safetensors.numpy import save_file

    from rlx_mil.models.pretrained import build

    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise InvalidOptionError(f"shards must be an integer >= 1, got {shards!r}")
    np_dtype = _numpy_dtype(dtype)
    spec = model_spec(config)
    from rlx_mil.models.whisper import WhisperSpec

    if isinstance(spec, WhisperSpec):  # a speech model's several graphs read these
        whisper_tensors: dict[str, tuple[int, ...]] = spec.tensors()
    # an image encoder at its trained size; other models with one token (the tensors do not depend on it)
    if isinstance(spec, WhisperSpec):
        expected = whisper_tensors
    else:
        _, expected, _ = build(spec, pooling="auto") if isinstance(spec, VisionSpec) else build(spec, seq_len=1)
    if isinstance(spec, VisionSpec):  # what the family's checkpoints hold besides the tower (a text tower...)
        expected = {**expected, **dict(spec.unread_tensors)}
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n", encoding="utf-8")
    names = list(expected)
    itemsize = np.dtype(np_dtype).itemsize
    total = sum(math.prod(expected[n]) * itemsize for n in names)
    groups: list[list[str]] = [[] for _ in range(shards)]
    filled = 0
    for name in names:
        groups[min(shards - 1, filled * shards // max(total, 1))].append(name)
        filled += math.prod(expected[name]) * itemsize
    rng = np.random.default_rng(seed)
    weight_map: dict[str, str] = {}
    for index, group in enumerate(groups):
        file = SINGLE_FILE if shards == 1 else f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {n: _random_tensor(n, expected[n], spec, rng).astype(np_dtype) for n in group}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        del tensors
        weight_map.update(dict.fromkeys(group, file))
    if shards > 1:
        index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX_FILE).write_text(json.dumps(index_doc, indent=2) + "\n", encoding="utf-8")
    return out
