"""How much a calibration point's loss depends on its LR schedule (issue 51).

A learning-curve calibration (`plan --calibrate --curves`) makes every point of a size a
cool-down branch of one constant-LR trunk, so all of them share the trunk's warmup, which
has to end before the lowest level's branch starts. This trains one calibration point — a
shape at a FLOP level, with the batch and LR its calibration gave it — from scratch under
several schedules and scores each on the same held-out rows with eval's fixed masks, so the
spread says how far a shared short warmup moves a point against the recipe's one-cycle
schedule (the final run's) and against a WSD run with a longer warmup.

    python bench/calibration_schedules.py --data DATA --shape 2x128 --steps 952 \\
        --batch 16 --lr 0.0026 --jobs 2 [--json out.json]

Each schedule is `train.schedule=S train.warmup=W train.decay=D` (``--schedules``, ``;``
between them). The runs are step-budgeted, so the losses do not depend on the load.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from common import Bench, parser

DEFAULT_SCHEDULES = ("one-cycle; wsd 0.024 0.2; wsd 0.05 0.2; wsd 0.1 0.4; wsd 0.3 0.2")


def _shape(text: str) -> dict[str, int]:
    layers, hidden = (int(x) for x in text.lower().replace("×", "x").split("x"))
    return {"num_layers": layers, "hidden_size": hidden, "num_heads": max(1, hidden // 64),
            "intermediate_size": 2 * hidden}


def _one(args: tuple[str, dict[str, int], int, int, float, str, str, int]) -> dict[str, Any]:
    data, shape, steps, batch, lr, schedule, work, eval_rows = args
    import torch
    from rich.console import Console

    from shoestring import families
    from shoestring.config import load_config
    from shoestring.data.datadir import DataDir
    from shoestring.eval.held_out import held_out_loss
    from shoestring.train.loop import train

    torch.set_num_threads(1)
    parts = schedule.split()
    sets = [f"model.{k}={v}" for k, v in shape.items()] + [
        f"train.steps={steps}", "train.budget=null", f"train.batch_size={batch}",
        f"train.lr={lr}", "train.val_every=0", "train.tensorboard=false",
        f"train.schedule={parts[0]}"]
    if len(parts) == 3:
        sets += [f"train.warmup={parts[1]}", f"train.decay={parts[2]}"]
    run = Path(work) / schedule.replace(" ", "_")
    quiet = Console(stderr=True, quiet=True)
    summary = train(load_config(None, sets), data, run, overwrite=True, console=quiet)
    loss = held_out_loss(families.MLM, run, eval_rows, DataDir(data).seq_len, quiet)
    warm = round(float(parts[1]) * steps) if len(parts) == 3 else None
    return {"schedule": schedule, "warmup_steps": warm, "held_out_loss": loss,
            "final_train_loss": summary.get("final_train_loss"),
            "train_seconds": summary.get("train_seconds")}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--data", required=True, help="prepared MLM data dir")
    ap.add_argument("--shape", default="2x128", help="LAYERSxHIDDEN (FFN 2× hidden, heads of 64)")
    ap.add_argument("--steps", type=int, default=952)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.0026)
    ap.add_argument("--schedules", default=DEFAULT_SCHEDULES)
    ap.add_argument("--eval-sequences", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, one thread each")
    ap.add_argument("--work", default="runs/bench/calibration-schedules")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    bench = Bench("calibration_schedules", args, precision="auto (the trainer's choice)")
    schedules = [s.strip() for s in args.schedules.split(";") if s.strip()]
    jobs = [(args.data, _shape(args.shape), args.steps, args.batch, args.lr, s, args.work,
             args.eval_sequences) for s in schedules]
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        rows = list(pool.map(_one, jobs))
    best = min(r["held_out_loss"] for r in rows)
    for r in rows:
        r["vs_best"] = r["held_out_loss"] - best
        print(f"{r['schedule']:<16} warmup {r['warmup_steps'] or '–':>5} steps  held-out "
              f"{r['held_out_loss']:.4f} ({r['vs_best']:+.4f})  {r['train_seconds']:.0f} s",
              flush=True)
    bench.table(rows, f"{args.shape}, {args.steps} steps × {args.batch}, peak LR {args.lr}",
                formats={"held_out_loss": ".4f", "final_train_loss": ".4f", "vs_best": "+.4f",
                         "train_seconds": ".0f"})
    bench.end()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
