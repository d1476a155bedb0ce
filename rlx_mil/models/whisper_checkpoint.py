"""Whisper checkpoint folders -> (WhisperSpec, params under Hugging Face names).

Two layouts are read: Hugging Face (`config.json` + `model.safetensors` or shards, any float
dtype) and CTranslate2 / faster-whisper (`model.bin` + `config.json` + `tokenizer.json` or
`vocabulary.*`): its variables (`encoder/layer_0/self_attention/linear_0/weight`, fused
QKV and KV projections, float16/float32/bfloat16 or int8 with per-row `_scale`) are served
under the Hugging Face names the graphs read, sliced and dequantized when read, so the same
graphs convert both and the same weights give the same packages.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlx_mil.errors import CheckpointError, InvalidOptionError, UnsupportedConfigError
from rlx_mil.models.checkpoint import Checkpoint, ModelParams, pattern_matcher
from rlx_mil.models.ct2_file import CT2File
from rlx_mil.models.families import model_spec
from rlx_mil.models.hf_config import MAX_CONFIG_BYTES, read_json_file
from rlx_mil.models.whisper import IGNORED_TENSORS, WhisperSpec, parse_rows_name, sinusoids

#: Files a Whisper folder's tokenizer is made of (copied beside the packages when present).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "normalizer.json", "preprocessor_config.json", "generation_config.json",
                   "vocabulary.json", "vocabulary.txt")
#: CTranslate2's scalar config variables of a WhisperSpec (not weights).
_CT2_SCALARS = re.compile(r"(encoder|decoder)/(num_heads|activation|alibi|alignment_heads|alignment_layer|pre_norm|"
                          r"scale_embeddings|start_from_zero_embedding|embeddings_merge|layernorm_embedding|rms_norm|"
                          r"rotary_dim|rotary_interleave|rotary_scaling_type|rotary_scaling_factor|rotary_base|"
                          r"parallel_residual|shared_layer_norm|multi_query|num_heads_kv|sliding_window)")
#: CTranslate2's ActivationType enum (include/ctranslate2/ops/activation.h).
_CT2_ACTIVATIONS = {1: "gelu_tanh", 3: "gelu"}


@dataclass
class WhisperCheckpoint:
    """A Whisper checkpoint folder read: its architecture, its params (Hugging Face names,
    read on access) and what generation needs beside the weights."""

    directory: Path
    layout: str  # "hf" or "ct2"
    spec: WhisperSpec
    params: Mapping[str, np.ndarray]
    #: token ids by special token (`<|startoftranscript|>`, `<|en|>`, ...), from the tokenizer.
    special_tokens: dict[str, int] = field(default_factory=dict)
    #: (layer, head) pairs of the cross-attention heads that align words (word timestamps).
    alignment_heads: tuple[tuple[int, int], ...] = ()
    #: generation_config.json (Hugging Face) or its equivalent built from CTranslate2's config.
    generation_config: dict[str, Any] = field(default_factory=dict)

    @property
    def stored_dtype(self) -> str:
        shape_dtype = getattr(self.params, "dtype_of", None)
        if shape_dtype is None:
            return "float32"
        return str(np.dtype(shape_dtype("model.decoder.embed_tokens.weight")))


def is_ct2_folder(path: str | os.PathLike[str]) -> bool:
    folder = Path(path)
    return (folder / "model.bin").is_file() and not any(folder.glob("*.safetensors"))


def open_whisper(path: str | os.PathLike[str]) -> WhisperCheckpoint:
    """Read the Whisper folder `path` (Hugging Face or CTranslate2 layout); every mismatch
    between its config and its tensors is listed in one `CheckpointError`."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidOptionError(f"a checkpoint folder is a path (str or os.PathLike), got {type(path).__name__}")
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a Whisper checkpoint folder")
    found = _open_ct2(folder) if is_ct2_folder(folder) else _open_hf(folder)
    found.special_tokens = _special_tokens(folder)
    return found


def _open_hf(folder: Path) -> WhisperCheckpoint:
    checkpoint = Checkpoint(folder)
    spec = model_spec(checkpoint.config, source=str(folder / "config.json"))
    if not isinstance(spec, WhisperSpec):
        raise UnsupportedConfigError(f"{folder / 'config.json'}: model_type {checkpoint.config.get('model_type')!r} is"
                                     " not Whisper", field="model_type", value=checkpoint.config.get("model_type"))
    expected = spec.tensors()
    checkpoint.check(expected, "Whisper", pattern_matcher(*IGNORED_TENSORS))
    generation: dict[str, Any] = {}
    if (folder / "generation_config.json").is_file():
        loaded = read_json_file(folder / "generation_config.json", MAX_CONFIG_BYTES)
        generation = loaded if isinstance(loaded, dict) else {}
    heads = generation.get("alignment_heads") or ()
    return WhisperCheckpoint(folder, "hf", spec, ModelParams(checkpoint, tuple(expected), {}),
                             alignment_heads=_pairs(heads), generation_config=generation)


def _pairs(value: Any) -> tuple[tuple[int, int], ...]:
    try:
        return tuple((int(a), int(b)) for a, b in value)
    except (TypeError, ValueError):
        return ()


def _special_tokens(folder: Path) -> dict[str, int]:
    """`<|...|>` tokens and `<|endoftext|>` with their ids, from tokenizer.json's added tokens."""
    file = folder / "tokenizer.json"
    if not file.is_file():
        return {}
    data = read_json_file(file, 64 * 2**20)
    out: dict[str, int] = {}
    for token in data.get("added_tokens", []) if isinstance(data, dict) else []:
        if isinstance(token, dict) and isinstance(token.get("content"), str) and isinstance(token.get("id"), int):
            out[token["content"]] = token["id"]
    return out


# ---------------------------------------------------------------------------- CTranslate2


class CT2WhisperParams(Mapping[str, np.ndarray]):
    """A CTranslate2 Whisper `model.bin` under Hugging Face names: fused projections sliced,
    int8 weights dequantized (`int8 / scale` per row) when read."""

    def __init__(self, file: CT2File, spec: WhisperSpec) -> None:
        self.file = file
        self.spec = spec
        #: HF name -> (CT2 variable, first row, rows) (rows None: the whole variable)
        self.sources: dict[str, tuple[str, int, int | None]] = {}
        self.computed: dict[str, np.ndarray] = {}
        e = spec.d_model
        s = self.sources

        def whole(hf: str, ct2: str) -> None:
            s[hf] = (ct2, 0, None)

        def norm(hf: str, ct2: str) -> None:
            whole(f"{hf}.weight", f"{ct2}/gamma")
            whole(f"{hf}.bias", f"{ct2}/beta")

        def linear(hf: str, ct2: str, bias: bool = True, first: int = 0, rows: int | None = None) -> None:
            s[f"{hf}.weight"] = (f"{ct2}/weight", first, rows)
            if bias:
                s[f"{hf}.bias"] = (f"{ct2}/bias", first, rows)

        for side in ("encoder", "decoder"):
            layers = spec.encoder_layers if side == "encoder" else spec.decoder_layers
            for i in range(layers):
                hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
                norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
                for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    linear(f"{hf}.self_attn.{proj}", f"{ct}/self_attention/linear_0", proj != "k_proj", j * e, e)
                linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
                if side == "decoder":
                    norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")
                    linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0")
                    linear(f"{hf}.encoder_attn.k_proj", f"{ct}/attention/linear_1", False, 0, e)
                    linear(f"{hf}.encoder_attn.v_proj", f"{ct}/attention/linear_1", True, e, e)
                    linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
                norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")
                linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
                linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
            norm(f"model.{side}.layer_norm", f"{side}/layer_norm")
        for conv in ("conv1", "conv2"):
            linear(f"model.encoder.{conv}", f"encoder/{conv}")
        whole("model.decoder.embed_tokens.weight", "decoder/embeddings/weight")
        whole("model.decoder.embed_positions.weight", "decoder/position_encodings/encodings")
        if "encoder/position_encodings/encodings" in file:
            whole("model.encoder.embed_positions.weight", "encoder/position_encodings/encodings")
        else:  # older conversions keep the sinusoids implicit
            self.computed["model.encoder.embed_positions.weight"] = sinusoids(spec.max_source_positions, e)

    def check(self) -> None:
        """Every source variable present with the rows the spec needs; nothing unread left."""
        problems: list[str] = []
        expected = self.spec.tensors()
        used: set[str] = set()
        for hf, shape in expected.items():
            if hf in self.computed:
                continue
            ct2, first, rows = self.sources[hf]
            used.add(ct2)
            if ct2 not in self.file:
                problems.append(f"missing variable {ct2!r} (for {hf})")
                continue
            got = self.file.shape_of(ct2)
            want_rows = shape[0] if rows is None else first + rows
            if got[1:] != shape[1:] or (rows is None and got[0] != shape[0]) or got[0] < want_rows:
                problems.append(f"variable {ct2!r}: shape {list(got)} does not hold {hf} {list(shape)}")
            if self.file.dtype_name_of(ct2) == "int8":
                scale = f"{ct2}_scale"
                used.add(scale)
                if scale not in self.file:
                    problems.append(f"int8 variable {ct2!r} has no {scale!r}")
        for name in self.file.variables:
            if name not in used and not _CT2_SCALARS.fullmatch(name):
                problems.append(f"unexpected variable {name!r} {list(self.file.shape_of(name))}")
        if problems:
            raise CheckpointError(f"{self.file.path}: the CTranslate2 model does not match the Whisper architecture",
                                  problems)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.computed:
            return self.computed[name]
        ct2, first, rows = self.sources[name] if name in self.sources else (None, 0, None)
        if ct2 is None or name not in self.spec.tensors():
            raise KeyError(name)
        value = self.file[ct2]
        if rows is not None:
            value = value[first:first + rows]
        if value.dtype == np.int8:
            scale = np.asarray(self.file[f"{ct2}_scale"], np.float32).reshape(-1)
            if rows is not None and scale.size > 1:
                scale = scale[first:first + rows]
            shape = (-1,) + (1,) * (value.ndim - 1)
            return value.astype(np.float32) / scale.reshape(shape)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.spec.tensors())

    def __len__(self) -> int:
        return len(self.spec.tensors())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.spec.tensors()

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.spec.tensors()[name]

    def dtype_of(self, name: str) -> np.dtype[Any]:
        if name in self.computed:
            return self.computed[name].dtype
        ct2 = self.sources[name][0]
        stored = self.file.dtype_name_of(ct2)
        if stored == "bfloat16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(np.float32 if stored == "int8" else stored)


def _count_layers(file: CT2File, side: str) -> int:
    found = {int(m.group(1)) for n in file.variables if (m := re.match(rf"{side}/layer_(\d+)/", n))}
    if found != set(range(len(found))):
        raise CheckpointError(f"{file.path}: {side} layers {sorted(found)} are not numbered 0..n-1")
    return len(found)


def _open_ct2(folder: Path) -> WhisperCheckpoint:
    file = CT2File(folder / "model.bin")
    if file.spec_name != "WhisperSpec":
        raise CheckpointError(f"{file.path}: a CTranslate2 {file.spec_name or 'model'}, not a WhisperSpec")
    config: dict[str, Any] = {}
    if (folder / "config.json").is_file():
        loaded = read_json_file(folder / "config.json", MAX_CONFIG_BYTES)
        config = loaded if isinstance(loaded, dict) else {}
    needed = ("decoder/embeddings/weight", "encoder/conv1/weight", "decoder/position_encodings/encodings",
              "encoder/layer_0/ffn/linear_0/weight", "decoder/layer_0/ffn/linear_0/weight")
    missing = [n for n in needed if n not in file]
    if missing:
        raise CheckpointError(f"{file.path}: not a Whisper model: no {', '.join(missing)}")
    vocab, e = file.shape_of("decoder/embeddings/weight")
    activation_code = file.scalar("decoder/activation") if "decoder/activation" in file else 3
    if activation_code not in _CT2_ACTIVATIONS:
        raise UnsupportedConfigError(f"{file.path}: decoder/activation = {activation_code} is not GELU",
                                     field="decoder/activation", value=activation_code)
    specials = _special_tokens(folder)
    start = specials.get("<|startoftranscript|>", 50257 if vocab >= 51865 else vocab - 1)
    eos = specials.get("<|endoftext|>", 50256 if vocab >= 51865 else vocab - 2)
    encoder_heads = int(file.scalar("encoder/num_heads")) if "encoder/num_heads" in file else 0
    decoder_heads = int(file.scalar("decoder/num_heads")) if "decoder/num_heads" in file else 0
    if encoder_heads < 1 or decoder_heads < 1 or e % encoder_heads or e % decoder_heads:
        raise CheckpointError(f"{file.path}: num_heads {encoder_heads} / {decoder_heads} do not divide d_model {e}")
    positions = file.shape_of("encoder/position_encodings/encodings")[0] if "encoder/position_encodings/encodings" \
        in file else 1500
    spec = WhisperSpec(
        family="whisper", vocab_size=vocab, num_mel_bins=file.shape_of("encoder/conv1/weight")[1], d_model=e,
        encoder_layers=_count_layers(file, "encoder"), encoder_heads=encoder_heads,
        encoder_ffn_dim=file.shape_of("encoder/layer_0/ffn/linear_0/weight")[0],
        decoder_layers=_count_layers(file, "decoder"), decoder_heads=decoder_heads,
        decoder_ffn_dim=file.shape_of("decoder/layer_0/ffn/linear_0/weight")[0],
        max_source_positions=positions, max_target_positions=file.shape_of("decoder/position_encodings/encodings")[0],
        activation=_CT2_ACTIVATIONS[activation_code], decoder_start_token_id=start, eos_token_id=eos, pad_token_id=eos,
        suppress_tokens=tuple(int(t) for t in config.get("suppress_ids", ())),
        begin_suppress_tokens=tuple(int(t) for t in config.get("suppress_ids_begin", (220, eos))),
    )
    params = CT2WhisperParams(file, spec)
    params.check()
    heads = _pairs(config.get("alignment_heads") or ())
    generation = {
        "decoder_start_token_id": start, "eos_token_id": eos, "pad_token_id": eos, "bos_token_id": eos,
        "suppress_tokens": list(spec.suppress_tokens), "begin_suppress_tokens": list(spec.begin_suppress_tokens),
        "alignment_heads": [list(h) for h in heads], "lang_to_id": {}, "is_multilingual": bool(config.get("lang_ids")),
        "max_length": spec.max_target_positions,
    }
    lang_ids = set(config.get("lang_ids", ()))
    generation["lang_to_id"] = {token: token_id for token, token_id in specials.items() if token_id in lang_ids}
    for name in ("no_timestamps", "transcribe", "translate"):
        if f"<|{'notimestamps' if name == 'no_timestamps' else name}|>" in specials:
            generation[f"{name}_token_id" if name == "no_timestamps" else name] = specials[
                f"<|{'notimestamps' if name == 'no_timestamps' else name}|>"]
    if "transcribe" in generation and "translate" in generation:
        generation["task_to_id"] = {"transcribe": generation.pop("transcribe"), "translate": generation.pop("translate")}
    return WhisperCheckpoint(folder, "ct2", spec, params, alignment_heads=heads, generation_config=generation)


def hf_config_of(spec: WhisperSpec) -> dict[str, Any]:
    """A Hugging Face `config.json` of `spec` (what a CTranslate2 folder's package folder carries)."""
    from rlx_mil.models.families.whisper import WHISPER_DEFAULTS

    act = {"gelu": "gelu", "gelu_tanh": "gelu_new"}[spec.activation]
    return {
        **WHISPER_DEFAULTS, "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": spec.vocab_size, "num_mel_bins": spec.num_mel_bins, "d_model": spec.d_model,
        "encoder_layers": spec.encoder_layers, "encoder_attention_heads": spec.encoder_heads,
        "encoder_ffn_dim": spec.encoder_ffn_dim, "decoder_layers": spec.decoder_layers,
        "decoder_attention_heads": spec.decoder_heads, "decoder_ffn_dim": spec.decoder_ffn_dim,
        "max_source_positions": spec.max_source_positions, "max_target_positions": spec.max_target_positions,
        "activation_function": act, "decoder_start_token_id": spec.decoder_start_token_id,
        "eos_token_id": spec.eos_token_id, "pad_token_id": spec.pad_token_id, "bos_token_id": spec.eos_token_id,
        "suppress_tokens": list(spec.suppress_tokens), "begin_suppress_tokens": list(spec.begin_suppress_tokens),
    }


def ct2_variables_of(params: Mapping[str, np.ndarray], spec: WhisperSpec, dtype: str = "float16") -> dict[str, np.ndarray]:
    """The CTranslate2 WhisperSpec variables of Hugging Face-named `params` (fused QKV / KV,
    zero key biases, `dtype` float16/float32, or int8 with per-row scales as CTranslate2
    quantizes): how the tests and benchmarks write CTranslate2 folders."""
    out: dict[str, np.ndarray] = {}
    e = spec.d_model

    def put(name: str, value: np.ndarray, quantize: bool = False) -> None:
        value = np.asarray(value, np.float32)
        if dtype == "int8" and quantize:
            amax = np.abs(value).max(axis=1)
            scale = np.where(amax > 0, 127.0 / np.maximum(amax, 1e-30), 1.0).astype(np.float32)
            out[name] = np.clip(np.round(value * scale[:, None]), -127, 127).astype(np.int8)
            out[f"{name}_scale"] = scale
        else:
            out[name] = value.astype(np.float16 if dtype in ("float16", "int8") else np.float32)

    def linear(ct: str, hf: list[str], biases: list[str | None]) -> None:
        put(f"{ct}/weight", np.concatenate([np.asarray(params[f"{h}.weight"], np.float32) for h in hf]), True)
        put(f"{ct}/bias", np.concatenate([np.zeros(e, np.float32) if b is None else np.asarray(params[b], np.float32)
                                          for b in biases]))

    def norm(ct: str, hf: str) -> None:
        put(f"{ct}/gamma", params[f"{hf}.weight"])
        put(f"{ct}/beta", params[f"{hf}.bias"])

    for conv in ("conv1", "conv2"):
        put(f"encoder/{conv}/weight", params[f"model.encoder.{conv}.weight"])
        put(f"encoder/{conv}/bias", params[f"model.encoder.{conv}.bias"])
    put("encoder/position_encodings/encodings", params["model.encoder.embed_positions.weight"])
    put("decoder/embeddings/weight", params["model.decoder.embed_tokens.weight"])
    put("decoder/position_encodings/encodings", params["model.decoder.embed_positions.weight"])
    for side in ("encoder", "decoder"):
        layers = spec.encoder_layers if side == "encoder" else spec.decoder_layers
        for i in range(layers):
            hf, ct = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            a = f"{hf}.self_attn"
            norm(f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
            linear(f"{ct}/self_attention/linear_0", [f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj"],
                   [f"{a}.q_proj.bias", None, f"{a}.v_proj.bias"])
            linear(f"{ct}/self_attention/linear_1", [f"{a}.out_proj"], [f"{a}.out_proj.bias"])
            if side == "decoder":
                c = f"{hf}.encoder_attn"
                norm(f"{ct}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
                linear(f"{ct}/attention/linear_0", [f"{c}.q_proj"], [f"{c}.q_proj.bias"])
                linear(f"{ct}/attention/linear_1", [f"{c}.k_proj", f"{c}.v_proj"], [None, f"{c}.v_proj.bias"])
                linear(f"{ct}/attention/linear_2", [f"{c}.out_proj"], [f"{c}.out_proj.bias"])
            norm(f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm")
            linear(f"{ct}/ffn/linear_0", [f"{hf}.fc1"], [f"{hf}.fc1.bias"])
            linear(f"{ct}/ffn/linear_1", [f"{hf}.fc2"], [f"{hf}.fc2.bias"])
        norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
    out["encoder/num_heads"] = np.array(spec.encoder_heads, np.int16)
    out["decoder/num_heads"] = np.array(spec.decoder_heads, np.int16)
    out["decoder/activation"] = np.array(3 if spec.activation == "gelu" else 1, np.int8)
    out["decoder/pre_norm"] = np.array(1, np.int8)
    return out


class ParamsOf(Mapping[str, np.ndarray]):
    """The params one graph reads (`names`) out of a whole checkpoint's, still read on access;
    `shape_of` / `dtype_of` answered from the metadata so conversion checks before reading."""

    def __init__(self, params: Mapping[str, np.ndarray], names: Iterable[str]) -> None:
        self._params = params
        self._names = tuple(names)
        self._set = frozenset(self._names)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._set:
            raise KeyError(name)
        rows = parse_rows_name(name)
        if rows is not None:  # a piece of a tensor (`rows_name`): a view of its rows
            tensor, start, stop = rows
            return self._params[tensor][start:stop]
        return self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._set

    def shape_of(self, name: str) -> tuple[int, ...]:
        rows = parse_rows_name(name)
        if rows is not None and name in self._set:
            tensor, start, stop = rows
            meta = getattr(self._params, "shape_of", None)
            whole = tuple(meta(tensor)) if meta is not None else tuple(np.shape(self._params[tensor]))
            return (stop - start, *whole[1:])
        meta = getattr(self._params, "shape_of", None)
        return tuple(meta(name)) if meta is not None else tuple(np.shape(self[name]))

    def dtype_of(self, name: str) -> np.dtype[Any]:
        rows = parse_rows_name(name)
        tensor = rows[0] if rows is not None and name in self._set else name
        meta = getattr(self._params, "dtype_of", None)
        return np.dtype(meta(tensor)) if meta is not None else np.asarray(self[name]).dtype
