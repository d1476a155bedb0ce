"""Compression specs, hostile or careless: a typed error naming the rule or modifier, or a
config that means exactly what it says (no rule ignored, no modifier overridden by order)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.compress import WeightCompressor, parse_compress, parse_scheme
from rlx_mil.compress.schemes import PER_BLOCK, PER_CHANNEL, PER_TENSOR, LinearScheme
from rlx_mil.errors import InvalidOptionError, RlxMilError
from rlx_mil.lowering.target import Precision, Target

from .tiny_lm import tiny_lm

_GRAPH = tiny_lm()
_WEIGHTS = sorted({n.op.name for n in _GRAPH if type(n.op).__name__ == "Param"})

_SYMMETRY = {"sym": True, "asym": False}
_GRANULARITY = {"tensor": PER_TENSOR, "channel": PER_CHANNEL, "block": PER_BLOCK, "block64": PER_BLOCK}


@pytest.mark.parametrize("text", ["int8-tensor-channel", "int8-sym-asym", "int4-block32-block64",
                                  "uint8-asym-symmetric", "lut4-tensor-group8", "lut4-group8-group16"])
def test_contradictory_modifiers_are_refused(text: str) -> None:
    with pytest.raises(InvalidOptionError, match="contradict"):
        parse_scheme(text)


@pytest.mark.parametrize("text", ["int8-sym-sym", "int4-block-block32", "lut4-group-group16"])
def test_repeated_modifiers_that_agree_are_accepted(text: str) -> None:
    assert parse_scheme(text) is not None


@given(st.sampled_from(["int8", "uint8", "int4", "uint4"]),
       st.lists(st.sampled_from([*_SYMMETRY, *_GRANULARITY]), max_size=4))
def test_linear_modifiers_typed_error_or_exact(base: str, mods: list[str]) -> None:
    text = "-".join([base, *mods])
    syms = {_SYMMETRY[m] for m in mods if m in _SYMMETRY}
    grans = {(_GRANULARITY[m], 64 if m == "block64" else 32) for m in mods if m in _GRANULARITY}
    try:
        scheme = parse_scheme(text)
    except InvalidOptionError as err:
        assert len(syms) > 1 or len(grans) > 1, f"{text!r} refused: {err}"
        return
    assert len(syms) <= 1 and len(grans) <= 1, f"{text!r} accepted though its modifiers contradict"
    assert isinstance(scheme, LinearScheme)
    if syms:
        assert scheme.symmetric is syms.pop()
    if grans:
        granularity, block = grans.pop()
        assert scheme.granularity == granularity
        if granularity == PER_BLOCK:
            assert scheme.block_size == block
    assert parse_scheme(scheme.label) == scheme


def _compressor(spec: str) -> WeightCompressor:
    config = parse_compress(spec)
    assert config is not None
    return WeightCompressor(config, _GRAPH, Target.parse("iOS18"), Precision.FP16)


@pytest.mark.parametrize("spec", ["int4;lm_haed=none", "glob:*nomatch*=int8", "int8;re:^nothing$=int4"])
def test_a_rule_matching_no_weight_is_refused_by_name(spec: str) -> None:
    pattern = spec.split(";")[-1].split("=")[0].split(":", 1)[-1]
    with pytest.raises(InvalidOptionError, match="matches no weight") as err:
        _compressor(spec)
    assert pattern in str(err.value)


def test_a_mistyped_option_key_gets_a_hint() -> None:
    with pytest.raises(InvalidOptionError, match="did you mean the option 'lm_head'"):
        _compressor("int4;lm_haed=none")


_PATTERN = st.one_of(
    st.sampled_from(_WEIGHTS).map(lambda n: "glob:" + n),
    st.sampled_from(["glob:*proj*", "glob:*nomatch*", "re:\\.v_proj\\.", "re:^zz", "lm_haed", "embedings", "head.weight"]),
    st.text(alphabet="abc*.?[]_", min_size=1, max_size=6).map(lambda t: "glob:" + t),
)
_SCHEME = st.sampled_from(["int8", "int4", "lut4", "none", "int8-asym-tensor", "int8-tensor-channel", "lut5"])


@given(st.sampled_from(["", "int8", "int4", "lut6", "bogus"]), st.lists(st.tuples(_PATTERN, _SCHEME), max_size=3))
def test_compression_configs_typed_error_or_every_rule_applies(default: str, rules: list[tuple[str, str]]) -> None:
    spec = ";".join([default] * bool(default) + [f"{p}={s}" for p, s in rules])
    try:
        compressor = _compressor(spec or "int8")
    except RlxMilError:
        return
    config = compressor.config
    for rule in config.rules:
        assert any(rule.matches(w) for w in _WEIGHTS), f"{spec!r}: rule {rule.label} matches nothing yet was accepted"
    for name in _WEIGHTS:
        first = next((r for r in config.rules if r.matches(name)), None)
        if first is not None:
            assert compressor.schemes.get(name) == first.scheme, f"{spec!r}: {name} did not get {first.label}'s scheme"
