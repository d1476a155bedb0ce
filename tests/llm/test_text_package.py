"""A chat checkpoint -> one stateful package carrying its tokenizer, chat template, generation
config and model description; text generation from the package folder alone; `rlx-mil eval`
against a NumPy computation of the same perplexity, KL and top-1 agreement."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models.hf_numpy import FORWARDS

from rlx_mil.cli import main
from rlx_mil.compress.quality import log_softmax
from rlx_mil.llm.generate import Session
from rlx_mil.llm.package import reference_greedy
from rlx_mil.llm.text import TextTokenizer
from rlx_mil.models.checkpoint import Checkpoint
from rlx_mil.progress import _CI_VARIABLES

from .text_fixtures import chat_checkpoint

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_checkpoint(tmp_path_factory.mktemp("hf") / "tiny-chat")


@pytest.fixture(scope="module")
def package(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pkg") / "chat.mlpackage"
    argv = ["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "48", "--prefill", "8",
            "--precision", "fp32", "-q", "--author", "Someone"]
    assert main(argv) == 0
    return out


def test_the_package_carries_the_text_files_and_description(
    package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = package / "Data" / "rlx_mil" / "tokenizer"
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    ]
    manifest = json.loads((package / "Manifest.json").read_text())
    assert any(e["path"] == "rlx_mil/tokenizer" and e["author"] == "rlx_mil" for e in manifest["itemInfoEntries"].values())
    capsys.readouterr()
    assert main(["inspect", str(package), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["description"] == {
        "author": "Someone",  # the flag wins over the owner in _name_or_path ("acme")
        "license": "apache-2.0", "version": "1.2",
        "short_description": "tiny-chat (Qwen3), converted to Core ML by rlx_mil",
    }
    assert info["text_folder"] == "Data/rlx_mil/tokenizer" and "tokenizer.json" in info["text_files"]
    assert info["model"]["name"] == "acme/tiny-chat" and info["model"]["named_by"] == "config.json _name_or_path"
    assert info["model"]["architecture"] == "Qwen3 (Qwen3ForCausalLM)" and info["model"]["parameters"] > 0
    assert main(["inspect", str(package)]) == 0
    text = capsys.readouterr().out
    assert "license:  apache-2.0" in text and "text:     Data/rlx_mil/tokenizer: config.json" in text
    assert re.search(r"model:    acme/tiny-chat, Qwen3 \(Qwen3ForCausalLM\), \d+\.\dK parameters; name from config\.json"
                     r" _name_or_path\n", text), text


def test_chat_generation_from_the_copied_folder_alone(
    package: Path, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = tmp_path / "elsewhere" / "copy.mlpackage"
    shutil.copytree(package, moved)
    tok = TextTokenizer(checkpoint)
    prompt = tok.encode_chat([{"role": "user", "content": QUESTION}])
    want_ids = reference_greedy(checkpoint, prompt, 12)
    stops = set(tok.stop_ids)
    cut = next((i + 1 for i, t in enumerate(want_ids) if t in stops), len(want_ids))
    want = tok.decode(want_ids[:cut])

    session = Session(moved, precision_model="float32")
    assert session.generate_text(QUESTION, 12, chat=True) == want
    assert session.stats.new_tokens == cut and session.stats.prompt_tokens == len(prompt)
    assert "".join(session.stream_text(QUESTION, 12, chat=True)) == want
    stream = session.stream_text(QUESTION, 12, chat=True)
    first = next(stream)
    # Text arrives as the tokens do, not after the last one.
    assert want.startswith(first) and (cut == 1 or session.stats.new_tokens < cut)
    stream.close()

    capsys.readouterr()
    argv = ["generate", str(moved), "--chat", "--prompt", QUESTION, "-n", "12", "--engine", "milexec"]
    # The CLI runs the declared (fp32) precision model: same program, same greedy text here.
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == want + "\n"
    assert "tok/s" in err and "prompt:" in err


def test_generation_stops_at_the_stop_ids(package: Path, checkpoint: Path, tmp_path: Path) -> None:
    tok = TextTokenizer(checkpoint)
    prompt = tok.encode("The capital")
    ids = reference_greedy(checkpoint, prompt, 6)
    # Make the last new distinct greedy token a stop token: generation ends right after it.
    cut = max(ids.index(t) for t in ids) + 1
    folder = tmp_path / "tok"
    shutil.copytree(checkpoint, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ids[cut - 1]}))
    session = Session(package, precision_model="float32")
    session.tokenizer = TextTokenizer(folder)
    assert session.generate_text("The capital", 6) == tok.decode(ids[:cut])
    assert session.stats.new_tokens == cut
    assert session.stats.stopped == ("stop token" if cut < 6 or ids[-1] == ids[cut - 1] else "max tokens")


def _numpy_scores(checkpoint: Path, ids: list[int], window: int, weights: object = None) -> list[np.ndarray]:
    """Log-probabilities of every scored position, window by window, from the NumPy forward."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    rows = []
    for start in range(0, len(ids), window):
        part = ids[start:start + window]
        if len(part) < 2:
            continue
        logits, _ = FORWARDS["qwen3"](weights or Checkpoint(checkpoint), cfg, np.asarray([part[:-1]]))
        rows.append(log_softmax(logits[0]))
    return rows


def test_eval_perplexity_and_reference_metrics_match_numpy(
    package: Path, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text_file = tmp_path / "text.txt"
    text_file.write_text("The capital of France is Paris. Hello, how are you? " * 4)
    tok = TextTokenizer(checkpoint)
    ids = tok.encode(text_file.read_text())[:60]
    want_rows = _numpy_scores(checkpoint, ids, 48)
    targets = [ids[s + 1:s + 48] for s in range(0, len(ids), 48) if len(ids[s:s + 48]) >= 2]
    nll = -np.mean(np.concatenate([r[np.arange(len(t)), t] for r, t in zip(want_rows, targets, strict=True)]))

    capsys.readouterr()
    argv = ["eval", str(package), "--text", str(text_file), "--max-tokens", "60", "--json", "-q",
            "--reference", str(checkpoint), "--engine", "milexec"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == 60 and got["windows"] == 2 and got["scored"] == 58
    assert got["perplexity"] == pytest.approx(math.exp(nll), rel=1e-3)
    assert got["reference_perplexity"] == pytest.approx(math.exp(nll), rel=1e-5)
    assert got["mean_kl"] == pytest.approx(0.0, abs=1e-4)
    assert got["top1_agreement"] == 1.0


INT4_TEXT = "Hello, how are you? I am fine, thank you. The capital of France is Paris."


def _numpy_int4_metrics(checkpoint: Path, int4: Path, window: int = 32) -> dict[str, float]:
    """What `eval INT4 --reference CHECKPOINT` should print for INT4_TEXT's first 40 tokens: the
    NumPy forward with the package's dequantized weights against the forward itself."""
    from rlx_mil.compress import dequantized_params, report_of
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.models.pretrained import from_pretrained

    report = report_of(package_info(int4).metadata)
    assert report is not None and report.weights
    _, params = from_pretrained(checkpoint, "prefill", seq_len=4)
    ids = TextTokenizer(checkpoint).encode(INT4_TEXT)[:40]
    p = np.concatenate(_numpy_scores(checkpoint, ids, window, dequantized_params(params, report)))
    q = np.concatenate(_numpy_scores(checkpoint, ids, window))
    flat = np.concatenate([ids[s + 1:s + window] for s in range(0, len(ids), window) if len(ids[s:s + window]) >= 2])
    nll_p, nll_q = -np.mean(p[np.arange(len(flat)), flat]), -np.mean(q[np.arange(len(flat)), flat])
    return {"scored": len(flat), "perplexity": math.exp(nll_p), "reference_perplexity": math.exp(nll_q),
            "perplexity_ratio": math.exp(nll_p - nll_q), "mean_kl": float(np.mean(np.sum(np.exp(q) * (q - p), axis=-1))),
            "top1_agreement": float(np.mean(np.argmax(p, -1) == np.argmax(q, -1)))}


def test_eval_of_an_int4_package_matches_numpy_with_its_dequantized_weights(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "int4.mlpackage"
    argv = ["convert-hf", str(checkpoint), "-o", str(out), "--stateful", "--max-context", "32",
            "--precision", "fp32", "--compress", "int4;min_size=1", "-q"]
    assert main(argv) == 0
    want = _numpy_int4_metrics(checkpoint, out)
    assert want["mean_kl"] > 1e-4  # int4 moves the distributions measurably
    text_file = tmp_path / "text.txt"
    text_file.write_text(INT4_TEXT)

    capsys.readouterr()
    assert main(["eval", str(out), "--text", str(text_file), "--max-tokens", "40", "--reference", str(checkpoint),
                 "--json", "-q"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["scored"] == want["scored"]
    assert got["perplexity"] == pytest.approx(want["perplexity"], rel=1e-4)
    assert got["reference_perplexity"] == pytest.approx(want["reference_perplexity"], rel=1e-5)
    assert got["perplexity_ratio"] == pytest.approx(want["perplexity_ratio"], rel=1e-4)
    assert got["mean_kl"] == pytest.approx(want["mean_kl"], rel=1e-3, abs=1e-6)
    assert got["top1_agreement"] == pytest.approx(want["top1_agreement"])
    for name in _CI_VARIABLES:  # progress is shown off CI only
        monkeypatch.delenv(name, raising=False)
    assert main(["eval", str(out), "--text", str(text_file), "--max-tokens", "40"]) == 0
    shown = capsys.readouterr()
    assert "perplexity:" in shown.out
    assert re.search(rf"^  scoring: {want['scored']} tokens \(", shown.err, re.M), shown.err  # progress on stderr


def test_eval_of_int4_against_fp16_packages_matches_numpy(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The comparison a user makes to pick a compression: `rlx-mil eval INT4 --reference FP16`,
    both packages of one checkpoint. NumPy: the int4 package is the forward with its dequantized
    weights, the fp16 one the forward itself; fp16 rounding is the only difference allowed."""
    half, int4 = tmp_path / "fp16.mlpackage", tmp_path / "int4.mlpackage"
    common = ["--stateful", "--max-context", "32", "--precision", "fp16", "-q"]
    assert main(["convert-hf", str(checkpoint), "-o", str(half), *common]) == 0
    assert main(["convert-hf", str(checkpoint), "-o", str(int4), *common, "--compress", "int4;min_size=1"]) == 0
    want = _numpy_int4_metrics(checkpoint, int4)
    assert want["mean_kl"] > 1e-3  # int4 moves the distributions well beyond fp16 rounding
    text_file = tmp_path / "text.txt"
    text_file.write_text(INT4_TEXT)

    capsys.readouterr()
    assert main(["eval", str(int4), "--text", str(text_file), "--max-tokens", "40", "--reference", str(half),
                 "--json", "-q", "--engine", "milexec"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["scored"] == want["scored"] and got["windows"] == 2 and got["reference"] == str(half)
    # Measured: perplexities within 1.3e-3, the KL within 6e-4 (relative) of NumPy's.
    for key in ("perplexity", "reference_perplexity", "perplexity_ratio"):
        assert got[key] == pytest.approx(want[key], rel=5e-3), key
    assert got["mean_kl"] == pytest.approx(want["mean_kl"], rel=1e-2)
    assert abs(got["top1_agreement"] - want["top1_agreement"]) <= 1 / want["scored"] + 1e-9  # one fp16 near-tie at most


def test_run_function_version_and_compute_units(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import rlx_mil

    ids = [5, 9, 14, 2, 7, 11, 3, 8]
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_ids=np.asarray([ids], np.int32), position_ids=np.arange(8, dtype=np.int32)[None],
             cache_position=np.zeros(1, np.int32))
    out = tmp_path / "out.npz"
    assert main(["run", str(package), "--inputs", str(inputs), "--function", "prefill_8", "-o", str(out),
                 "--engine", "milexec"]) == 0
    session = Session(package)
    want = session.feed(ids)
    assert session.calls == [("prefill_8", 8)]
    with np.load(out) as got:
        np.testing.assert_allclose(got["logits"].reshape(-1, want.size)[-1], want, rtol=1e-5, atol=1e-5)
    assert main(["run", str(package), "--inputs", str(inputs), "--function", "nope"]) == 1
    assert "no function 'nope' (functions: prefill_8, decode)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"rlx-mil {rlx_mil.__version__}"
    # Core ML does not store compute units in a package: only commands that load a model take them.
    for argv in (["convert-hf", "x", "-o", "y.mlpackage"], ["convert", "g.json", "-o", "y.mlpackage"], ["demo"]):
        with pytest.raises(SystemExit):
            main([*argv, "--compute-units", "CPU_ONLY"])
        assert "unrecognized arguments: --compute-units" in capsys.readouterr().err


def test_an_encoder_package_carries_its_tokenizer_for_padded_batches(tmp_path: Path) -> None:
    from models.hf_numpy import bert_forward, mean_pool
    from models.test_encoders import sentence_transformers_folder

    from rlx_mil.llm.package_files import package_text_folder
    from rlx_mil.llm.runner import run_package
    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    from .text_fixtures import write_wordpiece_tokenizer

    cfg = TINY_CONFIGS["bert"]
    folder = write_random_checkpoint(tmp_path / "minilm", cfg, seed=4)
    write_wordpiece_tokenizer(folder, vocab_size=cfg["vocab_size"])
    sentence_transformers_folder(folder)
    out = tmp_path / "minilm.mlpackage"
    assert main(["convert-hf", str(folder), "-o", str(out), "--seq-len", "12", "--batch-size", "2",
                 "--precision", "fp32", "-q"]) == 0
    text = package_text_folder(out)
    assert text is not None
    texts = ["hello paris", "how are you? i am fine, thank you."]
    inputs = TextTokenizer(text).encode_batch(texts, 12)
    assert inputs["attention_mask"][0].sum() < 12 and inputs["attention_mask"][1].sum() == 12  # padded, truncated
    got, _ = run_package(out, {k: inputs[k] for k in ("input_ids", "attention_mask")}, engine="milexec")
    tok = TextTokenizer(folder)
    for row, sentence in enumerate(texts):
        # Each sentence alone, unpadded (the second truncated as the tokenizer truncates it).
        ids = np.asarray([tok.encode(sentence)[:11] + tok.encode(sentence)[-1:] if row else tok.encode(sentence)])
        alone = mean_pool(bert_forward(Checkpoint(folder), cfg, ids, np.ones_like(ids)), np.ones_like(ids), True)
        np.testing.assert_allclose(got["sentence_embedding"][row], alone[0], rtol=1e-4, atol=1e-5)


def test_text_needs_a_tokenizer_and_a_template(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = tmp_path / "bare.mlpackage"
    shutil.copytree(package, bare)
    shutil.rmtree(bare / "Data" / "rlx_mil")
    manifest = json.loads((bare / "Manifest.json").read_text())
    manifest["itemInfoEntries"] = {k: v for k, v in manifest["itemInfoEntries"].items() if v["author"] != "rlx_mil"}
    (bare / "Manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["generate", str(bare), "--prompt", "hi", "-n", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlx-mil generate: error:") and "carries no tokenizer" in err and err.count("\n") == 1
    assert main(["generate", str(package), "--prompt", "hi", "--system", "x"]) == 1
    assert "--system needs --chat" in capsys.readouterr().err
    assert main(["generate", str(package), "--prompt-ids", "1,2", "--chat"]) == 1
    assert "need a text prompt (--prompt or -f)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # checked while parsing, before the package is opened
        main(["generate", str(package), "--prompt", "hi", "--top-p", "1.5", "--temperature", "1"])
    assert usage.value.code == 2 and "--top-p: expected a number in (0, 1]" in capsys.readouterr().err
    no_template = tmp_path / "nt"
    shutil.copytree(package / "Data" / "rlx_mil" / "tokenizer", no_template)
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    session = Session(package)
    session.tokenizer = TextTokenizer(no_template)
    from rlx_mil.llm.text import TokenizerError

    with pytest.raises(TokenizerError, match="no chat template"):
        session.generate_text("hi", 2, chat=True)
    assert isinstance(session.generate_text("hi", 2), str)


def test_a_tokenizer_larger_than_the_model_is_warned_of_and_its_extra_tokens_refused(
    package: Path, checkpoint: Path, tmp_path: Path,
) -> None:
    """A tokenizer.json whose added tokens lie past the model's vocab_size: converting warns,
    naming the file and the counts; a prompt holding such a token is a GenerationError naming
    the id (the embedding lookup would read past the table)."""
    import json
    import shutil

    from rlx_mil.errors import RlxMilError
    from rlx_mil.llm.package_files import check_tokenizer
    from rlx_mil.llm.text import TextTokenizer

    folder = tmp_path / "bigger"
    shutil.copytree(checkpoint, folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    data["added_tokens"].append({"id": vocab + 5, "content": "<|beyond|>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(data))
    beyond = TextTokenizer(folder).token_id("<|beyond|>")
    assert beyond is not None and beyond >= vocab
    with pytest.warns(UserWarning, match=rf"tokenizer\.json: token ids up to {beyond} .* past the model's vocab_size {vocab}"):
        check_tokenizer(folder)
    session = Session(package, engine="milexec")
    session.tokenizer = TextTokenizer(folder)
    with pytest.raises(RlxMilError, match=rf"token id {beyond} \('<\|beyond\|>'\), past the model's vocabulary of {vocab}"):
        list(session.stream_text("hello <|beyond|>", 2))
    (folder / "tokenizer.json").write_text(json.dumps(data)[:100])
    with pytest.raises(RlxMilError, match=r"tokenizer\.json: not a readable tokenizer"):
        check_tokenizer(folder)


def test_eval_of_hostile_texts_and_references_is_one_error_line(package: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Empty, binary, missing, folder and FIFO texts, a text of one token, --max-tokens 0, and a
    --reference that is not this model's: one `rlx-mil eval: error:` line each, before scoring."""
    import os

    from rlx_mil.models.random_checkpoint import TINY_CONFIGS, write_random_checkpoint

    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(bytes(range(128, 256)) * 40)
    (tmp_path / "one.txt").write_text("a")
    (tmp_path / "ok.txt").write_text("The capital of France is Paris. " * 3)
    os.mkfifo(tmp_path / "fifo.txt")
    other = write_random_checkpoint(tmp_path / "other", {**TINY_CONFIGS["llama"], "vocab_size": 90}, seed=2)
    cases = [
        (["--text", str(tmp_path / "empty.txt")], "the text is empty"),
        (["--text", str(tmp_path / "binary.txt")], "not UTF-8 text"),
        (["--text", str(tmp_path / "missing.txt")], "no such text file"),
        (["--text", str(tmp_path)], "a directory"),
        (["--text", str(tmp_path / "fifo.txt")], "a FIFO"),
        (["--text", str(tmp_path / "one.txt")], "the text has 1 token;"),
        (["--text", str(tmp_path / "ok.txt"), "--reference", str(other)], "vocabulary"),
        (["--text", str(tmp_path / "ok.txt"), "--reference", str(tmp_path / "nothing")], "nothing"),
    ]
    for flags, message in cases:
        assert main(["eval", str(package), "--engine", "milexec", "-q", *flags]) == 1, flags
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlx-mil eval: error: ") and message in lines[0], (flags, lines)


def test_eval_of_a_megabyte_line_scores_an_announced_prefix(package: Path, checkpoint: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Without --max-tokens, eval of a 1 MB single-line file scores DEFAULT_EVAL_TOKENS tokens
    (here made 24), says so in one warning line, and scores exactly what `--max-tokens 24` of
    the file's first 2,000 characters scores; `--max-tokens all` scores every token."""
    import sys

    from rlx_mil.cli.arguments import DEFAULT_EVAL_TOKENS
    from rlx_mil.llm import evaluate

    assert DEFAULT_EVAL_TOKENS == evaluate.DEFAULT_EVAL_TOKENS
    monkeypatch.setattr(sys.modules["rlx_mil.cli.main"], "DEFAULT_EVAL_TOKENS", 24)
    line = ("The capital of France is Paris. Hello, how are you? " * 20200)[:1 << 20]
    (tmp_path / "line.txt").write_text(line)
    (tmp_path / "start.txt").write_text(line[:2000])
    flags = ["--engine", "milexec", "--json"]
    capsys.readouterr()
    assert main(["eval", str(package), "--text", str(tmp_path / "line.txt"), *flags]) == 0
    out, err = capsys.readouterr()
    warned = [ln for ln in err.splitlines() if "warning" in ln]
    assert warned == [f"rlx-mil eval: warning: scoring the first 24 tokens of {tmp_path / 'line.txt'}; it has more"
                      " (--max-tokens N scores N, --max-tokens all the whole text) (UserWarning)"], err
    cut = json.loads(out)
    assert cut["tokens"] == 24 and cut["truncated"] is True
    assert main(["eval", str(package), "--text", str(tmp_path / "start.txt"), "--max-tokens", "24", "-q", *flags]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == cut and err == ""
    short = tmp_path / "short.txt"
    short.write_text(line[:150])
    assert main(["eval", str(package), "--text", str(short), "--max-tokens", "all", "-q", *flags]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["truncated"] is False and whole["tokens"] == len(TextTokenizer(checkpoint).encode(line[:150]))


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_encode_limited_keeps_the_first_ids_of_the_whole_encoding(kind: str, tmp_path: Path) -> None:
    """Prefix encoding gives the first ids of the whole text's encoding: words, one long word,
    random characters, and a word longer than WordPiece reads (one [UNK] for 10,000
    characters: the prefix grows until the ids are there)."""
    import random

    from rlx_mil.llm.evaluate import _string_prefix, encode_limited

    from .text_fixtures import write_bpe_tokenizer, write_wordpiece_tokenizer

    tok = TextTokenizer((write_bpe_tokenizer if kind == "bpe" else write_wordpiece_tokenizer)(tmp_path / kind))
    rng = random.Random(5)
    texts = [
        "Paris is the capital of France. " * 300,
        "a" * 9_000,
        "".join(rng.choice("abcdé fghij,.") for _ in range(9_000)),
        "x" * 10_000 + " hello world" * 40,
    ]
    for text in texts:
        whole = tok.encode(text)
        for limit in (2, 40):
            assert encode_limited(tok.encode, _string_prefix(text), limit) == (whole[:limit], len(whole) > limit)
        assert encode_limited(tok.encode, _string_prefix(text), None) == (whole, False)


_PIECES = ["Paris ", "capital", " of", "é", "ab", ",", ".", " ", "x" * 150, "<|im_end|>", "\n", "日本"]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    from .text_fixtures import write_bpe_tokenizer

    return TextTokenizer(write_bpe_tokenizer(tmp_path_factory.mktemp("bpe")))


@given(parts=st.lists(st.tuples(st.sampled_from(_PIECES), st.integers(1, 400)), min_size=1, max_size=12),
       limit=st.integers(2, 80))
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_encode_limited_is_a_prefix_of_the_whole_encoding(bpe: TextTokenizer, parts: list[tuple[str, int]],
                                                           limit: int) -> None:
    """Texts of a few characters to tens of thousands, runs of one piece or mixed, special
    tokens among them: the limited encoding is the whole encoding's start, and says whether
    it left ids out."""
    from rlx_mil.llm.evaluate import _string_prefix, encode_limited

    text = "".join(piece * count for piece, count in parts)
    whole = bpe.encode(text)
    assert encode_limited(bpe.encode, _string_prefix(text), limit) == (whole[:limit], len(whole) > limit)
