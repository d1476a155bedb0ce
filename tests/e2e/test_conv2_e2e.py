"""End-to-end: ConvTranspose2d, ConvTranspose3d, Conv3d and FusedConvBiasAct (part-2 spec 5)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from e2e.factory import Feeds, e2e_settings, normal, rng_for, seeds, weight_kinds
from rlx_mil import reference
from rlx_mil.api import convert
from rlx_mil.errors import UnsupportedOpError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Target


@dataclass(frozen=True)
class TransposeCase:
    groups: int
    in_channels: int
    out_per_group: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]


@st.composite
def transpose_cases(draw: st.DrawFn, rank: int) -> TransposeCase:
    """Any padding below the dilated kernel, output_padding below max(stride, dilation) (PyTorch's
    range; above `padding` it takes the zero-extension path)."""
    groups = draw(st.integers(1, 2))
    kernel, stride, padding, dilation, extra, spatial = [], [], [], [], [], []
    for _ in range(rank):
        k, s, d = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
        kernel.append(k)
        stride.append(s)
        dilation.append(d)
        padding.append(draw(st.integers(0, d * (k - 1) // 2)))
        extra.append(draw(st.integers(0, max(s, d) - 1)))
        spatial.append(draw(st.integers(1, 3)))
    return TransposeCase(groups, groups * draw(st.integers(1, 2)), draw(st.integers(1, 2)), tuple(spatial),
                         tuple(kernel), tuple(stride), tuple(padding), tuple(dilation), tuple(extra))


def _modern(weight_kind: str) -> list[Target] | None:
    """Run-time conv_transpose weights need iOS17 (const weights only before)."""
    return [t for t in Target if t >= Target.IOS17] if weight_kind == "input" else None


@pytest.mark.parametrize("rank", [2, 3], ids=["2d", "3d"])
@e2e_settings(3)
@given(data=st.data(), weight_kind=weight_kinds, seed=seeds)
def test_conv_transpose(rank: int, data: st.DataObject, weight_kind: str, seed: int) -> None:
    case = data.draw(transpose_cases(rank))
    rng = rng_for(seed)
    f = Feeds("conv_transpose")
    x = f.input("x", normal(rng, (1, case.in_channels, *case.spatial)))
    w = f.leaf(weight_kind, "w", normal(rng, (case.in_channels, case.out_per_group, *case.kernel), 0.5))
    build = f.graph.conv_transpose2d if rank == 2 else f.graph.conv_transpose3d
    out = build(x, w, stride=case.stride, padding=case.padding, dilation=case.dilation,
                output_padding=case.output_padding, groups=case.groups, name="deconv")
    f.verify([out], targets=_modern(weight_kind))


def test_conv_transpose_with_a_run_time_weight_names_ios17() -> None:
    g = Graph("deconv")
    x, w = g.input("x", [1, 2, 2, 2]), g.input("w", [2, 1, 2, 2])
    g.set_outputs([g.conv_transpose2d(x, w, stride=2, name="y")])
    with pytest.raises(UnsupportedOpError, match="iOS17"):
        convert(g, {}, target=Target.IOS16)


def test_conv_transpose_is_the_adjoint_of_conv() -> None:
    """<conv(a, w), b> == <a, conv_transpose(b, w)> for the matching geometry."""
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((1, 2, 7, 6)), rng.standard_normal((3, 2, 3, 2))
    g = Graph("adjoint")
    ai, wi = g.input("a", [1, 2, 7, 6]), g.input("w", [3, 2, 3, 2])
    conv = g.conv(ai, wi, stride=2, padding=1, dilation=[1, 2], name="conv")
    b = rng.standard_normal((1, 3, 4, 3))
    bi = g.input("b", [1, 3, 4, 3])
    back = g.conv_transpose2d(bi, wi, stride=2, padding=1, dilation=[1, 2], output_padding=[0, 1], name="back")
    g.set_outputs([conv, back])
    out = reference.evaluate(g, {"a": a.astype(np.float32), "w": w.astype(np.float32), "b": b.astype(np.float32)})
    assert out["back"].shape == a.shape
    np.testing.assert_allclose(np.sum(out["conv"] * b), np.sum(a * out["back"]), rtol=1e-4)


@e2e_settings(2)
@given(groups=st.integers(1, 2), weight_kind=weight_kinds, dilation=st.integers(1, 2), seed=seeds)
def test_conv3d(groups: int, weight_kind: str, dilation: int, seed: int) -> None:
    rng = rng_for(seed)
    f = Feeds("conv3d")
    x = f.input("x", normal(rng, (1, 2 * groups, 3, 4, 5)))
    w = f.leaf(weight_kind, "w", normal(rng, (2 * groups, 2, 2, 2, 3), 0.5))
    f.verify([f.graph.conv3d(x, w, stride=[1, 2, 1], padding=[1, 0, 1], dilation=[1, 1, dilation],
                             groups=groups, name="conv3d")])


@e2e_settings(3)
@given(
    activation=st.sampled_from([None, "relu", "silu", "gelu", "sigmoid"]),
    has_residual=st.booleans(),
    bias_kind=weight_kinds,
    stride=st.integers(1, 2),
    seed=seeds,
)
def test_fused_conv_bias_act(activation: str | None, has_residual: bool, bias_kind: str, stride: int, seed: int) -> None:
    rng = rng_for(seed)
    f = Feeds("fused_conv")
    x = f.input("x", normal(rng, (2, 3, 5, 4)))
    w = f.param("w", normal(rng, (4, 3, 3, 3), 0.3))
    bias = f.leaf(bias_kind, "bias", normal(rng, (4,), 0.5))
    out_h, out_w = (5 - 1) // stride + 1, (4 - 1) // stride + 1
    residual = f.input("residual", normal(rng, (2, 4, out_h, out_w))) if has_residual else None
    f.verify([f.graph.fused_conv_bias_act(x, w, bias, activation, residual=residual, stride=stride, padding=1,
                                          name="fused")])
