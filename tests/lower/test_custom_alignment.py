"""Upstream's Kitten TTS alignment helpers read as IR forms: the reference against loops
transcribed from rlx-cpu's kernels (`onnx_control_flow.rs`), the converted program against the
reference, and the shapes the kernels do not slice refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil import milexec, reference
from rlx_mil.errors import UnsupportedOpFormatError
from rlx_mil.ir.graph import Graph
from rlx_mil.ir.json_io import graph_from_json
from rlx_mil.testing import Tolerance, compare

from .conftest import convert_and_cleanup


def _graph(name: str, leaves: list[tuple[str, list[int], str]], out_dims: list[int], out_dtype: str) -> Graph:
    def node(i: int, op: object, inputs: list[int], dims: list[int], dtype: str, label: str | None = None) -> dict:
        return {"id": i, "op": op, "inputs": inputs, "name": label, "origin": None,
                "shape": {"dims": [{"Static": d} for d in dims], "dtype": dtype}}

    nodes = [node(i, {"Input": {"name": leaf}}, [], dims, dtype) for i, (leaf, dims, dtype) in enumerate(leaves)]
    nodes.append(node(len(leaves), {"Custom": {"name": name, "num_inputs": len(leaves), "attrs": []}},
                      list(range(len(leaves))), out_dims, out_dtype, "out"))
    return graph_from_json(json.dumps({"name": "align", "nodes": nodes, "outputs": [len(leaves)]}))


def _alignment_range(limit: np.ndarray, total: int) -> np.ndarray:
    """`alignment_range_ids`, transcribed."""
    frames = max(int(limit.reshape(-1)[0]) if limit.size else 0, 0)
    return np.asarray([i if i < frames else 0 for i in range(total)], np.int64)


def _expand_i64_align(data: np.ndarray, shape: np.ndarray, total: int) -> np.ndarray:
    """`expand_i64_align`, transcribed."""
    n = max(int(shape.reshape(-1)[0]) if shape.size else 0, 0)
    flat = data.reshape(-1)
    out = np.zeros(total, np.int64)
    for i in range(min(n, total)):
        out[i] = flat[i] if i < flat.size else 0
    return out


def _vocoder_slice(wave: np.ndarray, frames: int, out_time: int) -> np.ndarray:
    """`vocoder_waveform_slice`, transcribed (saturating arithmetic on usize)."""
    axis = 2 if wave.ndim == 3 else wave.ndim - 1
    frames = max(frames, 0)
    end = max(frames * 600 - 10, 0)
    copy_len = min(max(end - 10, 0), max(wave.shape[axis] - 10, 0), out_time)
    out_shape = list(wave.shape)
    out_shape[axis] = out_time
    out = np.zeros(out_shape, np.float32)
    moved_in, moved_out = np.moveaxis(wave, axis, 0), np.moveaxis(out, axis, 0)
    for t in range(copy_len):
        moved_out[t] = moved_in[10 + t]
    return out


def _check_program(g: Graph, feeds: dict[str, np.ndarray]) -> None:
    want = reference.evaluate(g, feeds)["out"]
    got = milexec.run(convert_and_cleanup(g, {}, target="iOS18", precision="fp32"), feeds)["out"]
    ok, _, detail = compare(np.asarray(got, np.float32), np.asarray(want, np.float32), Tolerance(0, 0))
    assert ok, detail


@settings(max_examples=6, deadline=None)
@given(total=st.integers(1, 12), frames=st.integers(-3, 15), dtype=st.sampled_from(["I64", "I32", "F32"]),
       out_dtype=st.sampled_from(["I64", "F32"]))
def test_alignment_range_counts_up_to_the_frames(total: int, frames: int, dtype: str, out_dtype: str) -> None:
    g = _graph("onnx.AlignmentRange", [("frames", [1], dtype)], [total], out_dtype)
    feeds = {"frames": np.asarray([frames], {"I64": np.int64, "I32": np.int32, "F32": np.float32}[dtype])}
    np.testing.assert_array_equal(reference.evaluate(g, feeds)["out"], _alignment_range(feeds["frames"], total))
    _check_program(g, feeds)


@settings(max_examples=6, deadline=None)
@given(length=st.integers(1, 9), rows=st.integers(1, 3), cols=st.integers(1, 5), n=st.integers(-2, 20),
       seed=st.integers(0, 2**16))
def test_expand_i64_align_keeps_the_first_n(length: int, rows: int, cols: int, n: int, seed: int) -> None:
    g = _graph("onnx.ExpandI64Align", [("data", [length], "I64"), ("n", [1], "I64")], [rows, cols], "I64")
    feeds = {"data": np.random.default_rng(seed).integers(-50, 50, size=length).astype(np.int64),
             "n": np.asarray([n], np.int64)}
    want = _expand_i64_align(feeds["data"], feeds["n"], rows * cols).reshape(rows, cols)
    np.testing.assert_array_equal(reference.evaluate(g, feeds)["out"], want)
    _check_program(g, feeds)


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from([[700], [2, 650], [1, 2, 1250], [3, 1, 40]]), out_time=st.integers(1, 1300),
       frames=st.integers(-1, 3), seed=st.integers(0, 2**16))
def test_vocoder_waveform_slice_trims_the_wave(shape: list[int], out_time: int, frames: int, seed: int) -> None:
    axis = 2 if len(shape) == 3 else len(shape) - 1
    out_dims = [out_time if i == axis else s for i, s in enumerate(shape)]
    g = _graph("onnx.VocoderWaveformSlice", [("wave", shape, "F32"), ("frames", [1], "I64")], out_dims, "F32")
    feeds = {"wave": np.random.default_rng(seed).standard_normal(shape).astype(np.float32),
             "frames": np.asarray([frames], np.int64)}
    want = _vocoder_slice(feeds["wave"], frames, out_time)
    np.testing.assert_array_equal(reference.evaluate(g, feeds)["out"], want)
    _check_program(g, feeds)


@pytest.mark.parametrize(("leaves", "out_dims", "message"), [
    ([("wave", [2, 30], "F32"), ("frames", [1], "I64")], [3, 20], "sizes agree off the time axis"),
    ([("wave", [2, 30], "F32"), ("frames", [1], "I64")], [60], "one rank"),
    ([("wave", [2, 30], "I32"), ("frames", [1], "I64")], [2, 20], "F32 wave"),
])
def test_vocoder_slices_the_kernel_does_not_make_are_refused(leaves: list, out_dims: list[int], message: str) -> None:
    with pytest.raises(UnsupportedOpFormatError, match=message):
        _graph("onnx.VocoderWaveformSlice", leaves, out_dims, "F32")
