"""Graphs that declare C64 tensors: read into interleaved F32 pairs, each complex op's value
checked against NumPy's complex arithmetic (np.fft for the interleaved Fft form), and the
converted program against the reference through the executor."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec, reference
from rlx_mil.errors import UnsupportedOpError, UnsupportedOpFormatError
from rlx_mil.ir.dtype import DType
from rlx_mil.ir.json_io import graph_from_json
from rlx_mil.testing import Tolerance, compare

from .conftest import convert_and_cleanup


def _node(i: int, op: object, inputs: list[int], dims: list[int], dtype: str, name: str | None = None) -> dict[str, object]:
    return {"id": i, "op": op, "inputs": inputs, "shape": {"dims": [{"Static": d} for d in dims], "dtype": dtype},
            "name": name, "origin": None}


def _doc(nodes: list[dict[str, object]], outputs: list[int]) -> str:
    return json.dumps({"name": "complex", "nodes": nodes, "outputs": outputs})


def _pairs(z: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(z.astype(np.complex64)).view(np.float32)


@settings(max_examples=3, deadline=None)
@given(rows=st.integers(1, 3), n=st.integers(1, 9), inverse=st.booleans(),
       norm=st.sampled_from(["Backward", "Forward", "Ortho"]), seed=st.integers(0, 2**16))
def test_c64_graphs_compute_the_complex_values(rows: int, n: int, inverse: bool, norm: str, seed: int) -> None:
    nodes = [
        _node(0, {"Input": {"name": "z"}}, [], [rows, n], "C64"),
        _node(1, {"Param": {"name": "w"}}, [], [rows, n], "C64"),
        _node(2, {"Fft": {"inverse": inverse, "norm": norm}}, [0], [rows, n], "C64", "spec"),
        _node(3, "ComplexNormSq", [2], [rows, n], "F32", "power"),
        _node(4, {"Binary": "Mul"}, [2, 1], [rows, n], "C64", "product"),
        _node(5, "Conjugate", [4], [rows, n], "C64"),
        _node(6, {"Binary": "Sub"}, [5, 0], [rows, n], "C64", "diff"),
        _node(7, {"Transpose": {"perm": [1, 0]}}, [6], [n, rows], "C64", "turned"),
        _node(8, {"Narrow": {"axis": 1, "start": n - 1, "len": 1}}, [2], [rows, 1], "C64"),
        _node(9, {"Concat": {"axis": 1}}, [8, 0], [rows, n + 1], "C64", "joined"),
        _node(10, {"Reshape": {"new_shape": [rows * (n + 1)]}}, [9], [rows * (n + 1)], "C64", "flat"),
    ]
    g = graph_from_json(_doc(nodes, [3, 4, 7, 10]))
    assert all(node.shape.dtype is not DType.C64 for node in g)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, n)) + 1j * rng.standard_normal((rows, n))
    w = rng.standard_normal((rows, n)) + 1j * rng.standard_normal((rows, n))
    z, w = z.astype(np.complex64).astype(np.complex128), w.astype(np.complex64).astype(np.complex128)
    spec = {"Backward": (np.fft.ifft(z) * n) if inverse else np.fft.fft(z),
            "Forward": np.fft.ifft(z) if inverse else np.fft.fft(z),
            "Ortho": np.fft.ifft(z, norm="ortho") if inverse else np.fft.fft(z, norm="ortho")}[norm]
    product = spec * w
    want = {"power": np.abs(spec) ** 2, "product": _pairs(product),
            "turned": _pairs((np.conj(product) - z).T),
            "joined": _pairs(np.concatenate([spec[:, -1:], z], axis=1).reshape(-1))}
    feeds, params = {"z": _pairs(z)}, {"w": _pairs(w)}
    got = reference.evaluate(g, feeds, params)
    got = {"power": got["power"], "product": got["product"], "turned": got["turned"], "joined": got["flat"]}
    scale = max(1.0, float(np.abs(spec).max()) ** 2)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-5 * scale, err_msg=key)
    reference_values = reference.evaluate(g, feeds, params)
    converted = milexec.run(convert_and_cleanup(g, params, target="iOS18", precision="fp32"), feeds)
    for name, value in reference_values.items():
        ok, _, detail = compare(converted[name], value, Tolerance(1e-5, 1e-5 * scale))
        assert ok, f"{name}: {detail}"
    assert graph_from_json(g.to_json()).to_json() == g.to_json()  # written back as the F32 pairs


@pytest.mark.parametrize(("op", "dtype", "message"), [
    ({"Binary": "Div"}, "C64", r"nodes\[2\]: Binary reads C64 values"),
    ({"Activation": "Exp"}, "C64", r"nodes\[2\]: Activation reads C64 values"),
    ({"Reduce": {"op": "Sum", "axes": [1], "keep_dim": False}}, "C64", r"nodes\[2\]: Reduce reads C64"),
])
def test_other_ops_on_c64_are_refused_by_name(op: object, dtype: str, message: str) -> None:
    nodes = [_node(0, {"Input": {"name": "a"}}, [], [2, 4], "C64"), _node(1, {"Input": {"name": "b"}}, [], [2, 4], "C64")]
    arity = 2 if "Binary" in str(op) else 1
    nodes.append(_node(2, op, [0, 1][:arity], [2, 4] if "Reduce" not in str(op) else [2], dtype))
    with pytest.raises(UnsupportedOpFormatError, match=message):
        graph_from_json(_doc(nodes, [2]))


def test_casts_into_c64_and_c128_tensors_stay_refused() -> None:
    cast = [_node(0, {"Input": {"name": "x"}}, [], [4], "F32"), _node(1, {"Cast": {"to": "C64"}}, [0], [4], "C64")]
    with pytest.raises(UnsupportedOpFormatError, match=r"nodes\[1\]: Cast makes C64 values"):
        graph_from_json(_doc(cast, [1]))
    wide = graph_from_json(_doc([_node(0, {"Input": {"name": "x"}}, [], [4], "C128")], [0]))
    with pytest.raises(UnsupportedOpError, match="complex dtype C128"):
        rlx_mil.convert(wide, {}, target="iOS18")


def test_c64_constants_and_scalars_are_their_pairs() -> None:
    c = (np.arange(3) + 1j * np.arange(3, 6)).astype(np.complex64)
    nodes = [
        _node(0, {"Constant": {"data": list(c.tobytes())}}, [], [3], "C64"),
        _node(1, {"Input": {"name": "z"}}, [], [3], "C64"),
        _node(2, {"Binary": "Add"}, [0, 1], [3], "C64", "sum"),
        _node(3, "ComplexNormSq", [0], [3], "F32", "norm"),
        _node(4, {"Input": {"name": "s"}}, [], [], "C64"),
        _node(5, {"Reshape": {"new_shape": [1]}}, [4], [1], "C64", "row"),
    ]
    g = graph_from_json(_doc(nodes, [2, 3, 5]))
    assert g.node(4).shape.sizes() == (2,)  # a C64 scalar is one (re, im) pair
    z = np.array([2 + 1j, -1 - 3j, 0.5j], np.complex64)
    got = reference.evaluate(g, {"z": _pairs(z), "s": _pairs(np.array([1 + 2j]))})
    np.testing.assert_array_equal(got["sum"].view(np.complex64), c + z)
    np.testing.assert_array_equal(got["norm"], np.abs(c) ** 2)
    np.testing.assert_array_equal(got["row"], [1.0, 2.0])
