"""Reference kernels of the mixture-of-experts matmuls (spec part 2, sections 2.4-2.6)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlx_mil.errors import ShapeError
from rlx_mil.ir.ops import (
    DequantGroupedMatMul,
    DequantGroupedMatMulMlx,
    DequantMoEWeights,
    GroupedMatMul,
    QuantScheme,
)
from rlx_mil.ir.shape import Shape
from rlx_mil.reference.quant import as_bytes, gguf_dequantize
from rlx_mil.reference.registry import as_float, finish, reference_kernel, static_sizes
from rlx_mil.reference.scatter import decode_indices, resolve_indices


def expert_ids(ids: np.ndarray, experts: int, op: str) -> np.ndarray:
    """F32-encoded expert ids as int64, each in [0, experts) (upstream leaves them unchecked)."""
    return resolve_indices(decode_indices(np.asarray(ids).reshape(-1), op), experts, op, negative=False)


def grouped_matmul(x: np.ndarray, weight: np.ndarray, ids: np.ndarray, op: str = "GroupedMatMul") -> np.ndarray:
    """Row i of `x` [M, K] times `weight[ids[i]]` ([E, K, N])."""
    if x.ndim != 2 or weight.ndim != 3 or x.shape[1] != weight.shape[1]:
        raise ShapeError(f"input {list(x.shape)} and weight {list(weight.shape)} are not [M, K] and [E, K, N]",
                         operand="weight")
    rows = expert_ids(ids, weight.shape[0], op)
    if rows.shape[0] != x.shape[0]:
        raise ShapeError(f"{rows.shape[0]} expert ids for {x.shape[0]} rows", operand="expert_idx")
    return np.einsum("mk,mkn->mn", as_float(x), as_float(weight)[rows])


def moe_weights(scheme: QuantScheme, packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """The `[E, K, N]` experts in GGUF `packed` bytes: E slabs of an `[N, K]` row-major
    matrix, each decoded and transposed (the CPU's layout, spec part 2 section 9 Q11)."""
    rows = gguf_dequantize(scheme.kind, as_bytes(packed), k)  # [E * N, K]
    if rows.shape[0] % n:
        raise ShapeError(f"the bytes hold {rows.shape[0]} rows of K = {k}, not whole experts of N = {n}",
                         operand="packed_w")
    return np.ascontiguousarray(rows.reshape(-1, n, k).transpose(0, 2, 1))


@reference_kernel(GroupedMatMul)
def _grouped_matmul(op: GroupedMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, weight, ids = inputs
    return finish(grouped_matmul(x, weight, ids), out)


@reference_kernel(DequantGroupedMatMul)
def _dequant_grouped_matmul(op: DequantGroupedMatMul, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, packed, ids = inputs
    n = static_sizes(out, "the output")[1]
    weight = moe_weights(op.scheme, packed, x.shape[1], n)
    return finish(grouped_matmul(x, weight, ids, "DequantGroupedMatMul"), out)


@reference_kernel(DequantMoEWeights)
def _dequant_moe_weights(op: DequantMoEWeights, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    experts, k, n = static_sizes(out, "the output")
    weight = moe_weights(op.scheme, inputs[0], k, n)
    if weight.shape[0] != experts:
        raise ShapeError(f"the bytes hold {weight.shape[0]} experts, the node declares {experts}", operand="packed_w")
    return finish(weight, out)


def mlx_codes(words: np.ndarray, rows: int, k: int, bits: int) -> np.ndarray:
    """`[rows, k]` codes of MLX-affine words: each row's `k * bits / 8` bytes are one LSB-first
    bit stream (MLX's uint32 words, little-endian; 3/5/6-bit codes cross byte boundaries)."""
    stream = np.unpackbits(as_bytes(words).reshape(rows, k * bits // 8), axis=1, bitorder="little")
    weights = (1 << np.arange(bits, dtype=np.int64))
    return (stream.reshape(rows, k, bits).astype(np.int64) * weights).sum(axis=2)


def mlx_experts(scheme: QuantScheme, words: np.ndarray, scales: np.ndarray, biases: np.ndarray) -> np.ndarray:
    """`[E, N, K]` weights: code * scale + bias per group of `group_size` along K."""
    assert scheme.bits is not None and scheme.group_size is not None
    experts, n, groups = scales.shape
    k = groups * scheme.group_size
    codes = mlx_codes(words, experts * n, k, scheme.bits).reshape(experts, n, groups, scheme.group_size)
    s = as_float(scales).astype(np.float32)[..., None]
    b = as_float(biases).astype(np.float32)[..., None]
    return (codes.astype(np.float32) * s + b).reshape(experts, n, k)


def clamped_experts(ids: np.ndarray, experts: int) -> np.ndarray:
    """Upstream's `(id as usize).min(E - 1)`: truncated, NaN and negatives to 0, past the end to E - 1."""
    v = np.nan_to_num(np.asarray(ids, np.float64).reshape(-1), nan=0.0, posinf=experts - 1, neginf=0.0)
    return np.clip(np.trunc(v), 0, experts - 1).astype(np.int64)


@reference_kernel(DequantGroupedMatMulMlx)
def _dequant_grouped_matmul_mlx(op: DequantGroupedMatMulMlx, inputs: Sequence[np.ndarray], out: Shape) -> np.ndarray:
    x, words, scales, biases, ids = inputs
    weight = mlx_experts(op.scheme, words, scales, biases)
    rows = clamped_experts(ids, weight.shape[0])
    return finish(np.einsum("mk,mnk->mn", as_float(x).astype(np.float32), weight[rows]), out)
