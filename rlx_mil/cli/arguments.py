"""argparse types that check a value while the command line is parsed: a bad number is a usage
error (exit 2) before any package or checkpoint is opened."""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Callable, Sequence

# The choices below mirror their owners' tables, which import NumPy and more
# (tests/test_cli_startup.py checks that they agree).
TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18", "iOS26")
DEPLOY_FORMS = ("plain", "gpu", "ane")
#: rlx_mil.llm.evaluate.DEFAULT_EVAL_TOKENS: what `eval` scores without --max-tokens.
DEFAULT_EVAL_TOKENS = 512
#: What generate, chat and eval take (argparse shows no line for a positional without help).
LLM_PACKAGE_HELP = ("the stateful LLM package convert-hf / convert-gguf wrote: a .mlpackage, a chunked set's folder"
                    " or a .aimodel")


def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return float(value) if kind is float else int(value)


def int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(_number(text, int))
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value

    parse.__name__ = "int"  # argparse names the type in its message
    return parse


def token_limit(text: str) -> int | str:
    """`eval --max-tokens`: an integer >= 2, or `all`."""
    if text.strip().lower() == "all":
        return "all"
    return int_at_least(2)(text)


token_limit.__name__ = "int"


def float_at_least(low: float, strictly: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _number(text, float)
        if value < low or (strictly and value == low):
            raise argparse.ArgumentTypeError(f"expected a number {'>' if strictly else '>='} {low:g}, got {text!r}")
        return value

    parse.__name__ = "float"
    return parse


def fraction(low_open: bool) -> Callable[[str], float]:
    """A number in (0, 1] (`low_open`) or [0, 1]."""

    def parse(text: str) -> float:
        value = _number(text, float)
        if value > 1 or value < 0 or (low_open and value == 0):
            raise argparse.ArgumentTypeError(f"expected a number in {'(' if low_open else '['}0, 1], got {text!r}")
        return value

    parse.__name__ = "float"
    return parse


def compute_units(args: argparse.Namespace) -> str:
    """--compute-units (default ALL), with a warning where Core ML does not run the model."""
    given = getattr(args, "compute_units", None)
    if given is None:
        return "ALL"
    engine = getattr(args, "engine", "auto")
    if engine == "milexec" or (engine == "auto" and sys.platform != "darwin"):
        warnings.warn(f"--compute-units {given} has no effect here: the NumPy MIL executor runs the model"
                      " (Core ML runs only on macOS)", UserWarning, stacklevel=2)
    return str(given)


def announce(args: argparse.Namespace, text: str) -> None:
    """The command's first line on a terminal's stderr (within milliseconds of the start, before
    the seconds its imports take); none with -q, under CI or when stderr is not a terminal (where
    an error stays the one line written)."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        return
    from rlx_mil.progress import running_under_ci

    if not running_under_ci():
        print(text, file=sys.stderr, flush=True)


def unknown_options(sub: argparse.ArgumentParser, words: Sequence[str]) -> list[str]:
    """The option-like words of a subcommand's arguments that `sub` does not take. argparse
    reports a missing required argument before an unrecognized one, so `generate PKG --bogus`
    would complain about --prompt instead of naming the typo; looking first names it."""
    known = set(sub._option_string_actions)
    long_known = [k for k in known if k.startswith("--")]
    found = []
    for word in words:
        if word == "--":
            break
        if not word.startswith("-") or word == "-" or sub._negative_number_matcher.match(word):
            continue
        name = word.split("=", 1)[0]
        if name in known or (name.startswith("--") and sub.allow_abbrev and any(k.startswith(name) for k in long_known)):
            continue
        if not name.startswith("--") and name[:2] in known:  # -n5: a short option with its value
            continue
        found.append(word)
    return found


def add_load_flags(p: argparse.ArgumentParser) -> None:
    """--engine and --compute-units: the commands that open a package."""
    p.add_argument("--engine", choices=["auto", "coreml", "milexec", "coreai"], default="auto",
                   help="Core ML (macOS), the NumPy MIL executor, or Apple's Core AI runtime (the coreai "
                        "extra; also on Linux); auto: Core ML where it runs")
    p.add_argument("--compute-units", choices=["ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE"], type=str.upper,
                   help="where Core ML runs the model (macOS; default ALL; not stored in a package)")


def add_conversion_flags(p: argparse.ArgumentParser) -> None:
    """--target, --precision and --attention: the commands that convert."""
    p.add_argument("--target", default="iOS18", choices=TARGETS,
                   help="the oldest OS the package runs on (default iOS18: stateful KV cache, fused attention)")
    p.add_argument("--precision", default="fp16", choices=["fp16", "fp32"], help="float type of compute and weights")
    p.add_argument("--attention", default="auto", choices=["auto", "fused", "decomposed"], help="SDPA op (fused,"
                   " iOS18+) or matmul/softmax; auto: fused where target and model allow (docs/attention.md)")
