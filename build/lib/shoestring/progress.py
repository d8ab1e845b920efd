"""Progress bars shared by the long-running stages (rich)."""

from __future__ import annotations

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
