"""JSON of the vision / audio / diffusion ops (part-2 spec section 5): upstream's spelling of each
op loads, names the right attributes and re-serialises byte-identically."""

from __future__ import annotations

import json

import pytest

from rlx_mil.errors import GraphFormatError
from rlx_mil.ir import ops
from rlx_mil.ir.graph import Graph


def _graph_json(op: str, inputs: list[list[int]], out: list[int]) -> str:
    """One node applying `op` (upstream JSON text, floats as upstream writes them) to F32 inputs
    of the given shapes."""

    def shape(dims: list[int]) -> dict[str, object]:
        return {"dims": [{"Static": d} for d in dims], "dtype": "F32"}

    nodes: list[dict[str, object]] = [
        {"id": i, "op": {"Input": {"name": f"in{i}"}}, "inputs": [], "shape": shape(dims), "name": f"in{i}", "origin": None}
        for i, dims in enumerate(inputs)
    ]
    nodes.append({"id": len(inputs), "op": "@OP@", "inputs": list(range(len(inputs))), "shape": shape(out),
                  "name": "y", "origin": None})
    text = json.dumps({"name": "g", "nodes": nodes, "outputs": [len(inputs)]}, separators=(",", ":"))
    return text.replace('"@OP@"', op)


#: (upstream op JSON, input shapes, output shape, expected op).
CASES = {
    "BatchNormInference": (
        '{"BatchNormInference":{"eps":0.00001}}', [[2, 3], [3], [3], [3], [3]], [2, 3], ops.BatchNormInference(1e-5),
    ),
    "LayerNorm2d": ('{"LayerNorm2d":{"eps":0.000001}}', [[1, 3, 2, 2], [3], [3]], [1, 3, 2, 2], ops.LayerNorm2d(1e-6)),
    "AdaLayerNorm": (
        '{"AdaLayerNorm":{"norm":"RmsNorm","eps":0.000001}}', [[2, 3, 4], [2, 1, 4], [2, 1, 4]], [2, 3, 4],
        ops.AdaLayerNorm(ops.AdaNormKind.RMS_NORM, 1e-6),
    ),
    "GatedResidual": ('"GatedResidual"', [[2, 4], [2, 4], [4]], [2, 4], ops.GatedResidual()),
    "ConvTranspose2d": (
        '{"ConvTranspose2d":{"kernel_size":[4,4],"stride":[2,2],"padding":[1,1],"dilation":[1,1],'
        '"output_padding":[0,0],"groups":1}}',
        [[1, 2, 3, 3], [2, 5, 4, 4]], [1, 5, 6, 6], ops.ConvTranspose2d((4, 4), (2, 2), (1, 1), (1, 1), (0, 0), 1),
    ),
    "Conv3d": (
        '{"Conv3d":{"stride":[1,2,2],"padding":[1,1,1],"dilation":[1,1,1],"groups":1}}',
        [[1, 2, 4, 4, 4], [3, 2, 3, 3, 3]], [1, 3, 4, 2, 2], ops.Conv3d((1, 2, 2), (1, 1, 1), (1, 1, 1), 1),
    ),
    "ConvTranspose3d": (
        '{"ConvTranspose3d":{"stride":[2,2,2],"padding":[0,0,0],"dilation":[1,1,1],"output_padding":[0,0,0],'
        '"groups":1}}',
        [[1, 2, 2, 2, 2], [2, 3, 2, 2, 2]], [1, 3, 4, 4, 4],
        ops.ConvTranspose3d((2, 2, 2), (0, 0, 0), (1, 1, 1), (0, 0, 0), 1),
    ),
    "FusedConvBiasAct": (
        '{"FusedConvBiasAct":{"kernel_size":[3,3],"stride":[1,1],"padding":[1,1],"dilation":[1,1],"groups":1,'
        '"activation":"Relu","has_residual":false}}',
        [[1, 2, 4, 4], [3, 2, 3, 3], [3]], [1, 3, 4, 4],
        ops.FusedConvBiasAct((3, 3), (1, 1), (1, 1), (1, 1), 1, ops.ActivationKind.RELU, False),
    ),
    "ResizeNearest2x": ('"ResizeNearest2x"', [[1, 2, 3, 3]], [1, 2, 6, 6], ops.ResizeNearest2x()),
    "Interpolate3d": (
        '{"Interpolate3d":{"size":[8,32,32]}}', [[1, 2, 4, 16, 16]], [1, 2, 8, 32, 32], ops.Interpolate3d((8, 32, 32)),
    ),
    "AxialRope2d": (
        '{"AxialRope2d":{"end_x":4,"end_y":2,"head_dim":8,"num_heads":1,"theta":10000.0,"repeat_factor":1}}',
        [[1, 8, 8]], [1, 8, 8], ops.AxialRope2d(4, 2, 8, 1, 10000.0, 1),
    ),
    "LogMel": ('"LogMel"', [[3, 16], [4, 5]], [3, 4], ops.LogMel()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_upstream_json_loads_and_round_trips(name: str) -> None:
    op_json, inputs, out, expected = CASES[name]
    text = _graph_json(op_json, inputs, out)
    graph = Graph.from_json(text)
    assert graph.node(len(inputs)).op == expected
    assert graph.to_json() == text


def test_unknown_ada_norm_kind_is_a_format_error() -> None:
    text = _graph_json('{"AdaLayerNorm":{"norm":"GroupNorm","eps":0.000001}}', [[2, 4], [4], [4]], [2, 4])
    with pytest.raises(GraphFormatError, match="AdaNormKind"):
        Graph.from_json(text)
