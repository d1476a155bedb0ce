"""What `convert-hf` writes with no flag beyond the output: for a decoder, the stateful prefill +
decode package that `generate`, `chat` and `eval` run; one graph with `--graph-only` (or a flag
shaping one graph); encoders as one graph, refusing the stateful flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from tiny_llm_package import CFG, tiny_checkpoint

from rlx_mil.cli import main
from rlx_mil.cli.convert_hf import choose_stateful, max_context_option, prefill_option
from rlx_mil.cli.main import _parser
from rlx_mil.coreml.package_info import package_info
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("ck"), seed=5)


def test_a_decoder_converts_to_the_stateful_package_by_default(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.mlpackage"
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "-q"]) == 0
    info = package_info(out)
    # 2048 capped at the checkpoint's 256 positions; one prefill bucket of 128 tokens
    assert sorted(info.functions) == ["decode", "prefill_128"]
    assert "functions prefill_128, decode" in capsys.readouterr().out
    assert main(["generate", str(out), "--prompt-ids", "1,2,3", "-n", "3", "--engine", "milexec", "-q"]) == 0
    ids = capsys.readouterr().out.splitlines()[-1].split(",")
    assert len(ids) == 3 and all(0 <= int(t) < CFG["vocab_size"] for t in ids)


def test_graph_only_writes_the_one_graph(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.mlpackage"
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "--graph-only", "--seq-len", "8", "-q"]) == 0
    info = package_info(out)
    assert len(info.functions) <= 1 and [i.name for i in info.inputs] == ["input_ids"]
    assert info.inputs[0].shape == [1, 8]
    capsys.readouterr()
    # generate refuses it, naming the command-line way back to the stateful package
    assert main(["generate", str(out), "--prompt-ids", "1,2", "--engine", "milexec", "-q"]) == 1
    err = capsys.readouterr().err
    assert "without --graph-only" in err and "kv_cache" in err and err.count("\n") == 1


def _args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["convert-hf", "ck", "-o", "m.mlpackage", *argv])


@pytest.mark.parametrize(("argv", "decoder", "want"), [
    ((), True, True), (("--stateful",), True, True), (("--graph-only",), True, False), (("--no-stateful",), True, False),
    (("--seq-len", "8"), True, False), (("--variant", "decode"), True, False), (("--prefill", "8"), True, True),
    (("--max-context", "64"), True, True), ((), False, False), (("--seq-len", "8"), False, False),
])
def test_the_choice(argv: tuple[str, ...], decoder: bool, want: bool) -> None:
    assert choose_stateful(_args(*argv), decoder) is want


@pytest.mark.parametrize(("argv", "decoder", "message"), [
    (("--stateful", "--seq-len", "8"), True, "drop --seq-len, or add --graph-only"),
    (("--prefill", "8", "--seq-len", "8"), True, "drop --seq-len, or add --graph-only"),
    (("--graph-only", "--prefill", "8"), True, "--prefill shapes the stateful package; drop --graph-only or drop it"),
    (("--graph-only", "--prefill", "8", "--max-context", "9"), True, "shape the stateful package; drop --graph-only or drop them"),
    (("--stateful",), False, "--stateful: only decoders keep a KV cache"),
    (("--max-context", "9"), False, "--max-context: only decoders keep a KV cache"),
])
def test_clashes_are_refused_before_reading(argv: tuple[str, ...], decoder: bool, message: str) -> None:
    from rlx_mil.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match=message.replace("(", r"\(")):
        choose_stateful(_args(*argv), decoder)


def test_the_defaults_of_the_stateful_package() -> None:
    assert max_context_option(_args(), None) == 2048
    assert max_context_option(_args(), 512) == 512
    assert max_context_option(_args(), 32768) == 2048
    assert max_context_option(_args("--max-context", "4096"), 512) == 4096  # asked for: the builder checks it
    assert prefill_option(_args(), 2048) == "128"
    assert prefill_option(_args(), 64) == "32"
    assert prefill_option(_args(), 3) == ""
    assert prefill_option(_args("--prefill", "none"), 2048) == ""
    assert prefill_option(_args("--prefill", "16,64"), 2048) == "16,64"
    assert prefill_option(_args("--attention-mask"), 2048) == ""


def test_an_encoder_converts_to_one_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_random_checkpoint(tmp_path / "bert", TINY_CONFIGS["bert"], seed=1)
    out = tmp_path / "e.mlpackage"
    assert main(["convert-hf", str(folder), "-o", str(out), "--seq-len", "6", "-q"]) == 0
    assert len(package_info(out).functions) <= 1
    assert main(["convert-hf", str(folder), "-o", str(tmp_path / "s.mlpackage"), "--stateful", "-q"]) == 1
    assert "only decoders keep a KV cache" in capsys.readouterr().err
    assert not (tmp_path / "s.mlpackage").exists()
