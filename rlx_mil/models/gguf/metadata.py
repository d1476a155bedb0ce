"""GGUF metadata (`general.architecture`, `<arch>.block_count`, `<arch>.attention.*`,
`<arch>.rope.*`, ...) -> the `DecoderSpec` the Hugging Face path builds for the same model.

llama.cpp's conventions are undone here or by the tensor mapping: Gemma's norm weights are
stored as applied (`1 + w`, so the spec's norm offset is 0), Llama 3.1's rope scaling is the
`rope_freqs` tensor of per-frequency divisors, Gemma 2's and Gemma 3's score scale is implied
by the model size (llama.cpp: `n_embd / n_head` for the 46-layer Gemma 2 27B and the 62-layer
Gemma 3 27B, head_dim otherwise), and so are Gemma 3's layer kinds (see `_gemma3`). A value that
changes the math in a way the builders do not implement is refused with an
`UnsupportedConfigError` naming the key and value.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.gguf.reader import GGUFFile
from rlx_mil.models.hf_config import GEMMA_STREAM_SCALE, DecoderSpec, RopeSpec

#: GGUF `general.architecture` values read, and the rlx_mil family each becomes.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3_text",
                 "phi3": "phi3"}
#: Architectures whose Q/K rows llama.cpp's converter permutes for its interleaved RoPE mode.
PERMUTED_QK = frozenset({"llama"})


class _Keys:
    """Typed access to `<arch>.*` metadata; every refusal names the key and value."""

    def __init__(self, file: GGUFFile, arch: str) -> None:
        self.file = file
        self.arch = arch

    def refuse(self, key: str, value: object, why: str) -> UnsupportedConfigError:
        return UnsupportedConfigError(f"{self.file.path}: {key} = {json.dumps(value, default=str)} is not supported for {self.arch}: {why}",
                                      field=key, value=value)

    def get(self, key: str) -> Any:
        return self.file.value(f"{self.arch}.{key}")

    def int_(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.get(key)
        if value is None:
            if default is None:
                raise UnsupportedConfigError(f"{self.file.path}: required metadata {self.arch}.{key} is missing", field=f"{self.arch}.{key}")
            return default
        if isinstance(value, list):
            raise self.refuse(f"{self.arch}.{key}", value, "per-layer values are not implemented")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.refuse(f"{self.arch}.{key}", value, f"expected an integer >= {minimum}")
        return value

    def float_(self, key: str, default: float | None = None) -> float:
        value = self.get(key)
        if value is None:
            if default is None:
                raise UnsupportedConfigError(f"{self.file.path}: required metadata {self.arch}.{key} is missing", field=f"{self.arch}.{key}")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.refuse(f"{self.arch}.{key}", value, "expected a positive finite number")
        return float(value)

    def opt_float(self, key: str) -> float | None:
        value = self.get(key)
        return None if value is None or value == 0 else self.float_(key)


def architecture(file: GGUFFile) -> str:
    arch = file.value("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedConfigError(
            f"{file.path}: general.architecture = {json.dumps(arch)} is not supported; rlx_mil reads GGUF files of"
            f" {', '.join(sorted(ARCHITECTURES))}", field="general.architecture", value=arch,
        )
    return str(arch)


def _rope(k: _Keys, head_dim: int) -> RopeSpec:
    theta = k.float_("rope.freq_base", 10000.0)
    rotary_dim = k.int_("rope.dimension_count", head_dim)
    if rotary_dim > head_dim or rotary_dim % 2:
        raise k.refuse(f"{k.arch}.rope.dimension_count", rotary_dim, f"needs an even rotary width <= head_dim {head_dim}")
    kind = k.get("rope.scaling.type")
    factors = _freq_factors(k, rotary_dim)
    if kind in (None, "none"):
        return RopeSpec(theta, rotary_dim, freq_factors=factors)
    if kind == "linear":
        return RopeSpec(theta, rotary_dim, "linear", factor=k.float_("rope.scaling.factor"), freq_factors=factors)
    raise k.refuse(f"{k.arch}.rope.scaling.type", kind, "implemented rope scaling types are 'none' and 'linear' (and Llama 3.1's rope_freqs tensor)")


def _freq_factors(k: _Keys, rotary_dim: int) -> tuple[float, ...] | None:
    t = k.file.tensors.get("rope_freqs.weight")
    if t is None:
        return None
    if t.type_name != "F32" or t.shape != (rotary_dim // 2,):
        raise k.refuse("rope_freqs.weight", f"{t.type_name} {list(t.shape)}", f"expected F32 [{rotary_dim // 2}] frequency divisors")
    values = np.asarray(t.raw, np.float64)
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise k.refuse("rope_freqs.weight", "non-positive or non-finite values", "frequency divisors must be positive")
    return tuple(float(v) for v in values)


def _has(file: GGUFFile, suffix: str) -> bool:
    return f"blk.0.{suffix}" in file.tensors


def decoder_spec(file: GGUFFile) -> DecoderSpec:
    """The architecture a GGUF file's metadata describes."""
    arch = architecture(file)
    k = _Keys(file, arch)
    hidden = k.int_("embedding_length")
    layers = k.int_("block_count")
    heads = k.int_("attention.head_count")
    kv_heads = k.int_("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise k.refuse(f"{arch}.attention.head_count_kv", kv_heads, f"must divide head_count {heads}")
    if k.get("attention.key_length") is None and hidden % heads:
        raise k.refuse(f"{arch}.attention.head_count", heads, f"must divide embedding_length {hidden}")
    head_dim = k.int_("attention.key_length", hidden // heads)
    value_dim = k.int_("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise k.refuse(f"{arch}.attention.value_length", value_dim, f"must equal key_length {head_dim}")
    embed = file.tensors.get("token_embd.weight")
    if embed is None:
        raise UnsupportedConfigError(f"{file.path}: no token_embd.weight tensor", field="token_embd.weight")
    vocab = embed.shape[0]
    declared_vocab = k.get("vocab_size")
    if declared_vocab is not None and declared_vocab != vocab:
        raise k.refuse(f"{arch}.vocab_size", declared_vocab, f"token_embd.weight has {vocab} rows")
    window = k.int_("attention.sliding_window", 0, minimum=0) or None
    common: dict[str, Any] = {
        "family": ARCHITECTURES[arch], "vocab_size": vocab, "hidden_size": hidden, "num_layers": layers,
        "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
        "intermediate_size": k.int_("feed_forward_length"),
        "rms_norm_eps": k.float_("attention.layer_norm_rms_epsilon", 1e-6),
        "rope": _rope(k, head_dim), "max_position_embeddings": k.int_("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in file.tensors,
    }
    if arch == "gemma2":
        scalar = hidden / heads if layers == 46 else head_dim  # llama.cpp: 27B scales by n_embd / n_head
        return DecoderSpec(
            **common, activation="gelu_tanh", qkv_bias=_has(file, "attn_q.bias"), o_bias=_has(file, "attn_output.bias"),
            norm_offset=0.0, embed_scale=math.sqrt(hidden), sandwich_norms=True, stream_scale=GEMMA_STREAM_SCALE, score_scale=scalar**-0.5,
            attn_softcap=k.opt_float("attn_logit_softcapping"), final_softcap=k.opt_float("final_logit_softcapping"),
            layer_windows=tuple(window if i % 2 == 0 else None for i in range(layers)),
        )
    if arch == "gemma3":
        return _gemma3(k, common, window)
    if arch == "phi3":
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            if name in file.tensors:
                raise k.refuse(name, "present", "Phi-3's long-context (su/longrope) scaling is not implemented")
        if not _has(file, "attn_qkv.weight"):
            raise k.refuse("blk.0.attn_qkv.weight", "missing", "Phi-3 GGUF files hold one fused attn_qkv weight per layer")
        return DecoderSpec(**common, fused_qkv=True, fused_gate_up=True, layer_windows=(window,) * layers)
    qkv_bias = _has(file, "attn_q.bias")
    if arch == "qwen2" and not qkv_bias:
        raise k.refuse("blk.0.attn_q.bias", "missing", "Qwen2 has biases on q, k and v")
    return DecoderSpec(
        **common, qkv_bias=qkv_bias, o_bias=_has(file, "attn_output.bias"), mlp_bias=_has(file, "ffn_down.bias"),
        qk_norm=arch == "qwen3", layer_windows=(window,) * layers,
    )


#: llama.cpp's Gemma 3: every sixth layer attends globally, the others slide (`set_swa_pattern(6)`),
#: and the sliding layers' RoPE base is 10000, unscaled (`rope_freq_base_train_swa`).
GEMMA3_PATTERN, GEMMA3_LOCAL_THETA = 6, 10000.0


def _gemma3_sliding(k: _Keys, layers: int) -> tuple[bool, ...]:
    """Which layers slide: `attention.sliding_window_pattern` as llama.cpp reads the key (an
    integer n: layer i slides unless i % n == n - 1, so 1 is all global; or one bool per
    layer, true for sliding), else llama.cpp's Gemma 3 default of n = 6."""
    key = f"{k.arch}.attention.sliding_window_pattern"
    value = k.get("attention.sliding_window_pattern")
    if value is None:
        value = GEMMA3_PATTERN
    if isinstance(value, list):
        if len(value) != layers or not all(isinstance(v, bool) for v in value):
            raise k.refuse(key, value, f"expected one bool per layer ({layers})")
        return tuple(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise k.refuse(key, value, "expected an integer >= 1 or one bool per layer")
    return tuple(i % value < value - 1 for i in range(layers))


def _gemma3(k: _Keys, common: dict[str, Any], window: int | None) -> DecoderSpec:
    """Gemma 3 as llama.cpp runs it (`llm_build_gemma3`): Gemma 2's sandwich block with q/k
    RmsNorms, norms stored as applied, embeddings x sqrt(hidden), queries scaled by head_dim
    ** -0.5 (the 62-layer 27B: (hidden / heads) ** -0.5, llama.cpp's `f_attention_scale`).
    With a sliding window, the sliding layers (`_gemma3_sliding`) take the window and a RoPE of
    base `rope.freq_base_swa` (llama.cpp: 10000), unscaled; the global ones `rope.freq_base`
    with the file's rope scaling. Without one every layer is global. The final logits are
    soft-capped when `final_logit_softcapping` is given; attention never is (Gemma 3 has no
    attention soft-cap: Hugging Face's Gemma 3 reads none, nor does llama.cpp)."""
    layers, hidden, heads = common["num_layers"], common["hidden_size"], common["num_heads"]
    head_dim = common["head_dim"]
    global_rope = common["rope"]
    sliding = _gemma3_sliding(k, layers) if window else (False,) * layers
    local_rope = RopeSpec(k.float_("rope.freq_base_swa", GEMMA3_LOCAL_THETA), global_rope.rotary_dim)
    scalar = hidden / heads if layers == 62 else head_dim  # llama.cpp: Gemma 3 27B scales by n_embd / n_head
    return DecoderSpec(
        **common, activation="gelu_tanh", qkv_bias=_has(k.file, "attn_q.bias"), o_bias=_has(k.file, "attn_output.bias"),
        qk_norm=True, norm_offset=0.0, embed_scale=math.sqrt(hidden), sandwich_norms=True, stream_scale=GEMMA_STREAM_SCALE, score_scale=scalar**-0.5,
        attn_softcap=None, final_softcap=k.opt_float("final_logit_softcapping"),
        layer_windows=tuple(window if s else None for s in sliding),
        layer_ropes=tuple(local_rope if s else global_rope for s in sliding),
    )
