"""What `sweep --jobs` buys: the same FLOP-budgeted IsoFLOP sweep trained one point at a time
(all cores each) and N at a time (cores / N each), side by side on one machine.

Each round trains the same points (the sizes around the law's pick at each ``--budgets``
level) into a fresh sweep dir, once with ``--jobs 1`` and once with ``--jobs N``, the order
alternating between rounds; printed per round and arm: the wall time, the points' summed
training seconds and their held-out losses, so the table shows both the speed-up and that the
losses agree (FLOP budgets: only the summation order of the threads differs). Run it alone:
two cores shared with other work measure the other work.

    python bench/sweep_jobs.py --data DATA [--budgets 2e12,6e12] [--jobs 2] [--rounds 2]

DATA is any prepared data dir, e.g. `shoestring prep builtin:pydocs -o runs/data/pydocs`.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from common import ROOT, Bench, parser
from rich.console import Console
from table import render


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--data", required=True, help="prepared data dir")
    ap.add_argument("--budgets", default="2e12,6e12", help="FLOP levels, comma-separated")
    ap.add_argument("--sizes", default="0.5,1,2", help="sizes as factors of the law's pick")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--eval-sequences", type=int, default=512)
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "sweep_jobs")
    args = ap.parse_args(argv)
    from shoestring.plan.sweep import parse_floats, run_sweep

    budgets = parse_floats(args.budgets, "--budgets")
    sizes = parse_floats(args.sizes, "--sizes")
    bench = Bench("sweep_jobs", args, precision="the trainer's (auto)")
    quiet = Console(stderr=True, quiet=True)
    rows = []
    for r in range(args.rounds):
        order = [1, args.jobs] if r % 2 == 0 else [args.jobs, 1]
        for jobs in order:
            out = args.work / f"round{r}-jobs{jobs}"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            points = run_sweep(args.data, out, budgets, sizes, overrides=[
                "train.val_every=0", "train.tensorboard=false"],
                eval_sequences=args.eval_sequences, console=quiet, floor=False, jobs=jobs)
            wall = time.perf_counter() - t
            points.sort(key=lambda p: p["id"])
            rows.append({"round": r, "jobs": jobs, "points": len(points), "wall s": wall,
                         "train s (sum)": sum(p["train_seconds"] or 0 for p in points),
                         "losses": " ".join(f"{p['val_loss']:.3f}" for p in points)})
            print(f"round {r} jobs {jobs}: {len(points)} points in {wall:.0f} s",
                  file=sys.stderr, flush=True)
    walls = {j: sorted(x["wall s"] for x in rows if x["jobs"] == j) for j in (1, args.jobs)}
    median = {j: w[len(w) // 2] for j, w in walls.items()}
    bench.table(rows, formats={"wall s": ".0f", "train s (sum)": ".0f"}, notes=[
        f"median wall: jobs 1 {median[1]:.0f} s, jobs {args.jobs} {median[args.jobs]:.0f} s: "
        f"{median[1] / median[args.jobs]:.2f}x"])
    for record in bench.end():
        print(render(record), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
