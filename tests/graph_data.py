"""Plausible inputs and weights for arbitrary graphs (upstream fixtures, examples)."""

from __future__ import annotations

import numpy as np

from rlx_mil.ir.graph import Graph, Node
from rlx_mil.ir.ops import (
    Attention,
    AttentionBackward,
    DequantMatMul,
    Gather,
    GatherElements,
    GatherNd,
    Input,
    MatMul,
    Param,
    QuantKind,
    Rope,
    ScatterAdd,
    ScatterElements,
    ScatterNd,
)
from rlx_mil.ir.ops.scaled import ScaledDequantize, ScaledGroupedMatMul, ScaledMatMul, ScaleKind


def _consumers(graph: Graph) -> dict[int, list[tuple[int, int]]]:
    users: dict[int, list[tuple[int, int]]] = {n.id: [] for n in graph}
    for node in graph:
        for pos, i in enumerate(node.inputs):
            users[i].append((node.id, pos))
    return users


def leaf_values(graph: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, params) for `graph`, shaped by how each leaf is consumed: attention masks are
    0/1 key-padding masks with at least one kept key, gather indices are in range, rope tables
    are real cos/sin tables, quantized weights hold valid codes."""
    rng = np.random.default_rng(seed)
    users = _consumers(graph)
    inputs: dict[str, np.ndarray] = {}
    params: dict[str, np.ndarray] = {}
    for node in graph:
        if not isinstance(node.op, (Input, Param)):
            continue
        shape = node.shape.sizes()
        dtype = node.shape.dtype.numpy
        value = rng.standard_normal(shape).astype(np.float32)
        for user_id, pos in users[node.id]:
            user = graph.node(user_id)
            if isinstance(user.op, (Attention, AttentionBackward)) and pos == len(user.inputs) - 1 and user.op.mask_kind.has_mask_input:
                if user.op.mask_kind.type.value == "Custom":
                    mask = (rng.random(shape) > 0.3).astype(np.float32)
                    flat = mask.reshape(shape[0], -1)
                    flat[:, 0] = 1.0
                    value = flat.reshape(shape)
            elif isinstance(user.op, Gather) and pos == 1:
                table = graph.node(user.inputs[0]).shape.sizes()
                value = rng.integers(0, table[user.op.axis], size=shape).astype(np.float32)
            elif isinstance(user.op, (ScatterAdd, ScatterNd, ScatterElements, GatherNd, GatherElements)) and pos == 1:
                value = _valid_indices(graph, user, shape, rng)
            elif isinstance(user.op, Rope) and pos in (1, 2):
                positions = np.arange(shape[0])[:, None]
                freq = 10000.0 ** (-np.arange(shape[1]) / shape[1])
                value = (np.cos if pos == 1 else np.sin)(positions * freq).astype(np.float32)
            elif isinstance(user.op, MatMul) and pos == 1 and len(shape) >= 2:
                # Unit-variance activations through the layer, as trained weights give;
                # unscaled weights make softmax near one-hot and fp16 checks ill-conditioned.
                value = (value / np.sqrt(shape[-2])).astype(np.float32)
            elif isinstance(user.op, DequantMatMul) and pos == 1:
                kind = user.op.scheme.kind
                low, high = (0, 16) if kind is QuantKind.INT4_BLOCK else (-127, 128)
                value = rng.integers(low, high, size=shape).astype(np.float32)
            elif isinstance(user.op, DequantMatMul) and pos == 2:
                value = rng.uniform(0.01, 0.05, size=shape).astype(np.float32)
            elif isinstance(user.op, DequantMatMul) and pos == 3:
                value = rng.integers(-4, 5, size=shape).astype(np.float32)
            elif isinstance(user.op, (ScaledDequantize, ScaledMatMul, ScaledGroupedMatMul)):
                value = _scaled_leaf(graph, user, pos, shape, rng)
        if dtype.kind in "iu":
            value = np.trunc(value).astype(dtype) if np.all(np.abs(value) < 1e6) else value.astype(dtype)
        elif dtype.kind == "b":
            value = value > 0
        else:
            value = value.astype(dtype)
        (inputs if isinstance(node.op, Input) else params)[node.op.name] = value
    return inputs, params


def _valid_indices(graph: Graph, user: Node, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """In-range indices for a scatter/gather node (non-negative, so valid for every op)."""
    op = user.op
    if isinstance(op, ScatterAdd):
        limits: int | np.ndarray = user.shape.sizes()[op.axis]
    elif isinstance(op, (ScatterNd, GatherNd)):
        data = graph.node(user.inputs[0]).shape.sizes()
        skip = max(op.batch_dims, 0) if isinstance(op, GatherNd) else 0
        limits = np.asarray(data[skip:skip + shape[-1]])
    else:
        data = graph.node(user.inputs[0]).shape.sizes()
        limits = data[op.axis % len(data)]
    return np.floor(rng.random(shape) * limits).astype(np.float32)


def _scaled_leaf(graph: Graph, user: Node, pos: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Codes of the operand's format with magnitudes near 1 (no NaN/inf codes), scale bytes near
    2^0, per-tensor scales near 1, valid expert ids and plain biases."""
    from rlx_mil.reference.scaled import code_table

    op = user.op
    codes_pos, scale_pos = ((0,), (1,)) if isinstance(op, ScaledDequantize) else ((0, 1), (2, 3))
    if pos in codes_pos:
        fmt = op.format if isinstance(op, ScaledDequantize) else (op.lhs_format, op.rhs_format)[pos]
        table = code_table(fmt)
        usable = np.flatnonzero(np.isfinite(table) & (np.abs(table) <= 8))
        return rng.choice(usable, size=shape).astype(np.float32)
    if pos in scale_pos:
        kind = op.scale_layout.kind
        if kind is ScaleKind.PER_TENSOR:
            return rng.uniform(0.5, 2.0, size=shape).astype(np.float32)
        low, high = (124, 130) if kind is ScaleKind.BLOCK_MX_E8M0 else (0x30, 0x40)
        return rng.integers(low, high, size=shape).astype(np.float32)
    if isinstance(op, ScaledGroupedMatMul) and pos == 4:
        experts = graph.node(user.inputs[1]).shape.sizes()[0]
        return rng.integers(0, experts, size=shape).astype(np.float32)
    return rng.standard_normal(shape).astype(np.float32)
