"""The `rlx-mil` command: every argparse parser and command of the project lives in this package,
and nothing else in `rlx_mil` imports it."""

try:
    from rlx_mil.cli.main import EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, entry, main
except KeyboardInterrupt:
    # Ctrl-C while the command is still importing (a fraction of a second, seconds on a busy
    # machine): the same one line and exit code as later, not a traceback.
    import sys as _sys

    _command = _sys.argv[1] if len(_sys.argv) > 1 and _sys.argv[1][:1].isalpha() else ""
    print(f"rlx-mil{' ' + _command if _command else ''}: interrupted", file=_sys.stderr)
    raise SystemExit(130) from None

__all__ = ["EXIT_ERROR", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "entry", "main"]
