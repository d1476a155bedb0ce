"""End-to-end: Conv (1-D/2-D/3-D, stride, padding, dilation, groups) and Pool (every kind)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, e2e_settings, normal, rng_for, seeds, signed, weight_kinds
from rlx_mil.ir.ops import ReduceOp


@dataclass(frozen=True)
class ConvCase:
    batch: int
    in_channels: int
    out_channels: int
    groups: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]


@st.composite
def conv_cases(draw: st.DrawFn, rank: int) -> ConvCase:
    groups = draw(st.integers(1, 3))
    in_channels = groups * draw(st.integers(1, 2))
    out_channels = groups * draw(st.integers(1, 2))
    kernel, stride, padding, dilation, spatial = [], [], [], [], []
    for _ in range(rank):
        k = draw(st.integers(1, 3))
        d = draw(st.integers(1, 2))
        p = draw(st.integers(0, 2))
        s = draw(st.integers(1, 2))
        span = d * (k - 1) + 1
        size = draw(st.integers(max(1, span - 2 * p), max(1, span - 2 * p) + (3 if rank < 3 else 2)))
        kernel.append(k)
        dilation.append(d)
        padding.append(p)
        stride.append(s)
        spatial.append(size)
    return ConvCase(draw(st.integers(1, 2)), in_channels, out_channels, groups, tuple(spatial),
                    tuple(kernel), tuple(stride), tuple(padding), tuple(dilation))


@pytest.mark.parametrize("rank", [1, 2, 3], ids=["1d", "2d", "3d"])
@e2e_settings(2)
@given(data=st.data(), weight_kind=weight_kinds, seed=seeds)
def test_conv(rank: int, data: st.DataObject, weight_kind: str, seed: int) -> None:
    """NCHW cross-correlation with symmetric zero padding; weights const or at run time
    (run-time weights with dilation take the zero-tap path)."""
    case = data.draw(conv_cases(rank))
    rng = rng_for(seed)
    f = Feeds("conv")
    x = f.input("x", normal(rng, (case.batch, case.in_channels, *case.spatial)))
    w = f.leaf(weight_kind, "w", normal(rng, (case.out_channels, case.in_channels // case.groups, *case.kernel), 0.5))
    out = f.graph.conv(x, w, stride=case.stride, padding=case.padding, dilation=case.dilation,
                       groups=case.groups, name="conv")
    f.verify([out])


@dataclass(frozen=True)
class PoolCase:
    dims: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]


@st.composite
def pool_cases(draw: st.DrawFn, rank: int) -> PoolCase:
    """Padding at most half the kernel (as PyTorch), so no window is all padding."""
    kernel, stride, padding, spatial = [], [], [], []
    for _ in range(rank):
        k = draw(st.integers(1, 3))
        p = draw(st.integers(0, k // 2))
        kernel.append(k)
        padding.append(p)
        stride.append(draw(st.integers(1, 3)))
        spatial.append(draw(st.integers(max(1, k - 2 * p), 6)))
    dims = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *spatial)
    return PoolCase(dims, tuple(kernel), tuple(stride), tuple(padding))


@pytest.mark.parametrize("rank", [1, 2], ids=["1d", "2d"])
@e2e_settings(3)
@given(data=st.data(), seed=seeds)
def test_every_pool_kind(rank: int, data: st.DataObject, seed: int) -> None:
    """Max/Min ignore padded cells, Mean divides by the full kernel area (count_include_pad),
    Sum/Prod pad with their identities. Magnitudes in [0.6, 1.4] keep Prod in range."""
    case = data.draw(pool_cases(rank))
    rng = rng_for(seed)
    f = Feeds("pool")
    x = f.input("x", signed(rng, case.dims, 0.6, 1.4))
    outputs = [
        f.graph.pool(x, kind, case.kernel, case.stride, case.padding, name=kind.value.lower()) for kind in ReduceOp
    ]
    f.verify(outputs)
