"""rlx_mil's trimmed Core ML pass pipeline gives the same program as the default pipeline.

`rlx_mil.convert` runs only the passes that can change a program its rules emit
(`rlx_mil.coreml.pipeline.RLX_PASSES`); on every catalogue graph, on every target family and
in both precisions, the converted program must be the one Core ML's default pipeline makes
(same ops computing the same values from the same inputs; names and op order aside).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from catalogue import CATALOGUE, CATALOGUE_GROUP, CatalogueModels, random_leaves

import rlx_mil
from rlx_mil.coreml.pipeline import (
    default_pass_pipeline,
    needs_reduce_transposes,
    program_structure,
    rlx_passes,
)
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision, Target
from rlx_mil.models.transformer import DecoderConfig, llama_decoder, random_params
from rlx_mil.testing import supported_targets

#: (target, precision, attention): the fused and decomposed attention paths, both precisions,
#: the oldest target and the one before fused attention.
SETTINGS = [
    ("iOS18", "fp16", "auto"),
    ("iOS18", "fp32", "decomposed"),
    ("iOS15", "fp16", "auto"),
    ("iOS17", "fp32", "auto"),
]


def _default(graph: Graph, params: dict[str, np.ndarray], target: str, precision: str, attention: str) -> object:
    """The structure of the program Core ML's default pipeline makes."""
    default = rlx_mil.convert(
        graph, params, target=target, precision=precision, attention=attention,
        pass_pipeline=default_pass_pipeline(Precision.parse(precision)),
    )
    return program_structure(default._mil_program)  # type: ignore[attr-defined]


def _both(graph: Graph, params: dict[str, np.ndarray], target: str, precision: str, attention: str) -> tuple[object, object]:
    trimmed = rlx_mil.convert(graph, params, target=target, precision=precision, attention=attention)
    return program_structure(trimmed._mil_program), _default(graph, params, target, precision, attention)  # type: ignore[attr-defined]


def _convertible_cases() -> list[tuple[str, str, str, str]]:
    """(case, target, precision, attention) for every catalogue graph that converts there (ops
    needing a later target raise before any pass runs)."""
    cases = []
    for name in sorted(CATALOGUE):
        graph = CATALOGUE[name]()
        targets = supported_targets(graph)
        cases += [(name, *setting) for setting in SETTINGS if Target.parse(setting[0]) in targets]
    return cases


@pytest.mark.xdist_group(CATALOGUE_GROUP)
@pytest.mark.parametrize(("name", "target", "precision", "attention"), _convertible_cases())
def test_trimmed_pipeline_gives_the_default_program(
    name: str, target: str, precision: str, attention: str, catalogue_models: CatalogueModels,
) -> None:
    graph = CATALOGUE[name]()
    _, params = random_leaves(graph)
    trimmed = program_structure(catalogue_models.model(name, target, precision, attention)._mil_program)
    assert trimmed == _default(graph, params, target, precision, attention)


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_trimmed_pipeline_gives_the_default_decoder(precision: str) -> None:
    config = DecoderConfig(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2, seq=16)
    graph = llama_decoder(config)
    trimmed, default = _both(graph, random_params(graph, config), "iOS18", precision, "auto")
    assert trimmed == default


def test_structure_sees_values_and_wiring() -> None:
    """The comparison is not vacuous: other weights or other wiring give other structures."""
    g = Graph("affine")
    x = g.input("x", [2, 4])
    g.set_outputs([g.sub(g.mul(x, g.param("w", [4])), x, name="y")])
    swapped = Graph("affine")
    xs = swapped.input("x", [2, 4])
    swapped.set_outputs([swapped.sub(xs, swapped.mul(xs, swapped.param("w", [4])), name="y")])
    w = np.float32([1.5, -2.0, 0.5, 3.0])

    def structure(graph: Graph, weights: np.ndarray) -> object:
        return program_structure(rlx_mil.convert(graph, {"w": weights})._mil_program)

    assert structure(g, w) == structure(g, w.copy())
    assert structure(g, w) != structure(g, w * 2)
    assert structure(g, w) != structure(swapped, w)


def test_trimmed_passes_are_default_passes_in_default_order() -> None:
    import coremltools as ct

    default = list(ct.PassPipeline.DEFAULT.passes)
    position = 0
    trimmed = rlx_passes()
    for name in trimmed:
        assert name in default[position:], f"{name} is not a later default pass"
        position = default.index(name, position) + 1
    assert len(trimmed) <= len(default)


def test_reduce_transposes_runs_only_where_a_transpose_can_move() -> None:
    config = DecoderConfig(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=1, seq=16)
    graph = llama_decoder(config)
    params = random_params(graph, config)
    # fused attention: q/k/v transposes feed scaled_dot_product_attention, the output's a reshape
    assert not needs_reduce_transposes(rlx_mil.lower(graph, params, target="iOS18"))
    # decomposed without GQA: the query scale is a mul straight on the transposed q
    mha = DecoderConfig(hidden=64, heads=4, kv_heads=4, intermediate=128, layers=1, seq=16)
    graph = llama_decoder(mha)
    lowered = rlx_mil.lower(graph, random_params(graph, mha), target="iOS18", attention="decomposed")
    assert needs_reduce_transposes(lowered)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_trimmed_pipeline_gives_the_default_hugging_face_decoder(name: str, tmp_path: Path) -> None:
    """Hugging Face layouts make q/k head-major by a transpose before RoPE: the rotation is
    lowered before that transpose, so no transpose feeds an element-wise op and the skipped
    reduce_transposes could not have changed the program."""
    from rlx_mil.models import from_pretrained
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    graph, params = from_pretrained(write_random_checkpoint(tmp_path / name, TINY_CONFIGS[name], seed=1), seq_len=8)
    if name == "llama":  # RoPE rotates before the head-major transpose (Qwen3 norms q/k after it)
        assert not needs_reduce_transposes(rlx_mil.lower(graph, params, target="iOS18"))
    trimmed, default = _both(graph, dict(params), "iOS18", "fp16", "auto")
    assert trimmed == default


def _small_graph() -> Graph:
    g = Graph("validate_once")
    x = g.input("x", [2, 8])
    g.set_outputs([g.relu(g.matmul(x, g.param("w", [8, 8])), name="y")])
    return g


def test_each_pipeline_validates_its_program_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager
    from coremltools.converters.mil.mil.program import Program

    pipelines: list[int] = []
    validations: list[bool] = []  # each validation of a program, with its essential-scope check
    real_apply, real_validate = PassPipelineManager.apply_pipeline, Program.validate

    def counting_apply(prog: object, pipeline: object) -> None:
        pipelines.append(len(pipeline.passes))  # type: ignore[attr-defined]
        real_apply(prog, pipeline)

    def counting_validate(self: Program, check_essential_scope: bool = False) -> None:
        validations.append(check_essential_scope)
        real_validate(self, check_essential_scope=check_essential_scope)

    monkeypatch.setattr(PassPipelineManager, "apply_pipeline", staticmethod(counting_apply))
    monkeypatch.setattr(Program, "validate", counting_validate)
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    rlx_mil.convert(_small_graph(), {"w": w})
    assert len(pipelines) == 3 and max(pipelines) > 50  # frontend, main (most passes), backend
    # One per pipeline (dead-code elimination runs in the last two: their essential-scope
    # check), then the two of coremltools' serialiser; not one before and one after each pass.
    assert validations == [False, True, True, True, True]
    monkeypatch.setattr(PassPipelineManager, "apply_pipeline", staticmethod(real_apply))
    rlx_mil.convert(_small_graph(), {"w": w})
    assert PassPipelineManager.apply_pipeline is real_apply  # restored after each conversion


def test_a_pass_that_breaks_the_program_is_still_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    last = type(PASS_REGISTRY[rlx_passes()[-1]])  # no later pass can repair the damage
    real = last.apply

    def corrupting(self: object, prog: object) -> None:
        real(self, prog)
        ops = list(prog.functions["main"].operations)  # type: ignore[attr-defined]
        ops[0].outputs[0]._child_ops.append(ops[-1])  # a use the consumer does not have

    monkeypatch.setattr(last, "apply", corrupting)
    w = np.zeros((8, 8), np.float32)
    with pytest.raises(rlx_mil.errors.ConversionError, match="should be consumed by op"):
        rlx_mil.convert(_small_graph(), {"w": w})


def _iOS18_cases() -> list[str]:
    return [name for name, target, precision, attention in _convertible_cases() if (target, precision) == ("iOS18", "fp16")]


@pytest.mark.xdist_group(CATALOGUE_GROUP)
@pytest.mark.parametrize("name", _iOS18_cases())
def test_skipped_nonreplaceable_marks_give_the_same_program(
    name: str, monkeypatch: pytest.MonkeyPatch, catalogue_models: CatalogueModels,
) -> None:
    """Blocks without constexpr ops skip recomputing Core ML's non-replaceable marks
    (`nonreplaceable_marks_only_with_constexprs`): the passes, which consult those marks, make
    the same program as with the recomputation on every block exit."""
    from contextlib import nullcontext

    graph = CATALOGUE[name]()
    _, params = random_leaves(graph)
    skipping = program_structure(catalogue_models.model(name, "iOS18", "fp16")._mil_program)
    api = sys.modules["rlx_mil.api"]
    monkeypatch.setattr(api, "nonreplaceable_marks_only_with_constexprs", nullcontext)
    always = program_structure(rlx_mil.convert(graph, params, target="iOS18", precision="fp16")._mil_program)
    assert skipping == always


def test_nonreplaceable_marks_are_recomputed_only_once_a_var_is_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a constexpr op no var gets a mark, and no block exit recomputes them; a
    compressed weight (a constexpr op) turns the recomputation on."""
    from rlx_mil.coreml import pipeline

    recomputed: list[object] = []
    real = pipeline.recompute_marks

    def counting(block: object) -> None:
        recomputed.append(block)
        real(block)

    monkeypatch.setattr(pipeline, "recompute_marks", counting)
    g = Graph("marks")
    x = g.input("x", [2, 64])
    g.set_outputs([g.relu(g.matmul(x, g.param("w", [64, 64])), name="y")])
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    rlx_mil.convert(g, {"w": w}, precision="fp16")
    assert recomputed == []
    rlx_mil.convert(g, {"w": w}, precision="fp16", compress="int8")
    assert recomputed


def test_nonreplaceable_marks_are_still_computed_for_constexpr_weights() -> None:
    """A compressed weight is a constexpr op: its consumers carry its mark as Core ML makes it."""
    g = Graph("compressed")
    x = g.input("x", [2, 64])
    g.set_outputs([g.relu(g.matmul(x, g.param("w", [64, 64])), name="y")])
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    program = rlx_mil.convert(g, {"w": w}, precision="fp16", compress="int8")._mil_program
    ops = program.functions["main"].operations
    constexprs = [op for op in ops if op.op_type.startswith("constexpr_")]
    assert constexprs
    marked = [op for op in ops if not op.op_type.startswith("constexpr_") and op.outputs
              and any(out.nonreplaceable_vars_upstream for out in op.outputs)]
    assert marked, "no op downstream of the constexpr weight carries its non-replaceable mark"


@pytest.mark.parametrize("compress", ["int8", "lut4"])
def test_compressed_decoder_skips_reduce_transposes_and_gives_the_default_program(compress: str, tmp_path: Path) -> None:
    """A program with compressed weights (constexpr ops) takes Core ML's default pipeline, less
    reduce_transposes where no transpose feeds an op it moves: the program is the one the
    whole default pipeline makes."""
    from rlx_mil.coreml.pipeline import REDUCE_TRANSPOSES, rlx_pass_pipeline
    from rlx_mil.models import from_pretrained
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    graph, params = from_pretrained(write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"], seed=1), seq_len=8)
    lowered = rlx_mil.lower(graph, params, target="iOS18", compress=compress)
    assert any(op.op_type.startswith("constexpr_") for op in lowered.functions["main"].operations)
    assert not needs_reduce_transposes(lowered)
    assert REDUCE_TRANSPOSES not in rlx_pass_pipeline(Precision.FP16, lowered).passes
    assert REDUCE_TRANSPOSES in default_pass_pipeline(Precision.FP16).passes
    ours = rlx_mil.convert(graph, params, target="iOS18", precision="fp16", compress=compress)
    default = rlx_mil.convert(graph, params, target="iOS18", precision="fp16", compress=compress,
                              pass_pipeline=default_pass_pipeline(Precision.FP16))
    assert program_structure(ours._mil_program) == program_structure(default._mil_program)  # type: ignore[attr-defined]


def test_recomputed_marks_are_core_mls_own(tmp_path: Path) -> None:
    """`recompute_marks` gives every var of a compressed decoder's program the set Core ML's
    own `_propagate_nonreplaceable_vars` gives it (constexpr outputs mark themselves; shapes
    nothing; the rest their inputs' union)."""
    from coremltools.converters.mil.mil.block import Block

    from rlx_mil.coreml.pipeline import recompute_marks
    from rlx_mil.models import from_pretrained
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    graph, params = from_pretrained(write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"], seed=1), seq_len=8)
    block = rlx_mil.convert(graph, params, target="iOS18", precision="fp16", compress="int8")._mil_program.functions["main"]
    outputs = [out for op in block.operations for out in op.outputs or []]
    original = Block.__dict__["_propagate_nonreplaceable_vars"]  # Core ML's (outside a conversion)
    assert not getattr(original, "rlx_mil_skips", False)
    for out in outputs:  # stale marks: both must recompute every one
        out._nonreplaceable_vars_upstream = {out}
    recompute_marks(block)
    ours = [set(out.nonreplaceable_vars_upstream) for out in outputs]
    for out in outputs:
        out._nonreplaceable_vars_upstream = {out}
    original(block)
    theirs = [set(out.nonreplaceable_vars_upstream) for out in outputs]
    assert ours == theirs
    assert sum(1 for marks in ours if marks) > len(outputs) // 4  # marks reach most of the program
    assert any(len(marks) > 1 for marks in ours)
