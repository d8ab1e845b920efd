"""What pretraining buys downstream: dev scores after 0, 10, 30 and 90 minutes of pretraining.

For each pretraining budget the default recipe (`shoestring train` defaults, `cram` dims)
trains on `mixed-en.jsonl`; each run is fine-tuned on GLUE CoLA, SST-2 and MRPC with the
`sane` protocol and the same seeds. Minute 0 is the from-scratch control (the same
architecture, random initialization, same fine-tuning code and seeds: `--control scratch`);
every other budget is compared with it seed by seed (eval/control.py: mean paired difference,
95% t interval, verdict). The answer it prints: how many CPU-minutes until pretraining beats
scratch, and by how much.

The work is resumable, so a curve longer than one session finishes over several: a finished
pretraining run (its `final/`) is reused, an interrupted one resumes from its newest
checkpoint (`train --resume`), and a fine-tuning result already in `OUT/<run>/downstream/`
(complete) is reused. Run it again with the same arguments to continue.

    python bench/transfer_curve.py                                   # 0,10,30,90 min
    python bench/transfer_curve.py --budgets 0,10 --max-train 2000 --seeds 3
    python bench/transfer_curve.py --budgets 90 --preset small       # one larger preset

Prints the machine, precision and load average, and one row per (budget, task).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from rich.console import Console

from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.data.prep import prep
from shoestring.errors import ShoestringError
from shoestring.eval.control import compare_arms
from shoestring.eval.downstream import evaluate_downstream
from shoestring.eval.report import fmt_difference
from shoestring.fsutil import write_json_atomic
from shoestring.rundir import RunDir
from shoestring.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
console = Console(stderr=True)


from peers import cpu_name  # bench/peers.py: the CPU's model name


def base_config(preset: str | None) -> Config:
    """The default recipe, or a named preset's model (`shoestring presets`)."""
    return Config() if preset is None else Config.model_validate({"model": {"preset": preset}})


def pretrained(cfg: Config, data: Path, run: Path, minutes: float) -> Path:
    """A finished run of ``minutes`` pretraining in ``run``: reused, resumed or started."""
    rd = RunDir(run)
    if (run / "final" / "model.safetensors").is_file() and (run / "summary.json").is_file():
        console.print(f"reusing {run} (finished)")
        return run
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"budget": f"{minutes:g}m"})})
    resume = rd.is_run and bool(rd.checkpoints())
    console.print(f"{'resuming' if resume else 'training'} {run}: {minutes:g} minutes")
    train(cfg, data, run, overwrite=not resume, resume=resume, console=console)
    return run


def finetuned(run: Path, glue: Path, tasks: str, seeds: int, max_train: int | None,
              control: str) -> dict:
    """The run's downstream results (reused when complete)."""
    out = run / "downstream"
    done = out / "results.json"
    if done.is_file():
        res = json.loads(done.read_text())
        if res.get("complete") and res.get("control") == control and len(res["seeds"]) == seeds \
                and res.get("max_train") == max_train:
            console.print(f"reusing {done}")
            return res
    return evaluate_downstream(run, glue=glue, tasks=tasks, seeds=seeds, out=out,
                               max_train=max_train, control=control, console=console)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=SHARED / "corpora" / "mixed-en.jsonl")
    ap.add_argument("--glue", type=Path, default=SHARED / "glue")
    ap.add_argument("--tasks", default="cola,sst2,mrpc")
    ap.add_argument("--budgets", default="0,10,30,90", help="pretraining minutes; 0 = scratch")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-train", type=int, default=None,
                    help="first N training rows per task (a quicker, noisier curve)")
    ap.add_argument("--preset", default=None, help="model preset instead of the default dims")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "transfer")
    ap.add_argument("--out", type=Path, default=None, help="JSON of the table")
    args = ap.parse_args()
    if not args.corpus.is_file() or not args.glue.is_dir():
        raise SystemExit(f"needs {args.corpus} and {args.glue} (see ../shared/data/README.md)")
    budgets = [float(b) for b in args.budgets.split(",")]
    cfg = base_config(args.preset)
    tag = args.preset or "default"
    console.print(f"machine: {cpu_name()}, {os.cpu_count()} cores; load average "
                  f"{os.getloadavg()}; model {tag}; seeds {args.seeds}; max-train {args.max_train}")
    data = args.work / "data"
    try:
        DataDir(data)
    except ShoestringError:
        prep([str(args.corpus)], data, cfg.data, console=console, overwrite=True)
    started = time.time()
    # Minute 0 is the control: any finished run's scratch arm (it does not depend on the
    # pretraining), computed once, beside the smallest positive budget.
    positive = sorted(b for b in budgets if b > 0)
    if not positive:
        positive = [min(10.0, max(budgets))]
    rows, scratch = [], None
    for minutes in positive:
        run = pretrained(cfg, data, args.work / f"{tag}-{minutes:g}m", minutes)
        control = "scratch" if scratch is None else "none"
        res = finetuned(run, args.glue, args.tasks, args.seeds, args.max_train, control)
        if scratch is None:
            scratch = {k: v["control"]["seeds"] for k, v in res["tasks"].items()}
        summary = json.loads((run / "summary.json").read_text())
        for name, task in res["tasks"].items():
            split = next(iter(task["summary"]))
            cmp = compare_arms(task["seeds"], scratch[name], split)
            rows.append({"minutes": minutes, "task": name, "split": split,
                         "tokens": summary["tokens"], "tokens_per_s": summary["tokens_per_s"],
                         "dtype": summary.get("dtype"), "val_loss": summary.get("val_loss_subset"),
                         **cmp})
    print(f"\nmachine: {cpu_name()} ({os.cpu_count()} cores); load average at end "
          f"{tuple(round(x, 2) for x in os.getloadavg())}; wall {time.time() - started:.0f}s")
    print(f"fine-tuning: sane protocol, {args.seeds} seeds, "
          f"{'first ' + str(args.max_train) + ' train rows' if args.max_train else 'full train sets'};"
          f" scratch = same architecture from random init, paired by seed")
    print(f"{'min':>5} {'task':6} {'tokens':>11} {'val MLM':>8} {'pretrained':>10} "
          f"{'scratch':>8}  pretrained − scratch [95% CI]  verdict")
    for r in rows:
        vl = f"{r['val_loss']:.3f}" if r["val_loss"] is not None else "–"
        print(f"{r['minutes']:>5g} {r['task']:6} {r['tokens']:>11,} {vl:>8} "
              f"{r['pretrained_median']:>10.1f} {r['scratch_median']:>8.1f}  "
              f"{fmt_difference(r):<28} {r['verdict']}")
    if args.out:
        write_json_atomic(args.out, {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()},
                                     "machine": cpu_name()})


if __name__ == "__main__":
    main()
