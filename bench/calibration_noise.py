"""How far a calibration point moves with the seed: one compute level of a finished
calibration retrained with other seeds, and what that does to the level's IsoFLOP minimum.

Each point of the level (default: the calibration's highest) is trained again exactly as the
calibration trained it (shape, steps, batch, LR, overrides, FLOPs) with ``train.seed`` set to
each of ``--seeds``, and scored on the same held-out rows (eval's fixed masks). Printed: per
shape the calibration's loss (seed 0) and each seed's, the spread (largest − smallest); and
per seed the level's minimum (the parabola's vertex in ln N, clamped and named at an edge, as
the planner computes it). The seed-to-seed spread is the noise floor under the calibration's
fit: differences between calibrations smaller than it are not a cause to look for.
Resumable (a sweep dir of its own: finished points are kept in WORK/points.jsonl, trained by the
sweep's own `train_points`); run it alone for honest wall times.

    python bench/calibration_noise.py --calibration CAL_DIR [--level 9e12] [--seeds 1,2] [--jobs 2]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from common import ROOT, Bench, parser
from table import render


def main(argv: list[str] | None = None) -> int:
    from shoestring.config import EvalConfig

    ap = parser(__doc__)
    ap.add_argument("--calibration", type=Path, required=True,
                    help="a calibration dir (points.jsonl and sweep.json, as plan --calibrate "
                         "writes them)")
    ap.add_argument("--level", type=float, default=None,
                    help="the compute level in FLOPs (default: the calibration's highest)")
    ap.add_argument("--seeds", default="1,2", help="seeds to retrain with, comma-separated")
    ap.add_argument("--jobs", type=int, default=2, help="points trained at once, one thread each")
    ap.add_argument("--eval-sequences", type=int, default=EvalConfig().max_sequences,
                    help="held-out rows scored (the calibration's: eval's default unless "
                         "--eval-sequences was given to it)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "calibration_noise")
    args = ap.parse_args(argv)
    from shoestring.plan import fit as F
    from shoestring import families
    from shoestring.plan.sweep import parse_floats, read_points, train_points

    spec = json.loads((args.calibration / "sweep.json").read_text(encoding="utf-8"))
    points = read_points(args.calibration)
    level = args.level or max(p["budget_flops"] for p in points)
    points = sorted((p for p in points if math.isclose(p["budget_flops"], level, rel_tol=1e-3)),
                    key=lambda p: p["params_non_embedding"])
    if len(points) < 3:
        print(f"error: the calibration has {len(points)} points at {level:.3g} FLOPs "
              "(need 3 or more)", file=sys.stderr)
        return 2
    seeds = [int(s) for s in parse_floats(args.seeds, "--seeds")]
    bench = Bench("calibration_noise", args, precision="the trainer's (auto)", threads=1)
    keep = ("budget_flops", "shape", "model", "params", "params_non_embedding",
            "flops_per_token", "batch_size", "lr", "seq_len", "steps", "tokens", "flops")
    retrain = [{**{k: p[k] for k in keep}, "id": f"{p['id']}-seed{seed}", "seed": seed,
                "overrides": [f"train.seed={seed}"]} for seed in seeds for p in points]
    train_points(args.work, retrain, spec["data_dir"], families.get(spec["objective"]),
                 overrides=spec.get("overrides", []), eval_sequences=args.eval_sequences,
                 jobs=args.jobs)
    done = {p["id"]: p for p in read_points(args.work)}
    rows, columns = [], {0: [p["val_loss"] for p in points]}
    for seed in seeds:
        columns[seed] = [done[f"{p['id']}-seed{seed}"]["val_loss"] for p in points]
    for i, p in enumerate(points):
        losses = [columns[s][i] for s in columns]
        rows.append({"shape": p["shape"], "params_non_embedding": p["params_non_embedding"],
                     "steps": p["steps"],
                     **{f"seed {s}": columns[s][i] for s in columns},
                     "spread": max(losses) - min(losses)})
    minima = []
    for s, losses in columns.items():
        found = F.isoflop_minima([{**p, "val_loss": v} for p, v in zip(points, losses)])
        m = found[0] if found else None
        minima.append({"seed": s, "minimum_params": m.params if m else None,
                       "edge": (m.edge or "inside") if m else "none",
                       "best_shape": min(zip(losses, (p["shape"] for p in points)))[1]})
    spreads = sorted(r["spread"] for r in rows)
    notes = [f"level {level:.3g} FLOPs of {args.calibration}; seed 0 is the calibration's own "
             f"run; {args.eval_sequences:,} held-out rows",
             f"spread across seeds: median {spreads[len(spreads) // 2]:.4f}, largest "
             f"{spreads[-1]:.4f} nats"]
    formats = {"params_non_embedding": ",", "spread": ".4f",
               **{f"seed {s}": ".4f" for s in columns}}
    bench.table(rows, "losses", formats=formats, notes=notes)
    bench.table(minima, "minima", formats={"minimum_params": ",.0f"})
    for record in bench.end():
        print(render(record), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
