"""The `rlx-mil` command: every argparse parser and command of the project lives in this package,
and nothing else in `rlx_mil` imports it."""

from rlx_mil.cli.main import EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, entry, main

__all__ = ["EXIT_ERROR", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "entry", "main"]
