"""rlx_mil's trimmed Core ML pass pipeline gives the same program as the default pipeline.

`rlx_mil.convert` runs only the passes that can change a program its rules emit
(`rlx_mil.lower.pipeline.RLX_PASSES`); on every catalogue graph, on every target family and
in both precisions, the converted program must be the one Core ML's default pipeline makes
(same ops computing the same values from the same inputs; names and op order aside).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from catalogue import CATALOGUE, random_leaves

import rlx_mil
from rlx_mil.ir.graph import Graph
from rlx_mil.lower.pipeline import (
    default_pass_pipeline,
    needs_reduce_transposes,
    program_structure,
    rlx_passes,
)
from rlx_mil.lower.registry import unsupported_ops
from rlx_mil.lower.target import Precision, Target
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


def _both(graph: Graph, params: dict[str, np.ndarray], target: str, precision: str, attention: str) -> tuple[object, object]:
    trimmed = rlx_mil.convert(graph, params, target=target, precision=precision, attention=attention)
    default = rlx_mil.convert(
        graph, params, target=target, precision=precision, attention=attention,
        pass_pipeline=default_pass_pipeline(Precision.parse(precision)),
    )
    return program_structure(trimmed._mil_program), program_structure(default._mil_program)  # type: ignore[attr-defined]


def _convertible_cases() -> list[tuple[str, str, str, str]]:
    """(case, target, precision, attention) for every catalogue graph that converts there (ops
    declared unsupported, or needing a later target, raise before any pass runs)."""
    cases = []
    for name in sorted(CATALOGUE):
        graph = CATALOGUE[name]()
        if any(type(n.op) in unsupported_ops() for n in graph):
            continue
        targets = supported_targets(graph)
        cases += [(name, *setting) for setting in SETTINGS if Target.parse(setting[0]) in targets]
    return cases


@pytest.mark.parametrize(("name", "target", "precision", "attention"), _convertible_cases())
def test_trimmed_pipeline_gives_the_default_program(name: str, target: str, precision: str, attention: str) -> None:
    graph = CATALOGUE[name]()
    _, params = random_leaves(graph)
    trimmed, default = _both(graph, params, target, precision, attention)
    assert trimmed == default


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
