"""rlx_mil: RLX IR graphs to Apple Core ML ML Programs through the coremltools MIL Builder."""

from __future__ import annotations

import sys as _sys

# The `rlx-mil` command (its console script, or `python -m rlx_mil.cli`): a Ctrl-C from here
# until the command's own handling starts (`rlx_mil.cli.main.main`, after the arguments are
# parsed) ends the process with one line and status 130, not with a traceback out of whichever
# import it hit. The first lines of the package, so that the window left is the interpreter's
# own start. A library import (any other program) changes no signal handler.
if _sys.argv and (_sys.argv[0].replace("\\", "/").rsplit("/", 1)[-1] in ("rlx-mil", "rlx-mil.exe")
                  or "rlx_mil.cli" in getattr(_sys, "orig_argv", ())[1:3]):
    import _signal

    def _interrupted_while_starting(signum: int, frame: object) -> None:
        import os

        command = next((a for a in _sys.argv[1:2] if a[:1].isalpha()), "")
        os.write(2, f"rlx-mil{' ' + command if command else ''}: interrupted\n".encode())
        os._exit(130)

    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # not ignored by the parent
        _signal.signal(_signal.SIGINT, _interrupted_while_starting)

import importlib as _importlib
import logging as _logging
from typing import TYPE_CHECKING

from rlx_mil import errors
from rlx_mil.version import __version__

# coremltools logs Linux-only proxy warnings when imported; keep them quiet unless the user
# configured that logger. (Importing rlx_mil changes nothing in the process environment: the
# pass-pipeline bars are hidden during rlx_mil's own conversions, `coreml.patches`.)
if _logging.getLogger("coremltools").level == _logging.NOTSET:
    _logging.getLogger("coremltools").setLevel(_logging.ERROR)

if TYPE_CHECKING:
    from rlx_mil.api import convert, convert_buckets, convert_functions, lower, save
    from rlx_mil.coreml.preflight import preflight
    from rlx_mil.ir import DType, Graph, MaskKind, QuantScheme, Shape

__all__ = [
    "DType", "Graph", "MaskKind", "QuantScheme", "Shape", "__version__", "convert", "convert_buckets",
    "convert_functions", "errors", "lower", "preflight", "save",
]

# Every name below loads on first use, so that `import rlx_mil` (and the `rlx-mil` command's
# start, `--help` included) costs milliseconds rather than the IR, lowering rules and NumPy.
# (`rlx_mil.lower` is the public function; the lowering stage is the package `rlx_mil.lowering`.)
_LAZY = {
    "DType": "rlx_mil.ir", "Graph": "rlx_mil.ir", "MaskKind": "rlx_mil.ir", "QuantScheme": "rlx_mil.ir",
    "Shape": "rlx_mil.ir", "convert": "rlx_mil.api", "convert_buckets": "rlx_mil.api",
    "convert_functions": "rlx_mil.api", "lower": "rlx_mil.api", "save": "rlx_mil.api",
    "preflight": "rlx_mil.coreml.preflight",
}
_SUBMODULES = ("reference", "milexec", "testing", "weights", "models", "generate")


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"rlx_mil.{name}")
    raise AttributeError(f"module 'rlx_mil' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
