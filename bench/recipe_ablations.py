"""Recipe ablations at equal wall clock, Cramming-style: one change against the default.

Every arm pretrains for the same wall clock (`--budget`, default 10 minutes) on
`mixed-en.jsonl` with `--threads` CPU threads, `--parallel` arms at a time (two one-thread
arms on a 2-core machine: each arm gets one core, and the machine does twice the work of one
two-thread run). Each arm changes one thing against the defaults:

    default          the defaults (`Config()`)
    default-seed1    the defaults with train.seed=1: the noise floor of the table
    mask15 / mask40  train.mask_rate 0.15 (BERT) / 0.40 (Wettig et al. 2023)
    lr1e-3 / lr4e-3  peak LR halved / doubled (default 2e-3)
    wsd              schedule warmup-stable-decay (5% warmup, 20% 1-sqrt cool-down)
    peak50           one-cycle peaking at 50% of the budget (default 75%)
    seq64            64-token sequences, batch 64 (the same tokens per step)
    ramp             batch ramp: 16 → 32 sequences over the first 60% (Cramming)
    plan             model shape, batch and LR from `shoestring plan` for this budget and core
    curated          Gopher quality + repetition filters and fuzzy dedup (default: exact dedup)
    mask40-seed1, lr4e-3-seed1, mask40-lr4e-3, mask40-lr4e-3-seed1
                     replicates of the two changes that won the first pass, and both together
    peak50-seed1     the first pass's fine-tuning candidate replicated (second pass, run on
                     the new defaults in its own --work: the `default` arm is the defaults of
                     the code that runs it)
    seq64-seed1, curated-seed1
                     the first pass's other two candidates, replicated (second pass: with
                     `seq64` and `curated` in the same --work they are two seeds each)

Scores per arm: held-out MLM loss on one common evaluation set (the default data's val split,
128-token rows; every arm shares the default tokenizer, so the losses compare), then
fine-tuning on CoLA, SST-2 and MRPC (sane protocol, `--seeds` seeds, first `--max-train`
rows) with the from-scratch control of its architecture, paired by seed (eval/control.py).

Resumable: finished runs and complete downstream results are reused; run it again with the
same arguments to continue.

    python bench/recipe_ablations.py                       # all arms, 10 minutes each
    python bench/recipe_ablations.py --arms default,mask40 --budget 2m --max-train 500
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import ROOT, SHARED, Bench, parser
from jobs import Scheduler, finished_downstream, log, pretrain

# name → (what changes, --set overrides, data variant)
ARMS: dict[str, tuple[str, list[str], str]] = {
    "default": ("the defaults", [], "default"),
    "default-seed1": ("train.seed=1 (noise floor)", ["train.seed=1"], "default"),
    "mask15": ("mask rate 0.15", ["train.mask_rate=0.15"], "default"),
    "mask40": ("mask rate 0.40", ["train.mask_rate=0.40"], "default"),
    "lr1e-3": ("peak LR 1e-3", ["train.lr=1e-3"], "default"),
    "lr4e-3": ("peak LR 4e-3", ["train.lr=4e-3"], "default"),
    "wsd": ("schedule wsd", ["train.schedule=wsd"], "default"),
    "peak50": ("one-cycle peak at 50%", ["train.lr_peak_at=0.5"], "default"),
    "seq64": ("64-token rows, batch 64", ["data.seq_len=64", "train.batch_size=64"], "seq64"),
    "ramp": ("batch ramp 16→32 over 60%",
             ["train.micro_batch_size=16", "train.batch_ramp=0.6"], "default"),
    "plan": ("shape/batch/LR from `plan`", [], "default"),
    "curated": ("gopher filters + fuzzy dedup", [], "curated"),
    # replicates and the combination of the two changes that beat the default in the first pass
    "mask40-seed1": ("mask rate 0.40, seed 1", ["train.mask_rate=0.40", "train.seed=1"], "default"),
    "lr4e-3-seed1": ("peak LR 4e-3, seed 1", ["train.lr=4e-3", "train.seed=1"], "default"),
    "mask40-lr4e-3": ("mask 0.40 and LR 4e-3", ["train.mask_rate=0.40", "train.lr=4e-3"],
                      "default"),
    "mask40-lr4e-3-seed1": ("mask 0.40 and LR 4e-3, seed 1",
                            ["train.mask_rate=0.40", "train.lr=4e-3", "train.seed=1"], "default"),
    # the second pass, on the new defaults (mask 0.40): the first pass's candidate, replicated
    "peak50-seed1": ("one-cycle peak at 50%, seed 1", ["train.lr_peak_at=0.5", "train.seed=1"],
                     "default"),
    "seq64-seed1": ("64-token rows, batch 64, seed 1",
                    ["data.seq_len=64", "train.batch_size=64", "train.seed=1"], "seq64"),
    "curated-seed1": ("gopher filters + fuzzy dedup, seed 1", ["train.seed=1"], "curated"),
}
# data variant → overrides of its prep (all but `default` reuse the default's tokenizer)
VARIANTS: dict[str, list[str]] = {
    "default": [],
    "seq64": ["data.seq_len=64"],
    "curated": ["curate.filters=gopher", "curate.dedup=fuzzy"],
}


def _config(overrides: list[str], plan: Path | None = None):  # noqa: ANN202
    from shoestring.config import load_config

    return load_config(overrides=overrides, plan=plan)


def prepare(variant: str, corpus: Path, work: Path) -> Path:
    """The data dir of one variant (reused when already built)."""
    from shoestring.data.datadir import DataDir
    from shoestring.prep.prep import prep
    from shoestring.errors import ShoestringError

    out = work / f"data-{variant}"
    try:
        DataDir(out)
        return out
    except ShoestringError:
        pass
    extra = [] if variant == "default" else \
        [f"data.tokenizer={work / 'data-default' / 'tokenizer.json'}"]
    cfg = _config(VARIANTS[variant] + extra)
    log(f"prep {variant}")
    prep([str(corpus)], out, cfg.data, curate=cfg.curate, overwrite=True)
    return out


def make_plan_file(work: Path, budget: str, threads: int) -> Path:
    """`shoestring plan` for this budget on `threads` threads of this machine (measured)."""
    out = work / "plan.yaml"
    if not out.is_file():
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        subprocess.run([sys.executable, "-m", "shoestring", "plan", "-b", budget, "-d",
                        str(work / "data-default"), "-o", str(out)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    return out


def arm_config(arm: str, work: Path, budget: str, threads: int):  # noqa: ANN201
    """The arm's full config: defaults ← its change ← equal wall clock and thread count."""
    plan = work / "plan.yaml" if arm == "plan" else None
    common = [f"train.budget={budget}", "train.steps=null", f"train.threads={threads}"]
    return _config(ARMS[arm][1] + common, plan=plan)


def run_pretrain(arm: str, work: Path, budget: str, threads: int) -> None:
    """Pretrain one arm (resumed from its newest checkpoint, or reused when finished), then
    score it on the common evaluation set."""
    from shoestring.eval.mlm_loss import evaluate_run

    run = work / arm
    pretrain(arm_config(arm, work, budget, threads), work / f"data-{ARMS[arm][2]}", run)
    if not (run / "eval-common.json").is_file():
        res = evaluate_run(run, work / "data-default")
        (run / "eval-common.json").write_text(json.dumps(res))


def scratch_owner(arm: str) -> str:
    """The arm whose from-scratch control this arm is compared with (same architecture)."""
    return "plan" if arm == "plan" else "default"


def run_finetune(arm: str, work: Path, glue: Path, tasks: str, seeds: int,
                 max_train: int | None) -> None:
    """Fine-tune one arm (with the scratch control when it owns one); reused when complete."""
    from shoestring.eval.downstream import evaluate_downstream

    out = work / arm / "downstream"
    control = "scratch" if scratch_owner(arm) == arm else "none"
    if finished_downstream(out, tasks, seeds, max_train, control) is not None:
        return
    evaluate_downstream(work / arm, glue=glue, tasks=tasks, seeds=seeds, out=out,
                        max_train=max_train, control=control, resume=True)


def _first_split(task: dict[str, Any]) -> str:
    return next(iter(task["summary"]))


def report(work: Path, arms: list[str]) -> list[dict]:
    """One row per arm: tokens, losses, downstream medians and the paired comparisons."""
    from shoestring.eval.control import compare_arms

    def downstream(arm: str) -> dict | None:
        p = work / arm / "downstream" / "results.json"
        return json.loads(p.read_text()) if p.is_file() else None

    rows = []
    for arm in arms:
        run = work / arm
        if not (run / "summary.json").is_file():
            continue
        s = json.loads((run / "summary.json").read_text())
        common = json.loads((run / "eval-common.json").read_text())
        row: dict[str, Any] = {"arm": arm, "change": ARMS[arm][0], "tokens": s["tokens"],
                               "tokens_per_s": s["tokens_per_s"], "steps": s["steps"],
                               "own_val_loss": s.get("val_loss_subset"),
                               "common_val_loss": common["mlm_loss"], "tasks": {}}
        res, owner = downstream(arm), downstream(scratch_owner(arm))
        base = downstream("default")
        if res and owner and res.get("complete") and owner.get("complete"):
            for name, task in res["tasks"].items():
                split = _first_split(task)
                scratch = owner["tasks"][name]["control"]["seeds"]
                cmp = compare_arms(task["seeds"], scratch, split)
                vs_default = (compare_arms(task["seeds"], base["tasks"][name]["seeds"], split)
                              if base and base.get("complete") and arm != "default" else None)
                row["tasks"][name] = {"split": split, "vs_scratch": cmp, "vs_default": vs_default}
            meds = [t["vs_scratch"]["pretrained_median"] for t in row["tasks"].values()]
            row["downstream_mean"] = float(np.mean(meds))
            row["scratch_mean"] = float(np.mean([t["vs_scratch"]["scratch_median"]
                                                 for t in row["tasks"].values()]))
        rows.append(row)
    return rows


def table_rows(rows: list[dict], names: list[str]) -> list[dict]:
    """The table's rows (``report``'s rows, one column per printed figure): the paired
    differences as text, ``~`` when every task's 95% interval contains zero."""
    base = next((r for r in rows if r["arm"] == "default"), None)
    out = []
    for r in rows:
        d = r["common_val_loss"] - base["common_val_loss"] if base else float("nan")
        row = {"arm": r["arm"], "tokens": r["tokens"], "tok/s": r["tokens_per_s"],
               "val MLM": r["common_val_loss"], "Δ vs def": d}
        for n in names:
            t = r["tasks"].get(n)
            row[n] = t["vs_scratch"]["pretrained_median"] if t else None
        row["mean"] = r.get("downstream_mean")
        vs = [t["vs_scratch"] for t in r["tasks"].values()]
        vd = [t["vs_default"] for t in r["tasks"].values() if t["vs_default"]]
        row["−scratch"] = _difference(vs) if row["mean"] is not None else None
        row["−default"] = _difference(vd) if row["mean"] is not None and vd else None
        out.append(row)
    return out


def _difference(comparisons: list[dict]) -> str:
    mean = np.mean([c["difference_mean"] for c in comparisons])
    return f"{mean:+.1f}" + ("~" if all(c["within_noise"] for c in comparisons) else "")


def _flagged(cell: str) -> str:
    """A difference cell in the printed layout: the number in 8 columns, then ``~`` or a blank."""
    return f"{cell.rstrip('~'):>8}{'~' if cell.endswith('~') else ' '}"


def print_table(rows: list[dict], args: argparse.Namespace) -> list[str]:
    """Print the table of `table_rows`; returns its setting lines (the record's notes)."""
    notes = [f"pretraining: {args.budget} wall clock per arm, {args.threads} thread(s) per arm, "
             f"{args.parallel} arm(s) at a time, mixed-en.jsonl",
             f"fine-tuning: sane protocol, {args.seeds} seeds, "
             f"{'first ' + str(args.max_train) + ' train rows' if args.max_train else 'full train sets'}"
             f", tasks {args.tasks}; scratch = same architecture from random init, paired by seed",
             "common val = the default data's val split (128-token rows, one tokenizer); "
             "'~' = the 95% interval contains zero"]
    print("\n" + "\n".join(notes))
    names = args.tasks.split(",")
    head = f"{'arm':20} {'tokens':>10} {'tok/s':>6} {'val MLM':>8} {'Δ vs def':>8}"
    head += "".join(f" {n:>7}" for n in names) + f" {'mean':>6} {'−scratch':>9} {'−default':>9}"
    print(head)
    for row in rows:
        line = (f"{row['arm']:20} {row['tokens']:>10,} {row['tok/s']:>6,.0f} "
                f"{row['val MLM']:>8.3f} {row['Δ vs def']:>+8.3f}")
        line += "".join(f" {row[n]:>7.1f}" if row[n] is not None else f" {'–':>7}"
                        for n in names)
        if row["mean"] is not None:
            line += f" {row['mean']:>6.1f} " + _flagged(row["−scratch"])
            if row["−default"] is not None:
                line += " " + _flagged(row["−default"])
        print(line)
    notes.append("−scratch / −default: mean over tasks of the mean paired difference (points); "
                 "'~' when every task's 95% interval contains zero")
    print("\n" + notes[-1])
    return notes


def main() -> None:
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=SHARED / "corpora" / "mixed-en.jsonl")
    ap.add_argument("--glue", type=Path, default=SHARED / "glue")
    ap.add_argument("--tasks", default="cola,sst2,mrpc")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--budget", default="10m", help="wall clock per arm")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per arm")
    ap.add_argument("--parallel", type=int, default=2, help="arms at a time")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-train", type=int, default=2000)
    ap.add_argument("--no-finetune", action="store_true", help="pretraining and MLM loss only")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "ablations")
    ap.add_argument("--out", type=Path, default=None, help="JSON of the table")
    ap.add_argument("--job", choices=["pretrain", "finetune"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; known: {', '.join(ARMS)}")
    if args.job == "pretrain":
        return run_pretrain(arms[0], args.work, args.budget, args.threads)
    if args.job == "finetune":
        return run_finetune(arms[0], args.work, args.glue, args.tasks, args.seeds, args.max_train)
    if not args.corpus.is_file() or not args.glue.is_dir():
        raise SystemExit(f"needs {args.corpus} and {args.glue} (see ../shared/data/README.md)")
    args.work.mkdir(parents=True, exist_ok=True)
    bench = Bench("recipe_ablations", args, precision="train.precision=auto (the trainer's choice)",
                  threads=args.threads)
    started = time.time()
    for variant in ["default"] + sorted({ARMS[a][2] for a in arms} - {"default"}):
        prepare(variant, args.corpus, args.work)
    if "plan" in arms:
        make_plan_file(args.work, args.budget, args.threads)
    sched = Scheduler(args.parallel, args.threads)
    me = [sys.executable, __file__, "--work", str(args.work), "--budget", args.budget,
          "--threads", str(args.threads), "--glue", str(args.glue), "--tasks", args.tasks,
          "--seeds", str(args.seeds), "--max-train", str(args.max_train)]
    for arm in arms:  # every pretraining run is queued before any fine-tuning
        sched.add(f"pretrain-{arm}", me + ["--job", "pretrain", "--arms", arm], [])
    if not args.no_finetune:
        for arm in arms:
            after = [f"pretrain-{arm}"]
            owner = scratch_owner(arm)
            if owner != arm and owner in arms:
                after.append(f"pretrain-{owner}")
            sched.add(f"finetune-{arm}", me + ["--job", "finetune", "--arms", arm], after)
    logs = args.work / "logs"
    failed = sched.run(logs)
    rows = report(args.work, arms)
    table = table_rows(rows, args.tasks.split(","))
    notes = print_table(table, args)
    print(f"wall {time.time() - started:.0f}s" + (f"; FAILED: {failed} (see {logs})" if failed else ""))
    bench.table(table, notes=notes, formats={"tok/s": ",.0f", "val MLM": ".3f", "Δ vs def": "+.3f",
                                             "mean": ".1f", **{n: ".1f" for n in args.tasks.split(",")}})
    bench.end()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "machine": bench.header,
                                        "args": {k: str(v) for k, v in vars(args).items()}},
                                       indent=1))


if __name__ == "__main__":
    main()
