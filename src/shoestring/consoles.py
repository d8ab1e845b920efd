"""The two consoles a command prints to: ``out`` (its result) and ``err`` (progress, warnings,
errors), shared by `cli` and the command bodies it dispatches to."""

from __future__ import annotations

import os
import sys

from rich.console import Console

LOG_WIDTH = 160  # columns when writing to a file or a pipe (a log, CI) with no COLUMNS set


def _console(stderr: bool = False) -> Console:
    """Rich's own width on a terminal or with COLUMNS set; otherwise ``LOG_WIDTH`` instead of
    rich's 80, which cut wide tables (GLUE's headers) in logs and CI."""
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, width=None if tty or os.environ.get("COLUMNS") else LOG_WIDTH)


out = _console()
err = _console(stderr=True)
