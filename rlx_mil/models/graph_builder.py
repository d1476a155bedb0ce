"""What every model builder shares: a graph, the checkpoint tensors it declares, shared
constants, and linear layers on Hugging Face `[out, in]` weights."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_mil.ir import Graph


class WeightGraph:
    """A graph under construction that records each checkpoint tensor it declares."""

    def __init__(self, name: str) -> None:
        self.g = Graph(name)
        self.expected: dict[str, tuple[int, ...]] = {}
        self._zeros: dict[int, int] = {}
        self._scalars: dict[float, int] = {}

    def weight(self, name: str, shape: tuple[int, ...]) -> int:
        self.expected[name] = shape
        return self.g.param(name, list(shape))

    def scalar(self, value: float) -> int:
        """A shared `[1]` float constant."""
        if value not in self._scalars:
            self._scalars[value] = self.g.constant(np.array([value], np.float32))
        return self._scalars[value]

    def zeros(self, width: int) -> int:
        """A shared `[width]` zero constant (the bias of norms that have none)."""
        if width not in self._zeros:
            self._zeros[width] = self.g.constant(np.zeros(width, np.float32))
        return self._zeros[width]

    def linear(self, x: int, module: str, out_features: int, in_features: int, bias: bool) -> int:
        """`x @ W.T (+ b)` with W `[out, in]` as stored under `module.weight`: the MatMul's
        right operand is `Transpose(W)`, which the lowering hands to Core ML `linear` in the
        stored layout."""
        w = self.weight(f"{module}.weight", (out_features, in_features))
        y = self.g.matmul(x, self.g.transpose(w, [1, 0], name=f"{module}.weight_t"), name=module)
        if bias:
            y = self.g.add(y, self.weight(f"{module}.bias", (out_features,)), name=f"{module}.add_bias")
        return y

    def split_heads(self, x: int, batch: int, seq: int, heads: int, head_dim: int, module: str,
                    per_head: Callable[[int], int] | None = None) -> int:
        """`[B, S, heads * D]` -> `[B, heads, S, D]`; `per_head` (an op over D, e.g. a per-head
        norm) applies to the `[B, S, heads, D]` rows before the transpose."""
        x = self.g.reshape(x, [batch, seq, heads, head_dim], name=f"{module}.split_heads")
        if per_head is not None:
            x = per_head(x)
        return self.g.transpose(x, [0, 2, 1, 3], name=f"{module}.head_major")

    def merge_heads(self, x: int, batch: int, seq: int, width: int, module: str) -> int:
        """`[B, H, S, D]` -> `[B, S, H * D]`."""
        x = self.g.transpose(x, [0, 2, 1, 3], name=f"{module}.seq_major")
        return self.g.reshape(x, [batch, seq, width], name=f"{module}.merge_heads")

    def l2_norm(self, x: int, module: str, eps: float = 1e-6) -> int:
        """`x * rsqrt(sum(x * x, -1) + eps)` (transformers' / FLA's l2norm)."""
        g = self.g
        energy = g.sum(g.mul(x, x), [-1], keep_dim=True, name=f"{module}.energy")
        return g.mul(x, g.rsqrt(g.add(energy, self.scalar(eps))), name=module)

    def repeat_heads(self, x: int, times: int, module: str) -> int:
        """`[B, S, H, D]` -> `[B, S, H * times, D]`, each head repeated in place (torch's
        `repeat_interleave` on the head axis; narrow + concat)."""
        if times == 1:
            return x
        heads = self.g.node(x).shape.sizes()[2]
        parts = [self.g.narrow(x, 2, h, 1) for h in range(heads) for _ in range(times)]
        return self.g.concat(parts, 2, name=module)
