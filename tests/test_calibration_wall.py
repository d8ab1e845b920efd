"""A wall-clock `plan --calibrate` budget is priced in this machine's seconds before the
calibration is sized (issue 62, major 6): at the assumed 30% MFU a 5-minute budget was
accepted and then calibrated for ~45 minutes, its tiny models reaching 0.2–2% of peak."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from conftest import fails_cleanly, run_cli
from shoestring.plan.calibrate import (CalibrationSpec, CalibrationTooSmall, calibrated_plan,
                                       calibration_dir, calibration_points, wall_price)
from shoestring.plan.calibration_wall import WallPrice
from shoestring.plan.planner import PlanRequest, make_plan
from shoestring.plan.sweep import _fixed_and_rate, cost

# about what a busy 2-core CPU measured for the README's tiny data (bench/calibration_wall.py):
# a point's price but its training, and seconds per training FLOP, by FLOPs per token (held
# flat to 1e9, so that a kept price spans every shape these tests' budgets may train)
SLOW = WallPrice(fixed=((3.5e5, 7.5), (4.3e6, 31.0), (1e9, 31.0)),
                 rates=((3.5e5, 5.5e-10), (4.3e6, 1.5e-10), (1e9, 1.5e-10)))


def test_a_point_costs_its_shapes_fixed_price_and_its_flops_at_its_rate() -> None:
    small = {"flops_per_token": 3.5e5, "flops": 1e10}
    assert SLOW.point_seconds(small) == pytest.approx(7.5 + 5.5e-10 * 1e10)
    mid = {"flops_per_token": math.sqrt(3.5e5 * 4.3e6), "flops": 1e10}  # log–log between
    assert SLOW.rate(mid["flops_per_token"]) == pytest.approx(math.sqrt(5.5e-10 * 1.5e-10))
    big = {"flops_per_token": 1e7, "flops": 1e10, "cost_flops": 2e9, "branch_step": 5}
    assert SLOW.point_seconds(big) == pytest.approx(2 * 31.0 + 1.5e-10 * 2e9)  # two runs


def _flops_for(seconds: float, data: Path, hardware: str = "t4") -> float:
    """The FLOPs `plan` buys for ``seconds`` of ``hardware`` at the assumed MFU (a datasheet
    row: the same on every machine)."""
    return make_plan(PlanRequest(hardware=hardware, budget=f"{seconds:g}s", data=str(data))
                     )["plan"]["budget"]["flops"]


@pytest.mark.slow
def test_a_wall_budget_the_flops_accept_is_refused_in_seconds_and_the_suggestion_fits(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """The FLOPs of 5 minutes at the assumed MFU buy a calibration (what was accepted and
    overran); priced in this machine's seconds it is refused, and the budget the refusal
    names — CLI and API alike — buys a calibration whose seconds fit its share."""
    spec = CalibrationSpec()
    flops = _flops_for(300, pydocs_dir)
    old = calibration_points(str(pydocs_dir), flops, spec)  # the FLOPs alone accept it …
    assert SLOW.seconds(old) > 4 * spec.share * 300  # … and it would run 4× its share or more
    with pytest.raises(CalibrationTooSmall) as e:
        calibration_points(str(pydocs_dir), flops, spec, SLOW, 300)
    assert e.value.need_s is not None and e.value.need_s > 300
    # the real CLI, with this price on file where the calibration would keep its own
    root = tmp_path / "cal"
    where = calibration_dir(str(pydocs_dir.resolve()), spec, root)
    where.parent.mkdir(parents=True)
    (where.parent / f"{where.name}.wall.json").write_text(json.dumps(SLOW.to_dict()))
    r = run_cli("plan", "--calibrate", "--hardware", "t4", "--budget", "5m", "--data",
                str(pydocs_dir),
                "--calibration-dir", str(root), timeout=120)
    fails_cleanly(r, "--budget", "budget too small to calibrate", "at the speed measured here")
    assert "measuring this machine" not in r.stderr  # the kept price, not a new measurement
    minutes = int(re.search(r"give --budget (\d+)m or more", r.stderr)[1])
    assert minutes * 60 >= e.value.need_s
    seconds = minutes * 60
    points = calibration_points(str(pydocs_dir), _flops_for(seconds, pydocs_dir), spec, SLOW,
                                seconds)
    assert SLOW.seconds(points) <= spec.share * seconds
    assert sum(map(cost, points)) <= spec.share * _flops_for(seconds, pydocs_dir)


def test_curves_are_priced_in_seconds_too(pydocs_dir: Path) -> None:
    """`--curves` (issue 62: its refusal suggested 2 minutes, which then overran): a branch
    pays two runs' fixed price, and the suggested seconds buy the calibration."""
    spec = CalibrationSpec(branched=True, levels=5)
    with pytest.raises(CalibrationTooSmall) as e:
        calibration_points(str(pydocs_dir), _flops_for(120, pydocs_dir), spec, SLOW, 120)
    need = math.ceil(e.value.need_s)
    points = calibration_points(str(pydocs_dir), _flops_for(need, pydocs_dir), spec, SLOW, need)
    assert SLOW.seconds(points) <= spec.share * need
    assert need > 20 * 120  # 2 minutes were never enough: 15 branches × 2 runs × 7.5 s alone


# the real measurement: a relaxed calibration (2 levels over 0.3 decades, 2 steps a point, 32
# rows scored, no periodic validation) so the probes take seconds
QUICK = CalibrationSpec(levels=2, decades=0.3, min_steps=2, eval_sequences=32, resamples=50,
                        overrides=("train.val_every=0", "train.tensorboard=false",
                                   "train.attention=sdpa"))


@pytest.mark.slow
def test_the_speed_is_measured_here_kept_and_a_wall_budget_is_refused_or_fits(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """The price is measured on this machine (real points trained and scored, the trainer's
    step timed), kept beside the calibration dir and reused; a 1-minute budget is then either
    refused with a suggestion whose seconds pay for the calibration, or calibrated within its
    share at the measured speed."""
    from rich.console import Console

    quiet = Console(quiet=True)
    root = tmp_path / "cal"
    flops = _flops_for(60, pydocs_dir, "auto")
    price = wall_price(str(pydocs_dir), flops, QUICK, root, None, quiet)
    assert price.measured_s > 0 and all(s >= 0 for _, s in price.fixed)
    assert all(r > 0 for _, r in price.rates) and len(price.rates) >= 2
    where = calibration_dir(str(pydocs_dir.resolve()), QUICK, root)
    assert (where.parent / f"{where.name}.wall.json").is_file()
    again = wall_price(str(pydocs_dir), flops, QUICK, root, None, quiet)
    assert again.measured_s == 0 and (again.fixed, again.rates) == (price.fixed, price.rates)
    assert not list(root.glob(".wall-probe-*"))  # the probes' runs are not left behind
    req = PlanRequest(budget="60s", data=str(pydocs_dir))
    try:
        tree = calibrated_plan(req, QUICK, root=root, console=quiet)
    except CalibrationTooSmall as e:
        minutes = int(re.search(r"give --budget (\d+)m or more", e.fix)[1])
        points = calibration_points(str(pydocs_dir), _flops_for(minutes * 60, pydocs_dir,
                                                                "auto"),
                                    QUICK, price, minutes * 60)
        assert price.seconds(points) <= QUICK.share * minutes * 60
    else:
        cal = tree["plan"]["calibration"]
        assert cal["estimated_wall_s"] <= QUICK.share * 60 == cal["share_of_budget_s"]


def test_the_estimate_splits_a_points_fixed_price_from_its_flops() -> None:
    """The time left after each point: seconds = fixed × points + rate × FLOPs, fitted once the
    points' FLOPs differ (issue 62: the first, smallest points' seconds per FLOP alone made the
    README's 21.6-minute calibration read 45–71)."""
    costs = [1e10] * 5 + [6e10] * 5
    samples, flops, seconds = [], 0.0, 0.0
    for k, c in enumerate(costs, 1):
        flops += c
        seconds += 12.0 + 2e-10 * c
        samples.append((k, flops, seconds))
    assert _fixed_and_rate(samples[:5]) == (0.0, None)  # alike: the split is unknown
    fixed, rate = _fixed_and_rate(samples)
    assert fixed == pytest.approx(12.0) and rate == pytest.approx(2e-10)
