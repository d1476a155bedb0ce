"""The public API's options and the atomic save."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx_mil
from rlx_mil.errors import InvalidOptionError
from rlx_mil.ir.graph import Graph
from rlx_mil.lowering.target import Precision, Target


def _graph() -> Graph:
    g = Graph("api")
    x = g.input("x", [2, 4])
    g.set_outputs([g.relu(x, name="y")])
    return g


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"target": "iOS14"}, "unknown target 'iOS14'"),
        ({"precision": "int8"}, "unknown precision 'int8'"),
        ({"compute_units": "GPU"}, "compute_units must be one of"),
        ({"attention": "flash"}, "attention must be one of"),
    ],
)
def test_bad_options_are_typed_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        rlx_mil.convert(_graph(), **kwargs)


def test_target_and_precision_spellings() -> None:
    assert Target.parse("ios17") is Target.IOS17
    assert Target.parse(16) is Target.IOS16
    assert Precision.parse("float32") is Precision.FP32


class _FailingModel:
    """Writes part of a package, then fails, like an interrupted save."""

    def save(self, path: str) -> None:
        Path(path).mkdir()
        (Path(path) / "Manifest.json").write_text("{}")
        raise OSError("disk full")


def test_failed_save_leaves_nothing_behind(tmp_path: Path) -> None:
    dest = tmp_path / "m.mlpackage"
    with pytest.raises(OSError, match="disk full"):
        rlx_mil.save(_FailingModel(), dest)
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_the_old_package(tmp_path: Path) -> None:
    dest = tmp_path / "m.mlpackage"
    dest.mkdir()
    (dest / "old").write_text("keep me")
    with pytest.raises(OSError, match="disk full"):
        rlx_mil.save(_FailingModel(), dest, overwrite=True)
    assert (dest / "old").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["m.mlpackage"]


def test_save_refuses_to_overwrite_and_checks_suffix(tmp_path: Path) -> None:
    model = rlx_mil.convert(_graph(), precision="fp32")
    dest = rlx_mil.save(model, tmp_path / "m.mlpackage")
    assert (dest / "Manifest.json").is_file()
    with pytest.raises(FileExistsError):
        rlx_mil.save(model, dest)
    rlx_mil.save(model, dest, overwrite=True)
    assert (dest / "Manifest.json").is_file()
    with pytest.raises(InvalidOptionError, match=r"\.mlpackage"):
        rlx_mil.save(model, tmp_path / "m.mlmodel")
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 4
    np.testing.assert_array_equal(rlx_mil.milexec.run(dest, {"x": x})["y"], np.maximum(x, 0))


@pytest.mark.parametrize("target", ["iOS15", "iOS18"])
def test_channel_scale_and_shift_convert_in_fp16(target: str) -> None:
    """coremltools' fuse_elementwise_to_batchnorm pass rejects its own output on fp16
    programs; convert() leaves it out, so mul/add by [C, 1, 1] weights convert."""
    g = Graph("scale_shift")
    x = g.input("x", [1, 4, 3, 3])
    y = g.add(g.mul(x, g.param("s", [4, 1, 1])), g.param("b", [4, 1, 1]), name="y")
    g.set_outputs([y])
    rng = np.random.default_rng(0)
    params = {"s": rng.standard_normal((4, 1, 1)).astype(np.float32), "b": rng.standard_normal((4, 1, 1)).astype(np.float32)}
    xv = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    model = rlx_mil.convert(g, params, target=target, precision="fp16")
    got = rlx_mil.milexec.run(model, {"x": xv})["y"]
    np.testing.assert_allclose(got, xv * params["s"] + params["b"], rtol=5e-3, atol=5e-3)


def test_weights_beyond_fp16_range_warn_naming_the_param() -> None:
    from rlx_mil.errors import PrecisionWarning

    g = Graph("big_weights")
    x = g.input("x", [1, 4])
    g.set_outputs([g.add(x, g.param("attn.bias", [4]), name="y")])
    params = {"attn.bias": np.float32([0.0, -1e9, 0.0, 1.0])}
    with pytest.warns(PrecisionWarning, match=r"param 'attn\.bias': values up to 1e\+09"):
        rlx_mil.lower(g, params, precision="fp16")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        rlx_mil.lower(g, params, precision="fp32")
