"""Ctrl-C in the `rlx-mil` command: what ends it while it starts, and how `main` ends it after."""

from __future__ import annotations

EXIT_INTERRUPTED = 130


def own_interrupt_handling() -> None:
    """From here a Ctrl-C is a KeyboardInterrupt `main` handles (cleaning up what the command
    started); until here it ended the starting command at once (`rlx_mil/__init__.py`)."""
    import signal

    if getattr(signal.getsignal(signal.SIGINT), "__name__", "") == "_interrupted_while_starting":
        # a KeyboardInterrupt that a library swallows is raised again (rlx_mil.interrupts)
        from rlx_mil import interrupts

        interrupts.install()


def exit_interrupted() -> int:
    """130, and the process does end with it. A Ctrl-C that passed through code an extension
    runs with `PyRun_String` (pybind11's `py::exec`) on its way to us sets CPython's "unhandled
    KeyboardInterrupt" flag, and the interpreter then ends by killing itself with SIGINT
    (status -2 to a parent) although we handled it; running any string resets that flag."""
    import ctypes

    try:
        ctypes.pythonapi.PyRun_SimpleString(b"pass")
    except (AttributeError, OSError):  # not CPython
        pass
    return EXIT_INTERRUPTED


def interrupted(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among `err`'s causes."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
