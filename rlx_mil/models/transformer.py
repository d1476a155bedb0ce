"""Built-in example graphs: a Llama-style pre-norm decoder (GQA, RoPE, SwiGLU, RmsNorm).

Used by the `rlx-mil demo` command, the benchmarks and end-to-end tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.ops import Param
from rlx_mil.ir.shape import MAX_TENSOR_ELEMENTS
from rlx_mil.models.rope import plain_rope_tables as rope_tables


@dataclass(frozen=True)
class DecoderConfig:
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 512
    layers: int = 2
    seq: int = 64
    batch: int = 1
    eps: float = 1e-5
    rope_base: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def __post_init__(self) -> None:
        for field in ("hidden", "heads", "kv_heads", "intermediate", "layers", "seq", "batch"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"{field} must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise InvalidOptionError(
                f"hidden {self.hidden} must divide into {self.heads} heads, and heads into {self.kv_heads} kv heads"
            )
        if self.head_dim % 2:
            raise InvalidOptionError(f"head_dim = hidden / heads = {self.head_dim} must be even for RoPE")
        self._check_sizes()

    def _check_sizes(self) -> None:
        """Every tensor the graph declares (decomposed attention scores included) within the
        graph tensor limit, and all weights together too: they are allocated up front."""
        b, s, e, f, h = self.batch, self.seq, self.hidden, self.intermediate, self.heads
        tensors = {
            "activations [batch, seq, intermediate]": b * s * f, "attention scores [batch, heads, seq, seq]": b * h * s * s,
            "weight [hidden, intermediate]": e * f, "weight [hidden, heads * head_dim]": e * e,
        }
        for what, count in tensors.items():
            if count > MAX_TENSOR_ELEMENTS:
                raise InvalidOptionError(
                    f"{what} would hold {count} elements, more than the tensor limit of {MAX_TENSOR_ELEMENTS}"
                )
        per_layer = 2 * e * e + 2 * e * self.kv_heads * self.head_dim + 3 * e * f + 4 * e
        total = self.layers * per_layer + s * self.head_dim
        if total > MAX_TENSOR_ELEMENTS:
            raise InvalidOptionError(
                f"{self.layers} layers of hidden {e} need {total} weights, more than the limit of"
                f" {MAX_TENSOR_ELEMENTS} (all are allocated in memory)"
            )


def llama_decoder(config: DecoderConfig = DecoderConfig(), name: str = "llama_decoder") -> Graph:
    """`config.layers` pre-norm decoder layers on input `hidden [B, S, E]`, output `out`."""
    c = config
    d = c.head_dim
    g = Graph(name)
    x = g.input("hidden", [c.batch, c.seq, c.hidden])
    cos = g.param("rope.cos", [c.seq, d // 2])
    sin = g.param("rope.sin", [c.seq, d // 2])
    for i in range(c.layers):
        p = f"layers.{i}."

        def weight(n: str, shape: list[int], p: str = p) -> int:
            return g.param(p + n, shape)

        h = g.rms_norm(x, weight("input_layernorm.weight", [c.hidden]), weight("input_layernorm.bias", [c.hidden]),
                       eps=c.eps, name=p + "input_norm")
        q = g.matmul(h, weight("self_attn.q_proj.weight", [c.hidden, c.heads * d]), name=p + "q_proj")
        k = g.matmul(h, weight("self_attn.k_proj.weight", [c.hidden, c.kv_heads * d]), name=p + "k_proj")
        v = g.matmul(h, weight("self_attn.v_proj.weight", [c.hidden, c.kv_heads * d]), name=p + "v_proj")
        q = g.rope(q, cos, sin, d, name=p + "q_rope")
        k = g.rope(k, cos, sin, d, name=p + "k_rope")
        a = g.attention_kind(q, k, v, c.heads, d, "causal", name=p + "attn")
        o = g.matmul(a, weight("self_attn.o_proj.weight", [c.heads * d, c.hidden]), name=p + "o_proj")
        x = g.add(x, o, name=p + "attn_residual")
        h = g.rms_norm(x, weight("post_attention_layernorm.weight", [c.hidden]),
                       weight("post_attention_layernorm.bias", [c.hidden]), eps=c.eps, name=p + "post_norm")
        gate = g.matmul(h, weight("mlp.gate_proj.weight", [c.hidden, c.intermediate]), name=p + "gate_proj")
        up = g.matmul(h, weight("mlp.up_proj.weight", [c.hidden, c.intermediate]), name=p + "up_proj")
        act = g.mul(g.silu(gate, name=p + "gate_act"), up, name=p + "swiglu")
        down = g.matmul(act, weight("mlp.down_proj.weight", [c.intermediate, c.hidden]), name=p + "down_proj")
        x = g.add(x, down, name=p + "mlp_residual")
    g.set_name(x, "out")
    g.set_outputs([x])
    return g


def random_params(graph: Graph, config: DecoderConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights with realistic scales: unit-variance activations through the layers."""
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    cos, sin = rope_tables(config.seq, config.head_dim, config.rope_base)
    for node in graph:
        if not isinstance(node.op, Param):
            continue
        name = node.op.name
        shape = node.shape.sizes()
        if name == "rope.cos":
            params[name] = cos
        elif name == "rope.sin":
            params[name] = sin
        elif name.endswith("norm.weight"):
            params[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name.endswith("norm.bias"):
            params[name] = np.zeros(shape, np.float32)
        else:
            params[name] = (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    return params


def example_inputs(config: DecoderConfig, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"hidden": rng.standard_normal((config.batch, config.seq, config.hidden)).astype(np.float32)}
