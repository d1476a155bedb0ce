"""What upstream graphs carry that is no IR op of its own - the `Custom` names read as IR ops and
C64 tensors read as interleaved F32 pairs - converted for every target that can hold it and
run by the executor against the reference: fp32 on every target, fp16 on the newest. (The
builder ops themselves are checked on every target by the catalogue, test_op_catalogue.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from rlx_mil import milexec, reference
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import graph_from_json
from rlx_mil.ir.serde.custom import READ_FORMS
from rlx_mil.lowering.target import Precision
from rlx_mil.testing import DEFAULT_TOLERANCES, Tolerance, compare, supported_targets

from .conftest import convert_and_cleanup

Feeds = dict[str, np.ndarray]


def _node(i: int, op: object, inputs: list[int], dims: list[int], dtype: str = "F32",
          name: str | None = None) -> dict[str, object]:
    return {"id": i, "op": op, "inputs": inputs, "shape": {"dims": [{"Static": d} for d in dims], "dtype": dtype},
            "name": name, "origin": None}


def _graph(leaves: list[tuple[str, list[int], str]], op: object, out_dims: list[int], out_dtype: str = "F32") -> Graph:
    nodes = [_node(i, {"Input": {"name": name}}, [], dims, dtype) for i, (name, dims, dtype) in enumerate(leaves)]
    nodes.append(_node(len(leaves), op, list(range(len(leaves))), out_dims, out_dtype, "out"))
    return graph_from_json(json.dumps({"name": "read", "nodes": nodes, "outputs": [len(leaves)]}))


def _custom(name: str, count: int, attrs: list[int]) -> dict[str, object]:
    return {"Custom": {"name": name, "num_inputs": count, "attrs": attrs}}


def _i32(*values: int) -> list[int]:
    return [b for v in values for b in v.to_bytes(4, "little", signed=True)]


def _rng() -> np.random.Generator:
    return np.random.default_rng(5)


def _scatter_nd() -> tuple[Graph, Feeds]:
    g = _graph([("data", [4, 3], "F32"), ("idx", [2, 1], "I32"), ("upd", [2, 3], "F32")],
               _custom("onnx.ScatterND", 3, _i32(1)), [4, 3])
    r = _rng()
    return g, {"data": r.standard_normal((4, 3)).astype(np.float32), "idx": np.asarray([[3], [1]], np.int32),
               "upd": r.standard_normal((2, 3)).astype(np.float32)}


def _mod() -> tuple[Graph, Feeds]:
    g = _graph([("a", [2, 5], "F32"), ("b", [2, 5], "F32")], _custom("onnx.Mod", 2, [0]), [2, 5])
    r = _rng()
    b = r.choice(np.asarray([-3.0, -0.5, 0.75, 2.0], np.float32), size=(2, 5))
    return g, {"a": (r.standard_normal((2, 5)) * 10).astype(np.float32), "b": b}


def _is_nan() -> tuple[Graph, Feeds]:
    g = _graph([("a", [2, 5], "F32")], _custom("onnx.IsNaN", 1, []), [2, 5], "Bool")
    a = _rng().standard_normal((2, 5)).astype(np.float32)
    a[0, 1] = a[1, 4] = np.nan
    return g, {"a": a}


def _gather_nd() -> tuple[Graph, Feeds]:
    g = _graph([("data", [2, 4, 3], "F32"), ("idx", [3, 2], "I64")], _custom("onnx.GatherND", 2, _i32(0)), [3, 3])
    return g, {"data": _rng().standard_normal((2, 4, 3)).astype(np.float32),
               "idx": np.asarray([[1, 3], [-1, 0], [5, -9]], np.int64)}  # a wrapped and two clamped


def _gather_elements() -> tuple[Graph, Feeds]:
    g = _graph([("data", [3, 4], "F32"), ("idx", [3, 2], "I32")], _custom("onnx.GatherElements", 2, _i32(-1)), [3, 2])
    return g, {"data": _rng().standard_normal((3, 4)).astype(np.float32),
               "idx": np.asarray([[0, 3], [-1, 2], [7, 1]], np.int32)}


def _one_hot() -> tuple[Graph, Feeds]:
    g = _graph([("idx", [3], "I64"), ("depth", [1], "I64"), ("values", [2], "F32")],
               _custom("onnx.OneHot", 3, _i32(-1)), [3, 4])
    return g, {"idx": np.asarray([2, -1, 9], np.int64), "depth": np.asarray([4], np.int64),
               "values": np.asarray([-0.5, 3.0], np.float32)}


def _cum_prod() -> tuple[Graph, Feeds]:
    g = _graph([("x", [2, 3], "F32")], _custom("onnx.CumProd", 1, [*_i32(1), 0, 1]), [2, 3])
    return g, {"x": _rng().uniform(0.5, 1.5, (2, 3)).astype(np.float32)}


def _einsum() -> tuple[Graph, Feeds]:
    g = _graph([("a", [2, 3], "F32"), ("b", [3, 4], "F32")], _custom("onnx.Einsum", 2, list(b"ij,jk->ki")), [4, 2])
    r = _rng()
    return g, {"a": r.standard_normal((2, 3)).astype(np.float32), "b": r.standard_normal((3, 4)).astype(np.float32)}


def _scatter_elements() -> tuple[Graph, Feeds]:
    g = _graph([("data", [3, 4], "F32"), ("idx", [1, 4], "I64"), ("upd", [1, 4], "F32")],
               _custom("onnx.ScatterElements", 3, _i32(0, 1)), [3, 4])
    r = _rng()
    return g, {"data": r.standard_normal((3, 4)).astype(np.float32), "idx": np.asarray([[2, 0, -1, 5]], np.int64),
               "upd": r.standard_normal((1, 4)).astype(np.float32)}


def _alignment_range() -> tuple[Graph, Feeds]:
    g = _graph([("frames", [1], "I64")], _custom("onnx.AlignmentRange", 1, []), [7], "I64")
    return g, {"frames": np.asarray([4], np.int64)}


def _expand_i64_align() -> tuple[Graph, Feeds]:
    g = _graph([("data", [5], "I64"), ("n", [1], "I64")], _custom("onnx.ExpandI64Align", 2, []), [2, 4], "I64")
    return g, {"data": np.asarray([7, -3, 2, 9, 4], np.int64), "n": np.asarray([6], np.int64)}


def _vocoder_waveform_slice() -> tuple[Graph, Feeds]:
    g = _graph([("wave", [1, 2, 1300], "F32"), ("frames", [1], "I64")], _custom("onnx.VocoderWaveformSlice", 2, []),
               [1, 2, 1250])
    return g, {"wave": _rng().standard_normal((1, 2, 1300)).astype(np.float32), "frames": np.asarray([2], np.int64)}


def _non_zero() -> tuple[Graph, Feeds]:
    g = _graph([("x", [3, 4], "F32")], _custom("onnx.NonZero", 1, []), [2, 5], "I64")
    x = np.asarray([[0, 1.5, 0, 0], [2, 0, 0, -1], [0, 0, 3, 0]], np.float32)
    return g, {"x": x}


def _complex() -> tuple[Graph, Feeds]:
    nodes = [
        _node(0, {"Input": {"name": "z"}}, [], [2, 6], "C64"),
        _node(1, {"Input": {"name": "w"}}, [], [2, 6], "C64"),
        _node(2, {"Fft": {"inverse": False, "norm": "Ortho"}}, [0], [2, 6], "C64"),
        _node(3, "ComplexNormSq", [2], [2, 6], "F32", "power"),
        _node(4, {"Binary": "Mul"}, [2, 1], [2, 6], "C64"),
        _node(5, "Conjugate", [4], [2, 6], "C64", "product"),
    ]
    g = graph_from_json(json.dumps({"name": "complex", "nodes": nodes, "outputs": [3, 5]}))
    r = _rng()
    return g, {"z": r.standard_normal((2, 12)).astype(np.float32), "w": r.standard_normal((2, 12)).astype(np.float32)}


CASES: dict[str, Callable[[], tuple[Graph, Feeds]]] = {
    "onnx.ScatterND": _scatter_nd, "onnx.Mod": _mod, "onnx.IsNaN": _is_nan, "onnx.GatherND": _gather_nd,
    "onnx.GatherElements": _gather_elements, "onnx.OneHot": _one_hot, "onnx.CumProd": _cum_prod,
    "onnx.Einsum": _einsum, "onnx.ScatterElements": _scatter_elements, "onnx.AlignmentRange": _alignment_range,
    "onnx.ExpandI64Align": _expand_i64_align, "onnx.VocoderWaveformSlice": _vocoder_waveform_slice,
    "onnx.NonZero": _non_zero, "C64": _complex,
}


def test_every_read_custom_name_has_a_case() -> None:
    assert set(READ_FORMS) == set(CASES) - {"C64"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_read_forms_match_the_reference_on_every_target(case: str) -> None:
    graph, feeds = CASES[case]()
    want = reference.evaluate(graph, feeds)
    targets = supported_targets(graph)
    assert targets, f"{case}: no target lowers every op it is read as"
    runs = [(target, Precision.FP32) for target in targets] + [(targets[-1], Precision.FP16)]
    for target, precision in runs:
        got = milexec.run(convert_and_cleanup(graph, {}, target=target, precision=precision.value), feeds)
        tol = Tolerance(1e-5, 1e-5) if precision is Precision.FP32 else DEFAULT_TOLERANCES[precision]
        for name, value in want.items():
            ok, _, detail = compare(np.asarray(got[name], np.float32), np.asarray(value, np.float32), tol)
            assert ok, f"{case} {target.label} {precision.value} {name}: {detail}"
