"""Packages from anywhere: `inspect`, `preflight` and `run` on random bytes, folders without a
manifest, manifests naming missing weights, truncated protobufs, and packages coremltools wrote
itself (neural network and ML program). Each ends in one `rlx-mil CMD: error:` line or a correct
result; with --json, stdout is JSON whatever the outcome. Deploy and target combinations that
cannot hold are refused before anything is read, naming both options."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import rlx_mil
from rlx_mil.cli import main


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = rlx_mil.Graph("tiny")
    x = g.input("x", [2, 4])
    g.set_outputs([g.matmul(x, g.param("w", [4, 3]), name="y")])
    weights = {"w": np.arange(12, dtype=np.float32).reshape(4, 3)}
    return rlx_mil.save(rlx_mil.convert(g, weights, precision="fp32"), tmp_path_factory.mktemp("pkg") / "t.mlpackage")


def _copy(package: Path, folder: Path, name: str) -> Path:
    out = folder / name
    shutil.copytree(package, out)
    return out


def _without_weights(package: Path, folder: Path) -> Path:
    out = _copy(package, folder, "noweights.mlpackage")
    for blob in out.rglob("weight.bin"):
        blob.unlink()
    return out


def _short_weights(package: Path, folder: Path) -> Path:
    out = _copy(package, folder, "shortweights.mlpackage")
    for blob in out.rglob("weight.bin"):
        blob.write_bytes(blob.read_bytes()[:32])
    return out


def _truncated_spec(package: Path, folder: Path) -> Path:
    out = _copy(package, folder, "truncated.mlpackage")
    for spec in out.rglob("model.mlmodel"):
        spec.write_bytes(spec.read_bytes()[: spec.stat().st_size // 2])
    return out


def _no_manifest(package: Path, folder: Path) -> Path:
    out = _copy(package, folder, "nomanifest.mlpackage")
    (out / "Manifest.json").unlink()
    return out


def _bad_manifest(package: Path, folder: Path) -> Path:
    out = _copy(package, folder, "badmanifest.mlpackage")
    (out / "Manifest.json").write_text("{nope")
    return out


def _random_file(package: Path, folder: Path) -> Path:
    (folder / "random.mlpackage").write_bytes(np.random.default_rng(1).bytes(3000))
    return folder / "random.mlpackage"


def _random_mlmodel(package: Path, folder: Path) -> Path:
    (folder / "random.mlmodel").write_bytes(np.random.default_rng(2).bytes(300))
    return folder / "random.mlmodel"


def _fifo(package: Path, folder: Path) -> Path:
    os.mkfifo(folder / "fifo.mlpackage")
    return folder / "fifo.mlpackage"


def _neural_network(package: Path, folder: Path) -> Path:
    import coremltools as ct
    from coremltools.models import datatypes
    from coremltools.models.neural_network import NeuralNetworkBuilder

    builder = NeuralNetworkBuilder([("x", datatypes.Array(3))], [("y", datatypes.Array(3))])
    builder.add_activation("relu", "RELU", "x", "y")
    out = folder / "nn.mlpackage"
    ct.models.MLModel(builder.spec).save(str(out))
    return out


def _checkpoint_folder(package: Path, folder: Path) -> Path:
    """The checkpoint given where its converted package belongs (a newcomer's first slip)."""
    out = folder / "hf"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "llama"}')
    (out / "model.safetensors").write_bytes(b"")
    return out


def _gguf_file(package: Path, folder: Path) -> Path:
    (folder / "model.gguf").write_bytes(b"GGUF" + bytes(60))
    return folder / "model.gguf"


CONVERT_HF_FIRST = "hf: a Hugging Face checkpoint folder, not a Core ML package; convert it first: rlx-mil convert-hf"
CONVERT_GGUF_FIRST = "model.gguf: a GGUF file, not a Core ML package; convert it first: rlx-mil convert-gguf"

BROKEN: list[tuple[str, Callable[[Path, Path], Path], str]] = [
    ("checkpoint folder", _checkpoint_folder, CONVERT_HF_FIRST),
    ("GGUF file", _gguf_file, CONVERT_GGUF_FIRST),
    ("random bytes", _random_file, "random.mlpackage"),
    ("random .mlmodel", _random_mlmodel, "not a readable Core ML package"),
    ("no manifest", _no_manifest, "nomanifest.mlpackage"),
    ("bad manifest", _bad_manifest, "badmanifest.mlpackage"),
    ("missing weight file", _without_weights, "weight.bin"),
    ("truncated weight file", _short_weights, "weight.bin"),
    ("truncated protobuf", _truncated_spec, "truncated.mlpackage"),
    ("FIFO", _fifo, "a FIFO"),
    ("neural network", _neural_network, "not an ML Program"),
]


@pytest.mark.parametrize("command", ["inspect", "preflight", "run"])
@pytest.mark.parametrize("label, make, message", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_and_foreign_packages_are_one_error_line(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, label: str,
    make: Callable[[Path, Path], Path], message: str,
) -> None:
    if command == "inspect" and label == "random bytes":
        message = "random.mlpackage"  # a file: read as a graph JSON, which it is not
    if command == "run" and label == "random .mlmodel":
        message = "cannot open"
    target = make(package, tmp_path)
    np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32))
    extra = {"run": ["--inputs", str(tmp_path / "in.npz")], "inspect": ["--json"], "preflight": ["--json"]}[command]
    assert main([command, str(target), *extra]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rlx-mil {command}: error: ") and message in lines[0], lines
    if "--json" in extra:
        assert json.loads(out) == {"error": lines[0].split(": error: ", 1)[1], "command": command}


def test_a_program_coremltools_wrote_itself_is_read_and_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3))])
    def program(x: object) -> object:
        return mb.add(x=x, y=np.full((2, 3), 2.0, np.float32), name="y")

    out = tmp_path / "ct.mlpackage"
    ct.convert(program, convert_to="mlprogram", skip_model_load=True).save(str(out))
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"][0]["name"] == "x"
    assert main(["preflight", str(out), "--json"]) == 0
    assert isinstance(json.loads(capsys.readouterr().out), list)
    np.savez(tmp_path / "in.npz", x=np.arange(6, dtype=np.float32).reshape(2, 3))
    assert main(["run", str(out), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as got:
        np.testing.assert_allclose(got["y"], np.arange(6).reshape(2, 3) + 2.0)


@pytest.mark.parametrize("command", ["convert-hf", "convert-gguf"])
@pytest.mark.parametrize("flags, names", [
    (["--deploy", "ane", "--target", "iOS16"], ["--target iOS16", "--deploy ane"]),
    (["--target", "iOS17"], ["--target iOS17"]),
])
def test_stateful_packages_below_ios18_are_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, flags: list[str], names: list[str],
) -> None:
    """Refused before the (absent) model is read: the options alone cannot hold."""
    if command == "convert-gguf" and "--deploy" in flags:
        flags = flags[2:]
        names = names[:1]
    source = tmp_path / ("m.gguf" if command == "convert-gguf" else "model")
    source.mkdir() if command == "convert-hf" else source.write_bytes(b"GGUF")
    if command == "convert-hf":
        (source / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    assert main([command, str(source), "-o", str(tmp_path / "x.mlpackage"), *flags]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and all(name in lines[0] for name in names) and "iOS18" in lines[0], lines
    assert not (tmp_path / "x.mlpackage").exists()


@pytest.mark.parametrize("where", ["config.json", "sub/report.json", "out"])
def test_a_report_path_inside_the_input_or_output_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             where: str) -> None:
    """--report onto the checkpoint's config.json replaced it with the report: a report path
    that is, or lies inside, the command's input or output is refused before any work."""
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    checkpoint = write_random_checkpoint(tmp_path / "ck", TINY_CONFIGS["llama"], seed=1)
    (checkpoint / "sub").mkdir()
    before = (checkpoint / "config.json").read_bytes()
    out = tmp_path / "m.mlpackage"
    report = out if where == "out" else checkpoint / where
    assert main(["convert-hf", str(checkpoint), "-o", str(out), "--compress", "int8", "--report", str(report), "-q"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "it is, or lies inside, the command's" in lines[0], lines
    assert (checkpoint / "config.json").read_bytes() == before and not out.exists()
