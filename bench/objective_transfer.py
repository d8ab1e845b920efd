"""Which pretraining objective buys more downstream at equal compute: RTD against MLM, each
pretrained with several seeds and each compared with its random-init twin.

Issue 60's proof. Every arm is the default recipe (`shoestring train` defaults, `cram` dims)
with one change (``ARMS``: the objective, and for RTD the generator's size, the embedding
sharing, ELECTRA's 15% masking or a lower LR), pretrained on the same prepared corpus with the
same budget. The budget is compute (``--budget 1.2e14flops``: 30 minutes of one core for the
default MLM on the fp32 host of 2026-11-29, about 14 on a bf16 one), so a loaded machine
stretches the wall clock but not the result, and every arm spends the same FLOPs by the
model's own exact count (RTD's includes its generator and the sampling). Each run is
pretrained with ``--pretrain-seeds`` seeds (``train.seed``: the initialization, the data order
and the masking), then fine-tuned on the GLUE tasks with the `sane` protocol and ``--seeds``
fine-tuning seeds; the random twin is the same encoder shape fine-tuned from random init with
the same fine-tuning seeds (`--control scratch`, computed once: it depends on neither the
objective nor the pretraining).

The comparisons are paired: fine-tuning seed ``f`` of every arm sees the same batches, and
pretraining seed ``p`` of two arms the same data order. The unit that repeats is the
pretraining run, so a difference is averaged over the fine-tuning seeds of each pretraining
seed and its 95% interval is Student's t over the pretraining seeds (with 3 seeds, t = 4.30:
an interval that excludes zero here is a real one). Each arm is compared with the random twin
and every arm after the first with the first (``--arms mlm,rtd``: RTD − MLM).

Each run is its own process (bench/jobs.py), ``--threads 1 --parallel 2`` two side by side on
a 2-core machine. Finished runs and fine-tunings are reused and interrupted ones resumed, so
a rerun with the same arguments continues, and a rerun with more seeds or arms adds them.

    python bench/objective_transfer.py --budget 1.2e14flops --pretrain-seeds 3 --seeds 2 \\
        --max-train 1000 --threads 1 --parallel 2
    python bench/objective_transfer.py --arms rtd,rtd-m15,rtd-plain,rtd-gen4 --budget 1.2e14flops
        # the masking, the generator's size and the sharing, each against RTD as it is

A session's ``--work`` does not outlive its checkout here, and three 90-core-minute seeds do
not fit in one session, so every finished comparison is also kept in ``--ledger`` (committed:
``bench/data/objectives/``, one small JSON per pretraining run: its summary's figures, its
held-out metrics and its fine-tuning results). A run found there is neither pretrained nor
fine-tuned again, and the table is printed from the ledger and the work dir together, so
seeds run in different sessions add up to one comparison.

`--collect` prints the table from what has finished without starting anything. Prints the
machine and load, one line per pretraining run (tokens, FLOPs, tokens/s, held-out
metrics, and where it was kept) and one row per (task, comparison).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from common import ROOT, SHARED, Bench, parser
from jobs import Scheduler, pretrain, write_table
from transfer_curve import downstream_dir, finetuned
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_json_atomic
from shoestring.eval.control import seeds_needed, t95
from shoestring.prep.prep import prep
from shoestring.units import parse_budget

console = Console(stderr=True)

# Each arm: the default recipe with these settings (config sections; docs/training.md).
# RTD's own recipe (families/rtd.py) masks 15% at LR 5e-4; the MLM recipe's 40% and 2e-3
# are an arm of their own, the first RTD measured (docs/benchmarks/eval.md).
RTD = {"objective": "rtd"}  # generator 1/3 wide, full depth, GDES sharing, weight 50
ARMS: dict[str, dict[str, dict[str, Any]]] = {
    "mlm": {"model": {"objective": "mlm"}},
    "rtd": {"model": RTD},
    "rtd-m40-lr2e-3": {"model": RTD, "train": {"mask_rate": 0.4, "lr": 2e-3}},  # MLM's recipe
    "rtd-m15": {"model": RTD, "train": {"lr": 2e-3}},  # ELECTRA's masking at MLM's LR
    "rtd-lr5e-4": {"model": RTD, "train": {"mask_rate": 0.4}},  # ELECTRA's LR at MLM's masking
    "rtd-plain": {"model": {**RTD, "rtd_sharing": "plain"}},  # ELECTRA's plain sharing
    # the generator's width is whole heads: at the default 4 heads ELECTRA-Small's 1/4 and the
    # default 1/3 round to the same 1-head generator, so rtd-gen4 trains rtd's model there
    "rtd-gen4": {"model": {**RTD, "generator_width": 0.25}},  # ELECTRA-Small's 1/4
    "rtd-gen2": {"model": {**RTD, "generator_width": 0.5}},  # 2 heads of 4
}


def arm_config(arm: str, seed: int, budget: str, threads: int | None,
               preset: str | None = None) -> Config:
    """The default recipe (or a preset's model) with the arm's model settings, the
    pretraining seed and the budget."""
    arm_tree = ARMS[arm]
    model = dict(arm_tree["model"], **({"preset": preset} if preset else {}))
    train = {**arm_tree.get("train", {}), "threads": threads, "seed": seed, "budget": budget}
    return Config.model_validate({"model": model, "train": train})


def held_out(run: Path) -> dict:
    """The run's eval.json (``shoestring eval``'s held-out MLM loss, for RTD the generator's,
    and the discriminator's detection scores), computed once when missing."""
    from shoestring.eval.mlm_loss import evaluate_run

    done = run / "eval.json"
    return json.loads(done.read_text()) if done.is_file() else evaluate_run(run, console=console)


def run_name(arm: str, budget: str, seed: int) -> str:
    return f"{arm}-{budget.replace(' ', '')}-p{seed}"


LEDGER = ROOT / "bench" / "data" / "objectives"
SUMMARY_KEYS = ("objective", "params", "tokens", "total_flops", "tokens_per_s", "train_seconds",
                "dtype")


def kept_at(ledger: Path, name: str) -> Path:
    """Where the ledger keeps run ``name``."""
    return ledger / f"{name}.json"


def finished(work: Path, ledger: Path, name: str) -> dict | None:
    """A pretraining run whose fine-tuning is complete: from the work dir (and then kept in the
    ledger, so a later checkout has it) or, when the work dir lacks it, from the ledger. None
    when neither has it."""
    run, kept = work / name, kept_at(ledger, name)
    done = downstream_dir(run, "sane") / "results.json"
    if done.is_file() and (results := json.loads(done.read_text())).get("complete"):
        summary = json.loads((run / "summary.json").read_text())
        entry = {"run": name, "summary": {k: summary[k] for k in SUMMARY_KEYS},
                 "eval": held_out(run), "results": results}
        ledger.mkdir(parents=True, exist_ok=True)
        write_json_atomic(kept, entry)
        return {**entry, "kept": "work"}
    if kept.is_file():
        return {**json.loads(kept.read_text()), "kept": "ledger"}
    return None


def scores(records: list[dict], split: str) -> dict[int, float]:
    """Fine-tuning seed → dev score ×100."""
    return {r["seed"]: 100 * r["splits"][split]["score"] for r in records}


def clustered(arm: dict[int, dict[int, float]], base: dict[int, dict[int, float]]
              ) -> dict[str, Any]:
    """``arm`` − ``base``, both pretraining seed → fine-tuning seed → score. The difference is
    paired by (pretraining seed, fine-tuning seed), averaged over the fine-tuning seeds of each
    pretraining seed, and its interval is t over the pretraining seeds, the unit that repeats."""
    per_seed = {}
    for p, a in arm.items():
        b = base.get(p)
        common_f = sorted(set(a) & set(b or {}))
        if common_f:
            per_seed[p] = float(np.mean([a[f] - b[f] for f in common_f]))
    d = np.array(list(per_seed.values()))
    out: dict[str, Any] = {
        "pretrain_seeds": len(d), "per_seed": per_seed,
        "arm_mean": float(np.mean([v for s in arm.values() for v in s.values()])),
        "base_mean": float(np.mean([v for s in base.values() for v in s.values()])),
        "difference_mean": float(d.mean()) if len(d) else None, "ci95": None}
    if len(d) < 2:
        out["verdict"] = "one pretraining seed: no interval"
        return out
    std = float(d.std(ddof=1))
    lo, hi = out["ci95"] = interval(d)
    if std == 0 and d.mean() == 0:
        out["verdict"] = "no difference: both arms scored the same on every seed"
    elif lo <= 0 <= hi:
        need = seeds_needed(std, float(d.mean()))
        out["verdict"] = "within noise" + (f" (~{need} pretraining seeds would resolve it)"
                                           if need else "")
    else:
        out["verdict"] = "ahead" if lo > 0 else "behind"
    return out


def interval(d: np.ndarray) -> list[float]:
    """The 95% t interval of the mean of ``d`` (two or more pretraining seeds' values)."""
    half = t95(len(d) - 1) * float(d.std(ddof=1)) / math.sqrt(len(d))
    return [float(d.mean() - half), float(d.mean() + half)]


def fmt(c: dict[str, Any]) -> str:
    if c["difference_mean"] is None:
        return "–"
    if c["ci95"] is None:
        return f"{c['difference_mean']:+.1f}"
    return f"{c['difference_mean']:+.1f} [{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}]"


def collect(args: argparse.Namespace, arms: list[str], seeds: list[int]
            ) -> tuple[list[dict], list[tuple[str, dict]]]:
    """The comparisons over the finished fine-tunings, and each finished run's summary."""
    results: dict[str, dict[int, dict]] = {a: {} for a in arms}
    runs = []
    for arm in arms:
        for p in seeds:
            if found := finished(args.work, args.ledger, run_name(arm, args.budget, p)):
                results[arm][p] = found["results"]
                runs.append((found["run"], {**found["summary"], "eval": found["eval"],
                                            "kept": found["kept"]}))
    first = results[arms[0]].get(seeds[0])
    if first is None:
        return [], runs  # the control runs with the first arm's first seed
    rows = []
    for task, entry in first["tasks"].items():
        split = next(iter(entry["summary"]))
        scratch = scores(entry["control"]["seeds"], split)
        by_arm = {a: {p: scores(r["tasks"][task]["seeds"], split) for p, r in res.items()}
                  for a, res in results.items()}
        for arm in arms:
            if not by_arm[arm]:
                continue
            rows.append({"task": task, "split": split, "arm": arm, "against": "random twin",
                         **clustered(by_arm[arm], {p: scratch for p in by_arm[arm]})})
            if arm != arms[0] and by_arm[arms[0]]:
                rows.append({"task": task, "split": split, "arm": arm, "against": arms[0],
                             **clustered(by_arm[arm], by_arm[arms[0]])})
    return rows, runs


def pretraining_line(name: str, s: dict) -> str:
    e = s["eval"]
    detection = (f" (the generator's), detection accuracy {e['rtd_disc_accuracy']:.1%} (base "
                 f"rate {1 - e['rtd_replaced_fraction']:.1%} at mask rate {e['mask_rate']:.0%}), "
                 f"AUC {e.get('rtd_auc', float('nan')):.3f}, recall {e['rtd_recall']:.1%}"
                 if "rtd_disc_accuracy" in e else "")
    return (f"  {name}: {s['objective']}, {s['params'] / 1e6:.1f}M params, {s['tokens']:,} "
            f"tokens, {s['total_flops']:.3g} FLOPs, {s['tokens_per_s']:,.0f} tok/s, "
            f"{s['train_seconds'] / 60:.1f} min, {s['dtype']}; held-out MLM loss "
            f"{e['mlm_loss']:.3f}{detection}; from the {s['kept']}")


def mean_differences(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Each comparison's rows over the tasks (issue 60's target is on their mean)."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["arm"], r["against"]), []).append(r)
    return out


def mean_line(arm: str, against: str, task_rows: list[dict]) -> str:
    """The mean over the tasks of ``arm`` − ``against``; with two or more pretraining seeds
    that every task has, its 95% t interval over those seeds (each seed's mean over the
    tasks is the unit that repeats)."""
    line = (f"mean over {len(task_rows)} tasks: {arm} − {against} "
            f"{np.mean([r['difference_mean'] for r in task_rows]):+.1f} points")
    seeds = sorted(set.intersection(*(set(r["per_seed"]) for r in task_rows)))
    if len(seeds) < 2:
        return line
    d = np.array([np.mean([r["per_seed"][p] for r in task_rows]) for p in seeds])
    lo, hi = interval(d)
    return (f"{line}; over its {len(seeds)} pretraining seeds {d.mean():+.1f} [{lo:+.1f}, "
            f"{hi:+.1f}] (per seed {' '.join(f'{v:+.1f}' for v in d)})")


def report(args: argparse.Namespace, rows: list[dict], runs: list[tuple[str, dict]],
           failed: list[str], bench: Bench) -> None:
    notes = [f"pretraining: model {args.preset or 'default'}, budget {args.budget} per run, "
             f"{args.threads or 'all'} thread(s) per run, {args.parallel} at a time; data "
             f"{args.data or args.corpus}"]
    notes += [pretraining_line(name, s) for name, s in runs]
    rows_used = f"first {args.max_train} train rows" if args.max_train else "full train sets"
    notes.append(f"fine-tuning: sane protocol, {args.seeds} seeds per pretraining run, "
                 f"{rows_used}; difference averaged over fine-tuning seeds, 95% t interval "
                 "over pretraining seeds")
    print("\n".join(notes))
    print(f"{'task':6} {'arm':14} {'against':14} {'arm':>6} {'base':>6}  "
          f"difference [95% CI]        per pretraining seed      verdict")
    for r in rows:
        per = " ".join(f"{v:+.1f}" for v in r["per_seed"].values())
        print(f"{r['task']:6} {r['arm']:14} {r['against']:14} {r['arm_mean']:>6.1f} "
              f"{r['base_mean']:>6.1f}  {fmt(r):<26} {per:<25} {r['verdict']}")
    for (arm, against), task_rows in mean_differences(rows).items():
        print(mean_line(arm, against, task_rows))
    if failed:
        print(f"FAILED or not started: {', '.join(failed)} (see {args.work / 'logs'})")
    bench.table([{"task": r["task"], "arm": r["arm"], "against": r["against"],
                  "arm score": r["arm_mean"], "base score": r["base_mean"],
                  "difference [95% CI]": fmt(r), "pretraining seeds": r["pretrain_seeds"],
                  "verdict": r["verdict"]} for r in rows],
                formats={"arm score": ".1f", "base score": ".1f"}, notes=notes)


def main() -> None:
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=SHARED / "corpora" / "mixed-en.jsonl")
    ap.add_argument("--data", type=Path, default=None,
                    help="a prepared MLM data dir to pretrain on instead of preparing --corpus "
                         "(the GPU check's carried slice)")
    ap.add_argument("--preset", default=None, help="model preset instead of the default dims")
    ap.add_argument("--glue", type=Path, default=SHARED / "glue")
    ap.add_argument("--tasks", default="cola,sst2,mrpc")
    ap.add_argument("--arms", default="mlm,rtd", help=f"comma-separated, of {', '.join(ARMS)}; "
                    "each arm after the first is also compared with the first")
    ap.add_argument("--budget", default="1.2e14flops",
                    help="each run's pretraining budget (the budget grammar; FLOPs keep the "
                         "arms at equal compute whatever the load)")
    ap.add_argument("--pretrain-seeds", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=2, help="fine-tuning seeds per pretraining run")
    ap.add_argument("--max-train", type=int, default=None,
                    help="first N training rows per task (a quicker, noisier comparison)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads per job")
    ap.add_argument("--parallel", type=int, default=1, help="jobs at a time")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "objectives")
    ap.add_argument("--ledger", type=Path, default=LEDGER,
                    help="where finished comparisons are kept across checkouts (committed)")
    ap.add_argument("--out", type=Path, default=None, help="JSON of the table")
    ap.add_argument("--collect", action="store_true",
                    help="print the table from the finished runs only; start nothing")
    ap.add_argument("--job", choices=["pretrain", "finetune"], help=argparse.SUPPRESS)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--control", default="none", help=argparse.SUPPRESS)
    args = ap.parse_args()
    arms = args.arms.split(",")
    if unknown := [a for a in arms if a not in ARMS]:
        ap.error(f"--arms: unknown {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    try:
        parse_budget(args.budget)
    except ShoestringError as e:
        ap.error(f"--budget: {e}")
    data = args.data or args.work / "data"
    if args.job:
        run = args.work / run_name(args.arm, args.budget, args.seed)
        if args.job == "pretrain":
            pretrain(arm_config(args.arm, args.seed, args.budget, args.threads, args.preset),
                     data, run, console=console)
        else:
            finetuned(run, args.glue, args.tasks, args.seeds, args.max_train, args.control,
                      "sane")
        return
    if not (args.data or args.corpus).exists() or not args.glue.is_dir():
        raise SystemExit(f"needs {args.data or args.corpus} and {args.glue} "
                         "(see ../shared/data/README.md)")
    bench = Bench("objective_transfer", args, precision="train.precision=auto (per run below)",
                  threads=args.threads)
    try:
        DataDir(data)
    except ShoestringError as e:
        if args.data:
            raise SystemExit(f"--data {args.data}: {e}") from None
        if not args.collect:  # --collect reads finished runs only: the ledger's need no data
            cfg = arm_config(arms[0], 0, args.budget, args.threads)
            prep([str(args.corpus)], data, cfg.data, curate=cfg.curate, console=console,
                 overwrite=True)
    started = time.time()
    seeds = list(range(args.pretrain_seeds))
    me = [sys.executable, __file__, "--work", str(args.work), "--glue", str(args.glue),
          "--tasks", args.tasks, "--seeds", str(args.seeds), "--budget", args.budget]
    me += ["--threads", str(args.threads)] if args.threads else []
    me += ["--preset", args.preset] if args.preset else []
    me += ["--data", str(args.data)] if args.data else []
    me += ["--max-train", str(args.max_train)] if args.max_train else []
    sched = Scheduler(args.parallel, args.threads)
    def kept(name: str) -> bool:  # finished in an earlier checkout, and not started in this one
        return kept_at(args.ledger, name).is_file() and not (args.work / name).is_dir()

    for p in seeds:  # seed by seed, so a session that ends early leaves whole comparisons
        todo = [arm for arm in arms if not kept(run_name(arm, args.budget, p))]
        for arm in todo:
            sched.add(f"pretrain-{run_name(arm, args.budget, p)}",
                      me + ["--job", "pretrain", "--arm", arm, "--seed", str(p)])
        for arm in todo:
            name = run_name(arm, args.budget, p)
            control = "scratch" if arm == arms[0] and p == seeds[0] else "none"
            sched.add(f"finetune-{name}",
                      me + ["--job", "finetune", "--arm", arm, "--seed", str(p),
                            "--control", control], after=[f"pretrain-{name}"])
    failed = [] if args.collect else sched.run(args.work / "logs")
    rows, runs = collect(args, arms, seeds)
    print(f"\nwall {time.time() - started:.0f}s")
    report(args, rows, runs, failed, bench)
    bench.end()
    if args.out:
        write_table(args.out, rows, args, bench.header)


if __name__ == "__main__":
    main()
