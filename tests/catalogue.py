"""One small, representative graph per IR op type (for conformance tests across targets)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import OP_TYPES


def _g(name: str) -> Graph:
    return Graph(name)


def _activation() -> Graph:
    g = _g("activation")
    x = g.input("x", [2, 8])
    g.set_outputs([g.gelu(g.silu(g.tanh(x)), name="y")])
    return g


def _cast() -> Graph:
    g = _g("cast")
    x = g.input("x", [2, 8])
    g.set_outputs([g.cast(g.cast(x, "f16"), "i32", name="y")])
    return g


def _binary() -> Graph:
    g = _g("binary")
    x, y = g.input("x", [2, 3, 4]), g.constant(np.array([1.5, -2.0, 0.5, 3.0], np.float32))
    g.set_outputs([g.maximum(g.mul(x, y), g.div(x, y), name="z")])
    return g


def _compare_where() -> Graph:
    g = _g("compare_where")
    x, y = g.input("x", [2, 4]), g.input("y", [2, 4])
    g.set_outputs([g.where_(g.lt_(x, y), x, y, name="z")])
    return g


def _matmul() -> Graph:
    g = _g("matmul")
    x = g.input("x", [2, 3, 8])
    g.set_outputs([g.matmul(x, g.param("w", [8, 4]), name="y")])
    return g


def _lora() -> Graph:
    g = _g("lora")
    x = g.input("x", [2, 8])
    y = g.lora_matmul(x, g.param("w", [8, 4]), g.param("a", [8, 2]), g.param("b", [2, 4]), 0.5, name="y")
    g.set_outputs([y])
    return g


def _fused_mm() -> Graph:
    g = _g("fused_matmul_bias_act")
    x = g.input("x", [2, 8])
    g.set_outputs([g.fused_matmul_bias_act(x, g.param("w", [8, 4]), g.param("b", [4]), "relu", name="y")])
    return g


def _quant() -> Graph:
    g = _g("quantize_dequantize")
    x = g.input("x", [2, 4])
    q = g.quantize(x, [0.1, 0.2], [0, 1], axis=0)
    g.set_outputs([g.dequantize(q, [0.1, 0.2], [0, 1], axis=0, name="y")])
    return g


def _dequant_matmul() -> Graph:
    g = _g("dequant_matmul")
    x = g.input("x", [2, 8])
    y = g.dequant_matmul(x, g.param("w", [8, 6], "i8"), g.param("s", [2, 6]), g.param("z", [2, 6]),
                         scheme="int8_block:4", name="y")
    g.set_outputs([y])
    return g


def _norms() -> Graph:
    g = _g("norms")
    x = g.input("x", [2, 3, 8])
    r = g.input("r", [2, 3, 8])
    gamma, beta = g.param("gamma", [8]), g.param("beta", [8])
    a = g.layer_norm(x, gamma, beta)
    b = g.rms_norm(a, gamma, beta)
    c = g.fused_residual_ln(b, r, gamma, beta)
    g.set_outputs([g.fused_residual_rms_norm(c, r, gamma, beta, bias=g.param("bias", [8]), name="y")])
    return g


def _group_norm() -> Graph:
    g = _g("group_norm")
    x = g.input("x", [2, 4, 3, 3])
    g.set_outputs([g.group_norm(x, g.param("gamma", [4]), g.param("beta", [4]), 2, name="y")])
    return g


def _reductions() -> Graph:
    g = _g("reductions")
    x = g.input("x", [2, 3, 4])
    s = g.softmax(x, axis=1)
    c = g.cumsum(s, axis=-1, exclusive=True)
    g.set_outputs([g.sum(c, [0, 2], name="y"), g.topk(x, 2, name="k")])
    return g


def _shapes() -> Graph:
    g = _g("shapes")
    x = g.input("x", [2, 3, 4])
    t = g.transpose(g.reshape(x, [6, 4]), [1, 0])
    n = g.narrow(t, 1, 1, 4)
    c = g.concat([n, n], 0)
    e = g.expand(g.param("s", [1, 4]), [8, 4])
    ids = g.input("ids", [5], "i32")
    g.set_outputs([g.add(c, e, name="y"), g.gather(g.param("table", [10, 3]), ids, name="emb")])
    return g


def _rope() -> Graph:
    g = _g("rope")
    x = g.input("x", [1, 4, 16])
    g.set_outputs([g.rope(x, g.param("cos", [4, 4]), g.param("sin", [4, 4]), 8, name="y")])
    return g


def _attention() -> Graph:
    g = _g("attention")
    q, k, v = g.input("q", [1, 8, 32]), g.input("k", [1, 8, 16]), g.input("v", [1, 8, 16])
    g.set_outputs([g.attention_kind(q, k, v, 4, 8, "causal", name="y")])
    return g


def _attention_backward() -> Graph:
    g = _g("attention_backward")
    q, k, v, dy = (g.input(n, [1, 2, 4, 8]) for n in ("q", "k", "v", "dy"))
    g.set_outputs(list(g.attention_backward_all(q, k, v, dy, 2, 8, "causal")))
    return g


def _swiglu() -> Graph:
    g = _g("swiglu")
    x = g.input("x", [2, 8])
    g.set_outputs([g.fused_swiglu(x, name="y")])
    return g


def _attention_block() -> Graph:
    g = _g("fused_attention_block")
    h, m = g.input("h", [1, 4, 16]), g.input("mask", [1, 4])
    y = g.fused_attention_block(h, g.param("qkv", [16, 48]), g.param("out", [16, 16]), m, 2, 8, name="y")
    g.set_outputs([y])
    return g


def _transformer_layer() -> Graph:
    g = _g("fused_transformer_layer")
    h, m = g.input("h", [1, 4, 16]), g.input("mask", [1, 4])
    y = g.fused_transformer_layer(
        h, m, qkv_w=g.param("qkv", [16, 48]), out_w=g.param("out", [16, 16]), ln1_gamma=g.param("g1", [16]),
        fc1_w=g.param("fc1", [16, 32]), fc2_w=g.param("fc2", [32, 16]), ln2_gamma=g.param("g2", [16]),
        num_heads=2, head_dim=8, name="y",
    )
    g.set_outputs([y])
    return g


def _conv_pool() -> Graph:
    g = _g("conv_pool")
    x = g.input("x", [1, 2, 6, 6])
    c = g.conv(x, g.param("w", [4, 1, 3, 3]), stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=2)
    g.set_outputs([g.pool(c, "max", [2, 2], name="y")])
    return g


CATALOGUE: dict[str, Callable[[], Graph]] = {
    "activation": _activation, "cast": _cast, "binary": _binary, "compare_where": _compare_where,
    "matmul": _matmul, "lora": _lora, "fused_matmul_bias_act": _fused_mm, "quantize_dequantize": _quant,
    "dequant_matmul": _dequant_matmul, "norms": _norms, "group_norm": _group_norm,
    "reductions": _reductions, "shapes": _shapes, "rope": _rope, "attention": _attention,
    "attention_backward": _attention_backward, "swiglu": _swiglu, "attention_block": _attention_block,
    "transformer_layer": _transformer_layer, "conv_pool": _conv_pool,
}


def covered_op_types() -> set[str]:
    return {node.op.type_name for build in CATALOGUE.values() for node in build()}


def all_op_type_names() -> set[str]:
    return set(OP_TYPES)


def random_leaves(graph: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    from graph_data import leaf_values

    return leaf_values(graph, seed)
