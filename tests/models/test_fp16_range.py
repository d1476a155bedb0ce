"""Gemma's residual stream under fp16: held divided by `DecoderSpec.stream_scale`, a tiny Gemma 3
whose hidden states pass fp16's 65,504 gives finite logits matching the independent forward,
where the same graph without the scaling gives inf / NaN."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rlx_mil
from models.hf_numpy import FORWARDS
from rlx_mil import milexec
from rlx_mil.errors import InvalidOptionError
from rlx_mil.models import from_pretrained
from rlx_mil.models.families import model_spec
from rlx_mil.models.hf_config import GEMMA_STREAM_SCALE, DecoderSpec
from rlx_mil.models.pretrained import build
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

FP16_MAX = 65504.0
#: The post-feed-forward norms' weights: each layer adds up to ~2.5 x 2e4 to a channel of the
#: stream (a normalised row of 32 holds values up to ~2.5), three layers pass 65,504.
LOUD_GAMMA = 2e4


def ids() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 96, (1, 8)).astype(np.int32)


@pytest.fixture(scope="module")
def loud_gemma3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """A tiny Gemma 3 whose post-feed-forward norms push the residual stream past fp16's range."""
    cfg = TINY_CONFIGS["gemma3_text"]
    folder = write_random_checkpoint(tmp_path_factory.mktemp("loud") / "gemma3", cfg, seed=0)
    _, params = from_pretrained(folder, seq_len=8)
    loud = dict(params)
    for i in range(cfg["num_hidden_layers"]):
        name = f"model.layers.{i}.post_feedforward_layernorm.weight"
        loud[name] = np.full_like(np.asarray(params[name]), LOUD_GAMMA)
    return loud


def test_gemma_specs_hold_the_stream_scaled() -> None:
    for family in ("gemma3_text", "gemma2"):
        spec = model_spec(TINY_CONFIGS[family])
        assert isinstance(spec, DecoderSpec) and spec.stream_scale == GEMMA_STREAM_SCALE
    assert model_spec(TINY_CONFIGS["llama"]).stream_scale is None  # type: ignore[union-attr]


def test_loud_gemma3_fp16_is_finite_and_matches_where_unscaled_overflows(loud_gemma3: dict[str, np.ndarray]) -> None:
    loud = loud_gemma3
    cfg = TINY_CONFIGS["gemma3_text"]
    want, _ = FORWARDS[cfg["model_type"]](loud, cfg, ids())
    spec = model_spec(cfg)
    assert isinstance(spec, DecoderSpec)
    scaled, _, _ = build(spec, seq_len=8)
    plain, _, _ = build(dataclasses.replace(spec, stream_scale=None), seq_len=8)
    feeds = {"input_ids": ids()}

    # the stream as the model computes it (fp32, unscaled) passes fp16's range ...
    exact_run = milexec.execute(rlx_mil.convert(plain, loud, precision="fp32"), feeds, keep_values=True)
    residuals = [v for name, v in exact_run.values.items() if "residual" in name]
    assert residuals and max(float(np.abs(v).max()) for v in residuals) > FP16_MAX
    # ... so in fp16 without the scaling a residual add overflows
    broken = milexec.execute(rlx_mil.convert(plain, loud, precision="fp16"), feeds)
    assert not np.isfinite(broken.outputs["logits"]).all()
    assert broken.nonfinite_origins and "residual" in broken.nonfinite_origins[0]

    half = milexec.run(rlx_mil.convert(scaled, loud, precision="fp16"), feeds)["logits"]
    assert np.isfinite(half).all()
    assert np.abs(half - want).max() <= 5e-2 * np.abs(want).max()
    assert (half.argmax(-1) == want.argmax(-1)).mean() >= 0.75

    # fp32: the scaled graph computes what the plain one does (powers of two scale exactly).
    exact = milexec.run(rlx_mil.convert(scaled, loud, precision="fp32"), feeds)["logits"]
    unscaled = exact_run.outputs["logits"]
    assert np.abs(exact - want).max() <= 1e-4 * np.abs(want).max()
    assert np.abs(exact - unscaled).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("scale", [3.0, 0.0, -4.0, float("inf")])
def test_stream_scale_must_be_a_power_of_two(scale: float) -> None:
    spec = model_spec(TINY_CONFIGS["gemma3_text"])
    assert isinstance(spec, DecoderSpec)
    with pytest.raises(InvalidOptionError, match="stream_scale"):
        build(dataclasses.replace(spec, stream_scale=scale), seq_len=4)

