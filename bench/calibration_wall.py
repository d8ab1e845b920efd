"""Does a wall-clock `plan --calibrate` stay within its share of the budget? (issue 62, major 6)

Prepares the README tour's tiny data (builtin:pydocs, vocabulary 512, sequences of 32) once
under WORK, then runs `shoestring plan --calibrate --budget BUDGET --data WORK/data
--calibration-dir WORK/cal-N` in a child process with a fresh calibration dir (so the speed is
measured again, as a first run would; `--reuse`: the last one's) and prints: the budget, the
calibration's share of it in seconds, the calibration's wall clock as the plan records it and as estimated before it ran
(at the speed measured first), their ratio, and the whole command's wall clock from outside.
With a budget too small the command's refusal (exit 2) and its suggestion are printed
instead: run again with the suggested budget to check that it then fits.

    python bench/calibration_wall.py [--budget 71m] [--share 0.15] [--curves] [--reuse]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml
from common import ROOT, Bench, parser, wall_budget
from table import render


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--budget", default="71m", type=wall_budget,
                    help="wall-clock budget, as plan --budget takes")
    ap.add_argument("--share", type=float, default=0.15, help="plan --calibrate-share")
    ap.add_argument("--curves", action="store_true", help="plan --calibrate --curves")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the last run's calibration dir (its measured speed, its points)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "calibration_wall")
    args = ap.parse_args(argv)
    budget = args.budget
    args.work.mkdir(parents=True, exist_ok=True)
    data = args.work / "data"
    shoestring = [sys.executable, "-m", "shoestring"]
    env = {**os.environ, "COLUMNS": "160"}
    if not (data / "manifest.json").is_file():
        subprocess.run([*shoestring, "prep", "builtin:pydocs", "-o", str(data), "--set",
                        "data.vocab_size=512", "--set", "data.seq_len=32"], check=True,
                       cwd=ROOT, env=env, capture_output=True)
    n = sum(1 for p in args.work.glob("cal-*")) + (0 if args.reuse else 1)
    cal, plan = args.work / f"cal-{n}", args.work / f"plan-{n}.yaml"
    cmd = [*shoestring, "plan", "--calibrate", "--budget", budget.text, "--calibrate-share",
           str(args.share), "--data", str(data), "--calibration-dir", str(cal), "-o", str(plan),
           *(["--curves"] if args.curves else [])]
    bench = Bench("calibration_wall", args, precision="the trainer's (auto)")
    log = args.work / f"plan-{n}.log"
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                              env=env).returncode
    wall = time.perf_counter() - start
    shown = " ".join(["shoestring", *cmd[3:]])
    if code == 2:
        refusal = [line for line in log.read_text(encoding="utf-8").splitlines()
                   if "error:" in line or "→" in line]
        print(f"`{shown}` refused (exit 2) after {wall:.0f} s:")
        print("\n".join(refusal))
        return 0
    if code != 0:
        print(f"error: plan --calibrate exited {code}; its output is in {log}", file=sys.stderr)
        return 1
    c = yaml.safe_load(plan.read_text(encoding="utf-8"))["plan"]["calibration"]
    rows = [{"budget s": budget.amount, "share s": args.share * budget.amount,
             "calibration s": c["wall_s"], "estimated s": c.get("estimated_wall_s"),
             "calibration / estimate": c["wall_s"] / c["estimated_wall_s"]
             if c.get("estimated_wall_s") else None,
             "within share": c["wall_s"] <= args.share * budget.amount,
             "spent before plan s": c.get("spent_before_plan_s"), "command wall s": wall,
             "points": c["points"]}]
    bench.table(rows, "cost", formats={
        "budget s": ".0f", "share s": ".0f", "calibration s": ".0f", "estimated s": ".0f",
        "calibration / estimate": ".2f", "spent before plan s": ".0f",
        "command wall s": ".0f"}, notes=[f"`{shown}`, timed from outside; output in {log}"])
    for record in bench.end():
        print(render(record), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
