"""tokenizer.json from anywhere, drawn by hypothesis: any node of a real tokenizer's JSON
replaced by a value of another kind, or the file cut short. Loading, encoding, decoding and
rendering the chat template end in a TokenizerError naming the file, or work."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm.text_fixtures import write_bpe_tokenizer
from rlx_mil.llm.text import TextTokenizer, TokenizerError

ODD_VALUES = st.sampled_from([None, 5, -1, "x", [], {}, 2**70, 1.5, True, [1, "a"], {"type": "Nope"}, "\x00", 10**9,
                              ["a", "b", "c"], {"type": "BPE"}, {"type": "ByteLevel"}, -(2**63)])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bpe_tokenizer(tmp_path_factory.mktemp("tok") / "bpe")


def _replace(node: Any, path: list[int], value: Any) -> Any:
    """`node` with the child reached by following `path` (indices into the keys or items met
    on the way, modulo their count) replaced by `value`."""
    if not path or not isinstance(node, (dict, list)) or not node:
        return value
    if isinstance(node, dict):
        key = sorted(node)[path[0] % len(node)]
        return {**node, key: _replace(node[key], path[1:], value)}
    at = path[0] % len(node)
    return [*node[:at], _replace(node[at], path[1:], value), *node[at + 1:]]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.integers(0, 50), max_size=5), value=ODD_VALUES, cut=st.one_of(st.none(), st.floats(0, 1)))
def test_mangled_tokenizer_json_is_typed_or_works(base: Path, tmp_path_factory: pytest.TempPathFactory,
                                                  path: list[int], value: Any, cut: float | None) -> None:
    folder = tmp_path_factory.mktemp("mangled") / "tok"
    shutil.copytree(base, folder)
    data = json.loads((base / "tokenizer.json").read_text())
    text = json.dumps(_replace(copy.deepcopy(data), path, value))
    if cut is not None:
        text = text[: int(len(text) * cut)]
    (folder / "tokenizer.json").write_text(text)
    try:
        tok = TextTokenizer(folder)
        ids = tok.encode("hello world, café \x00 \udcff".encode("utf-8", "replace").decode())
        tok.decode(ids)
        "".join(tok.stream_decode(ids))
        tok.render_chat([{"role": "user", "content": "hi"}])
    except TokenizerError as err:
        assert str(folder) in str(err), err
