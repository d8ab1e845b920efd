from __future__ import annotations

import pytest

from shoestring.errors import ShoestringError
from shoestring.train.budget import Budget, parse_duration
from shoestring.train.schedule import one_cycle


def test_one_cycle_shape() -> None:
    assert one_cycle(0.0, 0.75) == 0.0
    assert one_cycle(0.375, 0.75) == pytest.approx(0.5)
    assert one_cycle(0.75, 0.75) == pytest.approx(1.0)
    assert one_cycle(0.875, 0.75) == pytest.approx(0.5)
    assert one_cycle(1.0, 0.75) == 0.0
    values = [one_cycle(p / 100, 0.75) for p in range(101)]
    assert values.index(max(values)) == 75
    assert all(a <= b for a, b in zip(values[:76], values[1:76]))
    assert all(a >= b for a, b in zip(values[75:], values[76:]))


def test_one_cycle_edges() -> None:
    assert one_cycle(0.0, 0.0) == 1.0 and one_cycle(0.5, 0.0) == 0.5
    assert one_cycle(1.0, 1.0) == 1.0 and one_cycle(0.5, 1.0) == 0.5
    assert one_cycle(-1.0, 0.5) == 0.0 and one_cycle(2.0, 0.5) == 0.0


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("5m", 300), ("2h", 7200), ("1.5d", 129600), (" 3 m ", 180)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "5", "", "m", "-3m", "0s", "1e3s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ShoestringError, match="not a duration"):
        parse_duration(text)


def test_step_budget_progress() -> None:
    b = Budget(steps=10)
    assert b.progress(0) == 0.0 and b.progress(5) == 0.5
    assert not b.exhausted(9) and b.exhausted(10)


def test_time_budget_progress_uses_wall_clock() -> None:
    b = Budget(seconds=1000.0)
    b._start -= 250.0
    assert b.progress(0) == pytest.approx(0.25, abs=0.01)
    assert Budget(seconds=1.0, steps=4).progress(3) >= 0.75


def test_budget_required() -> None:
    with pytest.raises(ShoestringError):
        Budget()
