"""Upstream's `Custom { name, num_inputs, attrs }` ops. Upstream's Core ML backend lowers one name
itself, `onnx.ScatterND` (3 inputs), and runs the rest of what it knows on the host between Core
ML segments: its own `collective.*` ops and rlx-cpu's ONNX reference kernels. rlx_mil reads the
names whose host kernel is an IR op exactly, as that op (docs/upstream-ops-3.md):

* `onnx.ScatterND` -> ScatterNd with the reduction its first four attrs bytes give (a
  little-endian i32: 0 none, 1 add, 2 mul, 3 max, 4 min; fewer than four bytes = none);
* `onnx.Mod` (2 inputs) -> Binary Mod: the kernel's float remainder `a - trunc(a / b) * b` (both
  `fmod` attrs) is C fmod, the sign of a, NaN for b = 0; integers give 0 for b = 0, as the IR's;
* `onnx.IsNaN` (1 input) -> Compare Ne of the input with itself (true exactly where it is NaN).

Every other name is refused by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.op_base import Op
from rlx_mil.ir.ops.elementwise import Binary, BinaryOp, CmpOp, Compare
from rlx_mil.ir.ops.scatter import ScatterNd, ScatterNdReduction
from rlx_mil.ir.serde.codecs import describe, fail, json_array

SCATTER_ND_NAME = "onnx.ScatterND"
IS_NAN_NAME = "onnx.IsNaN"
_REDUCTIONS = (ScatterNdReduction.NONE, ScatterNdReduction.ADD, ScatterNdReduction.MUL, ScatterNdReduction.MAX,
               ScatterNdReduction.MIN)


def _scatter_nd(attrs: bytes, path: str) -> Op:
    code = int.from_bytes(attrs[:4], "little", signed=True) if len(attrs) >= 4 else 0
    if not 0 <= code < len(_REDUCTIONS):
        raise UnsupportedOpFormatError(f"{path}.attrs: {SCATTER_ND_NAME} reduction code {code} is not one of 0..4")
    return ScatterNd(_REDUCTIONS[code])


#: name -> (num_inputs, the IR op from the attrs bytes).
READ_AS: dict[str, tuple[int, Callable[[bytes, str], Op]]] = {
    SCATTER_ND_NAME: (3, _scatter_nd),
    "onnx.Mod": (2, lambda attrs, path: Binary(BinaryOp.MOD)),
    IS_NAN_NAME: (1, lambda attrs, path: Compare(CmpOp.NE)),
}


def decode_custom(content: object, path: str) -> Op:
    name = content.get("name") if isinstance(content, dict) else None
    num_inputs = content.get("num_inputs") if isinstance(content, dict) else None
    reading = READ_AS.get(name) if isinstance(name, str) else None
    if reading is None or num_inputs != reading[0]:
        known = ", ".join(f"{n!r} ({arity} inputs)" for n, (arity, _) in READ_AS.items())
        raise UnsupportedOpFormatError(
            f"{path}: upstream Custom op {name!r} ({describe(num_inputs)} inputs) is not supported by rlx_mil:"
            f" its meaning lives in upstream's run-time op registry; only {known} are read"
        )
    assert isinstance(content, dict)
    attrs = json_array(content.get("attrs", []), f"{path}.attrs")
    raw = [b for b in attrs if type(b) is int and 0 <= b <= 255]
    if len(raw) != len(attrs):
        fail(f"{path}.attrs", f"expected byte values 0..255, got {describe(attrs)}")
    return reading[1](bytes(raw), path)


def custom_operands(op_json: object, inputs: Sequence[int]) -> list[int]:
    """The IR op's operands for the node's inputs: IsNaN compares its one input with itself."""
    content = op_json.get("Custom") if isinstance(op_json, dict) else None
    if isinstance(content, dict) and content.get("name") == IS_NAN_NAME and len(inputs) == 1:
        return [inputs[0], inputs[0]]
    return list(inputs)
