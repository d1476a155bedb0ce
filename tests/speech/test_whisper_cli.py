"""`rlx-mil convert-hf` on Whisper folders: the WhisperKit folder in one command, --verify, and
one-line errors for what does not apply or cannot be read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlx_mil.cli import main
from rlx_mil.cli.convert_whisper import is_whisper_folder
from rlx_mil.models.ct2_file import write_ct2
from rlx_mil.models.families.whisper import TINY_WHISPER
from rlx_mil.models.random_checkpoint import write_random_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("cli") / "whisper-tiny", TINY_WHISPER, seed=4)


def test_convert_hf_writes_and_verifies_the_whisperkit_folder(checkpoint: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path), "--cache-len", "4", "--verify", "-q",
                 "--stateful"]) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "openai_whisper-tiny"
    assert sorted(p.name for p in folder.iterdir()) == [
        "AudioEncoder.mlpackage", "MelSpectrogram.mlpackage", "TextDecoder.mlpackage", "TextDecoderStateful.mlpackage",
        "config.json", "generation_config.json"]
    assert "TextDecoderStateful: 4 tokens against the reference decoder" in out and "argmax agrees: ok" in out
    for role, output in (("MelSpectrogram", "melspectrogram_features"), ("AudioEncoder", "encoder_output_embeds"),
                         ("TextDecoder", "logits")):
        assert f"{role}:   check {output}:" in out and f"wrote {folder}" in out
    assert " ok" in out and "FAIL" not in out
    assert json.loads((folder / "config.json").read_text())["d_model"] == TINY_WHISPER["d_model"]
    # an existing folder is refused without --overwrite
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path), "--cache-len", "4", "-q"]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--seq-len", "8"], "not for a Whisper folder: --seq-len"),
    (["--variant", "decode"], "not for a Whisper folder: --variant decode"),
    (["--cache-len", "999"], "cache_len must be an integer in [1, max_target_positions = 32]"),
    (["--max-kl", "abc"], "--max-kl is a finite mean KL > 0 (nats), got 'abc'"),
    (["--min-top1", "2", "--compress", "int8"], "--min-top1 is a top-1 agreement share in (0, 1]"),
    (["--stateful", "--target", "iOS17", "--deploy", "ane"], "--target iOS17 with --deploy ane: the stateful package"),
    (["--compress", "int4", "--target", "iOS17"], "--compress int4 with --target iOS17: int4-sym-block32: 4-bit linear"),
    (["--compress", "int8", "--target", "iOS15"], "--compress int8 with --target iOS15"),
    (["--chunk-bytes", "0"], "not for a Whisper folder: --chunk-bytes"),
    (["--compress", "int4", "--chunk-bytes", "x", "--compress-calibration", "missing.npz"],
     "not for a Whisper folder: --chunk-bytes"),
    (["--max-context", "8", "--author", "A", "--pooling", "mean"],
     "not for a Whisper folder: --max-context, --pooling, --author"),
    (["--report", "."], ".: a directory, not a report"),
    (["--attention", "fused"], "--attention does not apply to a Whisper folder"),
])
def test_flags_that_do_not_apply_are_one_line_errors(checkpoint: Path, tmp_path: Path, flags: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path), *flags]) in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlx-mil convert-hf: error:") and message in err[0]
    assert not (tmp_path / "openai_whisper-tiny").exists()


def test_quality_targets_without_compress_are_warned_about(checkpoint: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """--max-kl without --compress: one warning line, checked before anything is read (the
    conversion itself is stopped there)."""
    import rlx_mil.cli.convert_whisper as whisper_cli

    def stop(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(whisper_cli, "run_whisper", stop)
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path), "--max-kl", "0.5"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == ("rlx-mil convert-hf: warning: --max-kl: no effect, this conversion compressed no weight (give"
                      " --compress) (CompressionWarning)"), err


def test_a_broken_ct2_folder_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "faster-whisper-broken"
    folder.mkdir()
    write_ct2(folder / "model.bin", "WhisperSpec", 3, {})
    data = (folder / "model.bin").read_bytes()
    (folder / "model.bin").write_bytes(data[:-2])  # the alias count cut short
    assert is_whisper_folder(folder)
    assert main(["convert-hf", str(folder), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.bin" in err[0] and err[0].startswith("rlx-mil convert-hf: error:")


def test_whisper_folders_are_told_apart(checkpoint: Path, tmp_path: Path) -> None:
    assert is_whisper_folder(checkpoint)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not is_whisper_folder(tmp_path)
    assert not is_whisper_folder(tmp_path / "missing")


def test_a_failed_conversion_leaves_nothing_behind(checkpoint: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The packages are written into a staging folder renamed into place at the end: a
    conversion failing after the first package leaves no folder and no staging folder."""
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path), "--cache-len", "4", "--compress", "bogus"]) in (1, 2)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlx-mil convert-hf: error:")
    assert list(tmp_path.iterdir()) == []


def test_a_conversion_failing_midway_leaves_the_old_folder(checkpoint: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from rlx_mil import api
    from rlx_mil.errors import ConversionError
    from rlx_mil.speech.packages import convert_whisper

    old = tmp_path / "openai_whisper-tiny"
    old.mkdir()
    (old / "marker").write_text("old")
    real = api.convert

    def failing(graph: object, *args: object, **kwargs: object) -> object:
        if getattr(graph, "name", "") == "AudioEncoder":
            raise ConversionError("the encoder failed")
        return real(graph, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "convert", failing)
    with pytest.raises(ConversionError):
        convert_whisper(checkpoint, tmp_path, cache_len=4, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["openai_whisper-tiny"]
    assert [p.name for p in old.iterdir()] == ["marker"]


def test_staging_folders_of_dead_processes_are_swept(tmp_path: Path) -> None:
    from rlx_mil.speech.packages import _sweep_staging

    dead = tmp_path / ".openai_whisper-tiny.rlx-staging-999999999-abc"
    alive = tmp_path / f".openai_whisper-tiny.rlx-staging-{__import__('os').getpid()}-abc"
    dead.mkdir()
    alive.mkdir()
    _sweep_staging(tmp_path / "openai_whisper-tiny")
    assert not dead.exists() and alive.exists()
