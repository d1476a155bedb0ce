"""coremltools' gelu and prelu fusions match against pattern programs built once per process
(`rlx_mil.coreml.pipeline.fusion_patterns_built_once`): every run after the first still fuses,
and the patterns are restored afterwards."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

from rlx_mil.coreml import patches
from rlx_mil.coreml.pipeline import FUSION_PATTERNS, fusion_patterns_built_once


def _gelu_tanh_spelled_out(scale_first: bool) -> Any:
    """The two spellings of the tanh-approximated gelu `fuse_gelu_tanh_approximation` knows."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3, 4))])
    def prog(x: Any) -> Any:
        inner = mb.mul(x=0.7978845834732056, y=mb.add(x=x, y=mb.mul(x=0.044714998453855515, y=mb.pow(x=x, y=3.0))))
        one_plus = mb.add(x=1.0, y=mb.tanh(x=inner))
        if scale_first:
            return mb.mul(x=mb.mul(x=0.5, y=x), y=one_plus)
        return mb.mul(x=mb.mul(x=0.5, y=one_plus), y=x)

    return prog


def _prelu_spelled_out(transposed: bool) -> Any:
    """`a * relu(-x) + relu(x)`, on a BCHW tensor or after a transpose to BHWC."""
    channels = 3

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, channels, 4, 5))])
    def prog(x: Any) -> Any:
        alpha = np.float32([0.1, 0.2, 0.3])
        if transposed:
            x = mb.transpose(x=x, perm=[0, 2, 3, 1])
        else:
            alpha = alpha.reshape(channels, 1, 1)
        negative = mb.mul(x=mb.relu(x=mb.mul(x=x, y=-1.0)), y=alpha)
        return mb.add(x=mb.relu(x=x), y=negative)

    return prog


def _op_types(prog: Any) -> list[str]:
    return [op.op_type for op in prog.functions["main"].operations]


CASES = [
    ("common::fuse_gelu_tanh_approximation", lambda: _gelu_tanh_spelled_out(False), ["gelu"]),
    ("common::fuse_gelu_tanh_approximation", lambda: _gelu_tanh_spelled_out(True), ["gelu"]),
    ("common::fuse_prelu", lambda: _prelu_spelled_out(False), ["prelu"]),
    ("common::fuse_prelu", lambda: _prelu_spelled_out(True), ["prelu", "transpose"]),
]


@pytest.mark.parametrize(("pass_name", "build", "fused"), CASES, ids=["gelu1", "gelu2", "prelu1", "prelu2"])
def test_every_run_with_the_built_patterns_still_fuses(pass_name: str, build: Any, fused: list[str]) -> None:
    fuse = PASS_REGISTRY[pass_name]
    with fusion_patterns_built_once():
        for _ in range(3):  # the first run builds the patterns, the later ones reuse them
            prog = build()
            assert fused[0] not in _op_types(prog)
            fuse(prog)
            assert [t for t in _op_types(prog) if t != "const"] == fused


def test_the_patterns_are_built_once_and_restored_after() -> None:
    originals = {target: patches.current(target) for target in FUSION_PATTERNS}
    assert len(originals) == 4
    with fusion_patterns_built_once():
        for target in FUSION_PATTERNS:
            owner, attribute = patches.resolve(target)
            first = getattr(owner, attribute)()
            assert getattr(owner, attribute)() is first
            with fusion_patterns_built_once():  # nested (a conversion inside a conversion)
                assert getattr(owner, attribute)() is first
    assert {target: patches.current(target) for target in FUSION_PATTERNS} == originals
    for target in FUSION_PATTERNS:  # outside, each call builds a new program as coremltools does
        owner, attribute = patches.resolve(target)
        assert getattr(owner, attribute)() is not getattr(owner, attribute)()
