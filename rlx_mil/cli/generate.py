"""`rlx-mil generate` (one prompt, the text streamed) and `rlx-mil chat` (a conversation in the
terminal) with a stateful LLM package. Both print their speed and peak-memory line on stderr
at every exit, Ctrl-C included."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rlx_mil.cli.arguments import (
    LLM_PACKAGE_HELP,
    announce,
    compute_units,
    float_at_least,
    fraction,
    int_at_least,
)
from rlx_mil.errors import RlxMilError
from rlx_mil.units import counted

#: -n when not given: the reply ends at the tokenizer's stop token, or after this many tokens.
DEFAULT_MAX_NEW_TOKENS = 256


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-new-tokens", type=int_at_least(0),
                   help=f"tokens to generate at most (default: to the stop token, or {DEFAULT_MAX_NEW_TOKENS})")
    p.add_argument("--temperature", type=float_at_least(0), default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-k", type=int_at_least(1), help="sample among the k most likely tokens (with --temperature)")
    p.add_argument("--top-p", type=fraction(low_open=True),
                   help="sample in the nucleus of probability P (with --temperature)")
    p.add_argument("--min-p", type=fraction(low_open=False),
                   help="sample among the tokens at least P times as likely as the best one (with --temperature)")
    p.add_argument("--repeat-penalty", type=float_at_least(0, strictly=True), default=1.0,
                   help="make tokens already seen less likely: a positive logit divided by it, a negative one"
                        " multiplied (1.1 is common; default 1: off)")
    p.add_argument("--seed", type=int_at_least(0), help="random seed for sampling")


def add_generate_arguments(gen: argparse.ArgumentParser) -> None:
    gen.add_argument("package", type=Path, help=LLM_PACKAGE_HELP)
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="the prompt text ('-': read it from stdin; the package's"
                        " tokenizer encodes it); the generated text streams to stdout")
    prompt.add_argument("-f", "--file", type=Path, metavar="FILE", help="read the prompt text from a UTF-8 file")
    prompt.add_argument("--prompt-ids", metavar="ID,ID,...", help="comma-separated prompt token ids")
    gen.add_argument("--chat", action="store_true", help="the prompt is a user message rendered by the chat template")
    gen.add_argument("--system", metavar="TEXT", help="with --chat: a system message before the prompt")
    add_sampling_arguments(gen)
    gen.add_argument("-q", "--quiet", action="store_true", help="no progress or speed lines on stderr")


def add_chat_arguments(chat: argparse.ArgumentParser) -> None:
    chat.add_argument("package", type=Path, help=LLM_PACKAGE_HELP)
    chat.add_argument("--system", metavar="TEXT", help="a system message before the conversation")
    add_sampling_arguments(chat)
    chat.add_argument("-q", "--quiet", action="store_true", help="no speed lines on stderr")


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
            "min_p": args.min_p, "repeat_penalty": args.repeat_penalty}


def _max_new_tokens(args: argparse.Namespace) -> int:
    return DEFAULT_MAX_NEW_TOKENS if args.max_new_tokens is None else int(args.max_new_tokens)


def _new_tokens(session: Any, prompt_tokens: int, args: argparse.Namespace) -> int:
    """-n, capped where the package's context ends (with a warning when -n was given); an
    empty prompt or one longer than the context is refused before anything runs."""
    import warnings

    from rlx_mil.llm.generate import new_token_budget

    count, capped = new_token_budget(session.max_context, prompt_tokens, _max_new_tokens(args))
    if capped is not None and args.max_new_tokens is not None:
        warnings.warn(capped, stacklevel=2)
    return count


def peak_memory_text() -> str:
    """The process's peak resident memory (what the package and the executor took)."""
    try:
        import resource
    except ImportError:  # Windows
        return "peak memory: unknown"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere
    from rlx_mil.units import human_bytes

    return f"peak memory {human_bytes(peak_bytes)}"


class _Opening:
    """Wall and CPU time of opening the package as the user waits for it: from the first
    import of the session's code to a session with its tokenizer (the stage line's figure;
    `Session.open_seconds` alone leaves the imports out)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def done(self) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def text(self) -> str:
        return f"package opened in {self.wall:.2f} s (CPU {self.cpu:.2f} s)"


def _read_prompt(args: argparse.Namespace) -> str | None:
    """The prompt text: --prompt, stdin for `--prompt -`, or the file of -f."""
    if args.file is not None:
        from rlx_mil.fileio import read_regular_file

        data = read_regular_file(args.file, 1 << 28, RlxMilError, "prompt file")
    elif args.prompt == "-":
        data = sys.stdin.buffer.read()
    else:
        return str(args.prompt) if args.prompt is not None else None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise RlxMilError(f"{args.file or 'stdin'}: the prompt is not UTF-8 text ({err})") from None


def _chat_tokenizer(package: Path, advice: str) -> Any:
    """The package's tokenizer, read from its tokenizer folder alone; a refusal, before the
    package's model or weights are opened, when it has no chat template (None when the folder
    is not found: opening the package then says what is wrong)."""
    from rlx_mil.llm.package_files import tokenizer_folder
    from rlx_mil.llm.text import TextTokenizer

    folder = tokenizer_folder(package)
    if folder is None:
        return None
    tokenizer = TextTokenizer(folder)
    if not tokenizer.has_chat_template:
        raise RlxMilError(f"{package}: its tokenizer has no chat template; {advice}")
    return tokenizer


def run_generate(args: argparse.Namespace) -> int:
    """The generate command."""
    if args.prompt_ids is not None:
        if args.chat or args.system is not None:
            raise RlxMilError("--chat and --system need a text prompt (--prompt or -f)")
        return _generate_ids(args)
    if args.system is not None and not args.chat:
        raise RlxMilError("--system needs --chat")
    prompt = _read_prompt(args)
    assert prompt is not None
    from rlx_mil.progress import Progress, running_under_ci

    announce(args, f"opening {args.package} ...")
    chat_tokenizer = _chat_tokenizer(args.package, "drop --chat") if args.chat else None
    progress = Progress(enabled=not (args.quiet or running_under_ci()))
    progress.begin(f"opening {args.package}", unit=" weights")  # the executor counts those it prepares
    opening = _Opening()
    from rlx_mil.llm.generate import Session
    session = Session(args.package, engine=args.engine, compute_units=compute_units(args))
    if chat_tokenizer is not None:
        session.tokenizer = chat_tokenizer
    tokenizer = session.tokenizer  # fails early, before any output, on a package without one
    opening.done()
    progress.end(f"engine {session.engine}")
    prompt_ids = tokenizer.prompt_ids(prompt, chat=args.chat, system=args.system)
    pieces = session.stream_text(prompt, _new_tokens(session, len(prompt_ids), args), chat=args.chat,
                                 system=args.system, **_sampling(args))
    with _stats_on_exit(session, opening, args.quiet):
        progress.begin("reading the prompt")
        for piece in pieces:
            progress.end(counted(session.stats.prompt_tokens, "token"))  # the first piece ends the stage
            sys.stdout.write(piece)
            sys.stdout.flush()
        progress.end(counted(session.stats.prompt_tokens, "token"))
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0


class _stats_on_exit:
    """Prints the speed and peak-memory line when the block ends, however it ends."""

    def __init__(self, session: Any, opening: _Opening, quiet: bool, text: bool = True) -> None:
        self.session, self.opening, self.quiet, self.text = session, opening, quiet, text

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> None:
        if self.quiet or (kind is not None and kind is not KeyboardInterrupt):
            return  # an error: its one line says what happened
        if kind is KeyboardInterrupt:
            self.session.stats.stopped = "interrupted"
            if self.text:  # end the streamed text's line
                sys.stdout.write("\n")
                sys.stdout.flush()
        print(f"{self.opening.text()}; {self.session.stats.to_text()}; {peak_memory_text()}",
              file=sys.stderr, flush=True)


def _generate_ids(args: argparse.Namespace) -> int:
    try:
        prompt = [int(t) for t in args.prompt_ids.replace(" ", "").split(",") if t]
    except ValueError:
        raise RlxMilError(f"--prompt-ids takes comma-separated integers, got {args.prompt_ids!r}") from None
    opening = _Opening()
    from rlx_mil.llm.generate import Session
    session = Session(args.package, engine=args.engine, compute_units=compute_units(args))
    opening.done()
    count = _new_tokens(session, len(prompt), args)
    print(f"engine: {session.engine}")
    tokens: list[int] = []
    with _stats_on_exit(session, opening, args.quiet, text=False):
        try:
            tokens.extend(session.stream(prompt, count, **_sampling(args)))
        finally:
            print(",".join(str(t) for t in tokens))
    return 0


# -- chat ---------------------------------------------------------------------------------------
CHAT_HELP = "/reset starts a new conversation, /exit (or Ctrl-D) ends it"


class Conversation:
    """The turns of a chat and what the session's cache holds of them: each reply continues the
    cache when the rendered conversation extends what was fed, else the cache is refilled; when
    the conversation outgrows the context, its oldest turns are dropped (and said so)."""

    def __init__(self, session: Any, system: str | None, reserve: int) -> None:
        self.session, self.system, self.reserve = session, system, reserve
        self.turns: list[dict[str, str]] = []
        self.fed: list[int] = []

    def reset(self) -> None:
        self.turns, self.fed = [], []
        self.session.reset()

    def _messages(self) -> list[dict[str, str]]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.turns

    def prompt_ids(self, user: str, announce: Callable[[str], None]) -> list[int]:
        """Add the user's turn; the ids to feed (the whole conversation, or what extends the cache)."""
        self.turns.append({"role": "user", "content": user})
        tokenizer, limit = self.session.tokenizer, self.session.max_context - self.reserve
        ids = tokenizer.encode_chat(self._messages())
        dropped = 0
        while len(ids) > limit and len(self.turns) > 1:
            self.turns = self.turns[2:] if len(self.turns) > 2 else self.turns[1:]
            dropped += 1
            ids = tokenizer.encode_chat(self._messages())
        if len(ids) > limit:
            self.turns.pop()
            raise RlxMilError(f"the message takes {counted(len(ids), 'token')}; the package's context holds"
                              f" {self.session.max_context} with {self.reserve} for the reply")
        if dropped:
            announce(f"(dropped the {dropped} oldest turn{'s' * (dropped != 1)} to fit the context of"
                     f" {self.session.max_context} tokens)")
        # Keep what the cache holds of the conversation as rendered now (the template may render
        # the last reply differently from the tokens picked), feed the rest.
        same = 0 if dropped else _common_prefix(self.fed, ids)
        same = min(same, len(ids) - 1)
        if same <= 0 or not self.session.rewind(same):
            self.session.reset()
            same = 0
        self.fed = list(ids)
        return ids[same:]

    def reply(self, new_ids: list[int], max_new_tokens: int, sampling: dict[str, Any]) -> Iterator[str]:
        """Stream the assistant's reply to `new_ids`; the turn is recorded as it ends."""
        tokenizer = self.session.tokenizer
        tokens: list[int] = []

        def ids() -> Iterator[int]:
            for token in self.session.stream(new_ids, max_new_tokens, stop_ids=tokenizer.stop_ids, until_full=True,
                                             **sampling):
                tokens.append(token)
                yield token

        try:
            yield from tokenizer.stream_decode(ids())
        finally:
            # the cache holds every token but the last picked (never fed)
            self.fed.extend(tokens[:-1])
            self.turns.append({"role": "assistant", "content": tokenizer.decode(tokens)})


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def run_chat(args: argparse.Namespace) -> int:
    """The chat command: read a message, stream the reply, until /exit, Ctrl-D or Ctrl-C."""
    interactive = sys.stdin.isatty()
    if not args.quiet:
        print(f"opening {args.package} ...", file=sys.stderr, flush=True)
    chat_tokenizer = _chat_tokenizer(args.package, "use `rlx-mil generate --prompt`")
    from rlx_mil.progress import Progress, running_under_ci

    progress = Progress(enabled=interactive and not (args.quiet or running_under_ci()))
    progress.begin(f"opening {args.package}", unit=" weights")  # the executor counts those it prepares
    opening = _Opening()
    from rlx_mil.llm.generate import Session
    session = Session(args.package, engine=args.engine, compute_units=compute_units(args))
    opening.done()
    progress.end(f"engine {session.engine}")
    if chat_tokenizer is None:
        chat_tokenizer = session.tokenizer  # the package carries none: the Session's error says so
    session.tokenizer = chat_tokenizer
    max_new = _max_new_tokens(args)
    conversation = Conversation(session, args.system, reserve=min(max_new, session.max_context // 2))
    if not args.quiet:
        print(f"{opening.text()}; engine {session.engine}, context {session.max_context} tokens."
              f" {CHAT_HELP}", file=sys.stderr, flush=True)
    totals = {"tokens": 0, "seconds": 0.0}
    counted = session.stats  # the last reply's stats in the totals (Ctrl-C adds a newer reply's)
    try:
        while True:
            if interactive:
                sys.stdout.write(">>> ")
                sys.stdout.flush()
            line = sys.stdin.readline()
            if not line:
                break
            text = line.strip()
            if text in ("/exit", "/quit", "/bye"):
                break
            if text == "/reset":
                conversation.reset()
                print("(a new conversation)", file=sys.stderr, flush=True)
                continue
            if not text:
                continue
            try:
                new_ids = conversation.prompt_ids(text, lambda note: print(note, file=sys.stderr, flush=True))
            except RlxMilError as err:
                print(f"rlx-mil chat: {err}", file=sys.stderr, flush=True)
                continue
            for piece in conversation.reply(new_ids, max_new, _sampling(args)):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
            totals["tokens"] += session.stats.new_tokens
            totals["seconds"] += session.stats.seconds
            counted = session.stats
            if not args.quiet:
                print(f"[{session.stats.to_text()}]", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        sys.stdout.flush()
        if session.stats is not counted:  # the reply Ctrl-C cut short (a whole one is counted already)
            totals["tokens"] += session.stats.new_tokens
            totals["seconds"] += session.stats.seconds
        _chat_summary(args, totals)
        raise
    _chat_summary(args, totals)
    return 0


def _chat_summary(args: argparse.Namespace, totals: dict[str, Any]) -> None:
    if args.quiet:
        return
    tokens, seconds = totals["tokens"], totals["seconds"]
    rate = f"{tokens / seconds:.1f} tok/s" if seconds > 0 and tokens else "- tok/s"
    print(f"chat: {counted(tokens, 'token')} generated in {seconds:.2f} s ({rate}); {peak_memory_text()}",
          file=sys.stderr, flush=True)
