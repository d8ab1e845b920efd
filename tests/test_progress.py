"""The shared progress helper in a log: a plain line at most every ``every`` seconds and
one at the end, so a long stage is never silent where rich draws nothing."""

from __future__ import annotations

import io

from rich.console import Console

from shoestring.progress import counting


def _lines(every: float) -> list[str]:
    log = io.StringIO()
    with counting(Console(file=log, width=200), "scoring", 30, "rows", every=every) as advance:
        for _ in range(3):
            advance(10)
    return log.getvalue().splitlines()


def test_a_log_gets_a_line_per_interval_and_one_at_the_end() -> None:
    every = _lines(0.0)
    assert [line.split(" (")[0] for line in every] == [
        "scoring: 10 of 30 rows", "scoring: 20 of 30 rows", "scoring: 30 of 30 rows"]
    assert "min left" in every[0]
    hourly = _lines(3600.0)
    assert [line.split(" (")[0] for line in hourly] == ["scoring: 10 of 30 rows",
                                                        "scoring: 30 of 30 rows"]
