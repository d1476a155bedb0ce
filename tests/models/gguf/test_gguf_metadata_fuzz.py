"""GGUF metadata that lies, drawn by hypothesis: every key of the wrong type, counts and string
lengths claiming more than the file holds, duplicate keys and tensor names, bad alignments,
zero or overflowing dims, other GGUF versions, unsupported architectures, binary in text keys,
token lists shorter than the vocabulary; and files that are empty, folders or FIFOs. Each ends
in a typed rlx_mil error naming the file (or a model that builds), before any large
allocation, never a hang."""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_mil.errors import RlxMilError
from rlx_mil.models import from_gguf
from rlx_mil.models.gguf.reader import GGUFFile

ARCH = "llama"
HIDDEN, HEADS, LAYERS, VOCAB, FFN = 32, 4, 1, 16, 64

#: The metadata of a valid tiny llama file: key -> (value, gguf value type name).
BASE: dict[str, tuple[Any, str]] = {
    "general.architecture": (ARCH, "STRING"),
    f"{ARCH}.block_count": (LAYERS, "UINT32"),
    f"{ARCH}.context_length": (256, "UINT32"),
    f"{ARCH}.embedding_length": (HIDDEN, "UINT32"),
    f"{ARCH}.feed_forward_length": (FFN, "UINT32"),
    f"{ARCH}.attention.head_count": (HEADS, "UINT32"),
    f"{ARCH}.attention.head_count_kv": (HEADS, "UINT32"),
    f"{ARCH}.attention.layer_norm_rms_epsilon": (1e-5, "FLOAT32"),
    f"{ARCH}.rope.freq_base": (10000.0, "FLOAT32"),
    f"{ARCH}.rope.dimension_count": (HIDDEN // HEADS, "UINT32"),
    "tokenizer.ggml.model": ("gpt2", "STRING"),
    "tokenizer.ggml.tokens": ([f"t{i}" for i in range(VOCAB)], "ARRAY"),
    "tokenizer.chat_template": ("{{ messages[0]['content'] }}", "STRING"),
}

TENSORS: dict[str, tuple[int, ...]] = {
    "token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,),
    "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
    "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (HIDDEN, HIDDEN),
    "blk.0.attn_v.weight": (HIDDEN, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
    "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN), "blk.0.ffn_down.weight": (HIDDEN, FFN),
}

#: Values of every GGUF type, for keys that expect another.
WRONG_VALUES = st.one_of(
    st.tuples(st.integers(-(2**31), 2**31 - 1), st.just("INT32")),
    st.tuples(st.integers(0, 2**64 - 1), st.just("UINT64")),
    st.tuples(st.integers(-(2**63), 2**63 - 1), st.just("INT64")),
    st.tuples(st.floats(width=32, allow_nan=True), st.just("FLOAT32")),
    st.tuples(st.booleans(), st.just("BOOL")),
    st.tuples(st.text(max_size=8), st.just("STRING")),
    st.tuples(st.binary(max_size=8).map(lambda b: b), st.just("BYTES")),
    st.tuples(st.lists(st.integers(0, 2**31 - 1), max_size=4), st.just("ARRAY")),
    st.tuples(st.lists(st.text(max_size=3), max_size=4), st.just("ARRAY")),
    st.tuples(st.sampled_from([0, 1, 3, 2**32 - 1]), st.just("UINT32")),
)


def write_metadata_file(path: Path, metadata: dict[str, tuple[Any, str]], tensors: dict[str, tuple[int, ...]],
                        alignment: int | None = None) -> Path:
    """A GGUF file of `metadata` (value, type name) and F32 `tensors` of ones."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch=None)  # type: ignore[arg-type]
    w.kv_data[0].clear()
    for key, (value, kind) in metadata.items():
        if kind == "BYTES":  # raw bytes in a string key: not UTF-8
            w.add_key_value(key, value, gguf.GGUFValueType.STRING)
        elif kind == "ARRAY":
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY)
        else:
            w.add_key_value(key, value, gguf.GGUFValueType[kind])
    if alignment is not None:
        w.data_alignment = alignment
    for name, shape in tensors.items():
        w.add_tensor(name, np.ones(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _loads_or_typed(path: Path) -> None:
    """from_gguf on `path` in a thread: it must return or raise an RlxMilError within 30 s."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            from_gguf(path)
        except BaseException as err:  # judged below
            outcome.append(err)
        else:
            outcome.append(None)

    worker = threading.Thread(target=run, daemon=True)
    start = time.perf_counter()
    worker.start()
    worker.join(60)
    assert outcome, f"{path}: from_gguf did not return within 60 s"
    err = outcome[0]
    if err is not None and not isinstance(err, RlxMilError):
        raise AssertionError(f"{type(err).__name__}: {err}") from err
    if err is not None:
        assert str(path) in str(err), err
    assert time.perf_counter() - start < 60


def test_the_base_file_loads(tmp_path: Path) -> None:
    _, params = from_gguf(write_metadata_file(tmp_path / "m.gguf", BASE, TENSORS))
    assert params["model.embed_tokens.weight"].shape == (VOCAB, HIDDEN)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(BASE)), value=WRONG_VALUES)
def test_any_key_of_the_wrong_type(tmp_path_factory: pytest.TempPathFactory, key: str, value: tuple[Any, str]) -> None:
    path = tmp_path_factory.mktemp("wrong") / "m.gguf"
    try:
        write_metadata_file(path, {**BASE, key: value}, TENSORS)
    except (ValueError, TypeError, OverflowError, struct.error, UnicodeEncodeError):
        return  # gguf's writer refuses it: not a file anyone can have
    _loads_or_typed(path)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, 2000), value=st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]),
       width=st.sampled_from([4, 8]))
def test_counts_and_lengths_that_lie(tmp_path_factory: pytest.TempPathFactory, at: int, value: int, width: int) -> None:
    """Any 4- or 8-byte field of the header, key/values or tensor infos overwritten with a
    count, length, type or dim that claims far more (or nothing)."""
    folder = tmp_path_factory.mktemp("lie")
    data = bytearray(write_metadata_file(folder / "base.gguf", BASE, TENSORS).read_bytes())
    header_end = data.index(b"blk.0.ffn_down.weight") + 60
    at = at % max(header_end - width, 1)
    data[at:at + width] = struct.pack("<I" if width == 4 else "<Q", value % (1 << (8 * width)))
    (folder / "m.gguf").write_bytes(bytes(data))
    _loads_or_typed(folder / "m.gguf")


@pytest.mark.parametrize("version", [0, 1, 4, 2**31, 2**32 - 1])
def test_other_gguf_versions(tmp_path: Path, version: int) -> None:
    data = bytearray(write_metadata_file(tmp_path / "base.gguf", BASE, TENSORS).read_bytes())
    data[4:8] = struct.pack("<I", version)
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    with pytest.raises(RlxMilError, match=re.escape(f"{tmp_path / 'm.gguf'}: GGUF version ") + r"\d+; rlx_mil reads GGUF versions 2 and 3"):
        from_gguf(tmp_path / "m.gguf")


@pytest.mark.parametrize("alignment", [0, 3, 48, 2**31 + 1])
def test_alignment_zero_or_not_a_power_of_two(tmp_path: Path, alignment: int) -> None:
    path = write_metadata_file(tmp_path / "m.gguf", {**BASE, "general.alignment": (alignment, "UINT32")}, TENSORS)
    with pytest.raises(RlxMilError, match=r"general\.alignment"):
        GGUFFile(path)


def test_duplicate_keys_and_tensor_names(tmp_path: Path) -> None:
    meta = {**BASE, f"{ARCH}.context_lengtX": (99, "UINT32")}
    data = write_metadata_file(tmp_path / "base.gguf", meta, TENSORS).read_bytes()
    (tmp_path / "k.gguf").write_bytes(data.replace(f"{ARCH}.context_lengtX".encode(), f"{ARCH}.context_length".encode()))
    with pytest.raises(RlxMilError, match=rf"{ARCH}\.context_length.*twice"):
        from_gguf(tmp_path / "k.gguf")
    tensors = {**TENSORS, "blk.0.ffn_up.weighX": (FFN, HIDDEN)}
    data = write_metadata_file(tmp_path / "base2.gguf", BASE, tensors).read_bytes()
    (tmp_path / "t.gguf").write_bytes(data.replace(b"blk.0.ffn_up.weighX", b"blk.0.ffn_up.weight"))
    with pytest.raises(RlxMilError, match=r"blk\.0\.ffn_up\.weight.*twice"):
        from_gguf(tmp_path / "t.gguf")


@pytest.mark.parametrize("arch", ["mamba", "bert", "", "llama\x00", "ll\u00e9ama"])
def test_unsupported_architectures_are_named(tmp_path: Path, arch: str) -> None:
    path = write_metadata_file(tmp_path / "m.gguf", {**BASE, "general.architecture": (arch, "STRING")}, TENSORS)
    with pytest.raises(RlxMilError, match=r"general\.architecture"):
        from_gguf(path)


def test_binary_in_text_keys(tmp_path: Path) -> None:
    path = write_metadata_file(tmp_path / "m.gguf", {**BASE, "general.architecture": (b"\xff\xfe", "BYTES")}, TENSORS)
    with pytest.raises(RlxMilError, match=r"general\.architecture"):
        from_gguf(path)


def test_token_list_shorter_than_the_vocabulary(tmp_path: Path) -> None:
    meta = {**BASE, "tokenizer.ggml.tokens": ([f"t{i}" for i in range(VOCAB - 4)], "ARRAY")}
    path = write_metadata_file(tmp_path / "m.gguf", meta, TENSORS)
    from rlx_mil.models.gguf.tokenizer import gguf_tokenizer

    with pytest.raises(RlxMilError, match=r"tokenizer\.ggml\.tokens.*token_embd\.weight has 16 rows"):
        gguf_tokenizer(GGUFFile(path))


@pytest.mark.parametrize("dims", [(0, HIDDEN), (2**62, 2**62)])
def test_zero_or_overflowing_dims(tmp_path: Path, dims: tuple[int, int]) -> None:
    data = bytearray(write_metadata_file(tmp_path / "base.gguf", BASE, TENSORS).read_bytes())
    at = data.index(b"token_embd.weight") + len(b"token_embd.weight") + 4  # after n_dims
    data[at:at + 16] = struct.pack("<QQ", dims[1], dims[0])
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    with pytest.raises(RlxMilError, match=r"token_embd\.weight"):
        from_gguf(tmp_path / "m.gguf")


def test_empty_files_folders_and_fifos(tmp_path: Path) -> None:
    (tmp_path / "empty.gguf").write_bytes(b"")
    os.mkfifo(tmp_path / "fifo.gguf")
    (tmp_path / "dir.gguf").mkdir()
    for path in (tmp_path / "empty.gguf", tmp_path / "fifo.gguf", tmp_path / "dir.gguf"):
        _loads_or_typed(path)
        with pytest.raises(RlxMilError):
            from_gguf(path)
