"""Does the planner pick the right size on this machine? An IsoFLOP check on the shared corpus.

At each of two small FLOP budgets, train the planner's pick (default law) and the family
members 4× smaller and 4× larger (non-embedding parameters) to exactly that budget on the same
prepared corpus, and compare validation MLM loss. The pick is re-trained with a second seed at
the first budget to show the seed-to-seed noise. Then the law is refitted on these points
(`plan --fit`), and the refitted law's picks are printed beside the default's.

The peer here is the alternative sizes themselves: the question is whether the law's N:D split
is the best one on this data, not how fast anything runs, so FLOP budgets (not wall clock)
make the comparison independent of how loaded the shared machine is.

    python bench/planner_check.py --data /tmp/mixed-en -o /tmp/planner-check \\
        [--budgets 2.5e12,1e13] [--json out.json]

Prepare the data once with `shoestring prep ../shared/data/corpora/mixed-en.jsonl -o DATA`.
Resumable: re-running skips finished points.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from rich.console import Console

from shoestring.plan.sweep import fit_sweep, plan_points, read_points, run_sweep


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="data dir prepared from mixed-en.jsonl")
    ap.add_argument("-o", "--output", required=True, help="work dir (resumable)")
    ap.add_argument("--budgets", default="2.5e12,1e13", help="FLOP budgets, comma-separated")
    ap.add_argument("--eval-sequences", type=int, default=2048)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    console = Console(stderr=True)
    budgets = [float(x) for x in args.budgets.split(",")]
    out = Path(args.output)
    sets = ["train.tensorboard=false", "train.val_every=0"]
    load_before, t0 = _load(), time.time()

    run_sweep(args.data, out / "sweep", budgets, [0.25, 1.0, 4.0], "epoch", None, sets,
              args.eval_sequences, console)
    seed = run_sweep(args.data, out / "seed1", budgets[:1], [1.0], "epoch", None,
                     [*sets, "train.seed=1"], args.eval_sequences, console)
    points = read_points(out / "sweep")
    fitted = fit_sweep(out / "sweep")
    refit = {p["budget_flops"]: p for p in plan_points(args.data, budgets, [1.0],
                                                       str(out / "sweep" / "law.yaml"))}
    load_after = _load()

    rows, verdicts = [], []
    for c in budgets:
        pts = sorted((p for p in points if p["budget_flops"] == c),
                     key=lambda p: p["params_non_embedding"])
        best = min(pts, key=lambda p: p["val_loss"])
        pick = next(p for p in pts if p["is_pick"])
        for p in pts:
            rows.append({
                "budget_flops": c, "shape": p["shape"], "params_non_embedding":
                p["params_non_embedding"], "params": p["params"], "tokens": p["tokens"],
                "tokens_per_param": p["tokens"] / p["params_non_embedding"],
                "val_loss": p["val_loss"], "train_seconds": p["train_seconds"],
                # the family's smallest shape may be less than 4× below the pick
                "role": "pick" if p["is_pick"] else
                f"{p['params_non_embedding'] / pick['params_non_embedding']:.2g}× the pick",
            })
        verdicts.append({"budget_flops": c, "pick": pick["shape"], "best": best["shape"],
                         "gap_to_best": pick["val_loss"] - best["val_loss"],
                         "refit_pick": refit[c]["shape"]})
    noise = None
    if seed:
        a = next(p for p in points if p["budget_flops"] == budgets[0] and p["is_pick"])
        noise = abs(seed[0]["val_loss"] - a["val_loss"])
    law = fitted["law"]
    result = {
        "rows": rows, "verdicts": verdicts, "seed_noise": noise,
        "refit_law": {"E": law.E, "A": law.A, "B": law.B, "alpha": law.alpha, "beta": law.beta},
        "load_before": load_before, "load_after": load_after,
        "wall_s": round(time.time() - t0, 1),
    }
    print("| budget (FLOPs) | role | shape | non-emb params | tokens | tokens/param "
          "| val MLM loss |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['budget_flops']:.3g} | {r['role']} | {r['shape']} | "
              f"{r['params_non_embedding']:,} | {r['tokens']:,} | {r['tokens_per_param']:.1f} | "
              f"{r['val_loss']:.4f} |")
    for v in verdicts:
        print(f"C={v['budget_flops']:.3g}: pick {v['pick']}, best {v['best']}, pick − best = "
              f"{v['gap_to_best']:+.4f} nats; refitted law picks {v['refit_pick']}")
    if noise is not None:
        print(f"seed-to-seed difference of the pick at C={budgets[0]:.3g}: {noise:.4f} nats")
    print(f"refitted law: E={law.E:.3g} A={law.A:.3g} B={law.B:.3g} α={law.alpha:.3f} "
          f"β={law.beta:.3f} ({len(points)} points for 5 constants: indicative only)")
    print(f"load average before: {load_before}; after: {load_after}; wall {result['wall_s']}s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
