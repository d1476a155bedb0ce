"""`python -m rlx_mil.cli`: the same as the `rlx-mil` command."""

import sys

from rlx_mil.cli.main import entry

sys.exit(entry())
