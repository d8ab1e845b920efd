"""The one error type users see (and the one stop that is not an error).

A ``ShoestringError`` is a mistake in what the user asked for (a path, a value, a file's
contents), not a bug. The CLI prints its message and exits with code 2 and no traceback;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import signal
from pathlib import Path


class ShoestringError(Exception):
    """Bad input: says what went wrong, where, and what to do about it."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None) -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        parts = [f"{self.where}: {self.what}" if self.where else self.what]
        if self.fix:
            parts.append(f"  → {self.fix}")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple:
        # pickled across processes (a sweep's worker) with its where and fix intact
        return (self.__class__, (self.what,), dict(self.__dict__))


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived during training; a checkpoint was saved. The CLI exits with
    128 + signal. (Here rather than in train/ so that the CLI's entry point catches it
    without importing torch.)"""

    def __init__(self, signum: int, checkpoint: Path, step: int) -> None:
        self.signum, self.checkpoint, self.step = signum, checkpoint, step
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}")

    def __reduce__(self) -> tuple:
        return (self.__class__, (self.signum, self.checkpoint, self.step))


class Interrupted(Exception):
    """Ctrl-C in a long stage that is not training (an audit, a calibration). The message
    says what was kept and what running the same command again does; the CLI prints it with
    that command and exits 130, so a stop is never silent."""
