"""`rlx-mil`: convert, inspect and run Core ML packages from RLX graphs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlx_mil import interrupts
from rlx_mil.cli import aimodel_output, arguments
from rlx_mil.cli.aimodel_output import add_format_argument
from rlx_mil.cli.arguments import DEFAULT_EVAL_TOKENS, DEPLOY_FORMS, compute_units, token_limit
from rlx_mil.cli.interrupts import EXIT_INTERRUPTED, exit_interrupted, interrupted, own_interrupt_handling
from rlx_mil.errors import RlxMilError
from rlx_mil.units import counted

# Nothing heavy is imported at module level: `--help`, `--version` and usage errors answer
# before NumPy, the IR or coremltools load (tests/test_cli_startup.py checks it).

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 70
__all__ = ["EXIT_ERROR", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "entry", "main"]


def _version() -> str:
    from rlx_mil.version import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlx-mil", description="Convert Hugging Face checkpoints, GGUF files and RLX IR graphs into Core ML"
        " ML Programs (.mlpackage); run, generate with, evaluate and check them."
    )
    parser.add_argument("--version", action="version", version=f"rlx-mil {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    load_flags, conversion_flags = arguments.add_load_flags, arguments.add_conversion_flags
    from rlx_mil.cli.quality import add_compression_flags as compression_flags

    conv = sub.add_parser("convert", help="convert a graph (upstream RLX JSON) plus weights to .mlpackage")
    conv.add_argument("graph", type=Path, help="graph JSON as serialised by upstream RLX or rlx_mil")
    conv.add_argument("--params", type=Path, help="weights: .npz or .safetensors")
    conv.add_argument("-o", "--output", type=Path, required=True, help="output .mlpackage (or .aimodel) path")
    add_format_argument(conv)
    conv.add_argument("--overwrite", action="store_true", help="replace an existing package")
    conv.add_argument("--verify", action="store_true",
                      help="run the package on example inputs (through --engine) and compare with the NumPy reference;"
                      " a compressed package is also judged against the float weights and fails below the quality"
                      " thresholds unless --allow-quality-loss")
    conv.add_argument("-q", "--quiet", action="store_true", help="no warnings on stderr")
    conv.add_argument("--dim", action="append", default=[], metavar="SYMBOL=SIZE",
                      help="bind a dynamic dim symbol (e.g. 1=128 for SEQ); repeatable")
    _deploy_flag(conv)
    conversion_flags(conv)
    compression_flags(conv)

    hf = sub.add_parser("convert-hf", help="convert a Hugging Face checkpoint folder to .mlpackage")
    _convert_hf_arguments(hf)
    _deploy_flag(hf)
    conversion_flags(hf)
    compression_flags(hf)

    gg = sub.add_parser("convert-gguf", help="convert a llama.cpp GGUF file to .mlpackage (its quantization kept)")
    _convert_gguf_arguments(gg)
    conversion_flags(gg)
    compression_flags(gg)

    insp = sub.add_parser("inspect", help="summarise a .mlpackage (IO, op histogram, weights, target) or a graph JSON")
    insp.add_argument("package", type=Path, help="a .mlpackage folder, a chunked set's folder, or a graph .json (inputs,"
                      " params, op histogram)")
    insp.add_argument("--json", action="store_true", help="print JSON instead of text")
    insp.add_argument("--estimate", action="store_true",
                      help="the bytes a decode step streams and the resulting tokens/s upper bound per Apple chip"
                           " (memory bandwidth table: docs/deploying.md)")
    insp.add_argument("--context", type=int, metavar="N",
                      help="--estimate: tokens in the KV cache (default: the package's max_context)")

    tr = sub.add_parser("transcribe", help="speech to text with a Whisper package folder (docs/speech.md)")
    _transcribe_arguments(tr)

    pre = sub.add_parser("preflight", help="check a .mlpackage against the known Core ML device rules"
                         " (docs/deploying.md); exit 1 when it breaks one")
    _preflight_arguments(pre)

    run = sub.add_parser("run", help="run a .mlpackage (Core ML on macOS, the NumPy MIL executor elsewhere)")
    run.add_argument("package", type=Path, help="a .mlpackage (or a Core AI .aimodel)")
    run.add_argument("--inputs", type=Path, required=True, help=".npz of inputs keyed by input name")
    run.add_argument("-o", "--output", type=Path, help="write the outputs to this file (.npz format, the exact path given)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    run.add_argument("--function", metavar="NAME", help="the function to run of a multifunction package"
                     " (default: its default function)")
    load_flags(run)

    gen = sub.add_parser("generate", help="generate text (or token ids) with a stateful LLM package (docs/llm.md)")
    _generate_arguments(gen)
    load_flags(gen)

    chat = sub.add_parser("chat", help="chat with a stateful LLM package in the terminal: multi-turn, streamed"
                          " (/reset, /exit)")
    _chat_arguments(chat)
    load_flags(chat)

    ev = sub.add_parser("eval", help="perplexity of a text under a stateful LLM package, optionally against a reference")
    ev.add_argument("package", type=Path, help=f"{arguments.LLM_PACKAGE_HELP}; or a Whisper package folder (with --audio)")
    ev.add_argument("--text", type=Path, metavar="FILE",
                    help="UTF-8 text file to score (default: rlx_mil's built-in held-out English passage, a few"
                    " hundred tokens)")
    ev.add_argument("--reference", type=Path, metavar="MODEL_DIR_OR_PACKAGE",
                    help="a Hugging Face checkpoint folder or a GGUF file (NumPy reference, float32; a GGUF file's"
                    " codes decoded as llama.cpp decodes them) or another package: also"
                    " report the mean KL divergence, top-1 agreement and perplexity ratio")
    ev.add_argument("--max-tokens", type=token_limit, default=None, metavar="N",
                    help="score only the first N tokens of the text, 'all' for every token (default"
                    f" {DEFAULT_EVAL_TOKENS}, with a warning when the text has more)")
    ev.add_argument("--audio", type=Path, nargs="+", metavar="FILE",
                    help="for a speech package folder: WAV/FLAC files whose first 30 s are judged against --reference"
                    " (the Whisper checkpoint): encoder cosine / PSNR, and KL, top-1 and perplexity ratio teacher-forced"
                    " over the reference's greedy transcript (docs/speech.md)")
    ev.add_argument("--language", help="with --audio: the spoken language (default: the reference detects it)")
    ev.add_argument("--json", action="store_true", help="print JSON instead of text")
    ev.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    load_flags(ev)

    demo = sub.add_parser("demo", help="write a tiny random Hugging Face checkpoint, convert it, verify the package")
    demo.add_argument("-o", "--output", type=Path, default=Path("rlx_mil_demo.mlpackage"),
                      help="package to write (replaced if it exists)")
    demo.add_argument("--family", default="llama", choices=_demo_families(), metavar="FAMILY",
                      help="architecture of the checkpoint: %(choices)s (default %(default)s)")
    demo.add_argument("--checkpoint", type=Path, metavar="DIR", help="keep the random checkpoint in DIR")
    demo.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    demo.add_argument("--layers", type=int, default=2, help="decoder layers of the random model (default 2)")
    demo.add_argument("--hidden", type=int, default=256, help="its hidden size (default 256)")
    demo.add_argument("--heads", type=int, default=8, help="its attention heads (default 8)")
    demo.add_argument("--kv-heads", type=int, default=2, help="its key/value heads (default 2)")
    demo.add_argument("--seq", type=int, default=64, help="longest sequence of the random model (default 64)")
    demo.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                      help="check the package's numbers against the NumPy reference")
    conversion_flags(demo)
    return parser


def _convert(args: argparse.Namespace) -> int:
    from rlx_mil.api import convert, save
    from rlx_mil.coreml.package_info import package_info
    from rlx_mil.ir.graph import Graph
    from rlx_mil.llm.convert_hf import check_output
    from rlx_mil.units import human_bytes
    from rlx_mil.weights import load_params

    graph = Graph.from_json_file(args.graph)
    params = load_params(args.params) if args.params else {}
    check_output(args.output, args.overwrite)
    dims: dict[int, int] = {}
    for item in args.dim:
        symbol, _, size = item.partition("=")
        if not (symbol.strip().isdigit() and size.strip().isdigit()):
            raise RlxMilError(f"--dim takes SYMBOL=SIZE with non-negative integers, got {item!r}")
        dims[int(symbol)] = int(size)
    from rlx_mil.cli.convert_hf import compress_check_inputs
    from rlx_mil.cli.quality import check_report_path

    check_inputs = compress_check_inputs(args)
    check_report_path(args)
    start = time.perf_counter()
    options: dict[str, Any] = {
        "target": args.target, "precision": args.precision, "attention": args.attention, "dims": dims or None,
        "deploy": args.deploy, "split_logits": args.split_logits,
    }
    from rlx_mil.cli.convert_hf import compress_option

    model = convert(graph, params, compress=compress_option(args), **options)
    if check_inputs is not None:
        from rlx_mil.compress import measure_output_error

        measure_output_error(model, convert(graph, params, **options), check_inputs)
    save(model, args.output, overwrite=args.overwrite)
    info = package_info(args.output)
    print(f"wrote {args.output} ({counted(info.num_ops, 'op')}, {human_bytes(info.package_bytes)}) in"
          f" {time.perf_counter() - start:.2f} s")
    from rlx_mil.cli.convert_hf import print_compression
    from rlx_mil.cli.quality import print_summary, stored_check, write_report

    print_compression(model.user_defined_metadata)
    check = stored_check(model.user_defined_metadata)
    print_summary(check)
    write_report(args, model.user_defined_metadata, check)
    if args.verify:
        from rlx_mil.cli.quality import verify_quality

        return _verify_graph_package(args, graph.bind(dims) if dims else graph, params, model) or verify_quality(args, check)
    return EXIT_OK


def _verify_graph_package(args: argparse.Namespace, graph: Any, params: Any, model: Any) -> int:
    """`convert --verify`: the saved package on example inputs (through --engine) against the
    NumPy reference (on the weights the saved package stores, decoded from its own codes, when
    it is compressed)."""
    from rlx_mil.cli.convert_hf import _takes_tokens, _vocab_size
    from rlx_mil.compress import report_of
    from rlx_mil.models import verify

    report = report_of(model.user_defined_metadata)
    params = verify.package_weights(params, args.output, report)
    what = f" on {verify.STORED_WEIGHTS}: fidelity" if report is not None else ""
    print(f"verify: the package on {verify.engine_label(args.engine)} vs the NumPy reference{what}:")
    try:
        inputs = verify.example_inputs(graph, _vocab_size(graph) if _takes_tokens(graph) else 2)
    except ValueError as err:  # a dynamic input dim
        raise RlxMilError(f"--verify needs every input's shape ({err}): bind it with --dim") from None
    checks = verify.verify_package(graph, params, args.output, inputs, args.precision, engine=args.engine,
                                   progress=_progress(args))
    for check in checks:
        print(check.to_text())
    return EXIT_OK if all(c.ok for c in checks) else EXIT_ERROR


def _deploy_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--deploy", default="plain", choices=DEPLOY_FORMS,
                   help="shape the program for a device (docs/deploying.md): plain (default), gpu (fused attention,"
                   " iOS18) or ane (Neural Engine: channels-first 1x1 convs, per-head attention)")
    p.add_argument("--no-split-logits", dest="split_logits", action="store_false",
                   help="with --deploy ane: return an LM head wider than 16,384 as one concatenated logits output"
                   " instead of ceil(V/16384) pieces (preflight then reports its width)")


def _convert_hf_arguments(p: argparse.ArgumentParser) -> None:
    from rlx_mil.cli.convert_hf import add_arguments

    add_arguments(p)


def _convert_gguf_arguments(p: argparse.ArgumentParser) -> None:
    from rlx_mil.cli.convert_gguf import add_arguments

    add_arguments(p)


def _preflight_arguments(p: argparse.ArgumentParser) -> None:
    from rlx_mil.cli.preflight import add_arguments, run

    add_arguments(p)
    p.set_defaults(handler=run)


def _transcribe_arguments(p: argparse.ArgumentParser) -> None:
    from rlx_mil.cli.transcribe import add_arguments, run

    add_arguments(p)
    p.set_defaults(handler=run)


def _convert_gguf(args: argparse.Namespace) -> int:
    from rlx_mil.cli.convert_gguf import run

    return run(args)


class _LazyChoices:
    """argparse `choices` read from their owner on first use (a `demo` run or its `--help`),
    so that building the parser imports nothing heavy."""

    def __init__(self, load: Any) -> None:
        self._load = load
        self._values: tuple[str, ...] | None = None

    def _all(self) -> tuple[str, ...]:
        if self._values is None:
            self._values = tuple(self._load())
        return self._values

    def __contains__(self, value: object) -> bool:
        return value in self._all()

    def __iter__(self) -> Any:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def _demo_families() -> Any:
    def load() -> tuple[str, ...]:
        from rlx_mil.cli.demo import DEMO_FAMILIES

        return DEMO_FAMILIES

    return _LazyChoices(load)


def _convert_hf(args: argparse.Namespace) -> int:
    from rlx_mil.cli.convert_hf import run

    return run(args)


def _inspect(args: argparse.Namespace) -> int:
    from rlx_mil.cli.arguments import announce

    announce(args, f"reading {args.package} ...")
    from rlx_mil.coreml.package_info import package_info

    if args.context is not None and not args.estimate:
        raise RlxMilError("--context goes with --estimate")
    from rlx_mil.coreml.manifest import check_is_package

    check_is_package(args.package)  # a GGUF file is no graph JSON, a checkpoint folder no package
    if args.package.suffix == ".json" or (args.package.is_file() and args.package.suffix not in (".mlmodel", ".aimodel")):
        if args.estimate:
            raise RlxMilError("--estimate reads a .mlpackage or a chunked set's folder, not a graph JSON")
        from rlx_mil.cli.graph_info import graph_info

        summary = graph_info(args.package)
        print(summary.to_json() if args.json else summary.to_text())
        return EXIT_OK

    from rlx_mil.llm.chunked import is_chunked_set, read_chunked_set

    if args.package.suffix == ".aimodel" and not args.estimate:
        from rlx_mil.coreai.asset import asset_summary, summary_text

        asset = asset_summary(args.package)
        print(json.dumps(asset, indent=2) if args.json else summary_text(asset))
        return EXIT_OK
    if args.estimate:
        from rlx_mil.llm.estimate import estimate_decode

        estimate = estimate_decode(args.package, args.context)
        print(estimate.to_json() if args.json else estimate.to_text())
        return EXIT_OK
    if is_chunked_set(args.package):
        chunked = read_chunked_set(args.package)
        print(json.dumps(chunked.summary(), indent=2) if args.json else chunked.to_text())
        return EXIT_OK
    info = package_info(args.package)
    print(info.to_json() if args.json else info.to_text())
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from rlx_mil.fileio import atomic_output_file, check_output_path
    from rlx_mil.llm.runner import run_package
    from rlx_mil.weights import open_arrays

    if args.output is not None:  # before running: the path is what the user asked for, or an error
        check_output_path(args.output, overwrite=args.overwrite, what="outputs file", inputs=(args.inputs,))
    with open_arrays(args.inputs, "inputs file") as archive:
        inputs = dict(archive.items())
    outputs, engine = run_package(
        args.package, inputs, engine=args.engine, function_name=args.function, compute_units=compute_units(args)
    )
    print(f"engine: {engine}")
    for name, value in outputs.items():
        flat = value.astype(np.float64).ravel()
        stats = f"min {flat.min():.4g} max {flat.max():.4g} mean {flat.mean():.4g}" if flat.size else "empty"
        print(f"  {name}: {value.dtype}{list(value.shape)} {stats}")
    if args.output is not None:
        with atomic_output_file(args.output, overwrite=args.overwrite, what="outputs file") as stream:
            np.savez(stream, **outputs)  # type: ignore[arg-type]
        print(f"wrote {args.output}")
    return EXIT_OK


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    from rlx_mil.cli.generate import add_generate_arguments, run_generate

    add_generate_arguments(p)
    p.set_defaults(handler=run_generate)


def _chat_arguments(p: argparse.ArgumentParser) -> None:
    from rlx_mil.cli.generate import add_chat_arguments, run_chat

    add_chat_arguments(p)
    p.set_defaults(handler=run_chat)


def _progress(args: argparse.Namespace) -> Any:
    from rlx_mil.progress import Progress, running_under_ci

    return Progress(enabled=not (getattr(args, "quiet", False) or running_under_ci()))


def _eval(args: argparse.Namespace) -> int:
    from rlx_mil.cli.arguments import announce

    announce(args, f"opening {args.package} ...")
    if args.audio is not None or args.language is not None or (args.package / "AudioEncoder.mlpackage").is_dir():
        from rlx_mil.cli.speech_eval import run_speech_eval

        if args.max_tokens == "all":  # a transcript's own limit, n_text_ctx // 2
            args.max_tokens = None
        return run_speech_eval(args, _progress(args))
    text: str | Path
    if args.text is None:
        from rlx_mil.compress.builtin_text import builtin_text

        text = builtin_text("heldout")
    else:
        text = args.text
    limit = {None: DEFAULT_EVAL_TOKENS, "all": None}.get(args.max_tokens, args.max_tokens)
    progress = _progress(args)
    progress.begin(f"opening {args.package}", unit=" weights")  # the executor counts those it prepares
    from rlx_mil.llm.evaluate import evaluate_package

    def start(total: int) -> Any:
        progress.begin("scoring", total=total, unit=" tokens")
        return progress.advance

    result = evaluate_package(
        args.package, text, reference=args.reference, max_tokens=limit, engine=args.engine,
        compute_units=compute_units(args), progress=start, warn_cut=args.max_tokens is None,
    )
    progress.end(counted(result.scored, "token"))
    print(result.to_json() if args.json else result.to_text())
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from rlx_mil.cli.demo import run_demo

    return run_demo(args)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _error_lines(err: RlxMilError) -> str:
    """The error as one line, or, for a list of several problems ("...:\n  - a\n  - b"),
    its heading line and then one problem per line."""
    head, sep, rest = str(err).partition("\n  - ")
    problems = [" ".join(p.split()) for p in rest.split("\n  - ")]
    if not sep or len(problems) == 1:
        return _one_line(err)
    return " ".join(head.split()) + "".join(f"\n  - {p}" for p in problems)


def _show_warning(where: str) -> Any:
    """`warnings.showwarning` for the command line: `rlx-mil CMD: warning: MESSAGE`."""

    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        print(f"{where}: warning: {' '.join(str(message).split())} ({category.__name__})", file=sys.stderr)

    return show


def _os_error_line(err: OSError) -> str:
    if err.strerror and err.filename is not None:
        return f"{err.filename}: {err.strerror}"
    return _one_line(err)


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._subparsers._group_actions if parser._subparsers is not None else ():
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # stdout is not a file descriptor (captured): nothing will flush into a closed pipe


def entry() -> int:
    """The `rlx-mil` command (and `python -m rlx_mil.cli`): `main` in a process that goes
    without PyTorch and transformers, which no subcommand uses but coremltools imports whenever
    they are installed (about 2 s of CPU at every start, and a version warning)."""
    for name in ("torch", "transformers"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    code = main()
    # Done and said so: a Ctrl-C during the exit handlers (the scratch folder's removal, seconds
    # on a busy machine) would end the process by the signal, the clean-up cut short.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def _failed(args: argparse.Namespace, where: str, line: str) -> None:
    """The failure's line on stderr; with --json, also a JSON object on stdout, so that what
    a --json command prints is JSON whatever the outcome."""
    from rlx_mil.progress import abandon

    abandon()  # a bar still drawn would overwrite the line
    print(f"{where}: {line}", file=sys.stderr)
    if getattr(args, "json", False):
        kind, _, message = line.partition(": ")
        print(json.dumps({"error": message or kind, "command": args.command}), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; every failure ends in one `rlx-mil CMD: error: ...` line on stderr.

    Exit codes: 0 success, 1 a rlx_mil error or an OS failure (bad input, missing file, full
    disk...), 2 a usage error (argparse), 130 interrupted, 70 an internal error: a bug, whose
    traceback RLX_MIL_TRACEBACK=1 prints. Subcommands set `handler` with `set_defaults` (or
    appear in the table below) and inherit all of this.
    """
    from rlx_mil.cli.arguments import unknown_options

    parser = _parser()
    words = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, w in enumerate(words) if not w.startswith("-")), None)
    sub = _subparser(parser, words[at]) if at is not None else parser
    if sub is not parser and (typos := unknown_options(sub, words[at + 1:] if at is not None else [])):
        sub.error(f"unrecognized arguments: {' '.join(typos)}")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's usage, not the top-level one, names what it takes
        _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    handlers: dict[str, Any] = {
        "convert": _convert, "convert-hf": _convert_hf, "convert-gguf": _convert_gguf, "inspect": _inspect, "run": _run, "demo": _demo,
        "eval": _eval,
    }
    handler = getattr(args, "handler", None) or handlers[args.command]
    if args.command in ("convert", "convert-hf", "convert-gguf"):
        handler = aimodel_output.wrap(handler)
    where = f"rlx-mil {args.command}"
    own_interrupt_handling()
    try:
        with warnings.catch_warnings():
            # Warnings (NeuralEngineWarning, PrecisionWarning...) are diagnostics: one line
            # each on stderr, none with -q.
            if getattr(args, "quiet", False):
                warnings.simplefilter("ignore")
            else:
                warnings.showwarning = _show_warning(where)
            code = int(handler(args))
            sys.stdout.flush()  # a reader that went away is seen here, not at the interpreter's exit
            return code
    except RlxMilError as err:
        _failed(args, where, f"error: {_error_lines(err)}")
    except BrokenPipeError:
        # The reader went away (`rlx-mil preflight PKG | head -1`): not an error. Later writes
        # (and the interpreter's final flush) go nowhere instead of raising again.
        _silence_stdout()
        return EXIT_OK
    except OSError as err:
        _failed(args, where, f"error: {_os_error_line(err)}")
    except MemoryError:
        _failed(args, where, "error: out of memory")
    except KeyboardInterrupt:
        interrupts.handled()
        _failed(args, where, "interrupted")
        return exit_interrupted()
    except Exception as err:  # a bug: say so in one line, the traceback on request
        # Ctrl-C inside code that wraps what it catches (a class's __set_name__...), or that
        # turned it into another error
        if interrupted(err) or interrupts.pending():
            interrupts.handled()
            _failed(args, where, "interrupted")
            return exit_interrupted()
        if os.environ.get("RLX_MIL_TRACEBACK"):
            traceback.print_exc()
        _failed(args, where, f"internal error (please report it; RLX_MIL_TRACEBACK=1 shows where):"
                f" {type(err).__name__}: {_one_line(err)}")
        return EXIT_INTERNAL
    return EXIT_ERROR

