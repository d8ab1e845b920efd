"""The bodies of `shoestring plan` and `shoestring sweep`: a plan (from the law, or calibrated
on this data and machine), a law fitted to a sweep, or a sweep trained; and their tables."""

from __future__ import annotations

from pathlib import Path

from shoestring.consoles import err, out
from shoestring.plan.planner import PlanRequest, launch_line, make_plan, plan_table, write_plan
from shoestring.plan.sweep import fit_sweep, fit_table, parse_floats, points_table, run_sweep
from shoestring.units import BudgetSpec


def fit(sweep_dir: Path, output: Path | None) -> None:
    """``plan --fit``: fit the law to a sweep dir (written to ``output`` when given)."""
    out.print(fit_table(fit_sweep(sweep_dir, output)))


def plan(budget: BudgetSpec, *, hardware: str, devices: int, mfu: float | None, measure: bool,
         objective: str | None, law: str, data: Path | None, output: Path | None,
         calibrate: bool, calibrate_share: float, calibration_dir: Path | None, jobs: int,
         curves: bool, history: list[Path] | None, config: Path | None,
         sets: list[str] | None) -> None:
    """Plan ``budget`` on ``hardware``, calibrating first with ``calibrate`` or ``history``;
    print the plan and write it to ``output`` with the command that trains it."""
    req = PlanRequest(hardware=hardware, devices=devices, budget=budget, mfu=mfu, measure=measure,
                      objective=objective, law=law, data=str(data) if data else None)
    if calibrate or history:
        from shoestring.plan.calibrate import CalibrationSpec, calibrated_plan

        spec = CalibrationSpec(share=calibrate_share, law=law if law in ("epoch", "chinchilla")
                               else "epoch", overrides=tuple(sets or []), jobs=jobs,
                               branched=curves, levels=5 if curves else 3)
        tree = calibrated_plan(req, spec, calibrate_data=calibrate,
                               history=[str(h) for h in history or []], root=calibration_dir,
                               config=config, console=err)
    else:
        tree = make_plan(req, console=err)
    out.print(plan_table(tree))
    if output is not None:
        out.print(f"wrote {write_plan(tree, output)}; train it with: "
                  f"{launch_line(tree, str(output))}", soft_wrap=True)


def sweep(data: Path, output: Path, *, budgets: str, sizes: str, law: str, eval_sequences: int,
          jobs: int, curves: bool, config: Path | None, sets: list[str] | None) -> None:
    """Train the sweep's points (resumable) and print them."""
    points = run_sweep(data, output, parse_floats(budgets, "--budgets"),
                       parse_floats(sizes, "--sizes"), law, config, sets, eval_sequences,
                       console=err, jobs=jobs, branched=curves)
    out.print(points_table(points))
    out.print(f"fit a law to it: shoestring plan --fit {output}")
