"""Mixture-of-experts decoders: Qwen3-MoE, Qwen2-MoE and OLMoE (`model_type` `qwen3_moe`,
`qwen2_moe`, `olmoe`).

The attention half of each layer is the dense family's (Qwen3's per-head q/k norms, Qwen2's
q/k/v biases, OLMoE's q/k norms over the whole projection and `clip_qkv`); the MLP is a routed
mixture (transformers' `*SparseMoeBlock`):

    probs = softmax(x @ gate.T)                       # [M, E], M = B * S rows
    chosen = topk(probs, k); w = probs[chosen]        # normalised to sum 1 with norm_topk_prob
    out = sum_j w_j * down_e(silu(gate_e(x)) * up_e(x)),  e = chosen_j
    (+ sigmoid(x @ shared_expert_gate.T) * shared_expert(x) where the model has one)

The k picks of every row become k rows of one `GroupedMatMul` each for the gate/up and the down
projection (`[M*k, H] @ W[e]`), so a layer has two grouped matmuls whatever k is. Checkpoints
store one tensor per expert (`mlp.experts.{e}.gate_proj.weight` `[I, H]`, as Qwen and AllenAI
publish them) or transformers 5's fused `mlp.experts.gate_up_proj` `[E, 2I, H]` and
`mlp.experts.down_proj` `[E, H, I]`; either is stacked into the `[E, K, N]` layout the grouped
matmul takes when the param is read (`DerivedTensor`), one expert at a time into one array.

The config readers are the family records in `rlx_mil.models.families.moe`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rlx_mil.errors import UnsupportedConfigError
from rlx_mil.models.checkpoint import DerivedTensor
from rlx_mil.models.decoder import DecoderOptions, _Builder, rope_names
from rlx_mil.models.hf_config import DecoderSpec
from rlx_mil.models.rope import rope_tables


@dataclass(frozen=True)
class MoeSpec(DecoderSpec):
    """A decoder whose MLPs are (mostly) routed mixtures of SwiGLU experts."""

    num_experts: int = 0
    top_k: int = 1
    #: Width of one expert's SwiGLU.
    expert_size: int = 0
    norm_topk_prob: bool = False
    #: Per layer: True where the MLP is the routed mixture (else the dense `intermediate_size` MLP).
    sparse_layers: tuple[bool, ...] = ()
    #: Width of the always-on shared expert (Qwen2-MoE), 0 for none.
    shared_expert_size: int = 0
    #: OLMoE: RmsNorm over the whole q / k projection (before the head split).
    full_qk_norm: bool = False
    #: OLMoE: q, k and v clamped to [-clip_qkv, clip_qkv] after the norms.
    clip_qkv: float | None = None
    #: Stored expert layout: "per_expert" or "fused" (transformers 5).
    expert_layout: str = "per_expert"

    def build_graph(self, options: DecoderOptions, name: str) -> tuple[Any, dict[str, tuple[int, ...]], dict[str, Any]]:
        return build_moe(self, options, name)

    def for_checkpoint(self, names: Any) -> MoeSpec:
        """This spec with `expert_layout` read from the stored tensor names (fused when the first
        sparse layer stores `mlp.experts.gate_up_proj`)."""
        for i, sparse in enumerate(self.sparse_layers):
            if sparse:
                fused = f"model.layers.{i}.mlp.experts.gate_up_proj" in names
                return replace(self, expert_layout="fused" if fused else "per_expert")
        return self


def _stack_per_expert(arrays: list[np.ndarray]) -> np.ndarray:
    """`E` stored `[N, K]` weights (or `[N1, K]` + `[N2, K]` pairs) -> `[E, K, N]`."""
    first = arrays[0]
    out = np.empty((len(arrays), first.shape[1], first.shape[0]), first.dtype)
    for e, w in enumerate(arrays):
        out[e] = w.T
    return out


def _stack_pairs(arrays: list[np.ndarray]) -> np.ndarray:
    """gate and up of each expert (alternating) -> `[E, H, 2I]` (gate columns first)."""
    gates, ups = arrays[0::2], arrays[1::2]
    width, hidden = gates[0].shape
    out = np.empty((len(gates), hidden, 2 * width), gates[0].dtype)
    for e, (g, u) in enumerate(zip(gates, ups, strict=True)):
        out[e, :, :width] = g.T
        out[e, :, width:] = u.T
    return out


def _transpose_fused(arrays: list[np.ndarray]) -> np.ndarray:
    """transformers 5's `[E, N, K]` expert tensor -> `[E, K, N]`."""
    return np.ascontiguousarray(np.swapaxes(arrays[0], 1, 2))


class MoeBuilder(_Builder):
    """The dense decoder with routed-expert MLPs (and OLMoE's attention details)."""

    spec: MoeSpec

    def __init__(self, spec: MoeSpec, options: DecoderOptions, name: str) -> None:
        super().__init__(spec, options, name)
        self.derived: dict[str, DerivedTensor] = {}

    def linear(self, x: int, module: str, out_features: int, in_features: int, bias: bool) -> int:
        y = super().linear(x, module, out_features, in_features, bias)
        s = self.spec
        role = module.rsplit(".", 1)[-1]
        if ".self_attn." in module and role in ("q_proj", "k_proj", "v_proj"):
            if s.full_qk_norm and role != "v_proj":
                y = self.rms_norm(y, module.replace(role, f"{role[0]}_norm"), out_features)
            if s.clip_qkv is not None:
                y = self.g.clamp(y, -s.clip_qkv, s.clip_qkv, name=f"{module}.clip")
        return y

    def mlp(self, x: int, p: str) -> int:
        layer = int(p.split(".")[2])
        if not self.spec.sparse_layers[layer]:
            return super().mlp(x, p)
        return self.mixture(x, p)

    def expert_weight(self, p: str, role: str, experts: int, k: int, n: int) -> int:
        """The `[E, k, n]` stacked weight `{p}.experts.{role}` (a derived param)."""
        s = self.spec
        name = f"{p}.experts.{role}"
        if s.expert_layout == "fused":
            self.expected[name] = (experts, n, k)
            self.derived[name] = DerivedTensor((name,), (experts, k, n), _transpose_fused)
        elif role == "gate_up_proj":
            sources: list[str] = []
            for e in range(experts):
                for part in ("gate_proj", "up_proj"):
                    stored = f"{p}.experts.{e}.{part}.weight"
                    self.expected[stored] = (n // 2, k)
                    sources.append(stored)
            self.derived[name] = DerivedTensor(tuple(sources), (experts, k, n), _stack_pairs)
        else:
            sources = []
            for e in range(experts):
                stored = f"{p}.experts.{e}.{role}.weight"
                self.expected[stored] = (n, k)
                sources.append(stored)
            self.derived[name] = DerivedTensor(tuple(sources), (experts, k, n), _stack_per_expert)
        return self.g.param(name, [experts, k, n])

    def mixture(self, x: int, p: str) -> int:
        s, o, g = self.spec, self.options, self.g
        rows, e, width, k = o.batch_size * o.seq_len, s.hidden_size, s.expert_size, s.top_k
        h = g.reshape(x, [rows, e], name=f"{p}.rows")
        probs = g.softmax(self.linear(h, f"{p}.gate", s.num_experts, e, False), name=f"{p}.router")
        chosen = g.topk(probs, k, name=f"{p}.chosen")
        weights = g.gather_elements(probs, chosen, 1, name=f"{p}.top_weights")
        if s.norm_topk_prob:
            weights = g.div(weights, g.sum(weights, [1], keep_dim=True), name=f"{p}.top_weights_norm")
        # Row m's j-th pick is row m*k + j of one grouped matmul.
        picks = g.reshape(g.concat([g.reshape(h, [rows, 1, e])] * k, 1), [rows * k, e], name=f"{p}.pick_rows")
        ids = g.reshape(chosen, [rows * k], name=f"{p}.pick_experts")
        gate_up = g.grouped_matmul(picks, self.expert_weight(p, "gate_up_proj", s.num_experts, e, 2 * width), ids,
                                   name=f"{p}.experts.gate_up")
        gate = g.narrow(gate_up, 1, 0, width, name=f"{p}.experts.gate")
        up = g.narrow(gate_up, 1, width, width, name=f"{p}.experts.up")
        act = g.mul(g.silu(gate, name=f"{p}.experts.act"), up, name=f"{p}.experts.gated")
        down = g.grouped_matmul(act, self.expert_weight(p, "down_proj", s.num_experts, width, e), ids,
                                name=f"{p}.experts.down")
        weighted = g.mul(down, g.reshape(weights, [rows * k, 1]), name=f"{p}.experts.weighted")
        out = g.sum(g.reshape(weighted, [rows, k, e]), [1], name=f"{p}.experts.sum")
        if s.shared_expert_size:
            m = s.shared_expert_size
            q = f"{p}.shared_expert"
            shared = g.mul(g.silu(self.linear(h, f"{q}.gate_proj", m, e, False)), self.linear(h, f"{q}.up_proj", m, e, False))
            shared = self.linear(shared, f"{q}.down_proj", e, m, False)
            gate_logit = self.linear(h, f"{p}.shared_expert_gate", 1, e, False)
            out = g.add(out, g.mul(g.sigmoid(gate_logit), shared), name=f"{p}.with_shared")
        return g.reshape(out, [o.batch_size, o.seq_len, e], name=f"{p}.out")


def build_moe(spec: MoeSpec, options: DecoderOptions, name: str) -> tuple[Any, dict[str, tuple[int, ...]], dict[str, Any]]:
    """(graph, stored tensors name -> shape, computed arrays and derived tensors)."""
    options.validate(spec)
    if spec.num_experts < 1:
        raise UnsupportedConfigError(f"{spec.family}: num_experts must be >= 1", field="num_experts", value=spec.num_experts)
    builder = MoeBuilder(spec, options, name)
    graph = builder.build()
    computed: dict[str, Any] = dict(builder.derived)
    for rope, prefix in rope_names(spec).items():
        computed[f"{prefix}.cos"], computed[f"{prefix}.sin"] = rope_tables(rope, spec.head_dim, options.table_rows)
    return graph, builder.expected, computed
