"""GGUF tensor names (`token_embd`, `blk.N.attn_q`, `ffn_gate`, `output_norm`, `output`, ...)
-> the Hugging Face names the builders declare, and the params mapping that reads them.

llama.cpp's converter permutes the rows of Llama's Q and K projections (weights and biases)
for its interleaved RoPE mode; `undo_qk_permutation` gives the rows back in Hugging Face's
half-split order (a row reorder, so quantized rows move as whole blocks). A missing `output`
tensor means the LM head is the token embedding (tied).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rlx_mil.compress.code_store import CodeStore, WriterFactory
from rlx_mil.compress.schemes import Scheme
from rlx_mil.errors import CheckpointError, UnsupportedConfigError
from rlx_mil.lowering.target import Target
from rlx_mil.models.gguf.reader import GGUFFile, GGUFTensor
from rlx_mil.models.hf_config import DecoderSpec

#: Float types read as they are stored (BF16 as `ml_dtypes.bfloat16`).
DENSE_TYPES = ("F32", "F16", "BF16")
#: Tensors the metadata mapping consumes (not weights of the graph).
CONSUMED = frozenset({"rope_freqs.weight"})

_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_qkv": "self_attn.qkv_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
#: Gemma 2's and 3's sandwich norms: llama.cpp's ffn_norm is the pre-feed-forward norm there.
_GEMMA2_LAYER = {
    "ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK = re.compile(r"blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)")


def hf_name(name: str, spec: DecoderSpec) -> str | None:
    """The Hugging Face name of GGUF tensor `name` (None when it has none)."""
    m = _BLOCK.fullmatch(name)
    if m is None:
        base, _, kind = name.rpartition(".")
        target = _GLOBAL.get(base)
        return None if target is None or kind not in ("weight", "bias") else f"{target}.{kind}"
    layer, part, kind = m.groups()
    table = {**_LAYER, **_GEMMA2_LAYER} if spec.sandwich_norms else _LAYER
    if spec.fused_gate_up and part == "ffn_up":
        return f"model.layers.{layer}.mlp.gate_up_proj.{kind}"
    target = table.get(part)
    return None if target is None else f"model.layers.{layer}.{target}.{kind}"


def qk_heads(hf: str, spec: DecoderSpec) -> int | None:
    """Heads of the permuted rows when `hf` is a Llama q/k projection (None otherwise)."""
    if hf.endswith((".q_proj.weight", ".q_proj.bias")):
        return spec.num_heads
    if hf.endswith((".k_proj.weight", ".k_proj.bias")):
        return spec.num_kv_heads
    return None


def undo_qk_permutation(rows: int, heads: int) -> np.ndarray:
    """Row order turning llama.cpp's permuted Q/K rows back into Hugging Face's: llama.cpp
    stores HF row `h*D + i*D/2 + j` (half i, pair j) at `h*D + 2j + i`."""
    d = rows // heads
    order = np.arange(rows).reshape(heads, d // 2, 2).swapaxes(1, 2).reshape(rows)
    return order


def tensor_map(file: GGUFFile, spec: DecoderSpec, expected: Mapping[str, tuple[int, ...]], permuted: bool) -> dict[str, str]:
    """HF name -> GGUF name for every tensor the graph reads; every missing, unexpected or
    mis-shaped tensor listed in one `CheckpointError`."""
    problems: list[str] = []
    found: dict[str, str] = {}
    for name, t in file.tensors.items():
        if name in CONSUMED:
            continue
        hf = hf_name(name, spec)
        if hf is None or hf not in expected:
            problems.append(f"unexpected tensor {name!r} ({t.type_name} {list(t.shape)})")
            continue
        found[hf] = name
        if t.shape != tuple(expected[hf]):
            problems.append(f"tensor {name!r}: shape {list(t.shape)}, expected {list(expected[hf])}")
        if permuted and (heads := qk_heads(hf, spec)) is not None and t.shape[0] % (2 * heads):
            problems.append(f"tensor {name!r}: {t.shape[0]} rows are not {heads} heads of even width")
    for hf, shape in expected.items():
        if hf not in found:
            problems.append(f"missing tensor for {hf!r} (shape {list(shape)})")
    if problems:
        raise CheckpointError(f"{file.path}: the tensors do not match the {spec.family} architecture in its metadata", problems)
    return found


def check_types(file: GGUFFile, names: Mapping[str, str], supported: frozenset[str]) -> None:
    """Every tensor of a type this conversion holds; others refused by name."""
    bad = [f"tensor {g!r}: type {file.tensors[g].type_name}" for g in names.values() if file.tensors[g].type_name not in supported]
    if bad:
        raise UnsupportedConfigError(
            f"{file.path}: tensor types rlx_mil does not read (supported: {', '.join(sorted(supported))}):\n  - " + "\n  - ".join(bad),
            field="tensor type", value=sorted({file.tensors[g].type_name for g in names.values()} - supported),
        )


def dense_array(t: GGUFTensor) -> np.ndarray:
    """An F32/F16/BF16 tensor's values as stored (a view of the file's map)."""
    if t.type_name == "BF16":
        import ml_dtypes

        return t.raw.view(ml_dtypes.bfloat16).reshape(t.shape)
    return t.raw.reshape(t.shape)


#: Weights a quantized tensor is decoded in at once: the decode's intermediates (the `gguf`
#: package's, several times the slab in float32) stay small beside the float32 result.
DECODE_SLAB = 1 << 20


def decoded(raw_rows: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """llama.cpp's float32 decode of a quantized tensor's `[rows, bytes]` blocks, a slab of
    rows at a time into the result (Gemma 3 270M's 262,144 x 640 Q8_0 embedding: 0.67 GB,
    where decoding it at once held about three times that)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    kind = GGMLQuantizationType[type_name]
    rows = raw_rows.shape[0]
    out = np.empty((rows, int(np.prod(shape, dtype=np.int64)) // max(rows, 1)), np.float32)
    step = max(1, DECODE_SLAB // max(out.shape[1], 1))
    for start in range(0, rows, step):
        out[start:start + step] = dequantize(np.ascontiguousarray(raw_rows[start:start + step]), kind).reshape(-1, out.shape[1])
    return out.reshape(shape)


class GGUFParams(Mapping[str, np.ndarray]):
    """The params of a graph built from a GGUF file, under the builders' Hugging Face names:
    dense tensors as stored (a view of the map; Llama Q/K rows re-ordered), quantized ones
    dequantized exactly (float32) when read — the reference's view of the file — and the
    RoPE tables the builder computes. Conversion never reads the quantized ones this way: it
    takes their blocks as compressed weights (`prequantized_weights`), except those of the
    types `to_compress`, which it reads as float weights and compresses itself."""

    def __init__(self, file: GGUFFile, names: Mapping[str, str], spec: DecoderSpec, permuted: bool,
                 computed: Mapping[str, np.ndarray], requantize: Mapping[str, Scheme] | None = None,
                 to_compress: frozenset[str] = frozenset()) -> None:
        self.file = file
        self.names = dict(names)
        self.spec = spec
        self.permuted = permuted
        self._computed = dict(computed)
        #: GGUF type -> the scheme its tensors are re-quantized with (`rlx_mil.models.gguf.requantize`).
        self.requantize = dict(requantize or {})
        #: GGUF types whose tensors are float weights to the conversion (its `compress=` plans
        #: them): no codes carried, llama.cpp's decode read one tensor at a time.
        self.to_compress = frozenset(to_compress)
        #: (name, program float, LUT form) -> the codes made for a conversion: the functions of one
        #: package converted against these params hold the same arrays (written once, found
        #: shared without reading them), and a tensor is encoded once.
        self._codes: dict[tuple[str, str, bool], Any] = {}

    def gguf_tensor(self, name: str) -> GGUFTensor:
        return self.file.tensors[self.names[name]]

    def row_order(self, name: str) -> np.ndarray | None:
        """The row re-ordering applied to tensor `name` (None: as stored)."""
        heads = qk_heads(name, self.spec) if self.permuted else None
        return None if heads is None else undo_qk_permutation(self.gguf_tensor(name).shape[0], heads)

    def release_pages(self, name: str) -> None:
        """Drop tensor `name`'s pages of the file map (see `GGUFFile.release_pages`)."""
        self.file.release_pages(self.names[name])

    def raw_rows(self, name: str) -> np.ndarray:
        """The stored bytes of tensor `name` as [rows, bytes per row], rows in HF order."""
        t = self.gguf_tensor(name)
        raw = t.raw.reshape(t.shape[0] if len(t.shape) > 1 else 1, -1)
        order = self.row_order(name)
        return raw if order is None else raw[order]

    def prequantized_weights(self) -> dict[str, GGUFWeight]:
        """The quantized tensors, kept as their codes by a conversion (see
        `rlx_mil.compress.prequantized`)."""
        from rlx_mil.models.gguf.codes import FORMATS

        return {name: GGUFWeight(self, name) for name, g in self.names.items()
                if (kind := self.file.tensors[g].type_name) in FORMATS and kind not in self.to_compress}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._computed:
            return self._computed[name]
        if name not in self.names:
            raise KeyError(name)
        t = self.gguf_tensor(name)
        if t.type_name in DENSE_TYPES:
            value = dense_array(t)
            order = self.row_order(name)
            return value if order is None else value[order]
        return decoded(self.raw_rows(name), t.type_name, t.shape)

    def __iter__(self) -> Iterator[str]:
        yield from self.names
        yield from self._computed

    def __len__(self) -> int:
        return len(self.names) + len(self._computed)

    def __contains__(self, name: object) -> bool:
        return name in self._computed or name in self.names

    def shape_of(self, name: str) -> tuple[int, ...]:
        if name in self._computed:
            return tuple(self._computed[name].shape)
        return self.gguf_tensor(name).shape

    def source_type(self, name: str) -> str | None:
        """The llama.cpp type the file holds tensor `name` in (`Q4_K`, `Q8_0`, `F16`); None
        for a table the builder computes (RoPE)."""
        return None if name in self._computed or name not in self.names else self.gguf_tensor(name).type_name

    def dtype_of(self, name: str) -> np.dtype[Any]:
        if name in self._computed:
            return self._computed[name].dtype
        t = self.gguf_tensor(name)
        if t.type_name in DENSE_TYPES:
            return dense_array(t).dtype
        return np.dtype(np.float32)


class GGUFWeight:
    """A quantized GGUF tensor as a `rlx_mil.compress.prequantized.PrequantizedWeight`: its
    codes as the file holds them, or re-quantized with the scheme `params.requantize` gives
    its type (label `gguf-Q6_K>lut6-group16`)."""

    def __init__(self, params: GGUFParams, name: str) -> None:
        self.params = params
        self.name = name
        t = params.gguf_tensor(name)
        self.type_name = t.type_name
        self.scheme = params.requantize.get(t.type_name)
        self.label = f"gguf-{t.type_name}" + ("" if self.scheme is None else f">{self.scheme.label}")
        self.shape = t.shape

    def encode(self, store: type[np.floating[Any]], code_writer: WriterFactory, target: Target = Target.IOS18) -> Any:
        """The codes in the program's float type `store`, in `target`'s form (see
        `rlx_mil.models.gguf.codes.lut_form`). Codes made into a conversion's code store are
        kept (they live in its file) and handed to later conversions against these params;
        codes made in memory (the reference's decode) are not."""
        from rlx_mil.models.gguf.codes import lut_form

        key = (self.name, np.dtype(store).str, bool(self.scheme is None and lut_form(self.type_name, target)))
        cached = self.params._codes.get(key)
        if cached is not None:
            return cached
        codes = self._encode(store, code_writer, target)
        if isinstance(getattr(code_writer, "__self__", None), CodeStore):
            self.params._codes[key] = codes
        return codes

    def _encode(self, store: type[np.floating[Any]], code_writer: WriterFactory, target: Target) -> Any:
        from rlx_mil.models.gguf.codes import encode
        from rlx_mil.models.gguf.requantize import requantized

        rows, cols = self.shape
        try:
            raw = self.params.raw_rows(self.name)
            if self.scheme is not None:
                return requantized(raw, self.type_name, (rows, cols), self.scheme, store, code_writer, self.name)
            return encode(raw, self.type_name, (rows, cols), store, code_writer, target)
        finally:
            self.params.release_pages(self.name)
