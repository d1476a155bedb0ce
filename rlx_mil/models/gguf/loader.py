"""`from_gguf`: a llama.cpp GGUF file -> (RLX graph, params), like `from_pretrained`."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from rlx_mil.ir import Graph
from rlx_mil.models.gguf.codes import FORMATS
from rlx_mil.models.gguf.metadata import PERMUTED_QK, architecture, decoder_spec
from rlx_mil.models.gguf.reader import GGUFFile
from rlx_mil.models.gguf.tensors import DENSE_TYPES, GGUFParams, check_types, tensor_map

#: Tensor types `from_gguf` reads: dense ones as stored, quantized ones kept as their codes.
SUPPORTED_TYPES = frozenset(DENSE_TYPES) | frozenset(FORMATS)


def from_gguf(
    path: str | os.PathLike[str],
    variant: str = "prefill",
    *,
    seq_len: int | None = None,
    cache_len: int | None = None,
    batch_size: int = 1,
    last_logits: bool = False,
    kv_outputs: bool = False,
    position_ids: bool = False,
    max_positions: int | None = None,
    attention_mask: bool = False,
    requantize: str | Mapping[str, str] | None = None,
) -> tuple[Graph, Mapping[str, np.ndarray]]:
    """Build the RLX graph of the GGUF file `path` and its params (the options are
    `from_pretrained`'s). The metadata becomes the same model description a Hugging Face
    config gives, the tensors take the builders' Hugging Face names; every tensor's name,
    shape and type is checked against the architecture before any data is read.

    `requantize` re-quantizes the file's quantized tensors with rlx_mil's compression schemes
    instead of keeping their codes: one scheme for all (`"lut4"`), or per llama.cpp type (`"Q6_K=lut6"`); see `rlx_mil.models.gguf.requantize`.
    `requantize="compress"` hands them to the conversion's `compress=` as float weights
    (llama.cpp's decode, made one tensor at a time as the compressor reads it): with
    `rlx_mil.convert(graph, params, deploy="ane", compress="auto4")` that is what
    `convert-gguf --deploy ane` does (the measured plan; `rlx_mil.llm.calibration.gguf_compress`
    attaches the file's calibration text)."""
    from rlx_mil.models.gguf.requantize import compressed_types, parse_requantize
    from rlx_mil.models.pretrained import build

    schemes = parse_requantize(requantize, frozenset(FORMATS))
    to_compress = compressed_types(requantize, frozenset(FORMATS))

    file = GGUFFile(path)
    spec = decoder_spec(file)
    graph, expected, computed = build(
        spec, variant=variant, seq_len=seq_len, cache_len=cache_len, batch_size=batch_size, last_logits=last_logits,
        kv_outputs=kv_outputs, position_ids=position_ids, max_positions=max_positions, attention_mask=attention_mask,
        name=file.path.stem or None,
    )
    permuted = architecture(file) in PERMUTED_QK
    names = tensor_map(file, spec, expected, permuted)
    check_types(file, names, SUPPORTED_TYPES)
    return graph, GGUFParams(file, names, spec, permuted, computed, schemes, to_compress)
