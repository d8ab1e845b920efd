from __future__ import annotations

import pytest

from shoestring.errors import ShoestringError
from shoestring.train.budget import Budget
from shoestring.train.schedule import one_cycle
from shoestring.units import parse_budget


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
    spec = parse_budget(text)
    assert (spec.kind, spec.amount) == ("seconds", seconds)


@pytest.mark.parametrize("text", ["5x", "5", "", "m", "-3m", "0s", "1e3s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ShoestringError, match=f"budget '{text}' is (not a duration|out of range)"):
        parse_budget(text)


def test_step_budget_progress() -> None:
    b = Budget(steps=10)
    assert b.progress(0) == 0.0 and b.progress(5) == 0.5
    assert b.progress(9) < 1.0 and b.progress(10) == 1.0  # the loop stops at 1


def test_time_budget_progress_uses_wall_clock() -> None:
    b = Budget(seconds=1000.0)
    b._start -= 250.0
    assert b.progress(0) == pytest.approx(0.25, abs=0.01)
    assert Budget(seconds=1.0, steps=4).progress(3) >= 0.75


def test_budget_required() -> None:
    with pytest.raises(ShoestringError):
        Budget()


def _tc(**kw):
    from shoestring.config import TrainConfig

    return TrainConfig(steps=10, **kw)


def test_wsd_is_flat_then_cools_down_with_one_minus_sqrt() -> None:
    from shoestring.train.schedule import wsd

    assert wsd(0.05, 0.1, 0.2) == pytest.approx(0.5)  # warmup
    assert wsd(0.1, 0.1, 0.2) == wsd(0.5, 0.1, 0.2) == wsd(0.8, 0.1, 0.2) == 1.0
    assert wsd(0.85, 0.1, 0.2) == pytest.approx(1 - 0.25 ** 0.5)
    assert wsd(1.0, 0.1, 0.2) == pytest.approx(0.0)
    assert wsd(1.0, 0.1, 0.2, floor=0.1) == pytest.approx(0.1)


def test_cosine_linear_constant_shapes() -> None:
    from shoestring.train.schedule import constant, cosine, linear

    assert cosine(0.0, 0.0) == 1.0 and cosine(0.5, 0.0) == pytest.approx(0.5)
    assert cosine(1.0, 0.0, floor=0.2) == pytest.approx(0.2)
    assert linear(0.55, 0.1) == pytest.approx(0.5) and linear(1.0, 0.1) == pytest.approx(0.0)
    assert constant(0.02, 0.04) == pytest.approx(0.5) and constant(0.9, 0.04) == 1.0
    for f in (lambda p: cosine(p, 0.1), lambda p: linear(p, 0.1)):
        after = [f(i / 100) for i in range(10, 101)]
        assert all(a >= b for a, b in zip(after, after[1:]))  # monotone after warmup


@pytest.mark.parametrize("name", ["one-cycle", "wsd", "cosine", "linear", "constant"])
def test_lr_factor_dispatches_each_schedule(name: str) -> None:
    from shoestring.train.schedule import lr_factor

    tc = _tc(schedule=name, warmup=0.1)
    values = [lr_factor(tc, i / 20) for i in range(21)]
    assert max(values) == pytest.approx(1.0) and min(values) >= 0.0
    assert values[0] == 0.0  # every schedule starts from zero (warmup)


def test_batch_ramp_grows_in_micro_batches_to_the_target() -> None:
    from shoestring.train.schedule import batch_at

    tc = _tc(batch_size=32, micro_batch_size=4, batch_ramp=0.6)
    sizes = [batch_at(tc, i / 100) for i in range(101)]
    assert sizes[0] == 4 and sizes[30] == 16 and sizes[60] == 32 and sizes[-1] == 32
    assert all(s % 4 == 0 for s in sizes) and sizes == sorted(sizes)
    assert batch_at(_tc(batch_size=32), 0.0) == 32  # no ramp


@pytest.mark.parametrize(("text", "kind", "amount"), [
    ("90s", "seconds", 90), ("10m", "seconds", 600), ("3e15", "flops", 3e15),
    ("3e15flops", "flops", 3e15), ("30 Tflops", "flops", 3e13), ("20Mtok", "tokens", 2e7),
    ("2e7 tokens", "tokens", 2e7), ("500steps", "steps", 500), ("1k steps", "steps", 1000),
])
def test_parse_budget_kinds(text: str, kind: str, amount: float) -> None:
    spec = parse_budget(text)
    assert (spec.kind, spec.amount) == (kind, pytest.approx(amount))


@pytest.mark.parametrize("text", ["100", "5x", "", "-3m", "1e3 parsecs"])
def test_parse_budget_rejects(text: str) -> None:
    with pytest.raises(ShoestringError, match="not a duration, FLOP, token or step count"):
        parse_budget(text)


@pytest.mark.parametrize(("text", "valid"), [
    ("1e400flops", "from 1e+09 to 1e+30 FLOPs"),  # infinite: would train for ever at lr 0
    ("1e-3flops", "from 1e+09 to 1e+30 FLOPs"),
    ("0.5tok", "a whole number from 1 to 1e+16 tokens"),
    ("0tok", "a whole number from 1 to 1e+16 tokens"),
    ("0.1steps", "a whole number from 1 to 1e+12 steps"),  # was a ZeroDivisionError
    ("0steps", "a whole number from 1 to 1e+12 steps"),
    ("1.5steps", "a whole number from 1 to 1e+12 steps"),
    ("1e400", "from 1e+09 to 1e+30 FLOPs"),
    ("0s", "more than 0s and at most 366d"),
    ("400d", "more than 0s and at most 366d"),
    ("9" * 400 + "s", "more than 0s and at most 366d"),  # infinite seconds
])
def test_a_budget_out_of_its_range_is_refused_with_the_range(text: str, valid: str) -> None:
    with pytest.raises(ShoestringError) as e:
        parse_budget(text)
    assert "out of range" in e.value.what and valid in e.value.what, e.value.what


def test_whole_amounts_at_the_edges_of_their_ranges_are_budgets() -> None:
    assert parse_budget("1steps").amount == 1 and parse_budget("1tok").amount == 1
    assert parse_budget("1.5ktok").amount == 1500 and parse_budget("1e9flops").kind == "flops"
    assert parse_budget("0.001s").amount == pytest.approx(0.001)


def test_token_and_flop_budgets_progress() -> None:
    b = Budget(tokens=1000.0)
    assert b.progress(3, 250) == 0.25 and b.progress(9, 1000) == 1.0
    f = Budget(flops=1e6, flops_per_token=100.0)
    assert f.progress(1, 5000) == 0.5 and f.progress(1, 10_000) == 1.0


def test_paused_time_is_not_charged() -> None:
    import time

    b = Budget(seconds=100.0)
    with b.pause():
        time.sleep(0.2)
    assert b.elapsed < 0.1
    b.restart(elapsed_before=50.0)
    assert b.progress(0) == pytest.approx(0.5, abs=0.01)
