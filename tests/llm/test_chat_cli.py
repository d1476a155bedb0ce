"""`rlx-mil chat` (multi-turn, /reset, the oldest turns dropped when the context is full) and
generate's prompt sources (`--prompt -`, `-f FILE`), default length, `--repeat-penalty` and
`--min-p`; the speed and peak-memory line on every exit."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx_mil.cli import main
from rlx_mil.cli.generate import Conversation
from rlx_mil.llm.generate import Session, pick_token
from rlx_mil.llm.sampling import penalize

from .text_fixtures import chat_checkpoint

#: What the conversion below printed on stdout.
CONVERTED: list[str] = []


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import contextlib

    checkpoint = chat_checkpoint(tmp_path_factory.mktemp("hf") / "tiny-chat")
    out = tmp_path_factory.mktemp("pkg") / "chat.mlpackage"
    # the default conversion (stateful) with a short context, so that a chat fills it
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["convert-hf", str(checkpoint), "-o", str(out), "--max-context", "64", "--prefill", "8",
                     "--precision", "fp32", "-q"]) == 0
    CONVERTED.append(printed.getvalue())
    return out


def test_the_conversion_says_what_it_wrote_in_readable_units(package: Path) -> None:
    (line,) = [line for line in CONVERTED[-1].splitlines() if line.startswith("wrote ")]
    # "82008 bytes of weights" was what the tiny model's line said (SmolLM2's: 269060608)
    assert re.fullmatch(rf"wrote {re.escape(str(package))} \(functions prefill_8, decode; \d+\.\d KiB of weights\)"
                        r" in \d+\.\d s", line), line


def _greedy_text(package: Path, prompt: str, n: int) -> str:
    return Session(package, engine="milexec").generate_text(prompt, n, chat=True)


def test_prompt_from_stdin_and_from_a_file(package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    want = _greedy_text(package, "hello there", 5)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello there")))
    assert main(["generate", str(package), "--chat", "--prompt", "-", "-n", "5", "-q", "--engine", "milexec"]) == 0
    assert capsys.readouterr().out == want + "\n"
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello there")
    assert main(["generate", str(package), "--chat", "-f", str(prompt), "-n", "5", "-q", "--engine", "milexec"]) == 0
    assert capsys.readouterr().out == want + "\n"
    prompt.write_bytes(b"\xff\xfe bad")
    assert main(["generate", str(package), "-f", str(prompt), "-q"]) == 1
    assert "not UTF-8" in capsys.readouterr().err


def test_default_length_and_the_stats_line(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", str(package), "--prompt-ids", "1,2,3", "--engine", "milexec"]) == 0
    out, err = capsys.readouterr()
    ids = out.splitlines()[-1].split(",")
    # no -n: up to 256 tokens, the cache (64) ending it first (the last token picked is never fed)
    assert len(ids) == 64 - 3 + 1 and "peak memory" in err and "capped" not in err  # no -n given: no warning


def test_repeat_penalty_and_min_p() -> None:
    logits = np.array([2.0, -1.0, 0.5, 1.9])
    penalized = penalize(logits, {0, 1}, 2.0)
    assert penalized.tolist() == [1.0, -2.0, 0.5, 1.9]
    assert penalize(logits, {0}, 1.0) is logits
    assert int(np.argmax(penalized)) == 3  # greedy now avoids the repeated token
    rng = np.random.default_rng(0)
    # min_p 0.9: only tokens at least 0.9x as likely as the best stay; 0 and 3 differ by e^-0.1 = 0.905
    picks = {pick_token(logits, 1.0, None, rng, None, min_p=0.9) for _ in range(200)}
    assert picks == {0, 3}
    picks = {pick_token(logits, 1.0, None, rng, None, min_p=0.95) for _ in range(50)}
    assert picks == {0}


def test_penalty_flags_change_the_tokens(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", str(package), "--prompt-ids", "5,5,5", "-n", "12", "--engine", "milexec", "-q"]
    assert main(argv) == 0
    plain = capsys.readouterr().out.splitlines()[-1]
    assert main([*argv, "--repeat-penalty", "100"]) == 0
    penalized = [int(t) for t in capsys.readouterr().out.splitlines()[-1].split(",")]
    assert 5 not in penalized[:1] or plain.split(",")[0] != "5"
    # with a huge penalty every seen token is pushed down: the first 12 picks are all new tokens
    assert len(set(penalized)) == len(penalized)
    with pytest.raises(SystemExit):
        main([*argv, "--repeat-penalty", "0"])
    with pytest.raises(SystemExit):
        main([*argv, "--min-p", "1.5"])


def test_chat_continues_the_cache_and_resets(package: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    session = Session(package, engine="milexec")
    conversation = Conversation(session, None, reserve=4)
    notes: list[str] = []
    first = conversation.prompt_ids("hi", notes.append)
    reply = "".join(conversation.reply(first, 4, {}))
    second = conversation.prompt_ids("and you?", notes.append)
    # the second turn feeds only what extends what the cache holds of the conversation
    whole = session.tokenizer.encode_chat(conversation._messages())
    assert len(second) < len(whole) and whole[-len(second):] == second and session.position == len(whole) - len(second)
    assert reply == conversation.turns[1]["content"] or reply.strip() == conversation.turns[1]["content"].strip()
    # its reply equals a fresh session's on the whole conversation
    again = "".join(conversation.reply(second, 4, {}))
    fresh = Session(package, engine="milexec")
    fresh_ids = list(fresh.stream(whole, 4, stop_ids=fresh.tokenizer.stop_ids, until_full=True))
    assert again == fresh.tokenizer.decode(fresh_ids)
    # a long conversation drops its oldest turns, and says so
    for _ in range(6):
        ids = conversation.prompt_ids("tell me more about the capital", notes.append)
        "".join(conversation.reply(ids, 4, {}))
    assert notes and notes[0].startswith("(dropped the") and "context of 64 tokens" in notes[0]
    assert len(session.tokenizer.encode_chat(conversation._messages())) <= 64
    conversation.reset()
    assert conversation.turns == [] and conversation.fed == []


def test_chat_command_reads_turns_until_exit(package: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi\n/reset\nhello\n/exit\nnever read\n")))
    assert main(["chat", str(package), "-n", "3", "--engine", "milexec"]) == 0
    out, err = capsys.readouterr()
    # two replies, each the greedy one of a fresh conversation (the /reset between them)
    want = [_greedy_text(package, text, 3) for text in ("hi", "hello")]
    assert out == "".join(w + "\n" for w in want)
    assert "(a new conversation)" in err and err.count("generation: ") == 2
    assert err.rstrip().splitlines()[-1].startswith("chat: ") and "peak memory" in err


def test_ctrl_c_prints_the_stats_line(package: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the middle of the generated tokens: exit 130, the tokens so far, the speed and
    peak-memory line, then the one `interrupted` line."""
    real_stream = Session.stream

    def stream(self: Session, *args: object, **kwargs: object) -> object:
        for i, token in enumerate(real_stream(self, *args, **kwargs)):  # type: ignore[arg-type]
            if i == 3:
                raise KeyboardInterrupt
            yield token

    monkeypatch.setattr(Session, "stream", stream)
    assert main(["generate", str(package), "--prompt-ids", "1,2", "--engine", "milexec"]) == 130
    out, err = capsys.readouterr()
    assert len(out.splitlines()[-1].split(",")) == 3
    lines = err.strip().splitlines()
    assert "stopped: interrupted" in lines[-2] and "peak memory" in lines[-2] and lines[-1] == "rlx-mil generate: interrupted"
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi\nhello\n")))
    assert main(["chat", str(package), "--engine", "milexec"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    # (the 4th token was picked, and counted, when the interrupt came)
    assert err[-2].startswith("chat: 4 tokens generated") and err[-1] == "rlx-mil chat: interrupted"


def test_eval_without_a_text_scores_the_built_in_passage(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from rlx_mil.compress.builtin_text import builtin_text

    assert main(["eval", str(package), "--engine", "milexec", "--json", "-q", "--max-tokens", "40"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == 40 and result["scored"] == 39 and result["perplexity"] > 1, result
    (Path(package).parent / "heldout.txt").write_text(builtin_text("heldout"))
    assert main(["eval", str(package), "--engine", "milexec", "--json", "-q", "--max-tokens", "40",
                 "--text", str(Path(package).parent / "heldout.txt")]) == 0
    assert json.loads(capsys.readouterr().out) == result  # the same text, the same numbers


def test_chat_without_a_template_is_refused_before_the_package_opens(package: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`generate --chat` and `chat` on a package whose tokenizer has no chat template: refused
    from the tokenizer folder alone. The copy has no weights and no model at all, so any
    attempt to open them would be another error."""
    import json
    import shutil

    from rlx_mil.llm.package_files import package_text_folder

    plain = tmp_path / "plain.mlpackage"
    shutil.copytree(package, plain)
    text = package_text_folder(plain)
    assert text is not None
    (text / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((text / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (text / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.rmtree(plain / "Data" / "com.apple.CoreML")
    assert main(["generate", str(plain), "--chat", "--prompt", "hi", "-q"]) == 1
    assert capsys.readouterr().err.strip() == f"rlx-mil generate: error: {plain}: its tokenizer has no chat template; drop --chat"
    assert main(["chat", str(plain), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"rlx-mil chat: error: {plain}: its tokenizer has no chat template; use `rlx-mil generate --prompt`"


def test_ctrl_c_while_the_prompt_is_read_reports_no_finished_stage(
    package: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the prompt is fed: the stats line says the prompt stage stopped (with the
    time it ran), not "N tokens in 0.00 s" as if it had finished, and no generation figures;
    Ctrl-C before the prompt was reached says it was not read."""

    def feed(self: Session, ids: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "feed", feed)
    assert main(["generate", str(package), "--prompt", "hello there", "--engine", "milexec"]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    stats, last = lines[-2], lines[-1]
    assert last == "rlx-mil generate: interrupted"
    assert re.search(r"prompt: \d+ tokens, not all fed \(\d+\.\d\d s\); stopped: interrupted; peak memory", stats), stats
    assert " tokens in " not in stats and "generation:" not in stats and "tok/s" not in stats

    def stream(self: Session, *args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(Session, "stream", stream)
    assert main(["generate", str(package), "--prompt-ids", "1,2", "--engine", "milexec"]) == 130
    stats = capsys.readouterr().err.strip().splitlines()[-2]
    assert "prompt: not read; stopped: interrupted" in stats and "generation:" not in stats


def test_ctrl_c_at_the_chat_prompt_counts_the_last_reply_once(
    package: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stdin(io.StringIO):
        def readline(self, *args: object) -> str:
            line = super().readline()
            if not line:
                raise KeyboardInterrupt  # Ctrl-C at the `>>>` prompt, after a whole reply
            return line

    monkeypatch.setattr(sys, "stdin", Stdin("hi\n"))
    assert main(["chat", str(package), "-n", "3", "--engine", "milexec"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert "generation: 3 tokens" in err[-3] or "stopped: stop token" in err[-3]
    replied = int(err[-3].split("generation: ")[1].split(" ")[0])
    assert err[-2].startswith(f"chat: {replied} tokens generated") and err[-1] == "rlx-mil chat: interrupted"


def test_the_stats_line_times_the_opening_the_user_waited_for(
    package: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stats line's "package opened in" is the stage the user waited for (imports
    included), not `Session.open_seconds` alone, which the stage line contradicted (a 5.9 s
    stage, "opened in 0.60 s")."""
    real_init = Session.__init__
    sessions: list[Session] = []

    def slow_init(self: Session, *args: object, **kwargs: object) -> None:
        import time

        time.sleep(0.3)  # as an import before the Session's own clock starts
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        sessions.append(self)

    monkeypatch.setattr(Session, "__init__", slow_init)
    for argv in (["--prompt", "hi"], ["--prompt-ids", "1,2"]):
        assert main(["generate", str(package), *argv, "-n", "2", "--engine", "milexec"]) == 0
        line = capsys.readouterr().err.strip().splitlines()[-1]
        opened = float(re.match(r"package opened in (\d+\.\d+) s", line).group(1))  # type: ignore[union-attr]
        assert opened >= sessions[-1].open_seconds + 0.29, (opened, sessions[-1].open_seconds)


def test_a_source_given_for_its_package_names_the_command_that_converts_it(
    package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """generate / chat / eval on the checkpoint folder or GGUF file itself, and eval's
    --reference naming nothing: one line saying so, before any package is opened."""
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for argv in (["generate", str(checkpoint), "--prompt", "hi"], ["chat", str(checkpoint)], ["eval", str(checkpoint)],
                 ["generate", str(gguf), "--prompt", "hi"], ["eval", str(gguf)]):
        assert main([*argv, "-q"]) == 1, argv
        err = capsys.readouterr().err.strip()
        source, tool = ("Hugging Face checkpoint folder", "convert-hf") if argv[1] == str(checkpoint) \
            else ("GGUF file", "convert-gguf")
        assert err == (f"rlx-mil {argv[0]}: error: {argv[1]}: a {source}, not a Core ML package; convert it first:"
                       f" rlx-mil {tool} {argv[1]} -o model.mlpackage"), err
    assert main(["eval", str(package), "--reference", str(tmp_path / "nothing"), "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"rlx-mil eval: error: reference {tmp_path / 'nothing'}: no such checkpoint folder or package", err
