"""`rlx-mil convert-hf --stateful`: a tiny Qwen3-style checkpoint becomes one stateful prefill +
decode package in one command; the MIL executor generates the reference's greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlx_mil.cli import main
from rlx_mil.errors import InvalidOptionError
from rlx_mil.generate import Session
from rlx_mil.llm.package import prefill_buckets, reference_greedy
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("hf") / "qwen3", TINY_CONFIGS["qwen3"], seed=3)


def test_one_command_package_generates_the_reference_tokens(
    qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "qwen3.mlpackage"
    argv = ["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--max-context", "32", "--prefill", "8,4",
            "--precision", "fp32", "--verify", "-q"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "functions prefill_4, prefill_8, decode" in text and ": ok" in text
    prompt = [3, 14, 15, 92, 65, 35, 8, 9, 7, 9, 3, 2, 38]  # 8 + 4 + 1
    session = Session(out, precision_model="float32")
    assert session.generate(prompt, 16) == reference_greedy(qwen3, prompt, 16)
    assert [name for name, _ in session.calls[:3]] == ["prefill_8", "prefill_4", "decode"]
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "functions: 3 (default decode)" in shown
    assert "states:  key_cache fp16[2, 1, 2, 32, 16], value_cache fp16[2, 1, 2, 32, 16]" in shown
    contract = session.contract
    assert contract.max_context == 32 and contract.mask_kinds == ["Causal"]


def test_fp16_package_stays_close_to_the_reference(qwen3: Path, tmp_path: Path) -> None:
    out = tmp_path / "qwen3_fp16.mlpackage"
    assert main(["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--max-context", "32", "-q"]) == 0
    session = Session(out)
    got = session.generate([3, 14, 15, 92, 65], 8)
    want = reference_greedy(qwen3, [3, 14, 15, 92, 65], 8)
    # fp16 states and program against the fp32 reference: for this checkpoint no near-tie flips.
    assert got == want


def test_stateful_flags_are_checked(qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.mlpackage"
    assert main(["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--seq-len", "4"]) == 1
    assert "drop --seq-len" in capsys.readouterr().err
    assert main(["convert-hf", str(qwen3), "-o", str(out), "--stateful", "--max-context", "16", "--prefill", "16"]) == 1
    assert "prefill bucket" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(InvalidOptionError):
        prefill_buckets("4,x", 16)
    assert prefill_buckets("8, 4,8", 16) == [4, 8]


def test_batch_of_two_shares_one_write_position(qwen3: Path) -> None:
    # Two sequences of equal length decode together: one cache_position for the batch.
    import warnings

    import numpy as np

    import rlx_mil
    from rlx_mil import milexec, reference
    from rlx_mil.lowering.state.kv_cache import NeuralEngineWarning
    from rlx_mil.models.pretrained import from_pretrained

    tokens = np.array([[3, 14, 15, 92, 65, 35], [8, 9, 7, 9, 3, 2]], np.int32)
    models = {}
    for n in (4, 1):
        graph, params = from_pretrained(qwen3, "decode", seq_len=n, cache_len=1, batch_size=2, max_positions=32,
                                        last_logits=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NeuralEngineWarning)
            models[n] = rlx_mil.convert(graph, params, precision="fp32", kv_cache="auto", max_context=32)
    states: dict[str, np.ndarray] = {}
    position = 0
    for chunk in (tokens[:, :4], tokens[:, 4:5], tokens[:, 5:6]):
        n = chunk.shape[1]
        feeds = {"input_ids": chunk, "position_ids": np.tile(np.arange(position, position + n, dtype=np.int32), (2, 1)),
                 "cache_position": np.array([position], np.int32)}
        got = milexec.run(models[n], feeds, states=states, precision_model="float32")["logits"]
        position += n
        full, full_params = from_pretrained(qwen3, "prefill", seq_len=position, batch_size=2, last_logits=True)
        want = reference.evaluate(full, {"input_ids": tokens[:, :position]}, full_params)["logits"]
        np.testing.assert_allclose(got, want, atol=1e-4 * float(np.abs(want).max()), rtol=1e-4)
