"""Chunked sets: a decoder cut at layer boundaries into consecutive packages under a byte limit,
run by `Session(DIR)` exactly like the one package (against the unchunked package and the
NumPy reference of the checkpoint), and their manifest, CLI and failure behaviour."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_mil.cli import main
from rlx_mil.coreml.package_info import package_info
from rlx_mil.errors import ExistingFileError, InvalidOptionError
from rlx_mil.ir.cut import cut_graph, layer_of, layer_segments
from rlx_mil.llm.chunk_plan import (
    BLOB_OVERHEAD,
    ChunkingError,
    data_inputs,
    plan_chunks,
    planned_param_bytes,
    smallest_limit,
)
from rlx_mil.llm.chunk_seal import sealed
from rlx_mil.llm.chunked import MANIFEST, read_chunked_set
from rlx_mil.llm.estimate import estimate_decode
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import convert_llm_checkpoint, reference_greedy, reference_logits
from rlx_mil.models.pretrained import from_pretrained
from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint
from rlx_mil.reference import evaluate
from rlx_mil.units import parse_bytes

MAX_CONTEXT = 16
PROMPT = [5, 17, 3, 42, 8, 61]  # 6 tokens: prefill_4 then two decode calls
#: Each of the 3 layers (embeddings with the first, the head with the last) fits alone, no two do.
LIMITS = {"fp32": "56KB", "fp16": "30KB"}
LIMIT = LIMITS["fp32"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = {**TINY_CONFIGS["llama"], "num_hidden_layers": 3}
    return write_random_checkpoint(tmp_path_factory.mktemp("hf") / "llama3", config, seed=3)


def _convert(checkpoint: Path, out: Path, precision: str, chunk_bytes: str | None = None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny state dims: the Neural Engine notes are expected
        convert_llm_checkpoint(checkpoint, out, max_context=MAX_CONTEXT, prefill=[4], precision=precision,
                               chunk_bytes=chunk_bytes)


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def packages(request: pytest.FixtureRequest, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    work = tmp_path_factory.mktemp(f"pkg_{request.param}")
    single, folder = work / "one.mlpackage", work / "llama3"
    _convert(checkpoint, single, request.param)
    _convert(checkpoint, folder, request.param, LIMITS[request.param])
    return single, folder, request.param


def test_bytes_parse_si_and_iec_suffixes() -> None:
    assert parse_bytes("200KB") == 200_000
    assert parse_bytes("1GB") == 10**9
    assert parse_bytes("1GiB") == 2**30
    assert parse_bytes("1.5MiB") == 3 << 19
    assert parse_bytes("7") == 7
    for bad in ("1XB", "", "-1GB", "0", "GB", "1e9"):
        with pytest.raises(InvalidOptionError, match="chunk_bytes"):
            parse_bytes(bad, "chunk_bytes")


def test_the_set_has_consecutive_chunks_under_the_limit(packages: tuple[Path, Path, str]) -> None:
    _single, folder, precision = packages
    chunked = read_chunked_set(folder)
    assert [c.package for c in chunked.chunks] == [f"llama3_chunk_{i:02d}.mlpackage" for i in range(3)]
    assert [c.layers for c in chunked.chunks] == [["model.layers.0"], ["model.layers.1"], ["model.layers.2"]]
    for c in chunked.chunks:
        weights = folder / c.package / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
        assert weights.stat().st_size == c.weight_bytes < parse_bytes(LIMITS[precision])
        # states travel with their layers: one layer's K and V per chunk
        assert {name: shape[0] for name, shape in c.states.items()} == {"key_cache": 1, "value_cache": 1}
    first, middle, last = chunked.chunks
    assert first.receives == {} and middle.receives == {first.passes[0]: 0} and last.receives == {middle.passes[0]: 1}
    assert last.passes == [] and last.logits and not first.logits
    assert first.shapes["prefill_4"][first.passes[0]] == [1, 4, 32] and first.shapes["decode"][first.passes[0]] == [1, 1, 32]
    assert chunked.functions == {"prefill_4": 4, "decode": 1} and chunked.contract.layers == 3
    raw = json.loads((folder / MANIFEST).read_text())
    assert raw["text"] is None or raw["text"]["chunk"] == 0


def test_session_on_the_set_gives_the_single_package_tokens(packages: tuple[Path, Path, str], checkpoint: Path) -> None:
    single, folder, precision = packages
    exact = precision == "fp32"
    model = "float32" if exact else "declared"
    one = Session(single, engine="milexec", precision_model=model)
    chunked = Session(folder, engine="milexec", precision_model=model)
    assert chunked.max_context == MAX_CONTEXT and chunked.vocab == one.vocab
    want, got = one.feed(PROMPT), chunked.feed(PROMPT)
    assert chunked.calls == one.calls == [("prefill_4", 4), ("decode", 1), ("decode", 1)]
    np.testing.assert_array_equal(got, want)  # the same ops on the same values, chunk by chunk
    reference = reference_logits(checkpoint, PROMPT)
    np.testing.assert_allclose(got, reference, atol=1e-4 if exact else 3e-2, rtol=0)
    one.reset()
    chunked.reset()
    tokens = one.generate(PROMPT, 6)
    assert chunked.generate(PROMPT, 6) == tokens
    if exact:  # stateful decode against the NumPy reference over the whole sequence at every step
        assert tokens == reference_greedy(checkpoint, PROMPT, 6)


def test_cli_generate_and_inspect_read_the_set(packages: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    single, folder, _precision = packages
    ids = ",".join(map(str, PROMPT))
    assert main(["generate", str(single), "--prompt-ids", ids, "-n", "4", "--engine", "milexec", "-q"]) == 0
    want = capsys.readouterr().out
    assert main(["generate", str(folder), "--prompt-ids", ids, "-n", "4", "--engine", "milexec", "-q"]) == 0
    assert capsys.readouterr().out == want
    assert main(["inspect", str(folder), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [c["layers"] for c in info["chunks"]] == [["model.layers.0"], ["model.layers.1"], ["model.layers.2"]]
    assert info["functions"] == {"prefill_4": 4, "decode": 1}
    assert main(["inspect", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "3 chunks" in text and "llama3_chunk_02.mlpackage" in text
    # A decode step streams the same weights and caches in the set as in the one package (the
    # RoPE tables, copied into every chunk, aside).
    one, chunked = estimate_decode(single), estimate_decode(folder)
    assert chunked.state_bytes == one.state_bytes
    assert one.weight_bytes <= chunked.weight_bytes <= one.weight_bytes * 1.03


def test_every_decoder_family_cuts_at_each_layer(tmp_path: Path) -> None:
    for family in ("qwen3_moe", "lfm2", "qwen3_5_text", "gemma3_text"):
        config = TINY_CONFIGS[family]
        folder = write_random_checkpoint(tmp_path / family, config, seed=0)
        graph, params = from_pretrained(folder, "decode", seq_len=1, cache_len=1, max_positions=MAX_CONTEXT,
                                        last_logits=True)
        layers = config["num_hidden_layers"]
        segments = layer_segments(graph, data_inputs(graph))
        assert [s.layers for s in segments] == [(f"model.layers.{i}",) for i in range(layers)], family
        pieces = cut_graph(graph, data_inputs(graph), [1] * layers, shared_inputs={"input_ids"})
        # The pieces run one after another compute the whole graph's outputs.
        feeds: dict[str, np.ndarray] = {"input_ids": np.array([[7]], np.int32), "position_ids": np.array([[0]], np.int32)}
        for node in graph:
            if node.op.type_name == "Input" and node.op.name not in feeds:
                feeds[node.op.name] = np.zeros(node.shape.sizes(), node.shape.dtype.numpy)
        whole = evaluate(graph, feeds, params)
        values: dict[str, np.ndarray] = dict(feeds)
        for piece in pieces:
            names = {n.op.name for n in piece.graph if n.op.type_name == "Input"}
            own = {name: params[name] for name in piece.params}
            values.update(evaluate(piece.graph, {k: v for k, v in values.items() if k in names}, own))
        for name, value in whole.items():
            np.testing.assert_array_equal(values[name], value, err_msg=f"{family} {name}")


def test_layer_keys() -> None:
    assert layer_of("model.layers.12.mlp.experts.3.up_proj.weight") == "model.layers.12"
    assert layer_of("model.embed_tokens.weight") is None and layer_of("lm_head.weight") is None


def test_a_layer_over_the_limit_is_an_error_naming_it(checkpoint: Path, tmp_path: Path) -> None:
    graph, _ = from_pretrained(checkpoint, "decode", seq_len=1, cache_len=1, max_positions=MAX_CONTEXT, last_logits=True)
    sizes = planned_param_bytes(graph, precision="fp32")
    with pytest.raises(ChunkingError, match=r"layer model\.layers\.0 alone needs .* more than the chunk limit"):
        plan_chunks(graph, sizes, 45_000)
    smallest = smallest_limit(graph, sizes)
    assert len(plan_chunks(graph, sizes, smallest).groups) == 3
    with pytest.raises(ChunkingError, match=f"needs chunk_bytes >= {smallest}"):
        plan_chunks(graph, sizes, smallest - 1)
    assert sizes["model.layers.0.mlp.up_proj.weight"] == 64 * 32 * 4 + BLOB_OVERHEAD
    # int8 per channel: one byte a weight and an fp16 scale per output row; lut4: 4 bits and a
    # table of 16 fp16 entries per 16 rows
    small = planned_param_bytes(graph, precision="fp16", compress="int8;min_size=0")
    assert small["model.layers.0.mlp.up_proj.weight"] == 64 * 32 + 64 * 2 + BLOB_OVERHEAD
    lut = planned_param_bytes(graph, precision="fp16", compress="lut4;min_size=0")
    assert lut["model.layers.0.mlp.up_proj.weight"] == 64 * 32 // 2 + 4 * 16 * 2 + BLOB_OVERHEAD
    assert small["model.norm.weight"] == 32 * 2 + BLOB_OVERHEAD  # norms stay in float
    assert len(plan_chunks(graph, small, 30_000).groups) < len(plan_chunks(graph, sizes, 60_000).groups)
    with pytest.raises(ChunkingError, match=r"model\.layers\.0"):
        convert_llm_checkpoint(checkpoint, tmp_path / "set", max_context=MAX_CONTEXT, chunk_bytes="10KB")
    assert list(tmp_path.iterdir()) == []


def test_a_failure_leaves_no_folder(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlx_mil.api

    real = rlx_mil.api.convert_functions
    calls = []

    def failing(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    from rlx_mil.coreml.saving import host_tag, staging_prefix

    # a killed earlier conversion's staging folder (its process is gone) is cleared too
    stale = tmp_path / f"{staging_prefix(tmp_path / 'set')}999999999-{host_tag()}-x1"
    (stale / "set").mkdir(parents=True)
    monkeypatch.setattr(rlx_mil.api, "convert_functions", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        _convert(checkpoint, tmp_path / "set", "fp32", LIMIT)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a staging folder


def test_bad_outputs_are_refused_before_work(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidOptionError, match="folder"):
        convert_llm_checkpoint(checkpoint, tmp_path / "x.mlpackage", max_context=MAX_CONTEXT, chunk_bytes="1MB")
    (tmp_path / "taken").mkdir()
    with pytest.raises(ExistingFileError):
        convert_llm_checkpoint(checkpoint, tmp_path / "taken", max_context=MAX_CONTEXT, chunk_bytes="1MB")
    with pytest.raises(InvalidOptionError, match="chunk_bytes"):
        convert_llm_checkpoint(checkpoint, tmp_path / "y", max_context=MAX_CONTEXT, chunk_bytes="lots")
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path / "z"), "--graph-only", "--chunk-bytes", "1MB"]) == 1
    assert main(["convert-hf", str(checkpoint), "-o", str(tmp_path / "z"), "--stateful", "--chunk-bytes", "1QB"]) == 1


def test_a_damaged_manifest_is_a_typed_error(packages: tuple[Path, Path, str], tmp_path: Path) -> None:
    import shutil

    from rlx_mil.errors import RlxMilError

    _single, folder, _precision = packages
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    manifest = copy / MANIFEST
    good = json.loads(manifest.read_text())
    cases = {
        "not JSON": "{",
        "escaping package": json.dumps({**good, "chunks": [{**good["chunks"][0], "package": "../x.mlpackage"},
                                                            *good["chunks"][1:]]}),
        "receives nothing passed": json.dumps({**good, "chunks": [good["chunks"][0], good["chunks"][2]]}),
        "wrong format": json.dumps({**good, "format": "other/9"}),
        "missing key": json.dumps({k: v for k, v in good.items() if k != "functions"}),
    }
    for why, text in cases.items():
        if why != "not JSON":  # sealed again, so each case meets its own check, not the digest's
            text = json.dumps(sealed(json.loads(text)))
        manifest.write_text(text)
        with pytest.raises(RlxMilError, match=r"chunks\.json"):
            Session(copy, engine="milexec")
        assert main(["inspect", str(copy)]) == 1, why
    manifest.write_text(json.dumps(good))
    shutil.rmtree(copy / good["chunks"][1]["package"])
    with pytest.raises(RlxMilError, match=r"chunk 1 package .* is missing"):
        read_chunked_set(copy)


def test_a_tampered_set_is_refused_when_opened_naming_the_chunk(packages: tuple[Path, Path, str], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Chunks swapped, a chunk's weights from another model (other bytes, same size), the
    manifest edited by hand or truncated: each is found when the set is opened (Session,
    inspect, generate), naming the chunk, before anything runs."""
    import shutil

    from rlx_mil.errors import RlxMilError

    _single, folder, _precision = packages
    good = json.loads((folder / MANIFEST).read_text())
    first, second = (good["chunks"][i]["package"] for i in (0, 1))

    def tampered(name: str) -> Path:
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        return copy

    swapped = tampered("swapped")
    (swapped / first).rename(swapped / "tmp.mlpackage")
    (swapped / second).rename(swapped / first)
    (swapped / "tmp.mlpackage").rename(swapped / second)
    other = tampered("other")
    weights = next((other / second).rglob("weight.bin"))
    weights.write_bytes(np.random.default_rng(0).bytes(weights.stat().st_size))
    edited = tampered("edited")
    (edited / MANIFEST).write_text(json.dumps({**good, "chunk_bytes": good["chunk_bytes"] * 2}))
    truncated = tampered("truncated")
    (truncated / MANIFEST).write_text((folder / MANIFEST).read_text()[:200])
    for copy, message in ((swapped, rf"chunk 0 \({first}\) is not the package"), (other, rf"chunk 1 \({second}\) is not the package"),
                          (edited, "edited after the set was written"), (truncated, "not a valid chunked-set manifest")):
        with pytest.raises(RlxMilError, match=message):
            Session(copy, engine="milexec")
        for argv in (["inspect", str(copy)], ["generate", str(copy), "--prompt-ids", "1,2", "--engine", "milexec"]):
            assert main(argv) == 1
            lines = capsys.readouterr().err.strip().splitlines()
            assert len(lines) == 1 and re.search(message, lines[0]), lines
    Session(folder, engine="milexec")  # the untouched set still opens


def test_a_neural_engine_set_splits_the_head_and_matches_the_reference(tmp_path: Path) -> None:
    """deploy="ane" applies to every chunk: the last returns the logits in pieces, which Session
    joins, and the capacity is rounded up as for one package."""
    config = {**TINY_CONFIGS["llama"], "vocab_size": 40000}  # a head over 16,384 rows: 3 pieces
    checkpoint = write_random_checkpoint(tmp_path / "wide", config, seed=2)
    folder = tmp_path / "set"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        chunked = convert_llm_checkpoint(checkpoint, folder, max_context=MAX_CONTEXT, precision="fp32", deploy="ane",
                                         chunk_bytes="6MB")
    assert len(chunked.chunks) == 2 and chunked.contract.max_context == 32
    head = package_info(chunked.package(1)).functions["decode"]["outputs"]
    assert [t.name for t in head] == ["logits_0", "logits_1", "logits_2"]
    session = Session(folder, engine="milexec", precision_model="float32")
    assert session.vocab == 40000
    prompt = [5, 39999, 17]
    np.testing.assert_allclose(session.feed(prompt), reference_logits(checkpoint, prompt), atol=1e-4, rtol=0)


@pytest.mark.parametrize("swap", [True, False])
def test_a_finished_set_replaces_the_old_one_in_one_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: bool) -> None:
    import rlx_mil.coreml.saving as saving
    from rlx_mil.llm import chunked as chunked_module

    if not swap:  # a file system without an atomic exchange: two renames
        monkeypatch.setattr(saving, "exchange", lambda a, b: False)
    out = tmp_path / "set"
    out.mkdir()
    (out / "old.txt").write_text("old")
    staging = tmp_path / "staging"
    (staging / "set").mkdir(parents=True)
    (staging / "set" / MANIFEST).write_text("{}")
    chunked_module._move_into_place(staging / "set", out, staging)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST]
    assert (staging / saving.COMPLETE_FILE).exists()


_ODD = st.sampled_from([None, -1, 0, 2**70, 1.5, True, "x", "../x.mlpackage", [], {}, [1, "a"], {"a": -1}, "\x00"])


@settings(max_examples=15, deadline=None)
@given(path=st.lists(st.integers(0, 40), min_size=1, max_size=5), value=_ODD, reseal=st.booleans())
def test_fuzzed_manifests_are_typed_errors_or_the_same_set(packages: tuple[Path, Path, str],
                                                           tmp_path_factory: pytest.TempPathFactory,
                                                           path: list[int], value: object, reseal: bool) -> None:
    """Any node of the manifest replaced (and the digest recomputed, or not): reading the set
    is a typed error naming chunks.json (or a chunk), or gives a set that still opens."""
    import shutil

    from rlx_mil.errors import RlxMilError

    _single, folder, _precision = packages
    copy = tmp_path_factory.mktemp("fuzz") / "set"
    shutil.copytree(folder, copy)
    good = json.loads((folder / MANIFEST).read_text())

    def replace(node: object, steps: list[int]) -> object:
        if not steps or not isinstance(node, (dict, list)) or not node:
            return value
        if isinstance(node, dict):
            key = sorted(node)[steps[0] % len(node)]
            return {**node, key: replace(node[key], steps[1:])}
        at = steps[0] % len(node)
        return [*node[:at], replace(node[at], steps[1:]), *node[at + 1:]]

    mangled = replace(good, path)
    if reseal and isinstance(mangled, dict):
        mangled = sealed(mangled)
    (copy / MANIFEST).write_text(json.dumps(mangled))
    try:
        read_chunked_set(copy)
    except RlxMilError as err:
        assert str(copy) in str(err), err
