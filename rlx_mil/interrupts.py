"""A Ctrl-C that no library can swallow.

Python turns SIGINT into a KeyboardInterrupt raised wherever the main thread happens to be.
Where that is inside code that catches everything — a bare ``except:``, an extension that runs
Python through ``PyRun_String`` and clears the error, a ``__del__`` — the interrupt is lost and
the command goes on to the end (a conversion written, an evaluation finished) as if nobody had
pressed anything. Measured on the command line: about one Ctrl-C in six during a conversion's
last seconds, and once an evaluation that ran on for minutes.

`install` (the command line does it once it has started) makes SIGINT also leave a mark. The points
every long piece of work passes often — a progress stage or count, an executor run, the
commit of a package to its destination — call `check`, which raises the interrupt again while
the mark is there. The command line's handler of KeyboardInterrupt calls `handled`, and so
does code that deliberately stops one piece of work on Ctrl-C and goes on (none does today).
Without `install` (rlx_mil used as a library) the mark is never made and `check` costs one
global read.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_pending = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT raises KeyboardInterrupt (as Python's own handler does) and leaves a mark that
    `check` re-raises. Only from the main thread (where Python runs signal handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


def pending() -> bool:
    """Whether a Ctrl-C arrived that nothing has handled yet."""
    return _pending


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C arrived that nothing has handled (it was lost in a
    library on its way up). In the main thread only: a worker thread's work is the main
    thread's to stop."""
    if _pending and threading.current_thread() is threading.main_thread():
        raise KeyboardInterrupt


def handled() -> None:
    """The Ctrl-C has been dealt with: `check` raises nothing until the next one."""
    global _pending
    _pending = False
