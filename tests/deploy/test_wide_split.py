"""The Neural Engine form's dimension limit: wide const-weight projections split into pieces
(`rlx_mil.coreml.deploy.wide_split`), checked against NumPy and structurally."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx_mil
from rlx_mil import milexec
from rlx_mil.coreml import metadata
from rlx_mil.coreml.deploy.wide_split import dimension_limit, piece_sizes, split_wide_projections
from rlx_mil.coreml.output_pieces import OutputPieces, SplitOutputError, assemble
from rlx_mil.errors import ConversionError
from rlx_mil.ir.graph import Graph
from rlx_mil.mil_walk import iter_ops

RNG = np.random.default_rng(7)
D, V, M = 8, 100, 6
W = RNG.standard_normal((V, D)).astype(np.float32)
B = RNG.standard_normal(V).astype(np.float32)
W2 = RNG.standard_normal((M, V)).astype(np.float32)
SCALE = RNG.standard_normal(V).astype(np.float32)
X = RNG.standard_normal((1, 3, D)).astype(np.float32)


def _program() -> Any:
    """x -> wide head (+ bias) -> tanh -> * per-column const -> reshape: output; the tanh also
    feeds a down projection (contracting the wide axis) and the head a softmax."""
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, D))])
    def prog(x: Any) -> Any:
        h = mb.linear(x=x, weight=W, bias=B, name="head")
        t = mb.tanh(x=h, name="t")
        m = mb.mul(x=t, y=SCALE, name="m")
        down = mb.linear(x=t, weight=W2, name="down")
        logits = mb.reshape(x=m, shape=[3, V], name="logits")
        probs = mb.softmax(x=h, axis=-1, name="probs")
        return logits, down, probs

    return prog


def _numpy() -> dict[str, np.ndarray]:
    h = X @ W.T + B
    t = np.tanh(h)
    e = np.exp(h - h.max(-1, keepdims=True))
    return {"logits": (t * SCALE).reshape(3, V), "down": t @ W2.T, "probs": e / e.sum(-1, keepdims=True)}


def _max_dim(function: Any, skip: set[str] = frozenset()) -> int:  # type: ignore[assignment]
    return max(int(d) for op in iter_ops(function) if op.op_type != "const" and not op.op_type.startswith("constexpr_")
               for v in op.outputs if v.name not in skip for d in v.shape)


@pytest.mark.parametrize("limit", [32, 48, 64])
def test_split_program_matches_numpy_and_keeps_every_dim_under_the_limit(limit: int) -> None:
    program = _program()
    reports = split_wide_projections(program, limit=limit)
    report = reports["main"]
    sizes = piece_sizes(V, limit)
    assert report.projections == {"head": sizes, "down": sizes}
    assert report.outputs["logits"] == OutputPieces(1, tuple(f"logits_{i}" for i in range(len(sizes))), sizes)
    function = program.functions["main"]
    # the softmax reads the head whole: the only dims above the limit are that concatenation's
    assert report.concatenated == ["head"]
    assert _max_dim(function, {"head_joined", "probs"}) <= limit
    assert [v.name for v in function.outputs] == [*report.outputs["logits"].pieces, "down", "probs"]
    assert not [op for op in function.operations if op.name in ("head", "t", "m")]  # replaced ops are gone
    got = assemble(milexec.run(program, {"x": X}), report.outputs)
    want = _numpy()
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["down"], want["down"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["probs"], want["probs"], rtol=1e-5, atol=1e-6)


def test_split_outputs_false_concatenates_into_the_one_output() -> None:
    program = _program()
    report = split_wide_projections(program, limit=32, split_outputs=False)["main"]
    assert report.outputs == {}
    function = program.functions["main"]
    assert [v.name for v in function.outputs] == ["logits", "down", "probs"]
    assert function.outputs[0].op.op_type == "concat"
    got = milexec.run(program, {"x": X})
    np.testing.assert_allclose(got["logits"], _numpy()["logits"], rtol=1e-5, atol=1e-5)


def test_nothing_wide_leaves_the_program_alone() -> None:
    program = _program()
    before = str(program)
    assert split_wide_projections(program, limit=V) == {}
    assert str(program) == before


def test_matmul_and_conv_heads_split_on_their_output_axis() -> None:
    from coremltools.converters.mil import Builder as mb

    y = np.ascontiguousarray(W.T)  # [D, V]
    cw = W.reshape(V, D, 1, 1)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, D)), mb.TensorSpec(shape=(1, D, 1, 3))])
    def prog(x: Any, c: Any) -> Any:
        a = mb.matmul(x=x, y=y, name="mm")
        b = mb.matmul(x=x, y=W, transpose_y=True, name="mmt")
        k = mb.conv(x=c, weight=cw, bias=B, name="cv")
        return mb.relu(x=a, name="a"), mb.identity(x=b, name="b"), mb.sigmoid(x=k, name="k")

    c = np.transpose(X, (0, 2, 1))[:, :, None, :]
    reports = split_wide_projections(prog, limit=40)
    outs = assemble(milexec.run(prog, {"x": X, "c": c}), reports["main"].outputs)
    assert set(reports["main"].outputs) == {"a", "b", "k"}
    assert reports["main"].outputs["k"].axis == 1
    np.testing.assert_allclose(outs["a"], np.maximum(X @ W.T, 0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["b"], X @ W.T, rtol=1e-5, atol=1e-5)
    want_k = 1 / (1 + np.exp(-(np.einsum("od,bdhw->bohw", W, c) + B[None, :, None, None])))
    np.testing.assert_allclose(outs["k"], want_k, rtol=1e-5, atol=1e-5)
    assert _max_dim(prog.functions["main"]) <= 40


def test_pieces_run_through_squeeze_expand_dims_and_transpose() -> None:
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 1, D))])
    def prog(x: Any) -> Any:
        h = mb.linear(x=x, weight=W, name="head")
        e = mb.expand_dims(x=h, axes=[0], name="e")  # [1, 1, 1, V]
        t = mb.transpose(x=e, perm=[0, 3, 1, 2], name="t")  # [1, V, 1, 1]
        return mb.squeeze(x=t, axes=[2, 3], name="out")  # [1, V]

    x = X[:, :1]
    report = split_wide_projections(prog, limit=32)["main"]
    assert report.outputs["out"].axis == 1 and report.concatenated == []
    got = assemble(milexec.run(prog, {"x": x}), report.outputs)["out"]
    np.testing.assert_allclose(got, (x @ W.T).reshape(1, V), rtol=1e-5, atol=1e-5)
    assert _max_dim(prog.functions["main"]) <= 32


def test_piece_sizes_of_the_published_vocabularies() -> None:
    assert piece_sizes(128_256, 16_384) == (16_032,) * 8
    qwen = piece_sizes(151_936, 16_384)
    assert len(qwen) == 10 and sum(qwen) == 151_936 and max(qwen) <= 16_384
    assert all(s % 16 == 0 for s in qwen)
    assert piece_sizes(100, 100) == (100,)


@given(st.integers(2, 5000), st.integers(1, 600), st.sampled_from([1, 4, 8, 16, 32]))
def test_piece_sizes_cover_the_width_in_the_fewest_pieces(width: int, limit: int, step: int) -> None:
    try:
        sizes = piece_sizes(width, limit, step)
    except ConversionError:
        assert step > limit  # only a step wider than the limit cannot be cut
        return
    assert sum(sizes) == width and max(sizes) <= limit and min(sizes) >= 1
    assert all(s % step == 0 for s in sizes[:-1])
    if step == 1:
        assert len(sizes) == -(-width // limit)


def test_assemble_refuses_pieces_that_do_not_match() -> None:
    split = {"logits": OutputPieces(1, ("a", "b"), (2, 3))}
    with pytest.raises(SplitOutputError, match=r"no \['b'\]"):
        assemble({"a": np.zeros((1, 2))}, split)
    with pytest.raises(SplitOutputError, match="width 3"):
        assemble({"a": np.zeros((1, 2)), "b": np.zeros((1, 4))}, split)
    joined = assemble({"a": np.ones((1, 2)), "b": np.zeros((1, 3)), "c": np.ones(1)}, split)
    assert sorted(joined) == ["c", "logits"] and joined["logits"].tolist() == [[1, 1, 0, 0, 0]]


@pytest.mark.parametrize("raw, match", [
    ('{"main": {"logits": {"axis": 1, "pieces": ["a"], "sizes": [2, 3]}}}', "as many distinct pieces"),
    ('{"main": {"logits": {"axis": "1", "pieces": ["a"], "sizes": [2]}}}', "axis must be int"),
    ('{"main": {"logits": {"axis": 1, "pieces": ["a"], "sizes": [0]}}}', "not a width"),
    ('{"main": []}', "must be dict"),
    ('[1]', "the table must be dict"),
])
def test_malformed_split_metadata_is_a_typed_error(raw: str, match: str) -> None:
    with pytest.raises(metadata.PackageMetadataError, match=match):
        metadata.SplitOutputs.read({metadata.SPLIT_OUTPUTS: raw})


def test_split_metadata_round_trips() -> None:
    table = metadata.SplitOutputs({"decode": {"logits": OutputPieces(2, ("logits_0", "logits_1"), (32, 4))}})
    meta: dict[str, str] = {}
    table.write(meta)
    assert metadata.SplitOutputs.read(meta) == table
    assert table.of("decode")["logits"].width == 36 and table.of(None) == {}
    metadata.SplitOutputs().write(meta)
    assert metadata.SPLIT_OUTPUTS not in meta


# -- through rlx_mil.convert ------------------------------------------------------------------------


def _head_graph(vocab: int, hidden: int = 8) -> tuple[Graph, dict[str, np.ndarray]]:
    g = Graph("wide_head")
    x = g.input("x", [1, 2, hidden])
    w = g.param("lm_head.weight", [hidden, vocab])
    g.set_outputs([g.mul(g.matmul(x, w), g.constant(np.array([0.5], np.float32)), name="logits")])
    rng = np.random.default_rng(1)
    return g, {"lm_head.weight": rng.standard_normal((hidden, vocab)).astype(np.float32)}


def _convert(graph: Graph, params: dict[str, np.ndarray], **options: Any) -> Any:
    return rlx_mil.convert(graph, params, precision="fp32", **options)


def test_convert_ane_splits_the_head_and_the_executor_joins_it() -> None:
    graph, params = _head_graph(96)
    x = np.random.default_rng(2).standard_normal((1, 2, 8)).astype(np.float32)
    plain = _convert(graph, params)
    with dimension_limit(32):
        ane = _convert(graph, params, deploy="ane")
    names = [o.name for o in ane.get_spec().description.output]
    assert names == ["logits_0", "logits_1", "logits_2"]
    table = metadata.SplitOutputs.read(ane.user_defined_metadata)
    assert table.of("main") == {"logits": OutputPieces(2, tuple(names), (32, 32, 32))}
    assert metadata.read_io_names(ane.user_defined_metadata)["outputs"] == {n: n for n in names}
    got, want = milexec.run(ane, {"x": x}), milexec.run(plain, {"x": x})
    assert list(got) == ["logits"]
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["logits"], 0.5 * x @ params["lm_head.weight"], rtol=1e-5, atol=1e-5)


def _dims_over(model: Any, limit: int) -> list[str]:
    function = model._mil_program.functions["main"]
    return [v.name for op in iter_ops(function) if op.op_type != "const" and not op.op_type.startswith("constexpr_")
            for v in op.outputs if any(int(d) > limit for d in v.shape)]


@pytest.mark.parametrize("compress", ["lut4", "int4", "int8"])
def test_compressed_heads_are_sliced_in_their_codes(compress: str) -> None:
    graph, params = _head_graph(96, hidden=64)
    x = np.random.default_rng(3).standard_normal((1, 2, 64)).astype(np.float32)
    plain = _convert(graph, params, compress=compress)
    with dimension_limit(32):
        ane = _convert(graph, params, compress=compress, deploy="ane")
    ops = [op.op_type for op in ane._mil_program.functions["main"].operations]
    # the input's own width (64) reappears in its channels-first form; the 96-wide head never exists
    assert sum(t.startswith("constexpr_") for t in ops) >= 3 and _dims_over(ane, 64) == []
    np.testing.assert_allclose(milexec.run(ane, {"x": x})["logits"], milexec.run(plain, {"x": x})["logits"],
                               rtol=1e-5, atol=1e-5)


def test_split_logits_false_gives_one_output_joined_outside_the_neural_engine() -> None:
    """The joined output is made by a concatenation of the pieces only: preflight's
    `interface-copy` note, where the unsplit head (a matmul writing 16,400 wide) is an error."""
    graph, params = _head_graph(16_400, hidden=8)
    split = _convert(graph, params, deploy="ane")
    joined = _convert(graph, params, deploy="ane", split_logits=False)
    assert [o.name for o in split.get_spec().description.output] == ["logits_0", "logits_1"]
    assert [o.name for o in joined.get_spec().description.output] == ["logits"]
    rules: Callable[[Any], list[str]] = lambda m: [f.rule for f in rlx_mil.preflight(m, device="ane")]  # noqa: E731
    assert "dim-over-16384" not in rules(split) and "interface-copy" not in rules(split)
    assert "interface-copy" in rules(joined) and "dim-over-16384" not in rules(joined)
    assert "dim-over-16384" in rules(_convert(graph, params))
    x = np.ones((1, 2, 8), np.float32)
    np.testing.assert_array_equal(milexec.run(split, {"x": x})["logits"], milexec.run(joined, {"x": x})["logits"])


def test_split_logits_must_be_a_bool() -> None:
    graph, params = _head_graph(40)
    with pytest.raises(rlx_mil.errors.InvalidOptionError, match="split_logits must be True or False"):
        _convert(graph, params, deploy="ane", split_logits="no")


def test_fp16_split_package_matches_the_plain_one_within_fp16_tolerance() -> None:
    graph, params = _head_graph(96, hidden=16)
    x = np.random.default_rng(4).standard_normal((1, 2, 16)).astype(np.float32)
    plain = rlx_mil.convert(graph, params, precision="fp16")
    with dimension_limit(32):
        ane = rlx_mil.convert(graph, params, precision="fp16", deploy="ane")
    got, want = milexec.run(ane, {"x": x})["logits"], milexec.run(plain, {"x": x})["logits"]
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(got, 0.5 * x @ params["lm_head.weight"], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("vocab, pieces", [(128_256, 8), (151_936, 10)])
def test_published_vocabulary_heads_are_ceil_v_over_16384_pieces(vocab: int, pieces: int) -> None:
    graph, params = _head_graph(vocab, hidden=4)
    program = rlx_mil.lower(graph, params, precision="fp16", deploy="ane")
    function = program.functions["main"]
    heads = [op for op in function.operations if op.op_type in ("linear", "matmul", "conv")]
    assert len(heads) == pieces
    widths = [int(op.outputs[0].shape[1 if op.op_type == "conv" else -1]) for op in heads]
    assert sum(widths) == vocab and max(widths) <= 16_384
    if vocab == 128_256:
        assert set(widths) == {16_032}
    assert [v.name for v in function.outputs] == [f"logits_{i}" for i in range(pieces)]
    assert _max_dim(function) <= 16_384


def test_cli_no_split_logits(tmp_path: Any) -> None:
    from rlx_mil.cli import main
    from rlx_mil.coreml.package_info import package_info

    graph, params = _head_graph(16_400)
    graph.to_json_file(tmp_path / "g.json")
    np.savez(tmp_path / "w.npz", **params)  # type: ignore[arg-type]
    argv = ["convert", str(tmp_path / "g.json"), "--params", str(tmp_path / "w.npz"), "--precision", "fp32",
            "--deploy", "ane"]
    assert main([*argv, "-o", str(tmp_path / "split.mlpackage")]) == 0
    assert main([*argv, "-o", str(tmp_path / "one.mlpackage"), "--no-split-logits"]) == 0
    split = metadata.SplitOutputs.read(package_info(tmp_path / "split.mlpackage").metadata).of("main")
    assert split["logits"].sizes == (8_208, 8_192)
    assert metadata.SplitOutputs.read(package_info(tmp_path / "one.mlpackage").metadata).functions == {}


def test_tied_embedding_lookup_reads_the_head_pieces() -> None:
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    table = RNG.standard_normal((V, D)).astype(np.float32)
    ids = np.array([[0, 31, 32, 63, 64, 99, 5]], np.int32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 7), dtype=types.int32)])
    def prog(i: Any) -> Any:
        w = mb.const(val=table, name="embed")
        h = mb.gather(x=w, indices=i, axis=0, name="emb")  # [1, 7, D]
        return mb.identity(x=h, name="hidden"), mb.linear(x=h, weight=w, name="logits")

    report = split_wide_projections(prog, limit=32)["main"]
    assert report.lookups == 1
    function = prog.functions["main"]
    tables = [op.inputs["x"] for op in function.operations if op.op_type == "gather"]
    assert len(tables) == 4 and max(int(t.shape[0]) for t in tables) <= 32
    assert "embed" not in {op.name for op in function.operations}  # the whole table is gone
    assert _max_dim(function) <= 32
    got = assemble(milexec.run(prog, {"i": ids}), report.outputs)
    np.testing.assert_array_equal(got["hidden"], table[ids])  # the lookup is exact
    np.testing.assert_allclose(got["logits"], table[ids] @ table.T, rtol=1e-5, atol=1e-4)


@pytest.mark.filterwarnings("ignore::rlx_mil.errors.CompressionWarning")
@pytest.mark.parametrize("compress", [None, "lut4", "int8"])
def test_tied_head_package_keeps_one_table(compress: str | None) -> None:
    from rlx_mil.ir.dtype import DType

    g = Graph("tied")
    ids = g.input("ids", [1, 3], DType.I32)
    table = g.param("embed.weight", [96, 32])
    h = g.gather(table, ids, name="emb")
    g.set_outputs([g.matmul(h, g.transpose(table, [1, 0]), name="logits")])
    params = {"embed.weight": np.random.default_rng(5).standard_normal((96, 32)).astype(np.float32)}
    feeds = {"ids": np.array([[0, 40, 95]], np.int32)}
    plain = rlx_mil.convert(g, params, precision="fp32", compress=compress)
    with dimension_limit(32):
        ane = rlx_mil.convert(g, params, precision="fp32", compress=compress, deploy="ane")
    function = ane._mil_program.functions["main"]
    tables = [op.inputs["x"] for op in function.operations if op.op_type == "gather"]
    assert len(tables) == 3 and max(int(t.shape[0]) for t in tables) <= 32
    kinds = {t.op.op_type for t in tables}
    assert kinds == {"const"} if compress is None else all(k.startswith("constexpr_") for k in kinds)
    assert _dims_over(ane, 32) == []
    np.testing.assert_allclose(milexec.run(ane, feeds)["logits"], milexec.run(plain, feeds)["logits"], rtol=1e-5,
                               atol=1e-4)
