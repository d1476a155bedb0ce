"""Shape rules of the vision / audio / diffusion ops refuse bad attributes and shapes with typed
errors naming the node and operand (part-2 spec section 5)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlx_mil.errors import AttributeValueError, DTypeError, GraphError, ShapeError
from rlx_mil.ir.graph import Graph

Build = Callable[[Graph], int]


def _conv_transpose_wrong_c_in(g: Graph) -> int:
    return g.conv_transpose2d(g.input("x", [1, 2, 3, 3]), g.param("w", [3, 1, 2, 2]), stride=2)


def _conv_transpose_empty_output(g: Graph) -> int:
    return g.conv_transpose2d(g.input("x", [1, 2, 1, 1]), g.param("w", [2, 1, 1, 1]), padding=1)


def _conv3d_two_strides(g: Graph) -> int:
    return g.conv3d(g.input("x", [1, 2, 3, 3, 3]), g.param("w", [2, 2, 1, 1, 1]), stride=[1, 1])


def _conv3d_rank4(g: Graph) -> int:
    return g.conv3d(g.input("x", [1, 2, 3, 3]), g.param("w", [2, 2, 1, 1]))


def _fused_conv_bad_bias(g: Graph) -> int:
    return g.fused_conv_bias_act(g.input("x", [1, 2, 3, 3]), g.param("w", [4, 2, 1, 1]), g.param("b", [3]))


def _fused_conv_bad_residual(g: Graph) -> int:
    x, w, b = g.input("x", [1, 2, 3, 3]), g.param("w", [4, 2, 1, 1]), g.param("b", [4])
    return g.fused_conv_bias_act(x, w, b, "relu", residual=g.input("r", [1, 4, 2, 3]))


def _batch_norm_stats_on_axis_1(g: Graph) -> int:
    stats = [g.param(n, [2]) for n in ("g", "b", "m", "v")]
    return g.batch_norm_inference(g.input("x", [1, 2, 3]), *stats)


def _batch_norm_negative_eps(g: Graph) -> int:
    stats = [g.param(n, [3]) for n in ("g", "b", "m", "v")]
    return g.batch_norm_inference(g.input("x", [1, 2, 3]), *stats, eps=-1.0)


def _layer_norm_2d_rank3(g: Graph) -> int:
    return g.layer_norm_2d(g.input("x", [2, 3, 4]), g.param("g", [3]), g.param("b", [3]))


def _ada_scale_too_wide(g: Graph) -> int:
    x = g.input("x", [2, 3, 4])
    return g.ada_layer_norm(x, g.input("s", [2, 3, 3]), g.input("t", [2, 1, 4]))


def _ada_int_x(g: Graph) -> int:
    x = g.input("x", [2, 4], "i32")
    return g.ada_layer_norm(x, g.input("s", [4]), g.input("t", [4]))


def _gated_gate_grows(g: Graph) -> int:
    x = g.input("x", [3, 4])
    return g.gated_residual(x, g.input("y", [3, 4]), g.input("gate", [2, 3, 4]))


CASES: dict[str, tuple[Build, type[GraphError], str | None]] = {
    "conv_transpose_wrong_c_in": (_conv_transpose_wrong_c_in, ShapeError, "w"),
    "conv_transpose_empty_output": (_conv_transpose_empty_output, ShapeError, "x"),
    "conv3d_two_strides": (_conv3d_two_strides, AttributeValueError, None),
    "conv3d_rank4": (_conv3d_rank4, ShapeError, "x"),
    "fused_conv_bad_bias": (_fused_conv_bad_bias, ShapeError, "bias"),
    "fused_conv_bad_residual": (_fused_conv_bad_residual, ShapeError, "residual"),
    "batch_norm_stats_on_axis_1": (_batch_norm_stats_on_axis_1, ShapeError, "gamma"),
    "batch_norm_negative_eps": (_batch_norm_negative_eps, AttributeValueError, None),
    "layer_norm_2d_rank3": (_layer_norm_2d_rank3, ShapeError, "x"),
    "ada_scale_too_wide": (_ada_scale_too_wide, ShapeError, "scale"),
    "ada_int_x": (_ada_int_x, DTypeError, "x"),
    "gated_gate_grows": (_gated_gate_grows, ShapeError, "gate"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_node_is_a_typed_error_naming_node_and_operand(case: str) -> None:
    build, error, operand = CASES[case]
    g = Graph(case)
    with pytest.raises(error) as caught:
        build(g)
    assert caught.value.node == len(g), "the error names the node that was being added"
    if operand is not None:
        assert caught.value.operand == operand
