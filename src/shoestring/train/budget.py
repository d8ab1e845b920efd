"""Budgets: how much training a run may spend, and how much of it is used.

Progress is the fraction of the budget used, in [0, 1]. Schedules are keyed to progress,
not to step counts, so a wall-clock budget gets a complete schedule however fast the
machine turns out to be (Cramming's budget-aware schedules).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from shoestring.errors import ShoestringError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")


def parse_duration(text: str) -> float:
    """``'90s'``, ``'5m'``, ``'2h'``, ``'1.5d'`` → seconds."""
    m = _DURATION.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ShoestringError(
            f"budget '{text}' is not a duration",
            where="budget",
            fix="use a positive number with a unit: 90s, 5m, 2h or 1d",
        )
    return float(m.group(1)) * _UNITS[m.group(2)]


def format_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


@dataclass
class Budget:
    """A wall-clock limit, a step limit, or both; whichever runs out first ends training."""

    seconds: float | None = None
    steps: int | None = None
    _start: float = field(default_factory=time.perf_counter, repr=False)

    def __post_init__(self) -> None:
        if self.seconds is None and self.steps is None:
            raise ShoestringError("no budget given", fix="pass --budget 5m or --steps N")

    def restart(self) -> None:
        self._start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def progress(self, step: float) -> float:
        """Fraction used after ``step`` completed steps (``step + 0.5``: mid-way through the next)."""
        fractions = []
        if self.seconds is not None:
            fractions.append(self.elapsed / self.seconds)
        if self.steps is not None:
            fractions.append(step / self.steps)
        return min(1.0, max(fractions))

    def exhausted(self, step: float) -> bool:
        return self.progress(step) >= 1.0

    def describe(self) -> str:
        if self.steps is not None:
            return f"{self.steps} steps"
        return format_duration(self.seconds or 0.0)
