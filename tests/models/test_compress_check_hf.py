"""`convert-hf --compress ... --compress-check INPUTS.npz`: the uncompressed conversion's output
error on the inputs, recorded in the package's compression report and printed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlx_mil import milexec
from rlx_mil.cli import main
from rlx_mil.compress import report_of
from rlx_mil.coreml.package_info import package_info
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


def test_compress_check_records_the_output_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_random_checkpoint(tmp_path / "llama", TINY_CONFIGS["llama"], seed=2)
    ids = np.random.default_rng(0).integers(0, TINY_CONFIGS["llama"]["vocab_size"], (1, 6)).astype(np.int32)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_ids=ids)
    plain, packed = tmp_path / "plain.mlpackage", tmp_path / "int8.mlpackage"
    common = ["--seq-len", "6", "--precision", "fp32", "-q"]
    assert main(["convert-hf", str(folder), "-o", str(plain), *common]) == 0
    capsys.readouterr()
    assert main(["convert-hf", str(folder), "-o", str(packed), *common, "--compress", "int8;min_size=1",
                 "--compress-check", str(inputs)]) == 0
    out = capsys.readouterr().out
    assert "compressed" in out and "output logits: max |error|" in out
    report = report_of(package_info(packed).metadata)
    assert report is not None and report.output_error is not None
    # The recorded error is the one between the two packages on these inputs.
    want = np.abs(milexec.run(packed, {"input_ids": ids})["logits"] - milexec.run(plain, {"input_ids": ids})["logits"])
    assert report.output_error["logits"]["max_abs"] == pytest.approx(float(want.max()), rel=1e-5, abs=1e-7)
    assert report.output_error["logits"]["max_abs"] > 0

    assert main(["convert-hf", str(folder), "-o", str(tmp_path / "x.mlpackage"), "--compress-check", str(inputs)]) == 1
    assert "--compress-check needs --compress" in capsys.readouterr().err
    assert main(["convert-hf", str(folder), "-o", str(tmp_path / "y.mlpackage"), "--stateful", "--max-context", "16",
                 "--compress", "int8", "--compress-check", str(inputs)]) == 1
    assert "rlx-mil eval" in capsys.readouterr().err
