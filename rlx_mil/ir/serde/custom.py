"""Upstream's `Custom { name, num_inputs, attrs }` ops: the one name upstream's Core ML backend
lowers itself, `onnx.ScatterND` (3 inputs), is read as ScatterNd with the reduction its
first four attrs bytes give (a little-endian i32: 0 none, 1 add, 2 mul, 3 max, 4 min; fewer
than four bytes = none). Every other name is refused by name (docs/upstream-ops-3.md)."""

from __future__ import annotations

from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.ops.scatter import ScatterNd, ScatterNdReduction
from rlx_mil.ir.serde.codecs import describe, fail, json_array

SCATTER_ND_NAME = "onnx.ScatterND"
_REDUCTIONS = (ScatterNdReduction.NONE, ScatterNdReduction.ADD, ScatterNdReduction.MUL, ScatterNdReduction.MAX,
               ScatterNdReduction.MIN)


def decode_custom(content: object, path: str) -> ScatterNd:
    name = content.get("name") if isinstance(content, dict) else None
    num_inputs = content.get("num_inputs") if isinstance(content, dict) else None
    if name != SCATTER_ND_NAME or num_inputs != 3:
        raise UnsupportedOpFormatError(
            f"{path}: upstream Custom op {name!r} ({describe(num_inputs)} inputs) is not supported by rlx_mil:"
            f" its meaning lives in upstream's run-time op registry; only {SCATTER_ND_NAME!r} with 3 inputs is read"
        )
    assert isinstance(content, dict)
    attrs = json_array(content.get("attrs", []), f"{path}.attrs")
    raw = [b for b in attrs if type(b) is int and 0 <= b <= 255]
    if len(raw) != len(attrs):
        fail(f"{path}.attrs", f"expected byte values 0..255, got {describe(attrs)}")
    code = int.from_bytes(bytes(raw[:4]), "little", signed=True) if len(raw) >= 4 else 0
    if not 0 <= code < len(_REDUCTIONS):
        raise UnsupportedOpFormatError(f"{path}.attrs: {SCATTER_ND_NAME} reduction code {code} is not one of 0..4")
    return ScatterNd(_REDUCTIONS[code])
