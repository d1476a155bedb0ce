"""`convert-hf` and `generate` options, hostile or careless: a usage error (exit 2) or a typed
one-line error (exit 1), or, for convert-hf, the conversion reached with options that mean
what they say (no flag ignored); never an internal error.

convert-hf's conversion itself is replaced by a stub that records its arguments (converting
is tested elsewhere); generate runs a tiny stateful package through the MIL executor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_llm_package import CFG, tiny_checkpoint, tiny_stateful_package

from rlx_mil import api
from rlx_mil.cli import main


class _Reached(BaseException):
    """Raised by the stubbed conversion: past every check, the command stops there. (Not a
    KeyboardInterrupt, which hypothesis and the interpreter treat as the user's Ctrl-C.)"""


SLOW_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck"), seed=13)


@pytest.fixture(scope="module")
def package(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_stateful_package(checkpoint, tmp_path_factory.mktemp("pkg"))


_VALUES = ["0", "1", "-1", "4", "16", "2048", "99999999999", "nan", "4,8", "1,2", "x", "", "int4", "int8-sym-asym",
           "glob:*nomatch*=int8", "stacked", "per_layer", "decode"]
_FLAGS = st.one_of(
    st.sampled_from([["--stateful"], ["--verify"], ["--last-logits"], ["--kv-outputs"], ["--position-ids"],
                     ["--attention-mask"], ["--overwrite"], ["--token-type-ids"]]),
    st.tuples(st.sampled_from(["--prefill", "--max-context", "--cache-layout", "--seq-len", "--cache-len",
                               "--batch-size", "--max-positions", "--variant", "--compress", "--precision"]),
              st.sampled_from(_VALUES)).map(list),
)


@SLOW_OK
@given(flags=st.lists(_FLAGS, max_size=4))
def test_convert_hf_options_typed_error_or_meant(
    checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], flags: list[list[str]],
) -> None:
    reached: list[tuple[str, dict[str, Any]]] = []

    def stub(kind: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            reached.append((kind, kwargs))
            raise _Reached  # ends the command without converting
        return call

    monkeypatch.setattr(api, "convert", stub("convert"))
    monkeypatch.setattr(api, "convert_functions", stub("convert_functions"))
    argv = [item for flag in flags for item in flag]
    out = tmp_path_factory.mktemp("out") / "m.mlpackage"
    capsys.readouterr()
    try:
        code = main(["convert-hf", str(checkpoint), "-o", str(out), "-q", *argv])
    except SystemExit as exit_:
        assert exit_.code == 2, argv
        return
    except _Reached:
        code = 130
    if reached:
        assert code == 130
        kind, kwargs = reached[0]
        given = {flag[0]: flag[1] if len(flag) > 1 else True for flag in flags}
        # Decoders convert to the stateful package unless a flag shaping one graph is given.
        graph_flags = {"--seq-len", "--cache-len", "--max-positions", "--last-logits", "--kv-outputs", "--position-ids"}
        one_graph = bool(graph_flags & set(given)) or given.get("--variant") == "decode" or \
            given.get("--batch-size", "1") != "1"
        stateful = "--stateful" in given or not one_graph
        assert (kind == "convert_functions") == stateful, argv
        if not stateful:
            assert not {"--prefill", "--max-context", "--cache-layout"} & set(given), f"{argv}: a stateful flag ignored"
        else:
            # default: 2048 capped at the positions the checkpoint was trained for
            want = int(given.get("--max-context", min(2048, CFG["max_position_embeddings"])))
            assert kwargs["max_context"] == want, argv
            if "--cache-layout" in given:
                assert kwargs["cache_layout"] == given["--cache-layout"], argv
        return
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, f"{argv}: exit {code}: {err}"
    assert err and err[0].startswith("rlx-mil convert-hf: error: ") and "internal error" not in err[0], err
    assert not out.exists()


_GEN_VALUES = ["0", "1", "-1", "3", "0.7", "inf", "nan", "-0.5", "1e308", "1,2", "5,-1", "96", "x", "", "99999999999"]


@SLOW_OK
@given(flags=st.lists(st.tuples(st.sampled_from(["--prompt-ids", "-n", "--temperature", "--top-k", "--top-p",
                                                 "--seed"]), st.sampled_from(_GEN_VALUES)), max_size=4))
def test_generate_options_typed_error_or_tokens(package: Path, capsys: pytest.CaptureFixture[str],
                                               flags: list[tuple[str, str]]) -> None:
    argv = [item for flag in flags for item in flag]
    if "--prompt-ids" not in argv:
        argv = ["--prompt-ids", "1,2,3", *argv]
    capsys.readouterr()
    try:
        code = main(["generate", str(package), "--engine", "milexec", "-q", *argv])
    except SystemExit as exit_:
        assert exit_.code == 2, argv
        return
    out, err = capsys.readouterr()
    if code == 0:
        ids = ",".join(line for line in out.splitlines() if not line.startswith("engine:")).split(",")
        assert all(0 <= int(t) < CFG["vocab_size"] for t in ids if t), out
        return
    lines = err.strip().splitlines()
    assert code == 1 and lines and lines[0].startswith("rlx-mil generate: error: "), f"{argv}: exit {code}: {err}"
    assert "internal error" not in err
