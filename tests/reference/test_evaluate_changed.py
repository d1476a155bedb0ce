"""`evaluate_changed`: a run with some params changed reuses every value they do not reach."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_mil.reference import evaluate, evaluate_all, evaluate_changed
from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_inputs, tiny_lm_params

CONFIG = TinyLM(layers=3)
GRAPH = tiny_lm(CONFIG)
PARAMS = tiny_lm_params(GRAPH, CONFIG)
FEEDS = tiny_lm_inputs(CONFIG)


@pytest.mark.parametrize("names", [["layers.0.self_attn.q_proj.weight"],
                                   ["layers.1.mlp.down_proj.weight", "layers.2.self_attn.v_proj.weight"],
                                   ["head.weight"], ["embed_tokens.weight", "norm.weight"], []])
def test_the_outputs_equal_a_whole_run_with_the_changed_params(names: list[str]) -> None:
    rng = np.random.default_rng(len(names))
    changed = dict(PARAMS)
    for n in names:
        changed[n] = (PARAMS[n] + 0.05 * rng.standard_normal(PARAMS[n].shape)).astype(np.float32)
    from rlx_mil.ir.ops import Input, Param

    # Without the feeds' values: each run binds its own (base need not hold the weights).
    base = {i: v for i, v in evaluate_all(GRAPH, FEEDS, PARAMS).items() if not isinstance(GRAPH.node(i).op, (Input, Param))}
    got = evaluate_changed(GRAPH, FEEDS, changed, base, names)
    want = evaluate(GRAPH, FEEDS, changed)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    if names:
        assert not np.array_equal(got["logits"], evaluate(GRAPH, FEEDS, PARAMS)["logits"])


def test_values_the_changed_params_do_not_reach_come_from_the_base_run() -> None:
    base = dict(evaluate_all(GRAPH, FEEDS, PARAMS))
    # Poison layer 2's normalised MLP input (which its up_proj multiplies, and which up_proj
    # does not reach): a run that changes only up_proj takes it from base, one that changes
    # layer 0 recomputes it.
    residual = next(n.id for n in GRAPH if n.name == "layers.2.post_norm")
    base[residual] = base[residual] + 1.0
    clean = evaluate(GRAPH, FEEDS, PARAMS)["logits"]
    late = evaluate_changed(GRAPH, FEEDS, PARAMS, base, ["layers.2.mlp.up_proj.weight"])["logits"]
    assert not np.allclose(late, clean)
    early = evaluate_changed(GRAPH, FEEDS, PARAMS, base, ["layers.0.mlp.down_proj.weight"])["logits"]
    np.testing.assert_array_equal(early, clean)
