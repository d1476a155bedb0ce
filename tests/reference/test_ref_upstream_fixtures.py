"""The reference evaluates every upstream-serialized graph; its Attention, Rope and norm nodes
agree with the loop oracles on the values flowing through those real graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from oracles import attention_oracle, layer_norm_oracle, rms_norm_oracle, rope_oracle

from rlx_mil.ir import Graph
from rlx_mil.ir.ops import Attention, Input, LayerNorm, MaskType, Param, RmsNorm, Rope
from rlx_mil.ir.shape import Static
from rlx_mil.reference import evaluate, evaluate_all


def _feeds(g: Graph, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Seeded feeds: floats ~ N(0, 1); integers and bools 0/1 (valid gather ids, 4-bit
    codes and masks)."""
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    params: dict[str, np.ndarray] = {}
    for node in g:
        if not isinstance(node.op, (Input, Param)):
            continue
        dims = node.shape.sizes()
        value = (
            rng.standard_normal(dims).astype(np.float32) if node.shape.dtype.is_float
            else rng.integers(0, 2, dims).astype(np.float32)
        )
        (inputs if isinstance(node.op, Input) else params)[node.op.name] = value
    return inputs, params


def _fixtures(directory: Path) -> list[Path]:
    paths = sorted(directory.glob("*.json"))
    if not paths:
        pytest.skip(f"no upstream JSON fixtures in {directory}")
    return paths


def test_every_fixture_evaluates_to_its_declared_shapes(upstream_json_dir: Path) -> None:
    for path in _fixtures(upstream_json_dir):
        g = Graph.from_json_file(path)
        inputs, params = _feeds(g, 0)
        out = evaluate(g, inputs, params)
        assert len(out) == len(g.outputs), path.name
        for value, node_id in zip(out.values(), g.outputs, strict=True):
            declared = g.node(node_id).shape
            assert value.shape == declared.sizes() or (value.size == 1 and declared.rank <= 1), path.name
            assert value.dtype == (np.float32 if declared.dtype.value == "BF16" else declared.dtype.numpy)


def test_fixture_nodes_agree_with_oracles(upstream_json_dir: Path) -> None:
    checked = 0
    for path in _fixtures(upstream_json_dir):
        g = Graph.from_json_file(path)
        inputs, params = _feeds(g, 1)
        values = evaluate_all(g, inputs, params)
        for node in g:
            args = [values[i] for i in node.inputs]
            op = node.op
            if isinstance(op, Attention):
                kind = op.mask_kind.type
                name = {MaskType.NONE: "none", MaskType.CAUSAL: "causal", MaskType.SLIDING_WINDOW: "sliding",
                        MaskType.CUSTOM: "custom", MaskType.BIAS: "bias"}[kind]
                want = attention_oracle(
                    *args[:3], args[3] if len(args) > 3 else None, num_heads=op.num_heads, head_dim=op.head_dim,
                    kind=name, window=op.mask_kind.window, score_scale=op.scale, softcap=op.softcap,
                )
            elif isinstance(op, Rope):
                want = rope_oracle(args[0], args[1], args[2], op.head_dim, op.n_rot)
            elif isinstance(op, LayerNorm):
                want = layer_norm_oracle(*args, op.eps)
            elif isinstance(op, RmsNorm):
                want = rms_norm_oracle(*args, op.eps).reshape(values[node.id].shape)
            else:
                continue
            checked += 1
            np.testing.assert_allclose(values[node.id], want, rtol=1e-4, atol=1e-4, err_msg=f"{path.name} {node}")
    assert checked >= 10


def test_int4_fixture_accepts_packed_and_logical_weights(upstream_json_dir: Path) -> None:
    path = upstream_json_dir / "quant_matmul.json"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    g = Graph.from_json_file(path)
    inputs, params = _feeds(g, 2)
    weight = next(n for n in g if isinstance(n.op, Param) and n.op.name == "w_int4")
    assert weight.shape.dims == (Static(8), Static(6))
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (8, 6))
    flat = codes.reshape(-1)
    params["w_int4"] = codes.astype(np.float32)
    logical = evaluate(g, inputs, params)
    params["w_int4"] = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
    packed = evaluate(g, inputs, params)
    name = next(k for k in logical if "int4" in k)
    np.testing.assert_array_equal(logical[name], packed[name])
    scale = params["w_int4.scale"]
    want = inputs["x"].astype(np.float64) @ (codes * np.repeat(scale, 4, axis=0))
    np.testing.assert_allclose(packed[name], want, rtol=1e-5, atol=1e-5)
