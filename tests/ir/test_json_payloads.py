"""Constant payloads decoded from graph JSON before it is parsed: same graphs and same errors as
the ordinary reader, and peak memory near the file's size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_mil.errors import GraphFormatError
from rlx_mil.ir import Binary, BinaryOp, Constant, DType, Graph, Input, Shape, Static
from rlx_mil.ir.json_io import graph_from_json
from rlx_mil.ir.serde import payloads, reader
from rlx_mil.ir.serde.payloads import extract_payloads

REPO = Path(__file__).resolve().parents[2]


def graph_with(payload_arrays: list[bytes]) -> Graph:
    g = Graph("payloads")
    x = g.add_node(Input("x"), [], Shape((Static(1),), DType.U8))
    for data in payload_arrays:
        c = g.add_node(Constant(data), [], Shape((Static(len(data)),), DType.U8))
        y = g.add_node(Binary(BinaryOp.ADD), [x, c]) if data else c
        g.set_outputs([y])
    if not payload_arrays:
        g.set_outputs([x])
    return g


def ordinary(text: bytes) -> Graph | str:
    try:
        return reader._decode_text(text, Graph, reader.DEFAULT_LIMITS)
    except GraphFormatError as err:
        return f"error: {err}"


def extracted(text: bytes) -> Graph | str:
    try:
        return Graph.from_json(text)
    except GraphFormatError as err:
        return f"error: {err}"


def same(a: Graph | str, b: Graph | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return a.to_json() == b.to_json()


byte_arrays = st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=3)


@given(arrays=byte_arrays, indent=st.sampled_from([None, 1, 2]), chunk=st.sampled_from([3, 7, 64, 1 << 18]))
def test_extracted_payloads_give_the_ordinary_graph(arrays: list[bytes], indent: int | None, chunk: int) -> None:
    text = graph_with(arrays).to_json(indent=indent).encode()
    original, payloads.CHUNK_CHARS = payloads.CHUNK_CHARS, chunk
    try:
        taken = extract_payloads(text, 1 << 30)
        assert taken is not None and sorted(taken.payloads.values()) == sorted(arrays)
        assert b'"data":[' not in taken.skeleton.replace(b" ", b"").replace(b"\n", b"")
        got = Graph.from_json(text)
    finally:
        payloads.CHUNK_CHARS = original
    assert got.to_json(indent=indent).encode() == text
    assert [n.op.data for n in got.nodes if isinstance(n.op, Constant)] == arrays


# Spellings of an array body: valid JSON ones and the defects the ordinary reader reports.
BODIES = [
    "1,2,3", " 1 , 2 ,\n3 ", "\t0,255,\r\n10", "", "  ", "256,1,1", "01,2,3", "-1,2,3", "1 2,3",
    "1.0,2,3", "1e1,2,3", ",1,2", "1,2,", "1,,2", "1,2\f,3", '1,"2",3', "1,[2],3", "1,true,3",
    "1,null,3", "1,2,3,4", "1,2", "0,0,0", "1000,1,1", "9,99,199",
]


@given(body=st.sampled_from(BODIES), mutation=st.text(alphabet="0123456789,- .e\n[]\"", max_size=6),
       where=st.integers(0, 20))
def test_every_array_body_gives_the_ordinary_result(body: str, mutation: str, where: int) -> None:
    base = json.loads(graph_with([b"\x01\x02\x03"]).to_json())
    text = json.dumps(base).replace("[1, 2, 3]", "[" + body[:where] + mutation + body[where:] + "]")
    assert same(extracted(text.encode()), ordinary(text.encode()))


def test_a_forged_key_is_an_ordinary_error() -> None:
    text = graph_with([b"\x01\x02\x03", b"\x04"]).to_json()
    taken = extract_payloads(text.encode(), 1 << 30)
    assert taken is not None
    key = next(iter(taken.payloads))
    forged = text.replace("[4]", json.dumps(key)).encode()
    got = extracted(forged)
    assert isinstance(got, str) and "expected an array" in got
    assert got == ordinary(forged)


def test_payload_limit_is_the_ordinary_reader_s() -> None:
    text = graph_with([bytes(range(200))]).to_json().encode()
    limits = reader.JsonLimits(max_constant_bytes=100)
    assert extract_payloads(text, 100) is None
    with pytest.raises(GraphFormatError, match="constant payloads would total more than 100 bytes"):
        graph_from_json(text, limits=limits)


def test_constant_spelled_in_a_string_is_left_alone() -> None:
    g = graph_with([b"\x05"])
    text = g.to_json().replace('"name":"payloads"', '"name":"\\"Constant\\":{\\"data\\":[9]}"')
    got = Graph.from_json(text.encode())
    assert got.name == '"Constant":{"data":[9]}'
    assert [n.op.data for n in got.nodes if isinstance(n.op, Constant)] == [b"\x05"]


_LOAD = """
import sys
from rlx_mil.ir import Graph
# VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would start at the forking test process's size.
def high_water() -> int:
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
before = high_water()
graph = Graph.from_json_file(sys.argv[1])
after = high_water()
print(after - before, after, sum(len(n.op.data) for n in graph.nodes if type(n.op).__name__ == "Constant"))
"""


def test_peak_memory_of_a_big_graph_file_stays_near_its_size(tmp_path: Path) -> None:
    """A graph file of ~40 MB, nearly all Constant payloads: the ordinary parse peaked at about
    4.4x the file (list slots of 8 bytes per payload byte, the text and its str); now the
    process grows by at most 1.5x the file plus a few MB of decoding temporaries."""
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes() for _ in range(10)]
    path = tmp_path / "big.json"
    graph_with(arrays).to_json_file(path)
    size = path.stat().st_size
    assert size > 30e6
    done = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0, done.stderr
    grew, peak, payload_bytes = map(int, done.stdout.split())
    assert payload_bytes == 10 << 20
    assert grew <= 1.5 * size + 24 * 2**20, f"grew {grew / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file"
    assert peak < 4 * size + 200 * 2**20
