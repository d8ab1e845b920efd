"""Does `cram --auto` cost what it claims? The whole pipeline with a wall-clock budget —
prep, calibration on a share of the budget, the plan's run for the rest, evaluation — timed
from outside, as a user's clock sees it (interpreter start-up included).

Runs `shoestring cram --auto --budget BUDGET -o WORK/out SOURCE` in a child process once and
prints: the budget, the total wall time and its ratio to the budget, where the time went
(prep and start-up, calibration, the planned run's training and its save, evaluation and the
rest), the calibration's FLOPs and their share of the budget (its stated share beside it),
and the plan's prediction against the achieved held-out loss. The prepared data is reused
when WORK/out/data is already there from the same sources and settings (cram's own rule), so
a second round measures the rest; `--fresh` starts from nothing. Run it alone: a shared
machine makes every FLOP slower, which the wall-clock budget must absorb.

    python bench/cram_auto.py [--budget 20m] [--source builtin:pydocs] [--jobs 1] [--fresh]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from common import ROOT, Bench, parser, wall_budget
from table import render


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--budget", default="20m", type=wall_budget,
                    help="wall-clock budget, as cram --budget takes")
    ap.add_argument("--source", default="builtin:pydocs", help="corpus, as cram takes it")
    ap.add_argument("--jobs", type=int, default=1, help="calibration points trained at once")
    ap.add_argument("--share", type=float, default=0.15, help="cram --calibrate-share")
    ap.add_argument("--fresh", action="store_true", help="delete WORK/out first (prep again)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "cram_auto")
    args = ap.parse_args(argv)
    budget = args.budget
    out = args.work / "out"
    if args.fresh:
        shutil.rmtree(out, ignore_errors=True)
    args.work.mkdir(parents=True, exist_ok=True)
    bench = Bench("cram_auto", args, precision="the trainer's (auto)")
    cmd = [sys.executable, "-m", "shoestring", "cram", "--auto", "--budget", budget.text,
           "--calibrate-share", str(args.share), "--jobs", str(args.jobs), "-o", str(out),
           args.source]
    log = args.work / "cram.log"
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                              env={**os.environ, "COLUMNS": "160"}).returncode
    wall = time.perf_counter() - start
    if code != 0:
        print(f"error: cram --auto exited {code}; its output is in {log}", file=sys.stderr)
        return 1
    plan = yaml.safe_load((out / "plan.yaml").read_text(encoding="utf-8"))["plan"]
    summary = json.loads((out / "run" / "summary.json").read_text(encoding="utf-8"))
    evaluation = json.loads((out / "run" / "eval.json").read_text(encoding="utf-8"))
    cal = plan["calibration"]
    pred = summary.get("prediction") or {}
    train_s = summary["train_seconds"] + summary.get("save_seconds", 0.0)
    rest = wall - cal["wall_s"] - train_s
    achieved = evaluation["mlm_loss"]
    inside = pred.get("low") is not None and pred["low"] <= achieved <= pred["high"]
    rows = [{"budget s": budget.amount, "total wall s": wall,
             "total / budget": wall / budget.amount,
             "calibration s": cal["wall_s"], "planned run s (train + save)": train_s,
             "prep, start-up, eval and the rest s": rest,
             "calibration FLOPs share": cal["flops_share"], "stated share": args.share,
             "within share": cal["within_share"], "reused points": cal["reused_points"]}]
    bench.table(rows, "cost", formats={
        "budget s": ".0f", "total wall s": ".0f", "total / budget": ".3f",
        "calibration s": ".0f", "planned run s (train + save)": ".0f",
        "prep, start-up, eval and the rest s": ".0f", "calibration FLOPs share": ".1%",
        "stated share": ".0%"}, notes=[
        f"`{' '.join(['shoestring', *cmd[3:]])}`, timed from outside; output in {log}",
        f"the plan: {plan['model'].get('params', 0):,} params, {plan['budget'].get('input')} budget"
        f" input, the rest planned as {plan['budget'].get('flops', 0):.3g} FLOPs"])
    bench.table([{"predicted": pred.get("loss"), "low": pred.get("low"),
                  "high": pred.get("high"), "achieved (eval mlm_loss)": achieved,
                  "inside": inside}], "prediction", formats={
        "predicted": ".4f", "low": ".4f", "high": ".4f", "achieved (eval mlm_loss)": ".4f"})
    for record in bench.end():
        print(render(record), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
