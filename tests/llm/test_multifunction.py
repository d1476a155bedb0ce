"""Multifunction stateful packages: prefill buckets + decode sharing one copy of the weights and
the same states; the generation Session on the MIL executor against the reference."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import rlx_mil
from rlx_mil.errors import InvalidOptionError
from rlx_mil.generate import GenerationError, Session, pick_token
from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning

from .decode_graphs import TinyLM, decode_graph, tiny_params
from .stepping import full_sequence_logits

C = TinyLM()
PARAMS = tiny_params(C)
MAX_CONTEXT = 32


def _weights(path: Path) -> int:
    return os.path.getsize(path / "Data" / "com.apple.CoreML" / "weights" / "weight.bin")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mf") / "llm.mlpackage"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        rlx_mil.convert_functions(
            {"prefill_8": decode_graph(C, 8, 1), "prefill_4": decode_graph(C, 4, 1), "decode": decode_graph(C, 1, 1)},
            PARAMS, kv_cache="auto", max_context=MAX_CONTEXT, path=path,
        )
    return path


def test_functions_share_weights_and_states(package: Path, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        single = rlx_mil.save(rlx_mil.convert(decode_graph(C, 1, 1), PARAMS, kv_cache="auto", max_context=MAX_CONTEXT), tmp_path / "decode.mlpackage")
    ratio = _weights(package) / _weights(single)
    assert ratio <= 1.05, ratio
    import coremltools as ct

    model = ct.models.MLModel(str(package), skip_model_load=True)
    spec = model.get_spec()
    assert spec.description.defaultFunctionName == "decode"
    functions = {f.name: f for f in spec.description.functions}
    assert set(functions) == {"prefill_8", "prefill_4", "decode"}
    for f in functions.values():
        assert [s.name for s in f.state] == ["key_cache", "value_cache"]
        assert {i.name for i in f.input} == {"input_ids", "position_ids", "cache_position"}
    contract = json.loads(model.user_defined_metadata["rlx_mil.llm"])
    assert contract["functions"] == {"prefill_8": {"query_len": 8}, "prefill_4": {"query_len": 4}, "decode": {"query_len": 1}}
    assert contract["default_function"] == "decode" and contract["max_context"] == MAX_CONTEXT


def test_functions_are_lowered_against_one_copy_of_the_weights(tmp_path: Path) -> None:
    """Each weight is one array for every function (identity, not equal copies) and one blob;
    compressed codes, encoded per function, are still written once."""
    from rlx_mil.coreml import multifunction

    joined: list[object] = []
    original = multifunction.join_programs

    def spy(functions: dict[str, object], *args: object) -> object:
        programs = [f._mil_program.functions["main"] for f in functions.values()]  # type: ignore[attr-defined]
        arrays = [{id(op.outputs[0].val) for op in fn.operations if op.op_type == "const"
                   and getattr(op.outputs[0].val, "size", 0) >= 64} for fn in programs]
        joined.append(arrays)
        return original(functions, *args)  # type: ignore[arg-type]

    graphs = {"prefill_4": decode_graph(C, 4, 1), "decode": decode_graph(C, 1, 1)}
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        warnings.simplefilter("ignore", NeuralEngineWarning)
        patch.setattr(rlx_mil.api, "join_programs", spy)
        plain = rlx_mil.convert_functions(graphs, PARAMS, kv_cache="auto", max_context=MAX_CONTEXT)
        int8 = rlx_mil.convert_functions(graphs, PARAMS, kv_cache="auto", max_context=MAX_CONTEXT, compress="int8",
                                         path=tmp_path / "int8.mlpackage")
        single = rlx_mil.save(rlx_mil.convert(decode_graph(C, 1, 1), PARAMS, kv_cache="auto", max_context=MAX_CONTEXT,
                                              compress="int8"), tmp_path / "single.mlpackage")
    weights, _ = joined
    assert weights[0] == weights[1] and len(weights[0]) >= 4  # the very same arrays
    assert _weights(tmp_path / "int8.mlpackage") <= 1.05 * _weights(single)
    del plain, int8


def test_every_function_runs_and_matches_the_reference(package: Path) -> None:
    from rlx_mil import milexec

    program = milexec.load_program(package)
    for name, n in (("prefill_8", 8), ("prefill_4", 4), ("decode", 1)):
        tokens = list(range(3, 3 + n))
        feeds = {
            "input_ids": np.array([tokens], np.int32),
            "position_ids": np.arange(n, dtype=np.int32)[None],
            "cache_position": np.array([0], np.int32),
        }
        out = milexec.run(program, feeds, function_name=name, states={})
        want = full_sequence_logits(C, PARAMS, tokens)
        np.testing.assert_allclose(out["logits"], want, atol=0.02, rtol=0)


def reference_greedy(prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(np.argmax(full_sequence_logits(C, PARAMS, tokens)[0, -1])))
    return tokens[len(prompt):]


def test_session_generates_the_reference_greedy_tokens(package: Path) -> None:
    session = Session(package, precision_model="float32")
    assert session.engine == "milexec" or session.engine == "coreml"
    prompt = [5, 17, 3, 41, 8, 2, 9, 30, 11, 7, 1, 44, 20]  # 13 = 8 + 4 + 1: every function
    got = session.generate(prompt, 16)
    assert session.position == len(prompt) + 15
    assert got == reference_greedy(prompt, 16)
    session.reset()
    assert session.position == 0 and session.generate(prompt, 16) == got


def test_session_pads_a_tail_into_a_bucket(package: Path) -> None:
    session = Session(package, precision_model="float32")
    prompt = [5, 17, 3, 41, 8, 2, 9]  # 4 + a tail of 3: padded into prefill_4, then one decode
    got = session.generate(prompt, 4)
    assert session.calls[:3] == [("prefill_4", 4), ("prefill_4", 4), ("decode", 1)]
    assert got == reference_greedy(prompt, 4)


def test_session_refuses_what_does_not_fit(package: Path) -> None:
    session = Session(package)
    with pytest.raises(GenerationError, match="ints in"):
        session.feed([C.vocab])
    with pytest.raises(GenerationError, match="cache holds 32 tokens"):
        session.feed(list(range(MAX_CONTEXT + 1)))
    with pytest.raises(InvalidOptionError):
        session.generate([1], 2, temperature=-1.0)


def test_sampling_is_seeded_and_respects_top_k() -> None:
    logits = np.array([0.0, 5.0, 4.0, -3.0])
    rng = np.random.default_rng(0)
    picks = {pick_token(logits, 1.0, 2, rng) for _ in range(200)}
    assert picks == {1, 2}
    assert pick_token(logits, 0.0, None, rng) == 1


def test_function_options_are_checked() -> None:
    with pytest.raises(InvalidOptionError, match="identifier"):
        rlx_mil.convert_functions({"pre fill": decode_graph(C, 1, 1)}, PARAMS, kv_cache="auto", max_context=8)
    with pytest.raises(InvalidOptionError, match="default_function"):
        rlx_mil.convert_functions({"decode": decode_graph(C, 1, 1)}, PARAMS, default_function="x", kv_cache="auto", max_context=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuralEngineWarning)
        with pytest.raises(InvalidOptionError, match="different states"):
            rlx_mil.convert_functions(
                {"decode": decode_graph(C, 1, 1), "other": (decode_graph(C, 1, 1), {"max_context": 64})},
                PARAMS, kv_cache="auto", max_context=32,
            )


def test_cli_generate_and_inspect(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlx_mil.cli import main

    assert main(["generate", str(package), "--prompt-ids", "5,17,3", "-n", "16", "--engine", "milexec"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "engine: milexec"
    ids = [int(t) for t in out[1].split(",")]
    assert len(ids) == 16 and all(0 <= t < C.vocab for t in ids)
    assert main(["inspect", str(package)]) == 0
    text = capsys.readouterr().out
    assert "functions: 3 (default decode)" in text
    assert "    states:  key_cache fp16[2, 1, 2, 32, 8], value_cache fp16[2, 1, 2, 32, 8]" in text
    assert "kv cache: stacked, 2 layers, max_context 32, write position input 'cache_position'" in text
    assert main(["generate", str(package), "--prompt-ids", "5,x"]) == 1


def test_dynamic_sequence_dim_becomes_static_buckets(tmp_path: Path) -> None:
    from rlx_mil import milexec, reference
    from rlx_mil.ir.graph import Graph
    from rlx_mil.ir.shape import SEQ, Dynamic

    g = Graph("mlp")
    x = g.input("x", [1, Dynamic(SEQ), 16])
    y = g.gelu(g.matmul(x, g.param("w", [16, 16])), name="y")
    g.set_outputs([y])
    params = {"w": (np.random.default_rng(0).standard_normal((16, 16)) / 4).astype(np.float32)}
    path = tmp_path / "buckets.mlpackage"
    rlx_mil.convert_buckets(g, params, symbol=SEQ, sizes=[8, 4], path=path, precision="fp32")
    program = milexec.load_program(path)
    assert sorted(program.functions) == ["seq_4", "seq_8"]
    for n in (4, 8):
        feeds = {"x": np.random.default_rng(n).standard_normal((1, n, 16)).astype(np.float32)}
        got = milexec.run(program, feeds, function_name=f"seq_{n}", precision_model="float32")
        want = reference.evaluate(g, feeds, params)
        np.testing.assert_allclose(got["y"], want["y"], atol=1e-5, rtol=0)
    with pytest.raises(InvalidOptionError, match="no dynamic dim"):
        rlx_mil.convert_buckets(g, params, symbol=5, sizes=[4])
    with pytest.raises(InvalidOptionError, match="repeat"):
        rlx_mil.convert_buckets(g, params, symbol=SEQ, sizes=[4, 4])
