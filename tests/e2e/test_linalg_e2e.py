"""End-to-end: MatMul, LoraMatMul, FusedMatMulBiasAct (every activation and none)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from e2e.factory import (
    Feeds,
    e2e_settings,
    integers,
    leaf_kinds,
    normal,
    rng_for,
    seeds,
    uniform,
    weight_kinds,
)
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.ops import ActivationKind

sides = st.integers(1, 5)


@st.composite
def matmul_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """a [..., M, K] and b [..., K, N] whose batch dims broadcast (either may have none)."""
    batch_a, batch_b = draw(
        hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, min_side=1, max_side=3).map(
            lambda b: b.input_shapes
        )
    )
    m, k, n = draw(sides), draw(sides), draw(sides)
    return (*batch_a, m, k), (*batch_b, k, n)


@e2e_settings(5)
@given(shapes=matmul_shapes(), b_kind=leaf_kinds, seed=seeds)
def test_matmul(shapes: tuple[tuple[int, ...], tuple[int, ...]], b_kind: str, seed: int) -> None:
    """NumPy batch broadcasting; a Param/Constant rhs with unit batch dims becomes `linear`."""
    a_dims, b_dims = shapes
    rng = rng_for(seed)
    f = Feeds("matmul")
    a = f.input("a", normal(rng, a_dims))
    b = f.leaf(b_kind, "b", normal(rng, b_dims))
    f.verify([f.graph.matmul(a, b, name="matmul")])


@e2e_settings(3)
@given(
    lead=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3),
    k=sides,
    n=sides,
    b_kind=weight_kinds,
    seed=seeds,
)
def test_matmul_linear_layer(lead: tuple[int, ...], k: int, n: int, b_kind: str, seed: int) -> None:
    """The dominant form `[B, S, K] @ [K, N]` (x of rank 2 to 4), weight or run-time rhs."""
    rng = rng_for(seed)
    f = Feeds("linear_layer")
    x = f.input("x", normal(rng, (*lead, 3, k)))
    w = f.leaf(b_kind, "w", normal(rng, (k, n), 0.5))
    f.verify([f.graph.matmul(x, w, name="matmul")])


@e2e_settings(2)
@given(shapes=matmul_shapes(), seed=seeds)
def test_matmul_integer(shapes: tuple[tuple[int, ...], tuple[int, ...]], seed: int) -> None:
    """I32 operands give an I32 product (small values: exact in every precision)."""
    a_dims, b_dims = shapes
    rng = rng_for(seed)
    f = Feeds("matmul_int")
    a = f.input("a", integers(rng, a_dims, -4, 4), DType.I32)
    b = f.input("b", integers(rng, b_dims, -4, 4), DType.I32)
    f.verify([f.graph.matmul(a, b, name="matmul")])


@e2e_settings(4)
@given(
    lead=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3),
    k=sides,
    n=sides,
    rank=st.integers(1, 3),
    scale=st.sampled_from([0.5, 2.0, -1.0, 0.0]),
    kinds=st.tuples(weight_kinds, weight_kinds, weight_kinds),
    seed=seeds,
)
def test_lora_matmul(
    lead: tuple[int, ...], k: int, n: int, rank: int, scale: float, kinds: tuple[str, str, str], seed: int
) -> None:
    """`x @ w + scale * ((x @ a) @ b)`; all-weight operands are merged at conversion."""
    rng = rng_for(seed)
    f = Feeds("lora")
    x = f.input("x", normal(rng, (*lead, k)))
    w = f.leaf(kinds[0], "w", normal(rng, (k, n), 0.5))
    a = f.leaf(kinds[1], "lora_a", normal(rng, (k, rank), 0.5))
    b = f.leaf(kinds[2], "lora_b", normal(rng, (rank, n), 0.5))
    f.verify([f.graph.lora_matmul(x, w, a, b, scale, name="lora")])


# ------------------------------------------------------------------------------ FusedMatMulBiasAct

POSITIVE_DOMAIN = (ActivationKind.LOG, ActivationKind.SQRT, ActivationKind.RSQRT)


def _operands(rng: np.random.Generator, kind: ActivationKind | None, lead: tuple[int, ...], k: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, w, bias putting `x @ w + bias` inside the activation's unambiguous domain."""
    x_dims, w_dims = (*lead, k), (k, n)
    if kind in POSITIVE_DOMAIN:
        return uniform(rng, x_dims, 0.2, 1.0), uniform(rng, w_dims, 0.1, 0.5), uniform(rng, (n,), 0.2, 0.5)
    if kind is ActivationKind.TAN:
        return uniform(rng, x_dims, -0.5, 0.5), uniform(rng, w_dims, -0.3, 0.3), uniform(rng, (n,), -0.1, 0.1)
    if kind is ActivationKind.ROUND:
        # Integer products plus a 0.25 bias: exact in fp16, never a .5 tie.
        return integers(rng, x_dims, -2, 2), integers(rng, w_dims, -2, 2), integers(rng, (n,), -2, 2) + 0.25
    return normal(rng, x_dims), normal(rng, w_dims, 0.5), normal(rng, (n,), 0.5)


@e2e_settings(3)
@given(
    lead=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3),
    k=sides,
    n=sides,
    w_kind=weight_kinds,
    bias_kind=leaf_kinds,
    seed=seeds,
)
def test_fused_matmul_bias_act_every_activation(
    lead: tuple[int, ...], k: int, n: int, w_kind: str, bias_kind: str, seed: int
) -> None:
    """One node per activation kind (and None) in one graph; each node has its own operands."""
    rng = rng_for(seed)
    f = Feeds("fused_matmul_bias_act")
    outputs = []
    for kind in [None, *ActivationKind]:
        label = "none" if kind is None else kind.value.lower()
        xv, wv, bv = _operands(rng, kind, lead, k, n)
        x = f.input(f"x_{label}", xv)
        w = f.leaf(w_kind, f"w_{label}", wv)
        bias = f.leaf(bias_kind, f"bias_{label}", bv)
        outputs.append(f.graph.fused_matmul_bias_act(x, w, bias, kind, name=label))
    f.verify(outputs)
