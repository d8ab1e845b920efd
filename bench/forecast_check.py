"""How good is a run's own forecast of its final held-out loss: runs on several corpora, each
`shoestring train` as a user starts it, the forecasts it printed at 10%, 25% and 50% of its
budget against the held-out loss it then reached.

The forecast's code fits nothing across runs (each run is fitted on its own curve), so every
corpus here is one it has not seen. For each (corpus, objective, schedule, budget) a data dir
is prepared once (``OUT/data/``, reused) and one run trains with a wall-clock budget and the
default recipe (`shoestring train` defaults; `--schedule` picks another LR shape). Each run is
its own process: `--threads 1 --parallel 2` trains two side by side on a 2-core machine, so
the minutes are core-minutes. A finished run (its summary.json) is reused on a rerun.

    python bench/forecast_check.py                                  # 10 minutes, 2 corpora
    python bench/forecast_check.py --minutes 10,30 --objectives mlm,clm
    python bench/forecast_check.py --schedules one-cycle,wsd,cosine --minutes 3
    python bench/forecast_check.py --corpus /path/a.jsonl --corpus /path/b.txt
    python bench/forecast_check.py --cost    # how its cost grows with a run's steps (no training)

Prints the machine and load, one row per run (error of each forecast as a fraction of the
achieved loss, `*` where the 90% interval missed), and per forecast point the median and
largest |error| and the interval's coverage.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from common import SHARED, Bench, parser
from jobs import Scheduler, log

POINTS = (0.10, 0.25, 0.50)


def _corpora(given: list[str] | None) -> list[Path]:
    if given:
        return [Path(c) for c in given]
    found = [SHARED / "corpora" / "mixed-en.jsonl", SHARED / "corpora" / "wikitext2-valid.raw.txt"]
    missing = [p for p in found if not p.is_file()]
    if missing:
        sys.exit(f"error: {missing[0]} not found: pass --corpus FILE (two or more)")
    return found


def cost_table(bench: Bench) -> None:
    """The forecast's own cost against a run's length: a synthetic curve of 1k to 100k steps
    fed step by step (the per-step bookkeeping the loop pays) and one forecast at its half
    (the bins are capped, so the fit's cost should not grow; the steps to come are walked)."""
    import time

    import numpy as np

    from shoestring.config import TrainConfig
    from shoestring.train import forecast as F
    from shoestring.train.schedule import lr_factor

    rows = []
    for steps in (1_000, 10_000, 100_000):
        cfg = TrainConfig(budget=None, steps=steps)
        curve, rng = F.Curve(), np.random.default_rng(0)
        factors = [lr_factor(cfg, (k + 1) / steps) for k in range(steps // 2)]
        start = time.perf_counter()
        for k, f in enumerate(factors):
            curve.add(f, 3 + 4 * (k + 1) ** -0.4 + float(rng.normal(0, 0.05)))
            curve.progressed((k + 1) / steps)
        per_step = (time.perf_counter() - start) / len(factors)
        start = time.perf_counter()
        F.forecast(curve, F.future_factors(cfg, curve, 0.5), 0.5)
        rows.append({"steps": steps, "bins": len(curve.bins),
                     "per step (us)": per_step * 1e6,
                     "forecast at 50% (s)": time.perf_counter() - start})
        print(json.dumps(rows[-1]), flush=True)
    bench.table(rows, "cost", {"per step (us)": ".1f", "forecast at 50% (s)": ".2f"})


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--cost", action="store_true", help="only the cost-vs-steps table")
    ap.add_argument("--corpus", action="append", help="a text/jsonl file (repeatable); default: "
                    "the shared mixed-en.jsonl and wikitext2-valid.raw.txt")
    ap.add_argument("--minutes", default="10", help="wall-clock budgets, comma-separated")
    ap.add_argument("--objectives", default="mlm")
    ap.add_argument("--schedules", default="one-cycle")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/forecast"))
    args = ap.parse_args()
    bench = Bench("forecast_check", args, threads=args.threads)
    if args.cost:
        cost_table(bench)
        bench.end()
        return 0
    out = args.out
    sched = Scheduler(args.parallel, args.threads)
    runs = []
    for corpus in _corpora(args.corpus):
        for objective in args.objectives.split(","):
            data = out / "data" / f"{corpus.stem}-{objective}"
            prep_job = f"prep-{data.name}"
            if not (data / "manifest.json").is_file():
                sched.add(prep_job, [sys.executable, "-m", "shoestring", "prep", str(corpus),
                                     "-o", str(data), "--objective", objective,
                                     "--overwrite"])
            for schedule in args.schedules.split(","):
                for minutes in args.minutes.split(","):
                    name = f"{data.name}-{schedule}-{minutes}m"
                    run = out / "runs" / name
                    runs.append((name, corpus.name, objective, schedule, minutes, run))
                    if (run / "summary.json").is_file():
                        log(f"reusing {run}")
                        continue
                    sched.add(name, [
                        sys.executable, "-m", "shoestring", "train", "-d", str(data),
                        "-o", str(run), "--budget", f"{minutes}m", "--overwrite",
                        "--set", f"model.objective={objective}",
                        "--set", f"train.schedule={schedule}",
                        "--set", f"train.threads={args.threads}"], after=[prep_job])
    failed = sched.run(out / "logs")
    rows, errors = [], {p: [] for p in POINTS}
    for name, corpus, objective, schedule, minutes, run in runs:
        if not (run / "summary.json").is_file():
            continue
        s = json.loads((run / "summary.json").read_text())
        found = s.get("forecast") or {}
        row = {"corpus": corpus, "objective": objective, "schedule": schedule,
               "minutes": float(minutes), "steps": s["steps"], "achieved": found.get("achieved")}
        for p in found.get("points", []):
            key = f"at {p['at']:.0%}"
            if "error" in p:
                row[key] = f"{p['error']:+.2%}{'' if p['covered'] else '*'}"
                errors[p["at"]].append((abs(p["error"]), p["covered"]))
            else:
                row[key] = "none"
        row["forecast s"] = sum(p.get("seconds", 0.0) for p in found.get("points", []))
        row["share of run"] = f"{row['forecast s'] / max(s['train_seconds'], 1e-9):.2%}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = [{"point": f"{p:.0%}", "runs": len(e),
                "median |error|": f"{statistics.median(x for x, _ in e):.2%}" if e else "—",
                "max |error|": f"{max(x for x, _ in e):.2%}" if e else "—",
                "covered": f"{sum(c for _, c in e)} of {len(e)}"} for p, e in errors.items()]
    for r in summary:
        print(json.dumps(r))
    notes = ["each run: `shoestring train --budget Nm` with the default recipe, one thread; "
             "the error is (forecast − achieved) / achieved of the final validation loss "
             "(the fixed subset the run's validations use); * = outside the 90% interval"]
    bench.table(rows, "runs", {"achieved": ".3f", "forecast s": ".2f"}, notes)
    bench.table(summary, "points")
    bench.end()
    if failed:
        print(f"failed: {', '.join(failed)} (see {out / 'logs'})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
