"""Progress bars shared by the long-running stages (rich)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    """Items per second, in the task's own unit (docs/s, tokens/s)."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "it")
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} {unit}/s" if speed else f"– {unit}/s", style="cyan")


def progress_bar(console: Console) -> Progress:
    """Count, rate and ETA when the total is known; a spinner, count and rate otherwise."""
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


PLAIN_LINE_SECONDS = 30.0  # in a log, a progress line at most this often


@contextlib.contextmanager
def counting(console: Console, description: str, total: int, unit: str,
             every: float = PLAIN_LINE_SECONDS) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)`` for a count toward ``total``. On a terminal: the bar above. In a
    log or CI, where rich draws nothing until the end, a plain line at most every ``every``
    seconds (and one at the end) instead, so that a stage of many minutes is never silent."""
    if console.is_terminal:
        with progress_bar(console) as bar:
            task = bar.add_task(description, total=total, unit=unit)
            yield lambda n: bar.advance(task, n)
        return
    done, last, start = 0, -math.inf, time.monotonic()

    def advance(n: int) -> None:
        nonlocal done, last
        done += n
        now = time.monotonic()
        if now - last >= every or done >= total:
            last = now
            rate = done / max(now - start, 1e-9)
            console.print(f"{description}: {done:,} of {total:,} {unit} ({done / total:.0%}, "
                          f"{rate:,.0f} {unit}/s, ~{max(total - done, 0) / max(rate, 1e-9) / 60:.1f} min "
                          "left)", highlight=False, soft_wrap=True)

    yield advance
