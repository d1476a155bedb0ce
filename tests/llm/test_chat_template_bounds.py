"""Chat templates are untrusted code: each hostile template ends in a TokenizerError naming the
folder (and the bound it passed), in bounded time and memory, never a hang or a traceback."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm.text_fixtures import CHATML, write_bpe_tokenizer
from rlx_mil.llm import chat_template
from rlx_mil.llm.text import TextTokenizer, TokenizerError


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bpe_tokenizer(tmp_path_factory.mktemp("tok") / "bpe")


@pytest.fixture(autouse=True)
def short_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.5)


def _with_template(folder: Path, source: object) -> TextTokenizer:
    tok = TextTokenizer(folder)
    tok.chat_template_source = source  # type: ignore[assignment]
    tok._template = None
    return tok


def _render(folder: Path, source: object, **kwargs: object) -> str:
    return _with_template(folder, source).render_chat([{"role": "user", "content": "hi"}], **kwargs)  # type: ignore[arg-type]


HOSTILE: list[tuple[str, str, str]] = [
    ("nested loops", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
     "ran longer than|steps"),
    ("nested string loops", "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
     "ran longer than|steps"),
    ("huge repeat", "{{ 'a' * 10**9 }}", "repeats a sequence"),
    ("huge list repeat", "{{ [1] * 10**8 }}", "repeats a sequence"),
    ("huge power", "{{ 2 ** 1000000000 }}", "raises 2 to the power"),
    ("center", "{{ 'x'|center(10**9) }}", "passed 1000000000"),
    ("method ljust", "{{ 'x'.ljust(10**9) }}", "passed 1000000000"),
    ("format width", "{{ '%1000000000s'|format('x') }}", "width of 10\\^7"),
    ("str.format width", "{{ '{:>1000000000}'.format('x') }}", "width of 10\\^7"),
    ("percent width", "{{ '%1000000000d' % 5 }}", "width of 10\\^7"),
    ("doubling concat", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s|length }}", "string of"),
    ("doubling plus", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}", "adds sequences|string of"),
    ("doubling lists", "{% set ns = namespace(l=[1]) %}{% for i in range(200) %}{% set ns.l = [ns.l, ns.l] %}"
     "{% endfor %}{{ ns.l }}", "structure of more than|ran longer than"),
    ("doubling block", "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set t %}{{ ns.s }}{{ ns.s }}"
     "{% endset %}{% set ns.s = t %}{% endfor %}", "block of|string of"),
    ("output without end", "{% for i in range(100000) %}{{ 'y' * 1000000 }}{% endfor %}", "rendered more than"),
    ("indent", "{{ ('\\n' * 1000000)|indent(1000) }}", "indents past"),
    ("replace", "{{ ('a' * 1000000)|replace('a', 'b' * 1000) }}", "replaces into"),
    ("join", "{{ ('b' * 100000)|join('c' * 1000) }}", "joins into"),
    ("recursive macro", "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", "RecursionError|recursion"),
    ("lipsum", "{{ lipsum(10**6) }}", "failed"),
    ("raises", "{{ raise_exception('no system role here') }}", "no system role here"),
    ("zero division", "{{ 1 / 0 }}", "ZeroDivisionError"),
    ("type error", "{{ 'a' - 1 }}", "TypeError"),
    ("unsafe attribute", "{{ messages.__class__.__mro__ }}", "unsafe|__class__"),
    ("mutating", "{% set x = messages.append(1) %}", "unsafe|append"),
    ("missing token", "{{ bos_token }}{{ messages[0]['content'] }}", "writes bos_token, which the tokenizer does not define"),
]


@pytest.mark.parametrize("label, source, message", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_templates_are_typed_errors_in_bounded_time(folder: Path, label: str, source: str, message: str) -> None:
    start = time.perf_counter()
    with pytest.raises(TokenizerError, match=message) as err:
        _render(folder, source)
    assert str(folder) in str(err.value)
    assert time.perf_counter() - start < 8, f"{label}: took {time.perf_counter() - start:.1f} s"


@pytest.mark.parametrize("source, message", [
    (42, "must be text, got int"), (["x"], "must be text, got list"), ("{% for %}", "not a valid jinja2 template"),
    ("{{ x }", "not a valid jinja2 template"), ("{% endfor %}", "not a valid jinja2 template"),
])
def test_templates_that_are_not_templates(folder: Path, source: object, message: str) -> None:
    with pytest.raises(TokenizerError, match=message):
        _render(folder, source)


def test_ordinary_templates_render_as_before(folder: Path) -> None:
    tok = _with_template(folder, CHATML)
    text = tok.render_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    guarded = "{% if bos_token %}{{ bos_token }}{% endif %}{{ eos_token }}|{{ [1, 2] ~ (3, 4) }}|{{ {'a': 1}|tojson }}"
    assert _render(folder, guarded) == "<|im_end|>|[1, 2](3, 4)|{\"a\": 1}"
    loops = "{% for m in messages %}{{ loop.index }}{{ loop.length }}{% if loop.last %}!{% endif %}{% endfor %}"
    assert _render(folder, loops) == "11!"


def test_a_system_message_the_template_drops_is_refused(folder: Path) -> None:
    no_system = "{% for m in messages %}{% if m['role'] == 'user' %}<|im_start|>user\n{{ m['content'] }}{% endif %}{% endfor %}"
    tok = _with_template(folder, no_system)
    with pytest.raises(TokenizerError, match="has no system role"):
        tok.prompt_ids("hi", chat=True, system="be brief")
    assert tok.prompt_ids("hi", chat=True) == tok.encode("<|im_start|>user\nhi", add_special_tokens=False)


def test_a_special_token_missing_from_the_vocabulary_is_named(folder: Path) -> None:
    tok = _with_template(folder, "{{ eos_token }}hi")
    tok.special_tokens["eos_token"] = "<|not_in_vocab|>"
    with pytest.raises(TokenizerError, match="special token '<\\|not_in_vocab\\|>'"):
        tok.render_chat([{"role": "user", "content": "hi"}])


FRAGMENTS = st.sampled_from([
    "{% for i in range(N) %}", "{% endfor %}", "{{ 'ab' * N }}", "{{ x ~ x }}", "{% set x = x ~ x %}",
    "{% set ns.v = ns.v + ns.v %}", "{% set ns.v = [ns.v, ns.v] %}", "{{ ns.v }}", "{{ x|center(N) }}",
    "{{ x|indent(N) }}", "{{ N ** N }}", "{% if N %}", "{% endif %}", "{{ messages[0]['content'] * N }}",
    "{% macro m(k) %}{{ m(k) }}{% endmacro %}", "{{ m(1) }}", "{{ bos_token }}", "{{ x.replace('a', x) }}",
    "{% set y %}{{ x }}{{ x }}{% endset %}", "{{ y }}", "{{ x|join(x) }}", "{{ '%*d' % (N, 1) }}",
])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(FRAGMENTS, min_size=1, max_size=8), n=st.sampled_from([0, 3, 1000, 10**6, 10**9]))
def test_fuzzed_templates_end_in_text_or_a_typed_error(folder: Path, pieces: list[str], n: int) -> None:
    source = "{% set x = 'ab' %}{% set y = '' %}{% set ns = namespace(v='ab') %}" + "".join(pieces).replace("N", str(n))
    start = time.perf_counter()
    try:
        text = _render(folder, source)
    except TokenizerError:
        pass
    else:
        assert len(text) <= chat_template.MAX_TEXT
    assert time.perf_counter() - start < 8, source
