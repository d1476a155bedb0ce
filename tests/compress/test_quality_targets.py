"""The user's quality target (`--max-kl` / `--min-top1`, `max_kl=` / `min_top1=` in a
compression spec): validated up front, and used as the quality check's thresholds; the
report's per-weight reasons; and the quality options on a conversion that compresses nothing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil.cli import main
from rlx_mil.compress import parse_compress
from rlx_mil.compress.quality import DEFAULT_THRESHOLDS
from rlx_mil.errors import InvalidOptionError
from tests.llm.text_fixtures import chat_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_checkpoint(tmp_path_factory.mktemp("targets") / "ckpt")


def _convert(checkpoint: Path, out: Path, *extra: str) -> int:
    return main(["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "64",
                 "--precision", "fp32", *extra])


def test_a_valid_target_replaces_the_documented_thresholds() -> None:
    config = parse_compress("int8;max_kl=0.02;min_top1=0.95")
    assert config is not None
    assert (config.max_kl, config.min_top1) == (0.02, 0.95)
    assert config.thresholds.max_mean_kl == 0.02 and config.thresholds.min_top1 == 0.95
    assert config.thresholds.min_cosine == DEFAULT_THRESHOLDS.min_cosine
    assert "max_kl=0.02" in config.describe() and "min_top1=0.95" in config.describe()
    mapped = parse_compress({"default": "auto4", "min_top1": 1})
    assert mapped is not None and mapped.thresholds.min_top1 == 1.0 and mapped.thresholds.max_mean_kl == 0.1
    plain = parse_compress("int8")
    assert plain is not None and plain.thresholds == DEFAULT_THRESHOLDS


@pytest.mark.parametrize("option, value", [
    ("max_kl", "nan"), ("max_kl", "inf"), ("max_kl", "-0.1"), ("max_kl", "0"), ("max_kl", "low"),
    ("min_top1", "0"), ("min_top1", "1.01"), ("min_top1", "-1"), ("min_top1", "nan"), ("min_top1", "most"),
])
def test_a_bad_target_in_the_spec_is_refused_naming_the_option(option: str, value: str) -> None:
    with pytest.raises(InvalidOptionError, match=option):
        parse_compress(f"int8;{option}={value}")
    with pytest.raises(InvalidOptionError, match=option):
        parse_compress({"default": "int8", option: value})


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.booleans(), st.none()))
def test_any_hostile_min_top1_is_refused_or_kept_exactly(value: object) -> None:
    if value is None:
        return
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    good = not isinstance(value, bool) and math.isfinite(number) and 0 < number <= 1
    if good:
        config = parse_compress({"default": "int8", "min_top1": value})
        assert config is not None and config.thresholds.min_top1 == number
    else:
        with pytest.raises(InvalidOptionError, match="min_top1"):
            parse_compress({"default": "int8", "min_top1": value})


@pytest.mark.parametrize("flag, value", [("--max-kl", "nan"), ("--max-kl", "-1"), ("--min-top1", "2"),
                                         ("--min-top1", "high")])
def test_a_bad_target_on_the_command_line_is_one_error_before_any_work(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    out = tmp_path / "m.mlpackage"
    code = _convert(checkpoint, out, "--compress", "int8", flag, value)
    err = capsys.readouterr().err
    assert code in (1, 2)
    lines = [x for x in err.splitlines() if "error:" in x]
    assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err
    assert not out.exists()


def test_the_users_target_is_what_warns_and_what_verify_judges(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    # int8 passes the documented thresholds (test_quality_cli); a KL target below its KL does not
    code = _convert(checkpoint, tmp_path / "m.mlpackage", "--compress", "int8", "--max-kl", "1e-12", "--verify",
                    "--report", str(report))
    out, err = capsys.readouterr()
    assert code == 1, out
    assert "BELOW THRESHOLD" in err and "verify: FAILED: quality below the thresholds" in out
    quality = json.loads(report.read_text())["quality"]
    assert quality["thresholds"]["max_mean_kl"] == 1e-12 and not quality["ok"]
    assert quality["decoder"]["mean_kl"] > 1e-12
    # a garbage package fails the documented thresholds; a target that loose accepts it
    code = _convert(checkpoint, tmp_path / "m2.mlpackage", "--compress", "lut2-tensor", "--verify",
                    "--max-kl", "1000", "--min-top1", "1e-9", "--report", str(report))
    out, err = capsys.readouterr()
    quality = json.loads(report.read_text())["quality"]
    assert quality["thresholds"] == {"min_top1": 1e-9, "max_mean_kl": 1000.0, "min_cosine": DEFAULT_THRESHOLDS.min_cosine}
    assert quality["decoder"]["mean_kl"] > DEFAULT_THRESHOLDS.max_mean_kl  # the documented threshold would fail it
    assert code == 0 and quality["ok"], out + err
    assert "BELOW THRESHOLD" not in err


def test_the_report_says_why_each_weight_got_its_scheme(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    code = _convert(checkpoint, tmp_path / "m.mlpackage", "--compress", "auto4;embeddings=int8;re:v_proj=int8",
                    "--report", str(report))
    assert code == 0, capsys.readouterr()
    weights = json.loads(report.read_text())["compression"]["weights"]
    by_role: dict[str, list[dict[str, object]]] = {}
    for w in weights:
        by_role.setdefault(str(w["role"]), []).append(w)
    assert any("v_proj" in str(w["name"]) and str(w["note"]).startswith("rule ") for w in weights)
    planned = [w for w in weights if "v_proj" not in str(w["name"]) and w["role"] not in ("embedding",)]
    assert planned and all(str(w["note"]).startswith("auto4: est. error") and "(" in str(w["note"]) for w in planned)
    embedding = by_role["embedding"]  # tied: the head's note is checked on the plan below
    assert len(embedding) == 1 and str(embedding[0]["scheme"]).startswith("int8")
    assert embedding[0]["note"] == "embedding: the config's embedding scheme"


def test_quality_options_without_compression_warn_once_that_they_do_nothing(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _convert(checkpoint, tmp_path / "m.mlpackage", "--allow-quality-loss", "--max-kl", "0.05")
    err = capsys.readouterr().err
    assert code == 0
    lines = [x for x in err.splitlines() if "no effect" in x]
    assert len(lines) == 1 and "--allow-quality-loss, --max-kl" in lines[0] and "warning:" in lines[0]
    code = _convert(checkpoint, tmp_path / "m2.mlpackage", "--compress", "int8", "--allow-quality-loss")
    assert code == 0 and "no effect" not in capsys.readouterr().err


def test_the_auto_plan_names_the_head_as_the_most_sensitive_weight() -> None:
    import numpy as np

    from rlx_mil.compress.auto import plan_auto
    from rlx_mil.lowering.target import Target

    rng = np.random.default_rng(0)
    arrays = {"lm_head.weight": rng.standard_normal((64, 64)).astype(np.float32),
              "model.layers.0.mlp.up_proj.weight": rng.standard_normal((64, 64)).astype(np.float32)}
    storages = {n: (lambda a=a: a) for n, a in arrays.items()}
    roles = {"lm_head.weight": "lm_head", "model.layers.0.mlp.up_proj.weight": "weight"}
    total = sum(a.size * 2 for a in arrays.values())
    plan = plan_auto(4, storages, roles, Target.IOS18, np.float16, 0, total, 0.5, None)
    assert plan.notes["lm_head.weight"].startswith("auto4: est. error")
    assert "(head: the most sensitive weight; " in plan.notes["lm_head.weight"]
    assert "head:" not in plan.notes["model.layers.0.mlp.up_proj.weight"]
    # the head takes the budget first: its estimated error is below the other weight's
    assert plan.schemes["lm_head.weight"].bits >= plan.schemes["model.layers.0.mlp.up_proj.weight"].bits


def test_the_python_api_judges_by_the_target_in_the_spec() -> None:
    import warnings

    import rlx_mil
    from rlx_mil.compress import report_of
    from rlx_mil.errors import CompressionWarning
    from tests.compress.tiny_lm import TinyLM, tiny_lm, tiny_lm_params

    config = TinyLM(layers=1)
    graph = tiny_lm(config)
    params = tiny_lm_params(graph, config)
    verdicts = {}
    for spec in ("lut2", "lut2;max_kl=1000;min_top1=1e-9"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = rlx_mil.convert(graph, params, target="iOS18", precision="fp32", compress=spec)
        report = report_of(model)
        assert report is not None and report.quality is not None
        warned = [w for w in caught if issubclass(w.category, CompressionWarning) and "BELOW THRESHOLD" in str(w.message)]
        verdicts[spec] = (report.quality["ok"], len(warned), report.quality["thresholds"]["max_mean_kl"])
    # lut2 of this model crosses the documented KL threshold (0.206 > 0.1); the loose target accepts it
    assert verdicts == {"lut2": (False, 1, 0.1), "lut2;max_kl=1000;min_top1=1e-9": (True, 0, 1000.0)}
