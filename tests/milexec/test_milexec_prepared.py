"""The prepared executor (`rlx_mil.milexec.prepared`): the same numbers as a plain run, weights
mapped or widened once, KV caches written in place, and in-place writes only where safe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from milexec_util import build_function, unprepared_logits

from rlx_mil import milexec
from rlx_mil.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint
from rlx_mil.milexec import prepared
from rlx_mil.milexec.fp16 import widen
from rlx_mil.milexec.kernels.linalg import _blocked_linear
from rlx_mil.milexec.loader import mapped_file
from rlx_mil.milexec.prepared import prepare
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint


def test_fp16_widening_is_exact_for_every_bit_pattern() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got, want = widen(every), every.astype(np.float32)
    assert np.array_equal(got.view(np.uint32)[np.isfinite(want)], want.view(np.uint32)[np.isfinite(want)])
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[np.isinf(want)], want[np.isinf(want)])


def test_blocked_linear_equals_the_whole_float32_product() -> None:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((3000, 700)) * 0.05).astype(np.float16)
    for rows in (1, 5):
        x = rng.standard_normal((rows, 700)).astype(np.float32)
        want = x @ weight.astype(np.float32).T
        # The same products; BLAS may sum a block's columns in another order (float32 ulps).
        np.testing.assert_allclose(_blocked_linear(x, weight), want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("prepared")
    config = dict(TINY_CONFIGS["qwen3"], vocab_size=4096)  # an LM head big enough to be blocked
    checkpoint = write_random_checkpoint(folder / "qwen3", config, seed=4)
    path = folder / "qwen3.mlpackage"
    convert_llm_checkpoint(checkpoint, path, max_context=32, prefill=[4])
    return path


@pytest.mark.parametrize("memory", ["fast", "lean"])
def test_session_memory_modes_give_the_plain_runs_numbers(package: Path, memory: str) -> None:
    session = Session(package, engine="milexec", memory=memory)
    assert session.memory == memory
    prompt = [5, 17, 300, 4000, 9, 2]  # prefill_4, then decode twice
    got = [session.feed(prompt)]
    calls = [("prefill_4", prompt[:4], 0), ("decode", prompt[4:5], 4), ("decode", prompt[5:6], 5)]
    for token in (11, 12, 13):
        got.append(session.feed([token]))
        calls.append(("decode", [token], len(calls) + 3))
    want = unprepared_logits(package, calls)
    np.testing.assert_array_equal(got[0], want[2])
    for g, w in zip(got[1:], want[3:], strict=True):
        np.testing.assert_array_equal(g, w)


def test_states_are_written_in_place_and_weights_shared(package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A budget that holds the one weight past WIDEN_MIN here (the embedding / LM head).
    monkeypatch.setattr(prepared, "FAST_CACHE_RATIO", 2.0)
    session = Session(package, engine="milexec", memory="fast")
    session.feed([1, 2, 3, 4, 5])
    buffers = {name: id(value) for name, value in session._states.items()}
    session.feed([6])
    assert {name: id(value) for name, value in session._states.items()} == buffers
    key = session._states["key_cache"]
    assert key.dtype == np.float16 and np.count_nonzero(np.abs(key).sum(axis=(0, 1, 2, 4))) == 6

    fast = session._prepared
    lean = prepare(package, memory="lean")
    # The embedding / LM head (the one weight past WIDEN_MIN here) widened once for both
    # functions; nothing widened in lean.
    assert fast.prepared_bytes == 4 * 4096 * TINY_CONFIGS["qwen3"]["hidden_size"] and lean.prepared_bytes == 0
    widened = [next(v for v in plan.consts.values() if v.shape == (4096, 32)) for plan in fast._plans.values()]
    assert len(widened) == 2 and all(w is widened[0] and w.dtype == np.float32 for w in widened)
    # The default budget (1.5x the fp16 bytes) cannot hold a float32 copy of the only weight.
    monkeypatch.setattr(prepared, "FAST_CACHE_RATIO", 1.5)
    assert prepare(package, memory="fast").prepared_bytes == 0
    embed = next(v for v in lean._plans["decode"].consts.values() if v.ndim == 2 and v.shape[0] == 4096)
    assert embed.dtype == np.float16 and mapped_file(embed) is not None and not embed.flags.writeable


def _state_update_program(later_use: str) -> tuple[object, dict[str, np.ndarray]]:
    from coremltools.converters.mil import Builder as mb

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    feeds = {"x": x, "u": np.full((1, 4), -1.0, np.float32)}

    def build(inputs: dict[str, object]) -> list[object]:
        view = mb.reshape(x=inputs["x"], shape=[16]) if later_use == "view" else None
        written = mb.slice_update(x=inputs["x"], update=inputs["u"], begin=[1, 0], end=[2, 4])
        if later_use == "input":
            return [written, mb.add(x=inputs["x"], y=0.0)]
        if later_use == "view":
            return [written, mb.add(x=view, y=0.0)]
        return [written, mb.mul(x=written, y=1.0)]

    return build_function(feeds, build), feeds


@pytest.mark.parametrize("later_use", ["input", "view", "none"])
def test_in_place_writes_never_change_a_value_still_read(later_use: str) -> None:
    function, feeds = _state_update_program(later_use)
    outputs = list(milexec.run(function, feeds).values())
    expected = feeds["x"].copy()
    expected[1] = -1.0
    np.testing.assert_array_equal(outputs[0], expected)
    if later_use == "input":
        np.testing.assert_array_equal(outputs[1], feeds["x"])
    elif later_use == "view":
        np.testing.assert_array_equal(outputs[1], feeds["x"].reshape(16))
    else:
        np.testing.assert_array_equal(outputs[1], expected)


@pytest.mark.parametrize("option", [{"memory": "quick"}, {"threads": 0}, {"threads": True}, {"blas_threads": -1},
                                    {"blas_threads": 1.5}])
def test_bad_prepare_options_are_typed_errors_before_loading(option: dict[str, object], tmp_path: Path) -> None:
    from rlx_mil.errors import InvalidOptionError

    name = next(iter(option))
    with pytest.raises(InvalidOptionError, match=name):
        prepare(tmp_path / "never_read.mlpackage", **option)  # type: ignore[arg-type]
