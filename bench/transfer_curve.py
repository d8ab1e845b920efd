"""What pretraining buys downstream: dev scores after 0, 10, 30 and 90 minutes of pretraining.

For each pretraining budget the default recipe (`shoestring train` defaults, `cram` dims)
trains on `mixed-en.jsonl`; each run is fine-tuned on GLUE CoLA, SST-2 and MRPC with the
`sane` protocol and the same seeds. Minute 0 is the from-scratch control (the same
architecture, random initialization, same fine-tuning code and seeds: `--control scratch`);
every other budget is compared with it seed by seed (eval/control.py: mean paired difference,
95% t interval, verdict). The answer it prints: how many CPU-minutes until pretraining beats
scratch, and by how much.

Each run is its own process (bench/jobs.py): `--threads 1 --parallel 2` trains two budgets
side by side on a 2-core machine, one core each, so the minutes are then core-minutes.

The work is resumable, so a curve longer than one session finishes over several: a finished
pretraining run (its `final/`) is reused, an interrupted one resumes from its newest
checkpoint (`train --resume`), a fine-tuning result already in `OUT/<run>/downstream/`
(complete) is reused, and an interrupted one keeps its finished tasks (`eval --resume`). Run
it again with the same arguments to continue.

    python bench/transfer_curve.py                                   # 0,10,30,90 min
    python bench/transfer_curve.py --budgets 0,10 --max-train 2000 --seeds 3
    python bench/transfer_curve.py --budgets 90 --preset mini        # one larger preset
    python bench/transfer_curve.py --threads 1 --parallel 2          # core-minutes, 2 at a time
    python bench/transfer_curve.py --budgets 90 --tasks sst2 --seeds 3 --protocol sweep
        # both arms at their best fine-tuning LR × batch (chosen on dev, so optimistic)
    python bench/transfer_curve.py --budgets 90 --preset mini --threads 1 --parallel 2 \
        --finetune-threads 2     # a lone timed run on one core, its fine-tunes on both after

Prints the machine, precision and load average, and one row per (budget, task).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console

from common import ROOT, SHARED, Bench, parser
from jobs import Scheduler, finished_downstream, pretrain, write_table
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.prep.prep import prep
from shoestring.errors import ShoestringError
from shoestring.eval.control import compare_arms
from shoestring.eval.downstream import evaluate_downstream
from shoestring.eval.downstream_report import fmt_difference, sweep_choice

console = Console(stderr=True)


def base_config(preset: str | None, threads: int | None) -> Config:
    """The default recipe, or a named preset's model (`shoestring presets`)."""
    tree: dict = {"train": {"threads": threads}}
    if preset is not None:
        tree["model"] = {"preset": preset}
    return Config.model_validate(tree)


def pretrained(cfg: Config, data: Path, run: Path, minutes: float) -> Path:
    """A finished run of ``minutes`` pretraining in ``run``: reused, resumed or started."""
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"budget": f"{minutes:g}m"})})
    pretrain(cfg, data, run, console=console)
    return run


def downstream_dir(run: Path, protocol: str) -> Path:
    """Where a run's fine-tuning with ``protocol`` goes (`sane` keeps the plain name)."""
    return run / ("downstream" if protocol == "sane" else f"downstream-{protocol}")


def finetuned(run: Path, glue: Path, tasks: str, seeds: int, max_train: int | None,
              control: str, protocol: str) -> dict:
    """The run's downstream results (reused when complete)."""
    out = downstream_dir(run, protocol)
    res = finished_downstream(out, tasks, seeds, max_train, control, protocol)
    if res is not None:
        console.print(f"reusing {out / 'results.json'}")
        return res
    return evaluate_downstream(run, glue=glue, tasks=tasks, seeds=seeds, out=out,
                               max_train=max_train, control=control, console=console,
                               protocol=protocol, resume=True)


def run_name(tag: str, minutes: float) -> str:
    return f"{tag}-{minutes:g}m"


def collect(args: argparse.Namespace, tag: str, positive: list[float]
            ) -> tuple[list[dict], list[tuple[float, str, dict]]]:
    """One row per (budget, task) whose fine-tuning is complete, compared with the scratch
    control seed by seed; and each such run's summary."""
    rows, runs, scratch = [], [], None
    for minutes in positive:
        run = args.work / run_name(tag, minutes)
        done = downstream_dir(run, args.protocol) / "results.json"
        if not done.is_file() or not json.loads(done.read_text()).get("complete"):
            continue
        res = json.loads(done.read_text())
        if scratch is None:
            if minutes != positive[0]:
                break  # the control has not run yet
            scratch_arm = {k: v["control"] for k, v in res["tasks"].items()}
            scratch = {k: v["seeds"] for k, v in scratch_arm.items()}
        summary = json.loads((run / "summary.json").read_text())
        runs.append((minutes, run.name, summary))
        for name, task in res["tasks"].items():
            split = next(iter(task["summary"]))
            cmp = compare_arms(task["seeds"], scratch[name], split)
            rows.append({"minutes": minutes, "task": name, "split": split,
                         "tokens": summary["tokens"], "tokens_per_s": summary["tokens_per_s"],
                         "dtype": summary.get("dtype"), "val_loss": summary.get("val_loss_subset"),
                         "device": summary.get("device"), "setting": task["protocol"],
                         "scratch_setting": scratch_arm[name]["protocol"],
                         "choice": sweep_choice(task),
                         "scratch_choice": sweep_choice(scratch_arm[name]), **cmp})
    return rows, runs


def report(args: argparse.Namespace, tag: str, rows: list[dict],
           runs: list[tuple[float, str, dict]], train_tokens: int, failed: list[str],
           bench: Bench) -> None:
    """Print the runs, the settings and the table; hand the table to the bench record."""
    notes = [f"pretraining: model {tag}, {args.threads or 'all'} thread(s) per run, "
             f"{args.parallel} run(s) at a time"
             + ("; minutes are core-minutes" if args.threads == 1 else "")]
    for minutes, name, s in runs:
        notes.append(
            f"{minutes:>5g} {name}: {s['params'] / 1e6:.1f}M params "
            f"({s['params_non_embedding'] / 1e6:.1f}M non-embedding), {s['tokens_per_s']:,.0f} "
            f"tok/s, MFU {s['mfu']:.2f} of the measured peak, {s['dtype']}, "
            f"{s['total_flops']:.3g} FLOPs, "
            f"{s['tokens'] / train_tokens:.1f} passes over the {train_tokens / 1e6:.2f}M-token "
            f"train split")
    notes.append(
        f"fine-tuning: {args.protocol} protocol, {args.seeds} seeds, "
        f"{args.finetune_threads or args.threads or 'all'} thread(s) per job, "
        f"{'first ' + str(args.max_train) + ' train rows' if args.max_train else 'full train sets'};"
        f" scratch = same architecture from random init, paired by seed")
    print("\n".join(notes))
    print(f"{'min':>5} {'task':6} {'tokens':>11} {'val MLM':>8} {'pretrained':>10} "
          f"{'scratch':>8}  pretrained − scratch [95% CI]  verdict")
    for r in rows:
        vl = f"{r['val_loss']:.3f}" if r["val_loss"] is not None else "–"
        print(f"{r['minutes']:>5g} {r['task']:6} {r['tokens']:>11,} {vl:>8} "
              f"{r['pretrained_median']:>10.1f} {r['scratch_median']:>8.1f}  "
              f"{fmt_difference(r):<28} {r['verdict']}")
    if args.protocol == "sweep":
        print("settings chosen on dev:")
        for r in rows:
            print(f"{r['minutes']:>5g} {r['task']:6} pretrained {r['choice']}")
            print(f"{'':>5} {'':6} scratch    {r['scratch_choice']}")
    if failed:
        print(f"FAILED or not started: {', '.join(failed)} (see {args.work / 'logs'})")
    bench.table([{"min": r["minutes"], "task": r["task"], "tokens": r["tokens"],
                  "val MLM": r["val_loss"], "pretrained": r["pretrained_median"],
                  "scratch": r["scratch_median"], "pretrained − scratch [95% CI]":
                  fmt_difference(r), "verdict": r["verdict"]} for r in rows],
                formats={"min": "g", "val MLM": ".3f", "pretrained": ".1f", "scratch": ".1f"},
                notes=notes)


def main() -> None:
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=SHARED / "corpora" / "mixed-en.jsonl")
    ap.add_argument("--glue", type=Path, default=SHARED / "glue")
    ap.add_argument("--tasks", default="cola,sst2,mrpc")
    ap.add_argument("--budgets", default="0,10,30,90", help="pretraining minutes; 0 = scratch")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--protocol", choices=["sane", "sweep"], default="sane",
                    help="fine-tuning protocol (sweep: best of 6 LR × batch settings per task "
                         "and arm, chosen on dev; into OUT/<run>/downstream-sweep/)")
    ap.add_argument("--max-train", type=int, default=None,
                    help="first N training rows per task (a quicker, noisier curve)")
    ap.add_argument("--preset", default=None, help="model preset instead of the default dims")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads per run (default: torch's choice, all cores)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time")
    ap.add_argument("--finetune-threads", type=int, default=None,
                    help="CPU threads per fine-tuning job (default: --threads); a job with "
                         "more threads than --threads takes that many runs' slots")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "transfer")
    ap.add_argument("--out", type=Path, default=None, help="JSON of the table")
    ap.add_argument("--job", choices=["pretrain", "finetune"], help=argparse.SUPPRESS)
    ap.add_argument("--control", default="none", help=argparse.SUPPRESS)
    args = ap.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    cfg = base_config(args.preset, args.threads)
    tag = args.preset or "default"
    data = args.work / "data"
    if args.job == "pretrain":
        pretrained(cfg, data, args.work / run_name(tag, budgets[0]), budgets[0])
        return None
    if args.job == "finetune":
        finetuned(args.work / run_name(tag, budgets[0]), args.glue, args.tasks, args.seeds,
                  args.max_train, args.control, args.protocol)
        return None
    if not args.corpus.is_file() or not args.glue.is_dir():
        raise SystemExit(f"needs {args.corpus} and {args.glue} (see ../shared/data/README.md)")
    bench = Bench("transfer_curve", args, precision="train.precision=auto (per run below)",
                  threads=args.threads)
    console.print(f"model {tag}; seeds {args.seeds}; max-train {args.max_train}"
                  f"; threads per run {args.threads or 'all'}; {args.parallel} at a time")
    try:
        DataDir(data)
    except ShoestringError:
        prep([str(args.corpus)], data, cfg.data, curate=cfg.curate, console=console,
             overwrite=True)
    started = time.time()
    # Minute 0 is the control: the scratch arm of the smallest positive budget's run (it does
    # not depend on the pretraining), computed once.
    positive = sorted(b for b in budgets if b > 0)
    if not positive:
        positive = [min(10.0, max(budgets))]
    me = [sys.executable, __file__, "--work", str(args.work), "--glue", str(args.glue),
          "--tasks", args.tasks, "--seeds", str(args.seeds), "--protocol", args.protocol]
    me += ["--preset", args.preset] if args.preset else []
    me += ["--threads", str(args.threads)] if args.threads else []
    me += ["--max-train", str(args.max_train)] if args.max_train else []
    sched = Scheduler(args.parallel, args.threads)
    for minutes in sorted(positive, reverse=True):  # the longest first: it bounds the wall clock
        sched.add(f"pretrain-{run_name(tag, minutes)}",
                  me + ["--job", "pretrain", "--budgets", f"{minutes:g}"])
    for minutes in positive:
        control = "scratch" if minutes == positive[0] else "none"
        sched.add(f"finetune-{run_name(tag, minutes)}",
                  me + ["--job", "finetune", "--budgets", f"{minutes:g}", "--control", control],
                  after=[f"pretrain-{run_name(tag, minutes)}"], threads=args.finetune_threads)
    failed = sched.run(args.work / "logs")
    rows, runs = collect(args, tag, positive)
    print(f"\nwall {time.time() - started:.0f}s")
    report(args, tag, rows, runs, DataDir(data).manifest["splits"]["train"]["tokens"], failed,
           bench)
    bench.end()
    if args.out:
        write_table(args.out, rows, args, bench.header)


if __name__ == "__main__":
    main()
