"""The cases of `hostile_round4.py`, one `Case` each: the command line, the outcomes that count
as typed or correct, and what must be absent afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostile_round4_fixtures import (
    _copy,
    _coremltools_models,
    _edit_json,
    _gguf_bytes,
    _gguf_kv,
    _gguf_str,
    _gguf_with,
    _remove_later,
    _twin_run,
    _valid_package,
    _wav,
    _with_template,
    _with_tokenizer,
)


@dataclass
class Case:
    name: str
    argv: list[str]
    #: exit codes that count as the typed outcome; 0 needs `check` (when given) to hold.
    codes: tuple[int, ...] = (1, 2)
    check: Callable[[subprocess.CompletedProcess[str]], bool] | None = None
    #: seconds after which the case gets SIGINT (an interrupt case), and what must be absent after it.
    interrupt_after: float | None = None
    absent: tuple[Path, ...] = ()
    before: Callable[[], None] | None = None
    during: Callable[[subprocess.Popen[str]], None] | None = None
    json_out: bool = False
    #: an interrupt that may land before the interpreter installs any handler: ended by the
    #: signal itself (status -2; 130 to a shell) with nothing on stderr also counts.
    silent_ok: bool = False
    #: `interrupt_after` counts from the moment a bare interpreter would be up (measured just
    #: before the case): the command's own first moments, whatever the machine's load.
    after_interpreter_start: bool = False
    #: SIGINT as soon as stderr shows this text (a stage line: the command is mid-work on any
    #: machine, where a fixed delay can land after an idle machine has finished).
    interrupt_on: str | None = None
    result: dict[str, Any] = field(default_factory=dict)


def cases(fx: dict[str, Path], work: Path) -> list[Case]:
    import struct

    import gguf
    import numpy as np

    h = work / "cases"
    if h.exists():
        shutil.rmtree(h)
    h.mkdir(parents=True)
    pkg, chunks, asset, wk = fx["pkg"], fx["chunks"], fx["asset"], fx["wk"]
    out: list[Case] = []

    def add(name: str, argv: list[Any], **kw: Any) -> None:
        out.append(Case(name, [str(a) for a in argv], **kw))

    def ok_json(key: str, want: Any = None) -> Callable[[subprocess.CompletedProcess[str]], bool]:
        def check(done: subprocess.CompletedProcess[str]) -> bool:
            data = json.loads(done.stdout)
            return key in data and (want is None or data[key] == want)
        return check

    def fifo(name: str) -> Path:
        path = h / name
        os.mkfifo(path)
        return path

    # ---- eval limits
    line = h / "line.txt"
    line.write_text(("The capital of France is Paris. " * 40000)[:1 << 20])
    one_word = h / "oneword.txt"
    one_word.write_text("x" * (1 << 20))
    (h / "empty.txt").write_text("")
    (h / "binary.txt").write_bytes(os.urandom(4096))
    (h / "nul.txt").write_bytes(b"hello\0world " * 50)
    (h / "late-bad-utf8.txt").write_bytes(b"word " * 400_000 + b"\xff\xfe")
    ev = ["eval", pkg, "--engine", "milexec", "-q"]
    add("eval 1 MB single line, no --max-tokens", [*ev, "--text", line, "--json"], codes=(0,),
        check=ok_json("truncated", True))
    add("eval 1 MB one word, no --max-tokens", [*ev, "--text", one_word, "--json"], codes=(0,),
        check=ok_json("tokens", 512))
    add("eval invalid UTF-8 after 2 MB of words", [*ev, "--text", h / "late-bad-utf8.txt", "--max-tokens", "20",
                                                  "--json"], codes=(0,), check=ok_json("tokens", 20))
    add("eval invalid UTF-8 read whole (--max-tokens all)", [*ev, "--text", h / "late-bad-utf8.txt", "--max-tokens",
                                                            "all"])
    for flag in ("0", "-5", "abc", "1", "1e3", ""):
        add(f"eval --max-tokens {flag!r}", [*ev, "--max-tokens", flag])
    add("eval empty text", [*ev, "--text", h / "empty.txt"])
    add("eval random bytes text", [*ev, "--text", h / "binary.txt"])
    add("eval text with NUL bytes", [*ev, "--text", h / "nul.txt", "--max-tokens", "20", "--json"], codes=(0,),
        check=ok_json("tokens", 20))
    add("eval /dev/zero as text", [*ev, "--text", "/dev/zero"])
    add("eval FIFO as text", [*ev, "--text", fifo("text.fifo")])
    add("eval directory as text", [*ev, "--text", h])
    add("eval missing text", [*ev, "--text", h / "missing.txt"])
    add("eval --reference missing", [*ev, "--reference", h / "nothing"])
    add("eval --reference of another vocabulary", [*ev, "--reference", fx["other"]])
    (h / "random.bin").write_bytes(os.urandom(1000))
    add("eval --reference random bytes", [*ev, "--reference", h / "random.bin"])
    add("eval --json on a missing package", ["eval", h / "nope.mlpackage", "--json"], json_out=True)

    # ---- generation limits
    gen = ["generate", pkg, "--engine", "milexec", "-q"]
    add("generate -n 0", [*gen, "--prompt", "Hello", "-n", "0"], codes=(0, 1, 2))
    add("generate -n -1", [*gen, "--prompt", "Hello", "-n", "-1"])
    add("generate -n 10**9 (capped and said)", [*gen, "--prompt", "Hello", "-n", str(10**9)], codes=(0,))
    add("generate -n 10**30", [*gen, "--prompt", "Hello", "-n", str(10**30)], codes=(0, 2))
    for flag, value in (("--temperature", "nan"), ("--temperature", "-1"), ("--temperature", "inf"),
                        ("--top-p", "2"), ("--top-p", "0"), ("--top-k", "-1"), ("--top-k", "0"), ("--min-p", "nan"),
                        ("--repeat-penalty", "0"), ("--seed", "-3"), ("--seed", "x")):
        add(f"generate {flag} {value}", [*gen, "--prompt", "Hello", flag, value])
    add("generate empty prompt", [*gen, "--prompt", ""])
    big = h / "big-prompt.txt"
    big.write_text("word " * 200_000)
    add("generate 1 MB prompt file (longer than the context)", [*gen, "-f", big, "-n", "2"])
    add("generate prompt file of random bytes", [*gen, "-f", h / "binary.txt"])
    add("generate prompt file FIFO", [*gen, "-f", fifo("prompt.fifo")])
    add("generate prompt with NUL", [*gen, "--prompt", "a\tb", "-n", "2"], codes=(0,))
    add("generate --prompt-ids past the vocabulary", [*gen, "--prompt-ids", "1,99999999", "-n", "1"])
    add("generate --prompt-ids negative", [*gen, "--prompt-ids", "-4", "-n", "1"])
    add("generate --prompt-ids text", [*gen, "--prompt-ids", "1,x", "-n", "1"])
    add("generate --prompt-ids 10**30", [*gen, "--prompt-ids", str(10**30), "-n", "1"])
    add("generate --system without --chat", [*gen, "--prompt", "Hi", "--system", "be brief"])

    # ---- chat templates (the package's own tokenizer_config.json edited)
    templates = {
        "endless loop": "{% for i in range(10**9) %}{{ i }}{% endfor %}",
        "nested endless loops": "{% for i in range(10**5) %}{% for j in range(10**5) %}x{% endfor %}{% endfor %}",
        "huge string": "{{ 'x' * 10**10 }}",
        "huge list": "{% set a = [0] * 10**9 %}{{ a|length }}",
        "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "not jinja": "{% for %}",
        "raises": "{{ raise_exception('no system role') }}",
        "undefined special token": "{{ nonexistent_token.upper() }}",
        "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "a number": 42,
        "a list of non-templates": [1, 2],
        "empty": "",
    }
    for name, template in templates.items():
        bad = _with_template(pkg, h / f"tpl-{len(out)}.mlpackage", template)
        add(f"generate --chat, template: {name}", ["generate", bad, "--engine", "milexec", "-q", "--chat", "--prompt",
                                                   "Hi", "-n", "2"], codes=(0, 1, 2) if name == "empty" else (1, 2))
    add("generate --chat --system, template without a system role",
        ["generate", _with_template(pkg, h / "tpl-nosys.mlpackage",
                                    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception("
                                    "'System role not supported') }}{% endif %}{{ m['content'] }}{% endfor %}"),
         "--engine", "milexec", "-q", "--chat", "--system", "be brief", "--prompt", "Hi", "-n", "2"])

    # ---- tokenizers (the package's tokenizer.json edited)
    def truncated(p: Path) -> None:
        p.write_bytes(p.read_bytes()[:300])

    def wrong_schema(p: Path) -> None:
        p.write_text(json.dumps({"version": "1.0", "model": 5}))

    def added_past_vocab(p: Path) -> None:
        _edit_json(p, lambda d: {**d, "added_tokens": [*d["added_tokens"], {
            "id": 100000, "content": "<|beyond|>", "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}]})

    def vocab_larger(p: Path) -> None:
        def grow(d: Any) -> Any:
            d["model"]["vocab"].update({f"zz{i}": 1000 + i for i in range(5000)})
            return d
        _edit_json(p, grow)

    def deep(p: Path) -> None:
        p.write_text("[" * 100_000 + "]" * 100_000)

    def huge_ids(p: Path) -> None:
        def ids(d: Any) -> Any:
            d["model"]["vocab"]["zz"] = 2**62
            return d
        _edit_json(p, ids)

    for name, write in (("truncated", truncated), ("random bytes", lambda p: p.write_bytes(os.urandom(2000))),
                        ("wrong schema", wrong_schema), ("added token past vocab_size", added_past_vocab),
                        ("vocabulary larger than vocab_size", vocab_larger), ("nested 100,000 deep", deep),
                        ("token id 2**62", huge_ids), ("empty", lambda p: p.write_text("")),
                        ("a folder", lambda p: (p.unlink(), p.mkdir())), ("a FIFO", lambda p: (p.unlink(), os.mkfifo(p))),
                        ("removed", lambda p: p.unlink())):
        bad = _with_tokenizer(pkg, h / f"tok-{len(out)}.mlpackage", write)
        # ids past vocab_size: a warning when the package opens, an error if the prompt holds one
        add(f"generate, tokenizer.json {name}", ["generate", bad, "--engine", "milexec", "-q", "--prompt", "Hi",
                                                 "-n", "2"], codes=(0, 1) if "vocab" in name else (1, 2))
    bad = _copy(pkg, h / "tokcfg.mlpackage")
    next(bad.rglob("tokenizer_config.json")).write_text("{not json")
    add("generate, tokenizer_config.json not JSON", ["generate", bad, "--engine", "milexec", "-q", "--prompt", "Hi"])

    # ---- GGUF metadata
    gg = ["convert-gguf"]
    (h / "empty.gguf").write_bytes(b"")
    add("convert-gguf empty file", [*gg, h / "empty.gguf", "-o", h / "o1.mlpackage"])
    add("convert-gguf directory", [*gg, h, "-o", h / "o2.mlpackage"])
    add("convert-gguf FIFO", [*gg, fifo("x.gguf"), "-o", h / "o3.mlpackage"])
    (h / "random.gguf").write_bytes(os.urandom(5000))
    add("convert-gguf random bytes", [*gg, h / "random.gguf", "-o", h / "o4.mlpackage"])
    for version in (1, 2, 4, 2**31):
        (h / f"v{version}.gguf").write_bytes(_gguf_bytes(version))
        add(f"convert-gguf version {version}", [*gg, h / f"v{version}.gguf", "-o", h / "o5.mlpackage"])
    (h / "tensors.gguf").write_bytes(_gguf_bytes(3, tensors=2**62))
    add("convert-gguf tensor count 2**62", [*gg, h / "tensors.gguf", "-o", h / "o6.mlpackage"])
    (h / "kvs.gguf").write_bytes(_gguf_bytes(3, kvs=2**62))
    add("convert-gguf key count 2**62", [*gg, h / "kvs.gguf", "-o", h / "o7.mlpackage"])
    (h / "strlen.gguf").write_bytes(_gguf_bytes(3, kvs=1, body=struct.pack("<Q", 2**60) + b"general"))
    add("convert-gguf key length 2**60", [*gg, h / "strlen.gguf", "-o", h / "o8.mlpackage"])
    arch = _gguf_kv("general.architecture", 8, _gguf_str(b"llama"))
    (h / "val.gguf").write_bytes(_gguf_bytes(3, kvs=2, body=arch + _gguf_kv("general.name", 8,
                                                                              struct.pack("<Q", 2**40) + b"x")))
    add("convert-gguf string value claiming 1 TB", [*gg, h / "val.gguf", "-o", h / "o9.mlpackage"])
    (h / "arr.gguf").write_bytes(_gguf_bytes(3, kvs=2, body=arch + _gguf_kv(
        "tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2**50))))
    add("convert-gguf array count 2**50", [*gg, h / "arr.gguf", "-o", h / "o10.mlpackage"])
    (h / "type.gguf").write_bytes(_gguf_bytes(3, kvs=2, body=arch + _gguf_kv("x.y", 99, b"")))
    add("convert-gguf value type 99", [*gg, h / "type.gguf", "-o", h / "o11.mlpackage"])
    (h / "dupkey.gguf").write_bytes(_gguf_bytes(3, kvs=2, body=arch + arch))
    add("convert-gguf duplicate key", [*gg, h / "dupkey.gguf", "-o", h / "o12.mlpackage"])
    (h / "binarch.gguf").write_bytes(_gguf_bytes(3, kvs=1, body=_gguf_kv("general.architecture", 8,
                                                                          _gguf_str(b"\xff\x00\xfe"))))
    add("convert-gguf binary architecture name", [*gg, h / "binarch.gguf", "-o", h / "o13.mlpackage"])
    for name, edit in (
        ("alignment 0", lambda w: w.add_uint32("general.alignment", 0)),
        ("alignment 3", lambda w: w.add_uint32("general.alignment", 3)),
        ("context_length a string", lambda w: w.add_string("llama.context_length", "4096")),
        ("block_count negative", lambda w: w.add_int32("llama.block_count", -1)),
        ("embedding_length 2**60", lambda w: w.add_uint64("llama.embedding_length", 2**60)),
        ("unsupported architecture", lambda w: w.add_string("general.architecture2", "x")),
    ):
        path = _gguf_with(h, f"meta-{len(out)}.gguf", edit)
        add(f"convert-gguf {name}", [*gg, path, "-o", h / "o14.mlpackage"])
    mamba = h / "mamba.gguf"
    writer = gguf.GGUFWriter(str(mamba), "mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    add("convert-gguf architecture mamba", [*gg, mamba, "-o", h / "o15.mlpackage"])
    data = fx["gguf"].read_bytes()
    (h / "cut.gguf").write_bytes(data[: len(data) // 2])
    add("convert-gguf truncated tensor data", [*gg, h / "cut.gguf", "-o", h / "o16.mlpackage"])
    (h / "cut-meta.gguf").write_bytes(data[:200])
    add("convert-gguf truncated metadata", [*gg, h / "cut-meta.gguf", "-o", h / "o17.mlpackage"])
    add("convert-gguf of a real tiny file", [*gg, fx["gguf"], "-o", h / "ok.mlpackage", "--max-context", "32",
                                             "--prefill", "8", "-q"], codes=(0,))

    # ---- chunked sets
    for value in ("0", "-1", "abc", "1", "1e99", "10**3", "nan", "1 GB"):
        add(f"convert-hf --chunk-bytes {value!r}", ["convert-hf", fx["chat"], "-o", h / "ck.mlpackage", "--stateful",
                                                    "--chunk-bytes", value, "-q"])
    missing = _copy(chunks, h / "ck-missing")
    shutil.rmtree(missing / "chat-chunks_chunk_01.mlpackage")
    swapped = _copy(chunks, h / "ck-swapped")
    (swapped / "chat-chunks_chunk_00.mlpackage").rename(swapped / "tmp.mlpackage")
    (swapped / "chat-chunks_chunk_01.mlpackage").rename(swapped / "chat-chunks_chunk_00.mlpackage")
    (swapped / "tmp.mlpackage").rename(swapped / "chat-chunks_chunk_01.mlpackage")
    cut = _copy(chunks, h / "ck-cut")
    (cut / "chunks.json").write_bytes((cut / "chunks.json").read_bytes()[:200])
    edited = _copy(chunks, h / "ck-edited")
    _edit_json(edited / "chunks.json", lambda d: {**d, "chunk_bytes": 1, "functions": {"decode": 3}})
    foreign = _copy(chunks, h / "ck-foreign")
    shutil.rmtree(foreign / "chat-chunks_chunk_00.mlpackage")
    _copy(fx["graphpkg"], foreign / "chat-chunks_chunk_00.mlpackage")
    for name, folder in (("a chunk missing", missing), ("chunks swapped", swapped), ("manifest truncated", cut),
                         ("manifest edited", edited), ("a chunk from another model", foreign)):
        add(f"generate chunked set, {name}", ["generate", folder, "--engine", "milexec", "-q", "--prompt", "Hi",
                                              "-n", "2"])
    add("generate chunked set, intact", ["generate", chunks, "--engine", "milexec", "-q", "--prompt", "Hi", "-n", "2"],
        codes=(0,))

    # ---- packages from anywhere
    (h / "random.mlpackage").write_bytes(os.urandom(3000))
    nomanifest = h / "nomanifest.mlpackage"
    nomanifest.mkdir()
    noweights = _copy(fx["graphpkg"], h / "noweights.mlpackage")
    shutil.rmtree(next(noweights.rglob("weights")))
    cutproto = _copy(fx["graphpkg"], h / "cutproto.mlpackage")
    model = next(cutproto.rglob("model.mlmodel"))
    model.write_bytes(model.read_bytes()[:100])
    fifoweights = _copy(fx["graphpkg"], h / "fifoweights.mlpackage")
    weight = next(fifoweights.rglob("weight.bin"))
    weight.unlink()
    os.mkfifo(weight)
    for name, bad in (("random bytes", h / "random.mlpackage"), ("a folder without a manifest", nomanifest),
                      ("no weight file", noweights), ("a truncated protobuf", cutproto), ("a FIFO weight.bin", fifoweights)):
        for command in ("inspect", "preflight", "run"):
            argv = [command, bad] + (["--json"] if command != "run" else [])
            add(f"{command}: {name}", argv, json_out=command != "run")
    add("preflight --device bogus", ["preflight", fx["graphpkg"], "--device", "tpu"])
    add("run --inputs missing", ["run", fx["graphpkg"], "--inputs", h / "missing.npz"])
    (h / "bad.npz").write_bytes(os.urandom(200))
    add("run --inputs random bytes", ["run", fx["graphpkg"], "--inputs", h / "bad.npz"])
    np.savez(h / "wrong.npz", nothing=np.zeros(3, np.float32))
    add("run --inputs with wrong names", ["run", fx["graphpkg"], "--inputs", h / "wrong.npz"])
    nn = h / "nn.mlmodel"
    _coremltools_models(nn, h / "ct.mlpackage")
    add("inspect a coremltools neural network", ["inspect", nn, "--json"], codes=(0, 1), json_out=True)
    add("inspect a coremltools ML program", ["inspect", h / "ct.mlpackage", "--json"], codes=(0,), json_out=True)
    np.savez(h / "x23.npz", x=np.ones((2, 3), np.float32))
    add("run a coremltools ML program", ["run", h / "ct.mlpackage", "--inputs", h / "x23.npz"], codes=(0,))
    add("generate on a graph package", ["generate", fx["graphpkg"], "--prompt", "Hi", "--engine", "milexec"])

    # ---- compression options
    conv = ["convert-hf", fx["chat"], "-o", h / "c.mlpackage", "--graph-only", "--seq-len", "8", "-q"]
    for flags in (["--compress-budget", "0"], ["--compress-budget", "-1"], ["--compress-budget", "nan"],
                  ["--compress-budget", "half"], ["--compress-budget", "1.5"], ["--max-error", "0"],
                  ["--max-error", "nan"], ["--max-error", "-1"], ["--max-kl", "0"], ["--max-kl", "nan"],
                  ["--max-kl", "-1"], ["--max-kl", "much"], ["--min-top1", "0"], ["--min-top1", "1.5"],
                  ["--compress-calibration", h / "missing.npz"], ["--compress-calibration", h / "wrong.npz"],
                  ["--compress-calibration", h / "bad.npz"], ["--compress-calibration", fifo("cal.npz")]):
        add(f"convert-hf --compress auto4 {' '.join(map(str, flags))}", [*conv, "--compress", "auto4", *flags])
    add("convert-hf --compress int3", [*conv, "--compress", "int3"])
    add("convert-hf --compress ''", [*conv, "--compress", ""])
    add("convert-hf text calibration for a model without a tokenizer",
        ["convert-hf", fx["llama"], "-o", h / "c2.mlpackage", "--graph-only", "--seq-len", "8", "-q", "--compress",
         "auto4", "--compress-calibration", line])
    add("convert auto4 of a graph with nothing to compress",
        ["convert", fx["g_json"], "-o", h / "c3.mlpackage", "--compress", "auto4"], codes=(0, 1))

    # ---- deploy and target
    for flags in (["--deploy", "ane", "--target", "iOS16"], ["--deploy", "gpu", "--target", "iOS15"],
                  ["--deploy", "tpu"], ["--target", "iOS99"], ["--target", ""],
                  ["--deploy", "ane", "--target", "iOS17", "--compress", "4bit"],
                  ["--compress", "int4", "--target", "iOS17", "--graph-only", "--seq-len", "8"],
                  ["--compress", "lut4-scaled", "--target", "iOS16", "--graph-only", "--seq-len", "8"]):
        add(f"convert-hf {' '.join(flags)}", ["convert-hf", fx["chat"], "-o", h / "d.mlpackage", "-q", *flags])
    for flags in (["--deploy", "ane", "--target", "iOS16", "--stateful"], ["--max-kl", "x"],
                  ["--compress", "int4", "--target", "iOS17"], ["--chunk-bytes", "0"], ["--max-context", "9"]):
        add(f"convert-hf whisper {' '.join(flags)}", ["convert-hf", fx["whisper"], "-o", h / "w", "-q", *flags])

    # ---- audio files for transcribe
    tr = ["transcribe", wk, "-q"]
    t = np.arange(16000) / 16000
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    audio = {
        "8 channels": _wav(h / "8ch.wav", np.tile(tone[:, None], (1, 8)), 16000),
        "NaN samples": _wav(h / "nan.wav", np.where(t < 0.5, tone, np.nan).astype(np.float32), 16000, "FLOAT"),
        "inf samples": _wav(h / "inf.wav", np.full(800, np.inf, np.float32), 16000, "FLOAT"),
        "0 samples": _wav(h / "zero.wav", np.zeros(0, np.float32), 16000),
        "FLAC truncated": _wav(h / "cut.flac", tone, 16000),
        "8 kHz (resampled)": _wav(h / "8k.wav", tone[::2], 8000),
    }
    cut_flac = audio["FLAC truncated"]
    cut_flac.write_bytes(cut_flac.read_bytes()[:400])
    one_hz = bytearray(_wav(h / "1hz.wav", tone, 16000).read_bytes())
    one_hz[24:28] = struct.pack("<I", 1)
    (h / "1hz.wav").write_bytes(bytes(one_hz))
    audio["1 Hz sample rate"] = h / "1hz.wav"
    huge = bytearray(fx["wav"].read_bytes())
    huge[40:44] = struct.pack("<I", 0xFFFFFFF0)
    (h / "huge.wav").write_bytes(bytes(huge))
    audio["data chunk claiming 4 GB"] = h / "huge.wav"
    riff = bytearray(fx["wav"].read_bytes())
    riff[16:20] = struct.pack("<I", 2**31)
    (h / "fmt.wav").write_bytes(bytes(riff))
    audio["fmt chunk claiming 2 GB"] = h / "fmt.wav"
    (h / "random.wav").write_bytes(os.urandom(4000))
    audio["random bytes"] = h / "random.wav"
    (h / "header.wav").write_bytes(fx["wav"].read_bytes()[:44])
    audio["header only"] = h / "header.wav"
    (h / "id3.mp3").write_bytes(b"ID3\x03\x00\x00\x00\x00\x00\x00" + os.urandom(3000))
    audio["MP3 bytes"] = h / "id3.mp3"
    audio["FIFO"] = fifo("audio.wav")
    audio["directory"] = h
    audio["/dev/zero"] = Path("/dev/zero")
    audio["missing"] = h / "missing.wav"
    for name, path in audio.items():
        add(f"transcribe: {name}", [*tr, path], codes=(0,) if "resampled" in name else (1, 2))
    add("transcribe: a .mlpackage instead of the folder", ["transcribe", pkg, fx["wav"]])
    add("transcribe: an LLM package folder", ["transcribe", fx["chat"], fx["wav"]])
    add("transcribe: --language xx", [*tr, fx["wav"], "--language", "xx"])

    # ---- Core AI assets
    (h / "random.aimodel").write_bytes(os.urandom(4000))
    empty_asset = h / "empty.aimodel"
    empty_asset.mkdir()
    cut_asset = _copy(asset, h / "cut.aimodel")
    blob = cut_asset / "main.mlirb"
    blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 3])
    no_blob = _copy(asset, h / "noblob.aimodel")
    (no_blob / "main.mlirb").unlink()
    no_meta = _copy(asset, h / "nometa.aimodel")
    (no_meta / "rlx_mil_metadata.json").unlink()
    edited_meta = _copy(asset, h / "editedmeta.aimodel")
    (edited_meta / "rlx_mil_metadata.json").write_text('{"rlx_mil.llm": "{broken", "x": [1, 2]}')
    garbage_meta = _copy(asset, h / "garbagemeta.aimodel")
    (garbage_meta / "metadata.json").write_bytes(os.urandom(300))
    random_blob = _copy(asset, h / "randomblob.aimodel")
    (random_blob / "main.mlirb").write_bytes(os.urandom(20000))
    not_asset = _copy(pkg, h / "package-renamed.aimodel")
    fifo_blob = _copy(asset, h / "fifoblob.aimodel")
    (fifo_blob / "main.mlirb").unlink()
    os.mkfifo(fifo_blob / "main.mlirb")
    # the program and its SHA-256 rewritten together (the hash check passes): Apple's runtime
    # would end the process reading these programs
    def rewritten(name: str, program: bytes) -> Path:
        import hashlib

        out = _copy(asset, h / f"{name}.aimodel")
        (out / "main.mlirb").write_bytes(program)
        (out / "main.hash").write_bytes(hashlib.sha256(program).digest())
        return out

    original = (asset / "main.mlirb").read_bytes()
    unknown_op = rewritten("unknown-op", original.replace(b"primitive.exp_v1", b"primitive.exq_v1", 1))
    wrong_arity = rewritten("wrong-arity", original.replace(b"primitive.exp_v1", b"primitive.add_v1", 1))
    not_bytecode = rewritten("not-bytecode", original[:16] + os.urandom(len(original) - 16))
    cut_weights = rewritten("cut-weights", original[: len(original) - 1000])  # blobs end past the file's end
    huge_entry = rewritten("huge-entry", original)
    entries = json.loads((huge_entry / "rlx_mil_entries.json").read_text())
    for entry in entries["entries"].values():
        for spec in entry["states"].values():
            spec["shape"] = [1 << 20, 1 << 20, 1 << 20]
    (huge_entry / "rlx_mil_entries.json").write_text(json.dumps(entries))
    other_entries = rewritten("other-entries", original)
    entries = json.loads((other_entries / "rlx_mil_entries.json").read_text())
    for entry in entries["entries"].values():
        entry["states"] = {f"{k}_x": v for k, v in entry["states"].items()}
    (other_entries / "rlx_mil_entries.json").write_text(json.dumps(entries))
    assets = {"program+hash rewritten: an unknown op": unknown_op, "program+hash rewritten: an op's operands": wrong_arity,
              "program+hash rewritten: not bytecode": not_bytecode, "program+hash rewritten: weights cut off": cut_weights, "entry points: huge state shapes": huge_entry,
              "entry points: states the program lacks": other_entries,
              "random bytes": h / "random.aimodel", "an empty folder": empty_asset, "main.mlirb truncated": cut_asset,
              "main.mlirb missing": no_blob, "rlx_mil metadata missing": no_meta,
              "rlx_mil metadata edited": edited_meta, "metadata.json random bytes": garbage_meta,
              "main.mlirb random bytes": random_blob, "a package renamed .aimodel": not_asset,
              "main.mlirb a FIFO": fifo_blob}
    for name, path in assets.items():
        add(f"inspect asset: {name}", ["inspect", path, "--json"], json_out=True,
            # inspect describes a malformed LLM contract rather than failing (docs/design.md)
            codes=(0, 1) if name in ("rlx_mil metadata missing", "rlx_mil metadata edited") or "rewritten" in name
            or "entry points" in name else (1, 2))
        add(f"generate asset: {name}", ["generate", path, "--prompt", "Hi", "-n", "2", "-q"])
        add(f"eval asset: {name}", ["eval", path, "--max-tokens", "8", "-q"])
        add(f"run asset: {name}", ["run", path, "--inputs", h / "wrong.npz"])
        add(f"transcribe asset: {name}", ["transcribe", path, fx["wav"]])
    add("generate asset: intact", ["generate", asset, "--prompt", "Hi", "-n", "2", "-q"], codes=(0, 1))

    # ---- interrupts and concurrency
    tmp_out = h / "int" / "x.mlpackage"
    tmp_out.parent.mkdir()
    add("Ctrl-C during convert-hf", ["convert-hf", fx["chat"], "-o", tmp_out, "--stateful", "--max-context", "32",
                                     "--prefill", "8"], codes=(130,),
        interrupt_on="is not a multiple of 32",  # the fixture's NeuralEngineWarning, before the conversion
        absent=(tmp_out,))
    add("Ctrl-C during eval", [*ev, "--text", line, "--max-tokens", "all"], codes=(130,), interrupt_after=8.0)
    demo_out = h / "int" / "demo.mlpackage"
    add("Ctrl-C during demo", ["demo", "-o", demo_out, "--layers", "1", "--hidden", "32", "--heads", "2",
                               "--kv-heads", "1", "--seq", "8", "-q"], codes=(130, 0), interrupt_after=9.0,
        absent=(demo_out,))
    # 90 s of audio: about 4 s idle, so the Ctrl-C lands early in the work on any machine
    add("Ctrl-C during transcribe", [*tr, fx["long_wav"]], codes=(130,), interrupt_after=1.5)
    add("Ctrl-C during generate", [*gen, "--prompt", "Hi", "-n", "10000"], codes=(130, 0), interrupt_after=3.0)
    # Ctrl-C while a command starts (imports, argument parsing): one line and 130, or, sent
    # before the interpreter set up its handler, the signal's own end with nothing printed.
    early_out = h / "int" / "early.mlpackage"
    starting = {"--help": ["--help"], "convert-hf": ["convert-hf", fx["chat"], "-o", early_out, "--max-context", "32",
                                                     "--prefill", "8"],
                "generate": [*gen, "--prompt", "Hi", "-n", "4"], "chat": ["chat", pkg, "--engine", "milexec"],
                "eval": [*ev, "--text", line], "preflight": ["preflight", pkg], "inspect": ["inspect", pkg]}
    for label, argv in starting.items():
        add(f"Ctrl-C right after spawn: {label}", argv, codes=(130, -2, 0), interrupt_after=0.0, silent_ok=True,
            absent=(early_out,))
        for delay in (0.0, 0.02, 0.05, 0.1):
            # a quick command (--help) may already be in the interpreter's shutdown, where Python
            # has put back the default handler: killed by the signal, nothing printed (130 to a
            # shell) is a correct end too
            add(f"Ctrl-C {delay:.2f} s into the command: {label}", argv, codes=(130, -2, 0), interrupt_after=delay,
                after_interpreter_start=True, absent=(early_out,), silent_ok=True)
    twin = h / "twin" / "m.mlpackage"
    add("two conversions to one destination", ["convert-hf", fx["chat"], "-o", twin, "--stateful", "--max-context",
                                               "32", "--prefill", "8", "-q"], codes=(0, 1), during=_twin_run,
        check=lambda done: _valid_package(twin))
    gone = h / "gone" / "sub" / "m.mlpackage"
    # convert-hf makes a missing parent folder: removed before the save, the package is written
    # where asked (exit 0, one valid package); removed during it, the save fails (exit 1, nothing).
    add("destination parent removed mid-run", ["convert-hf", fx["chat"], "-o", gone, "--stateful", "--max-context",
                                               "32", "--prefill", "8", "-q"], codes=(0, 1),
        before=lambda: gone.parent.mkdir(parents=True, exist_ok=True),
        during=lambda proc: _remove_later(gone.parent.parent, 5.0),
        check=lambda done: _valid_package(gone))
    return out


