"""NumPy reference semantics of the RLX IR subset (spec sections 3-11).

`evaluate(graph, inputs, params)` runs a graph; `kernel_for(op)` gives the kernel of one op
(`kernel(op, input_arrays, declared_shape) -> ndarray`). The array-level functions
(`attention_backward`, `layer_norm`, `pool`, `dequant_matmul`..., and in their family modules
`reference.attention.attention`, `reference.rope.rope`, `reference.conv.conv`,
`reference.reduce.reduce`) are reusable on their own. A family's module is never shadowed by
a function of the same name.

Choices where the spec leaves room (each documented at its kernel):

* Math runs in float32 (float64 for float64 or >= 32-bit integer operands); F16/BF16 results
  are rounded at the end. GELU evaluates erf in float64.
* Cast float -> int truncates and saturates, NaN -> 0 (Rust `as`); int -> int wraps.
  Quantize maps NaN to 0. Relu, like Binary Max, ignores NaN (NaN -> 0).
* Pool: padded cells hold the reduction's identity (-inf Max, +inf Min, 0 Sum, 1 Prod); Mean
  divides by the full kernel area. Empty stride/dilation lists mean 1, empty padding 0.
* Attention Bias masks broadcast to `[B, H, Sq, Sk]` or hold exactly that many values.
  AttentionBackward passes no gradient through scores the mask replaced, so a fully masked
  row contributes nothing to dQ/dK (its output does not depend on q or k).
* Int4Block/Nvfp4Block weights may be fed packed (ceil(K*N/2) bytes) even when declared with
  the logical `[K, N]` shape (upstream does so), or unpacked as one code 0..15 per element.
* GGUF: Q4_0, Q8_0 and every K-quant (Q2_K..Q6_K, Q8_K) decode.
"""

import importlib as _importlib

from rlx_mil.ir.ops import FAMILIES as _FAMILIES
from rlx_mil.reference.attention import FILL, attention_backward
from rlx_mil.reference.conv import pool
from rlx_mil.reference.elementwise import activation, binary
from rlx_mil.reference.fused import attention_block, swiglu, transformer_layer
from rlx_mil.reference.interpreter import evaluate, evaluate_all, evaluate_changed, evaluate_visiting
from rlx_mil.reference.linalg import matmul
from rlx_mil.reference.norm import group_norm, layer_norm, rms_norm
from rlx_mil.reference.quant import (
    decode_e4m3,
    decode_e5m2,
    dequant_matmul,
    dequant_weight,
    dequantize,
    gguf_dequantize,
    quantize,
    unpack_nibbles,
)
from rlx_mil.reference.reduce import cumsum, softmax, top_k_indices
from rlx_mil.reference.registry import (
    Kernel,
    kernel_for,
    reference_kernel,
    registered_op_types,
    round_to_bf16,
    to_dtype,
)
from rlx_mil.reference.shape import gather_indices
from rlx_mil.reference.special import erf

#: The reference kernel modules, one per IR op family (the IR's own list); importing them
#: registers their kernels. `integer` and `special` are shared math, not families.
KERNEL_MODULES = tuple(f"rlx_mil.reference.{family}" for family in _FAMILIES)
for _module in KERNEL_MODULES:
    _importlib.import_module(_module)

__all__ = [
    "FILL",
    "Kernel",
    "activation",
    "attention_backward",
    "attention_block",
    "binary",
    "cumsum",
    "decode_e4m3",
    "decode_e5m2",
    "dequant_matmul",
    "dequant_weight",
    "dequantize",
    "erf",
    "evaluate",
    "evaluate_all",
    "evaluate_changed",
    "evaluate_visiting",
    "gather_indices",
    "gguf_dequantize",
    "group_norm",
    "kernel_for",
    "layer_norm",
    "matmul",
    "pool",
    "quantize",
    "reference_kernel",
    "registered_op_types",
    "rms_norm",
    "round_to_bf16",
    "softmax",
    "swiglu",
    "to_dtype",
    "top_k_indices",
    "transformer_layer",
    "unpack_nibbles",
]
