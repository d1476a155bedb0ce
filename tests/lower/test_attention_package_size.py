"""Causal and sliding-window masks must not be baked into the package: the same 4-layer model
converted at S=128 and at S=2048 must differ by far less than one S x S mask (2048^2 fp16 =
8 MiB per layer)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import MaskKind
from rlx_mil.ir.shape import Shape

from .test_attention import convert_graph

LAYERS, HEADS, KV_HEADS, HEAD_DIM = 4, 4, 2, 8
HIDDEN = HEADS * HEAD_DIM
MIB = 1 << 20


def causal_model(seq: int, kind: MaskKind) -> tuple[Graph, dict[str, np.ndarray]]:
    """Four attention layers with q/k/v projections (GQA), hidden states [1, S, H*D]."""
    g = Graph(f"causal_{seq}")
    x = g.input("x", (1, seq, HIDDEN))
    rng = np.random.default_rng(0)
    params: dict[str, np.ndarray] = {}
    kv_width = KV_HEADS * HEAD_DIM
    for layer in range(LAYERS):
        projected = []
        for part, width in (("q", HIDDEN), ("k", kv_width), ("v", kv_width)):
            name = f"l{layer}_{part}"
            params[name] = (rng.standard_normal((HIDDEN, width)) * 0.1).astype(np.float32)
            w = g.param(name, (HIDDEN, width))
            projected.append(g.add_node(ops.MatMul(), [x, w], Shape.of((1, seq, width))))
        x = g.add_node(ops.Attention(HEADS, HEAD_DIM, kind), projected, Shape.of((1, seq, HIDDEN)), name=f"attn{layer}")
    g.set_outputs([x])
    return g, params


def package_bytes(path: str | os.PathLike[str]) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


@pytest.mark.parametrize(
    ("target", "kind"),
    [("iOS18", MaskKind.CAUSAL), ("iOS18", MaskKind.sliding_window(256)), ("iOS17", MaskKind.CAUSAL),
     ("iOS15", MaskKind.sliding_window(64))],
    ids=["ios18-causal", "ios18-sliding", "ios17-causal", "ios15-sliding"],
)
def test_package_does_not_grow_with_sequence_length(target: str, kind: MaskKind) -> None:
    sizes = {}
    for seq in (128, 2048):
        graph, params = causal_model(seq, kind)
        model = convert_graph(graph, params, target=target, precision="fp16")
        sizes[seq] = package_bytes(model.package_path)
    growth = sizes[2048] - sizes[128]
    assert growth < MIB, f"package grew by {growth} bytes from S=128 to S=2048 ({sizes})"
    # In fact only shape numbers change: nothing scales with S at all.
    assert abs(growth) < 4096, sizes


def test_measurement_sees_a_baked_mask() -> None:
    """Control: the same measurement catches an S x S mask that is a constant (a Bias param)."""
    sizes = {}
    for seq in (128, 2048):
        g = Graph(f"baked_{seq}")
        x = g.input("x", (1, seq, HIDDEN))
        bias = g.param("bias", (seq, seq))
        g.set_outputs([g.add_node(ops.Attention(HEADS, HEAD_DIM, MaskKind.BIAS), [x, x, x, bias], Shape.of((1, seq, HIDDEN)))])
        baked = np.triu(np.full((seq, seq), -1e4, np.float32), k=1)
        model = convert_graph(g, {"bias": baked}, target="iOS18", precision="fp16")
        sizes[seq] = package_bytes(model.package_path)
    assert sizes[2048] - sizes[128] > MIB
