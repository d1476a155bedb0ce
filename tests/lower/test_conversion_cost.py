"""What a conversion costs: each weight read once, cast before any layout change, held once
(shared by every node using it); masks and RoPE tables built once; the collector not rescanning
the process."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import rlx_mil
from rlx_mil.api import objects_frozen
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.context import program_array
from rlx_mil.models.transformer import DecoderConfig, llama_decoder, random_params

CONFIG = DecoderConfig(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=3, seq=16)


class LazyParams(Mapping[str, np.ndarray]):
    """A checkpoint-like mapping: metadata without reads, and a count of tensor reads."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.reads: Counter[str] = Counter()

    def __getitem__(self, name: str) -> np.ndarray:
        self.reads[name] += 1
        return self.arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.arrays[name].shape

    def dtype_of(self, name: str) -> str:
        return {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}[self.arrays[name].dtype.name]


@pytest.mark.parametrize("source", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_program_array_casts_then_transposes_in_one_new_array(source: type) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((300, 70)).astype(source)  # more rows than one transpose block
    out = program_array(w, np.float16, transpose=True)
    assert out.shape == (70, 300) and out.dtype == np.float16 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, w.astype(np.float32).astype(np.float16).T)
    assert not np.shares_memory(out, w)


def test_program_array_copies_nothing_already_in_form() -> None:
    w = np.arange(12, dtype=np.float16).reshape(3, 4)
    assert program_array(w, np.float16) is w
    stored_nk = np.ascontiguousarray(w.T)  # a checkpoint's [N, K] matrix seen as [K, N]
    assert np.shares_memory(program_array(stored_nk.T, np.float16, transpose=True), stored_nk)


def test_each_weight_is_read_once_and_decoder_shares_masks_and_rope_tables() -> None:
    graph = llama_decoder(CONFIG)
    arrays = {k: v.astype(ml_dtypes.bfloat16) for k, v in random_params(graph, CONFIG).items()}
    params = LazyParams(arrays)
    model = rlx_mil.convert(graph, params)
    assert set(params.reads) == set(arrays) and max(params.reads.values()) == 1
    ops = Counter(op.op_type for op in model._mil_program.functions["main"].operations)
    assert ops["scaled_dot_product_attention"] == CONFIG.layers
    assert ops["band_part"] == 1  # one causal mask for every layer
    assert ops["tile"] == 0
    tables = [
        op for op in model._mil_program.functions["main"].operations
        if op.op_type == "const" and op.outputs[0].shape == (CONFIG.seq, 1, CONFIG.head_dim)
    ]
    assert len(tables) == 2  # [cos, cos] and [-sin, sin], for q and k of every layer


def test_a_weight_used_twice_is_held_once() -> None:
    g = Graph("tied")
    x = g.input("x", [2, 8])
    w = g.param("w", [8, 8])
    g.set_outputs([g.add(g.matmul(x, w), g.matmul(g.relu(x), w), name="y")])
    value = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    program = rlx_mil.lower(g, {"w": value})
    weights = [op.weight.val for op in program.functions["main"].operations if op.op_type == "linear"]
    assert len(weights) == 2 and weights[0] is weights[1]
    np.testing.assert_array_equal(weights[0], value.T.astype(np.float16))


def test_tied_embedding_is_one_const_for_gather_and_linear() -> None:
    """An [V, H] table gathered by token ids and, through a Transpose, the output projection
    (tied embeddings): one fp16 buffer, one const feeding both ops, and the logits right."""
    g = Graph("tied_embedding")
    ids = g.input("ids", [1, 5], dtype="I32")
    table = g.param("embed", [11, 8])
    hidden = g.gather(table, ids, axis=0)
    g.set_outputs([g.matmul(hidden, g.transpose(table, [1, 0]), name="logits")])
    value = np.random.default_rng(2).standard_normal((11, 8)).astype(np.float32)
    program = rlx_mil.lower(g, {"embed": value})
    consts = [op for op in program.functions["main"].operations if op.op_type == "const" and op.outputs[0].shape == (11, 8)]
    assert len(consts) == 1
    assert sorted(c.op_type for c in consts[0].outputs[0].child_ops) == ["gather", "linear"]
    np.testing.assert_array_equal(consts[0].outputs[0].val, value.astype(np.float16))
    token_ids = np.array([[0, 3, 10, 3, 7]], np.int32)
    got = rlx_mil.milexec.run(rlx_mil.convert(g, {"embed": value}), {"ids": token_ids})["logits"]
    held = value.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(got, held[token_ids[0]][None] @ held.T, rtol=2e-2, atol=2e-2)


def test_known_zero_bias_is_dropped() -> None:
    g = Graph("bias")
    x = g.input("x", [2, 8])
    g.set_outputs([g.fused_matmul_bias_act(x, g.param("w", [8, 4]), g.param("b", [4]), None, name="y")])
    w = np.random.default_rng(2).standard_normal((8, 4)).astype(np.float32)
    for bias, has_bias in ((np.zeros(4, np.float32), False), (np.ones(4, np.float32), True)):
        ops = rlx_mil.lower(g, {"w": w, "b": bias}).functions["main"].operations
        (linear,) = [op for op in ops if op.op_type == "linear"]
        assert (linear.bias is not None and np.any(linear.bias.val != 0)) == has_bias


def test_conversion_freezes_the_collector_only_while_it_runs() -> None:
    gc.unfreeze()  # the suite's own per-test freeze (tests/conftest.py)
    assert gc.get_freeze_count() == 0
    with objects_frozen():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with objects_frozen():
            pass
        # a caller's own freeze is left alone: not undone (frozen objects that died meanwhile
        # leave the count, so it may only shrink)
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_direct_weight_writes_give_coremltools_bytes(precision: str, tmp_path: Path) -> None:
    """The weight file written from flat views is byte for byte the one coremltools writes."""
    from coremltools.converters.mil.backend.mil import helper

    graph = llama_decoder(CONFIG)
    params = random_params(graph, CONFIG)
    original = helper._get_offset_by_writing_data

    def weights(direct: bool) -> bytes:
        if direct:
            model = rlx_mil.convert(graph, params, precision=precision)
        else:  # coremltools' own writer: make the context manager a no-op for this conversion
            original.rlx_mil_direct = True  # type: ignore[attr-defined]
            try:
                model = rlx_mil.convert(graph, params, precision=precision)
            finally:
                del original.rlx_mil_direct  # type: ignore[attr-defined]
        path = rlx_mil.save(model, tmp_path / f"{direct}.mlpackage")
        return next(Path(path).rglob("weight.bin")).read_bytes()

    assert helper._get_offset_by_writing_data is original
    direct = weights(True)
    assert helper._get_offset_by_writing_data is original  # restored after the conversion
    assert len(direct) > 100_000 and direct == weights(False)
