"""Budgets: how much training a run may spend, and how much of it is used.

Progress is the fraction of the budget used, in [0, 1]. Schedules are keyed to progress,
not to step counts, so a wall-clock budget gets a complete schedule however fast the
machine turns out to be (Cramming's budget-aware schedules).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from shoestring.errors import ShoestringError
from shoestring.units import BudgetSpec, format_duration


@dataclass
class Budget:
    """How much training a run may spend; whichever limit runs out first ends training.

    ``seconds`` is wall clock of the training loop itself (model building, the peak
    measurement, validation and saving are not charged); ``flops`` is charged at the model's
    exact training FLOPs per token. ``elapsed_before`` carries time used before a resume.
    """

    seconds: float | None = None
    steps: int | None = None
    tokens: float | None = None
    flops: float | None = None
    flops_per_token: float = 0.0
    elapsed_before: float = 0.0
    _start: float = field(default_factory=time.perf_counter, repr=False)
    _paused: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if all(v is None for v in (self.seconds, self.steps, self.tokens, self.flops)):
            raise ShoestringError("no budget given", fix="pass --budget 5m or --steps N")

    @classmethod
    def from_spec(cls, spec: BudgetSpec | None, steps: int | None, flops_per_token: float) -> Budget:
        kw: dict = {"steps": steps, "flops_per_token": flops_per_token}
        if spec is not None:
            kw[spec.kind] = int(spec.amount) if spec.kind == "steps" else spec.amount
            if spec.kind == "steps" and steps is not None:
                kw["steps"] = min(steps, int(spec.amount))
        return cls(**kw)

    def restart(self, elapsed_before: float = 0.0) -> None:
        self._start = time.perf_counter()
        self._paused = 0.0
        self.elapsed_before = elapsed_before

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """``with budget.pause():`` — time inside (validation, checkpoints) is not charged."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused += time.perf_counter() - start

    @property
    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self._start - self._paused

    def progress(self, step: float, tokens: float = 0.0, elapsed: float | None = None) -> float:
        """Fraction used after ``step`` steps, ``tokens`` tokens and ``elapsed`` seconds
        (default: this process's clock), in [0, 1]."""
        fractions = [0.0]
        if self.seconds is not None:
            fractions.append((self.elapsed if elapsed is None else elapsed) / self.seconds)
        if self.steps is not None:
            fractions.append(step / self.steps)
        if self.tokens is not None:
            fractions.append(tokens / self.tokens)
        if self.flops is not None:
            fractions.append(tokens * self.flops_per_token / self.flops)
        return min(1.0, max(fractions))

    def describe(self) -> str:
        parts = []
        if self.seconds is not None:
            parts.append(format_duration(self.seconds))
        if self.flops is not None:
            parts.append(f"{self.flops:.3g} FLOPs")
        if self.tokens is not None:
            parts.append(f"{self.tokens:,.0f} tokens")
        if self.steps is not None:
            parts.append(f"{self.steps} steps")
        return " or ".join(parts)
