"""On macOS 15+, the stateful package runs through Core ML itself (make_state / predict with
state=, one state shared by the functions) and generates the executor's greedy tokens;
elsewhere these tests skip with the reason shown."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import rlx_mil
from rlx_mil.generate import Session
from rlx_mil.llm.runner import coreml_available
from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning

from .decode_graphs import TinyLM, decode_graph, tiny_params

pytestmark = pytest.mark.skipif(
    not coreml_available(),
    reason="stateful prediction needs macOS 15 with the Core ML runtime; here the MIL executor runs the packages",
)


@pytest.mark.parametrize("units", ["CPU_ONLY", "ALL"])
def test_core_ml_generates_the_executor_tokens(units: str, tmp_path: Path) -> None:
    c = TinyLM()
    path = tmp_path / "llm.mlpackage"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        rlx_mil.convert_functions(
            {"prefill_4": decode_graph(c, 4, 1), "decode": decode_graph(c, 1, 1)}, tiny_params(c),
            kv_cache="auto", max_context=32, path=path,
        )
    prompt = [5, 17, 3, 41, 8, 2, 9]
    want = Session(path, engine="milexec").generate(prompt, 8)
    got = Session(path, engine="coreml", compute_units=units).generate(prompt, 8)
    assert got == want


def test_core_ml_runs_a_chunked_set_like_the_executor(tmp_path: Path) -> None:
    from rlx_mil.llm.package import convert_llm_checkpoint
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    checkpoint = write_random_checkpoint(tmp_path / "llama", {**TINY_CONFIGS["llama"], "num_hidden_layers": 3}, seed=1)
    folder = tmp_path / "set"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        convert_llm_checkpoint(checkpoint, folder, max_context=32, prefill=[4], chunk_bytes="30KB")
    prompt = [5, 17, 3, 41, 8, 2, 9]
    want = Session(folder, engine="milexec").generate(prompt, 8)
    assert Session(folder, engine="coreml", compute_units="CPU_ONLY").generate(prompt, 8) == want
