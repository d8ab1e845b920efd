"""How good is a run's own forecast of its final held-out loss: runs on several corpora, each
`shoestring train` as a user starts it, the forecasts it printed at 10%, 25% and 50% of its
budget against the held-out loss it then reached.

The law is fitted on each run's own curve; the collapse reads `forecast.COLLAPSE`, the ends of
reference runs (its comment names their corpora), so a corpus none of them used is one
neither has seen. For each (corpus, objective, schedule, budget) a data dir is prepared once
(``OUT/data/``, reused) and one run trains with a wall-clock budget and the default recipe
(`shoestring train` defaults; `--schedule` picks another LR shape). Each run is its own
process: `--threads 1 --parallel 2` trains two side by side on a 2-core machine, so the
minutes are core-minutes. A finished run (its summary.json) is reused on a rerun.

    python bench/forecast_check.py                                  # 10 minutes, 2 corpora
    python bench/forecast_check.py --minutes 10,30 --objectives mlm,clm
    python bench/forecast_check.py --schedules one-cycle,wsd,cosine --minutes 3
    python bench/forecast_check.py --corpus /path/a.jsonl --corpus /path/b.txt
    python bench/forecast_check.py --wiki-books wikipedia,gutenberg --corpus builtin:pydocs \
        --objectives mlm,clm --minutes 30      # corpora the references had not seen
    python bench/forecast_check.py --wiki-books wikipedia --slice 3,0,60 --objectives mlm,clm \
        --minutes 90                           # other articles, enough for 90 minutes
    python bench/forecast_check.py --wiki-books gutenberg --slice 12,5,20 --objectives mlm \
        --set model.preset=mini --minutes 30   # a shape the references did not have
    python bench/forecast_check.py --cost    # how its cost grows with a run's steps (no training)
    python bench/forecast_check.py --references RUN RUN ...   # the collapse's references
    python bench/forecast_check.py --references bench/data/forecast/*.json  # from the ledger
    python bench/forecast_check.py --table    # the leave-one-out check of COLLAPSE as shipped
    python bench/forecast_check.py --check bench/data/forecast/RUN.json ...  # what they printed

Every finished run it reads or trains is kept in ``--ledger`` (``bench/data/forecast/``,
committed: a run dir does not outlive its checkout here) as a small record: its logged train
loss, validations, forecasts and final loss (`run_record`). `--references` takes run dirs or
those records. It reads finished runs (their metrics.jsonl, config.yaml and summary.json) and
prints, per run, the final held-out loss over the train loss "now" at each forecast point
(`forecast.loss_now`: the mean over the last tenth of the steps up to it) and how far the run
had come (now over its first loss), the `COLLAPSE` table they make (one run per
configuration: pass one seed of each), and the leave-one-out check: each run forecast from
the other runs of its objective and schedule only, where it had come as far as they had.

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
# --wiki-books: of one source of the shared wiki-books corpus, the 12th, 24th, ... document
# until 20M characters are kept (~3.5M tokens: a 30-core-minute run reads it ~1.3 times);
# --slice picks other documents and more text (every 3rd from the 1st, 60M: for 90 minutes)
SLICE = "12,11,20"  # every, phase (0: the first of each `every`), million characters


def _corpora(given: list[str] | None, wiki_books: str | None, out: Path,
             spec: str = SLICE) -> list[Path]:
    if wiki_books:
        try:
            every, phase, mchars = (int(x) for x in spec.split(","))
            assert 0 <= phase < every and mchars > 0
        except (ValueError, AssertionError):
            sys.exit(f"error: --slice {spec!r}: want EVERY,PHASE,MILLION_CHARS with "
                     "0 <= PHASE < EVERY (e.g. 3,0,60)")
        from gpu_data import CORPUS, write_slice

        if not CORPUS.is_file():
            sys.exit(f"error: {CORPUS} not found: --wiki-books slices the shared corpus")
        slices = []
        for source in wiki_books.split(","):
            tag = "" if spec == SLICE else f"-e{every}p{phase}m{mchars}"
            path = out / "corpora" / f"{source}{tag}.jsonl"
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                if not write_slice(CORPUS, every, path, source=source, phase=phase,
                                   max_chars=mchars * 1_000_000):
                    path.unlink()
                    sys.exit(f"error: --wiki-books {source}: no such source in {CORPUS} "
                             "(it has wikipedia and gutenberg)")
            slices.append(str(path))
        given = [*slices, *(given or [])]  # the slices first, as the bench's docs run them
    if given:
        return [Path(c) for c in given]
    found = [SHARED / "corpora" / "mixed-en.jsonl", SHARED / "corpora" / "wikitext2-valid.raw.txt"]
    missing = [p for p in found if not p.is_file()]
    if missing:
        sys.exit(f"error: {missing[0]} not found: pass --corpus FILE (two or more)")
    return found


def passes(summary: dict, data: Path) -> float | None:
    """How many times the run read its train split: the tokens it trained on over the split's
    (`forecast.MAX_PASSES` bounds where the collapse speaks)."""
    try:
        split = json.loads((data / "manifest.json").read_text())["splits"]["train"]
        return summary["tokens"] / split["tokens"]
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        return None


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


LEDGER = Path(__file__).resolve().parent / "data" / "forecast"


def run_record(run: Path) -> dict | None:
    """What the references and the check need of a finished run, small enough to keep
    (`--ledger`): its objective and schedule, whether the schedule has the default shape, its
    first and final held-out loss, steps, tokens, passes and dtype, the forecasts it printed,
    and its logged train loss (step, progress, loss). A run dir does not outlive its checkout here;
    the record does, so later sessions can check other ways to read the same curves."""
    from shoestring.config import load_config
    from shoestring.train import forecast as F

    try:
        summary = json.loads((run / "summary.json").read_text())
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        cfg = load_config(run / "config.yaml")
    except (OSError, ValueError) as e:
        print(f"skipping {run}: {e}", file=sys.stderr)
        return None
    return {"run": run.name, "objective": cfg.model.objective, "schedule": cfg.train.schedule,
            "default shape": F.same_schedule(cfg.train),
            "achieved": summary.get("val_loss_subset"), "first_loss": summary["first_loss"],
            "steps": summary["steps"], "tokens": summary["tokens"],
            "dtype": summary.get("dtype"), "train_seconds": summary.get("train_seconds"),
            "passes": passes(summary, Path(summary.get("data_dir", ""))),
            "points": (summary.get("forecast") or {}).get("points", []),
            "logged": [[r["step"], round(r["progress"], 6), round(r["loss"], 5)]
                       for r in records if "loss" in r],
            "validations": [[r["step"], round(r["val_loss"], 5)]
                            for r in records if "val_loss" in r]}


def keep(rec: dict, ledger: Path) -> Path:
    """Write ``rec`` to the ledger as RUN.json (RUN-2.json, ... when another run of that name
    is kept already); the same run again replaces its own."""
    from shoestring.fsutil import write_json_atomic

    ledger.mkdir(parents=True, exist_ok=True)
    same = ("first_loss", "achieved", "steps", "tokens")
    for k in range(1, 100):
        path = ledger / (f"{rec['run']}.json" if k == 1 else f"{rec['run']}-{k}.json")
        if not path.is_file() or all(json.loads(path.read_text()).get(f) == rec[f] for f in same):
            write_json_atomic(path, rec)
            return path
    raise SystemExit(f"error: {ledger}: 99 runs named {rec['run']}; pass another --ledger")


def load(given: Path, ledger: Path | None) -> dict | None:
    """A run dir (read, and kept in ``ledger``) or a record kept earlier (RUN.json)."""
    if given.suffix == ".json" and given.is_file():
        return json.loads(given.read_text())
    rec = run_record(given)
    if rec is not None and ledger is not None:
        log(f"kept {given} as {keep(rec, ledger)}")
    return rec


def _train_loss(logged: list, step: float) -> float | None:
    """The logged train loss over the last `forecast.NOW_WINDOW` of the steps up to ``step``
    (each log line is its steps' mean): the collapse's "loss now"."""
    from shoestring.train import forecast as F

    prev, total, weight = 0, 0.0, 0
    for st, _, loss in logged:
        if (1 - F.NOW_WINDOW) * step < st <= step:
            total, weight = total + loss * (st - prev), weight + st - prev
        prev = st
    return total / weight if weight else None


def run_ratios(rec: dict) -> dict | None:
    """A finished run's objective, schedule, whether its shape is the default, final held-out
    loss, and per forecast point the train loss now and the final's ratio to it. The loss now
    is the collapse's own (summary.json) where it spoke, else `_train_loss` up to the point.
    The ratio splits in two: the train loss's own fall to its end ("train ratio") and the
    final held-out loss over the train loss at the end ("gap at end"; "gap" at a point: the
    last validation by then over the loss now). "held-out ratio": the final held-out loss over
    that last validation, the collapse of the held-out curve itself (it sees the gap as the run
    has it, and compares runs that validate at the same shares of their budget)."""
    achieved, logged, points = rec["achieved"], rec["logged"], rec["points"]
    if achieved is None or not logged:
        return None
    # a law point's "now" was the law's held-out level, not the train loss, in runs of
    # e1402fb..7818944 (2026-11-29): only the collapse's is read back
    recorded = {p["at"]: p["now"] for p in points if p.get("now") and p.get("method") == "collapse"}
    row = {k: rec[k] for k in ("run", "objective", "schedule", "default shape", "achieved")}
    row["passes"] = rec.get("passes")
    # what the run itself printed, by the law (a run of an older version, or no references):
    # its error, to set beside the collapse's
    row["law"] = {p["at"]: p["error"] for p in points
                  if "error" in p and p.get("method", "law") == "law"}
    end = _train_loss(logged, logged[-1][0])
    row["gap at end"] = achieved / end
    for at in POINTS:
        step = next((st for st, prog, _ in logged if prog >= at), None)
        if step is None:
            continue
        now = recorded.get(at) or _train_loss(logged, step)
        if now is None:
            continue
        row[f"now {at:.0%}"], row[f"ratio {at:.0%}"] = now, achieved / now
        row[f"now/first {at:.0%}"] = now / rec["first_loss"]
        row[f"train ratio {at:.0%}"] = end / now
        if seen := [v for st, v in rec["validations"] if st <= step]:
            row[f"gap {at:.0%}"] = seen[-1] / now  # the last validation by then
            row[f"held-out ratio {at:.0%}"] = achieved / seen[-1]
    for at, r in law_ratios(rec).items():
        row[f"law ratio {at:.0%}"] = r
    return row


def law_ratios(rec: dict) -> dict[float, float]:
    """Per forecast point, the final held-out loss over what the run's own law forecast there
    (`forecast.forecast` without references, on the curve rebuilt from the record: each logged
    line's mean loss for each of its steps, the validations seen by then): the ratio a hybrid
    of the law and the collapse would carry from the references (the law to the end × their
    mean ratio, which holds the cool-down's gain the law cannot see before it starts). Only
    for a run of its schedule's default shape (its LR fractions are then known)."""
    from shoestring.config import TrainConfig
    from shoestring.train import forecast as F
    from shoestring.train.schedule import lr_factor

    if not rec["default shape"] or not rec["achieved"]:
        return {}
    cfg = TrainConfig(budget=None, steps=1, schedule=rec["schedule"])
    steps, prev_step, prev_q = [], 0, 0.0  # (progress after, loss) of each step
    for st, q, loss in rec["logged"]:
        steps += [(prev_q + (q - prev_q) * (k + 1) / (st - prev_step), loss)
                  for k in range(st - prev_step)]
        prev_step, prev_q = st, q
    curve, out, vals = F.Curve(), {}, list(rec["validations"])
    for at in POINTS:
        while curve.steps < len(steps) and curve.progress < at:
            done, loss = steps[curve.steps]
            curve.add(lr_factor(cfg, (curve.progress + done) / 2), loss)  # the step's middle
            curve.progressed(done)
            while vals and vals[0][0] <= curve.steps:
                curve.validated(*vals.pop(0))
        made = F.forecast(curve, F.future_factors(cfg, curve, curve.progress), at)
        if isinstance(made, F.Forecast):
            out[at] = rec["achieved"] / made.loss
    return out


def point_summary(errors: dict[tuple[str, float], list[tuple[float, bool]]]) -> list[dict]:
    """Per (objective or "all", point) the median and largest |error|, how many came within
    1% and 2%, and how many 90% intervals covered: the issue's targets, for both objectives
    and over all runs. Printed as it is built."""
    summary = [{"objective": o, "point": f"{p:.0%}", "runs": len(e),
                "median |error|": f"{statistics.median(x for x, _ in e):.2%}",
                "max |error|": f"{max(x for x, _ in e):.2%}",
                "within 1%": sum(x <= 0.01 for x, _ in e),
                "within 2%": sum(x <= 0.02 for x, _ in e),
                "covered": f"{sum(c for _, c in e)} of {len(e)}"}
               for (o, p), e in sorted(errors.items())]
    for r in summary:
        print(json.dumps(r))
    return summary


def leave_one_out(bench: Bench, refs: dict[tuple[str, str], list[tuple[str, dict]]],
                  laws: dict[str, str], name: str = "leave-one-out",
                  base: str = "its loss now") -> None:
    """Each reference forecast from the others of its objective and schedule, as the product
    forecasts: ``refs`` holds per (objective, schedule) one (name, {point: (ratio, now/first)})
    per run. The loss now cancels: the forecast is now × the others' mean ratio and the run
    ended at now × its own ratio, so the pairs are all it takes (`COLLAPSE` holds them). The
    same holds for any ``base`` the ratio is of (the hybrid's: the run's own law). Seeds of
    one configuration (names that differ only in a ``-pN`` suffix, as
    bench/objective_transfer.py names its pretraining seeds) are not each other's references:
    the check is of a configuration the others have not run."""
    import re

    from shoestring.train import forecast as F

    def config(name: str) -> str:
        return re.sub(r"-p\d+$", "", name)

    check, errors = [], {}
    for (objective, schedule), runs in refs.items():
        for run, own in runs:
            out = {"run": run, "objective": objective, "schedule": schedule}
            for at in POINTS:
                others = tuple(o[at] for n, o in runs if config(n) != config(run) and at in o)
                if at not in own or len(others) < 2:
                    out[f"at {at:.0%}"] = "none"
                    continue
                ratio, q = own[at]
                # how much further than the furthest of the others it had come (the far side)
                out[f"below {at:.0%}"] = round(min(o[1] for o in others) - q, 3)
                if not F.in_regime(q, 1.0, others, F.FAR_MARGIN.get(objective)):  # now/first
                    out[f"at {at:.0%}"] = "outside the others' regime"
                    continue
                mid, half = F.collapse(1.0, [o[0] for o in others])  # per unit of the base
                error, covered = mid / ratio - 1, abs(mid - ratio) <= half
                out[f"at {at:.0%}"] = (f"{error:+.1%} ±{half / ratio:.1%}"
                                       f"{'' if covered else '*'} ({len(others)})")
                for group in (objective, "all"):
                    errors.setdefault((group, at), []).append((abs(error), covered))
            out["the run's law"] = laws.get(run, "–")
            check.append(out)
            print(json.dumps(out), flush=True)
    summary = point_summary(errors)
    bench.table(check, name, notes=[
        "each run forecast from the other runs of its objective and schedule: the error of "
        f"({base} × their mean ratio) against its achieved final loss, ± the 90% "
        "interval's half-width, * where it missed, (references)"])
    bench.table(summary, f"{name} points")


def references_table(bench: Bench, runs: list[Path], ledger: Path | None) -> None:
    """The collapse's references from ``runs`` (run dirs, kept in ``ledger``, or records kept
    earlier) and the leave-one-out check of them."""
    records = [rec for rec in (load(run, ledger) for run in runs) if rec is not None]
    rows = [r for r in map(run_ratios, records) if r is not None]
    laws, refs, hybrid, held, table = {}, {}, {}, {}, {}
    for r in rows:
        print(json.dumps(r), flush=True)
        law = r.pop("law")
        laws[r["run"]] = ", ".join(f"{e:+.1%}" for e in law.values()) or "–"
        if r["default shape"]:
            refs.setdefault((r["objective"], r["schedule"]), []).append((r["run"], {
                at: (round(r[f"ratio {at:.0%}"], 4), round(r[f"now/first {at:.0%}"], 4))
                for at in POINTS if f"ratio {at:.0%}" in r}))
            hybrid.setdefault((r["objective"], r["schedule"]), []).append((r["run"], {
                at: (r[f"law ratio {at:.0%}"], r[f"now/first {at:.0%}"])
                for at in POINTS if f"law ratio {at:.0%}" in r and f"now/first {at:.0%}" in r}))
            held.setdefault((r["objective"], r["schedule"]), []).append((r["run"], {
                at: (r[f"held-out ratio {at:.0%}"], r[f"now/first {at:.0%}"])
                for at in POINTS if f"held-out ratio {at:.0%}" in r}))
            # the table forecast.py holds: (ratio, now/first, held-out ratio) per point
            for at, pair in refs[(r["objective"], r["schedule"])][-1][1].items():
                table.setdefault((r["objective"], r["schedule"]), {}).setdefault(at, []).append(
                    (*pair, round(r[f"held-out ratio {at:.0%}"], 4))
                    if f"held-out ratio {at:.0%}" in r else pair)
    print("COLLAPSE = " + repr({key: {at: tuple(v) for at, v in points.items()}
                                for key, points in table.items()}))
    for (objective, schedule), runs in refs.items():  # how far the runs' ratios lie apart
        spread = {}
        for at in POINTS:
            if len(r := [own[at][0] for _, own in runs if at in own]) >= 2:
                mid = statistics.mean(r)
                spread[f"{at:.0%}"] = (f"range {(max(r) - min(r)) / mid:.1%}, "
                                       f"±{max(abs(x - mid) for x in r) / mid:.1%} of the mean")
        print(json.dumps({"ratios of": f"{objective} {schedule}", "runs": len(runs), **spread}))
    bench.table(rows, "references", {"achieved": ".3f", "passes": ".2f", **{
        f"{k} {p:.0%}": ".3f"
        for k in ("now", "ratio", "now/first", "train ratio", "gap", "held-out ratio",
                  "law ratio")
        for p in POINTS}, "gap at end": ".3f"})
    leave_one_out(bench, refs, laws)
    leave_one_out(bench, hybrid, laws, "hybrid leave-one-out", "the run's own law to its end")
    leave_one_out(bench, held, laws, "held-out leave-one-out", "its last validation")


def shipped_table(bench: Bench) -> None:
    """The leave-one-out check of `forecast.COLLAPSE` as it ships: from the last validation
    (what a run that validates every tenth of its budget gets) and from the train loss now
    (any other run). Its references are named by their place in it (the comment above it
    says which runs, in that order), so a reference without an entry at some point could not
    be told apart from its neighbours: a table must hold one per reference at every point."""
    from shoestring.train import forecast as F

    held, train = {}, {}
    for key, points in F.COLLAPSE.items():
        counts = {len(v) for v in points.values()}
        if len(counts) != 1:
            sys.exit(f"error: COLLAPSE{key}: {sorted(counts)} references at different points")
        n = counts.pop()
        held[key] = [(f"{key[0]} #{k + 1}", {at: (points[at][k][2], points[at][k][1])
                                             for at in points}) for k in range(n)]
        train[key] = [(f"{key[0]} #{k + 1}", {at: points[at][k][:2] for at in points})
                      for k in range(n)]
    leave_one_out(bench, held, {}, "leave-one-out from the last validation",
                  "its last validation")
    leave_one_out(bench, train, {}, "leave-one-out from the train loss", "its train loss now")


def printed_table(bench: Bench, records: list[dict]) -> None:
    """What the check is for: the forecasts ``records`` (`run_record`) printed at each point
    against the final held-out loss they then reached, one row per run, and per objective and
    point the median and largest |error| and how many 90% intervals covered it. The runs of
    one invocation and runs kept from several (`--check`) are tabled alike."""
    rows, errors = [], {}
    for rec in records:
        row = {k: rec.get(k) for k in ("run", "objective", "steps", "passes", "achieved")}
        for p in rec["points"]:
            key = f"at {p['at']:.0%}"
            if "error" in p:
                row[key] = (f"{p['error']:+.2%}{'' if p['covered'] else '*'} "
                            f"{p.get('method', 'law')}")
                for group in (rec["objective"], "all"):  # the targets are for both
                    errors.setdefault((group, p["at"]), []).append(
                        (abs(p["error"]), p["covered"]))
            else:
                row[key] = "none"
        row["forecast s"] = sum(p.get("seconds", 0.0) for p in rec["points"])
        if rec.get("train_seconds"):  # records kept before 2026-11-30 lack it
            row["share of run"] = f"{row['forecast s'] / rec['train_seconds']:.2%}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = point_summary(errors)
    notes = ["each run: `shoestring train --budget Nm` with the default recipe, one thread; "
             "the error is (forecast − achieved) / achieved of the final validation loss "
             "(the fixed subset the run's validations use); * = outside the 90% interval; "
             "then the method that spoke (collapse: the last validation, or the train loss "
             "now, × the reference runs' ratio; law: the run's own fitted law)"]
    bench.table(rows, "runs", {"passes": ".2f", "achieved": ".3f", "forecast s": ".2f"}, notes)
    bench.table(summary, "points")


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--cost", action="store_true", help="only the cost-vs-steps table")
    ap.add_argument("--references", nargs="+", type=Path, metavar="RUN",
                    help="finished runs: print the collapse's references and check them")
    ap.add_argument("--check", nargs="+", type=Path, metavar="RUN",
                    help="finished runs (dirs or kept records): the forecasts they printed "
                    "against the loss they reached, as a check's own runs are tabled")
    ap.add_argument("--table", action="store_true",
                    help="the leave-one-out check of forecast.COLLAPSE as it ships")
    ap.add_argument("--corpus", action="append", help="a text/jsonl file (repeatable); default: "
                    "the shared mixed-en.jsonl and wikitext2-valid.raw.txt")
    ap.add_argument("--wiki-books", metavar="SOURCES",
                    help="also slices of these sources of the shared wiki-books corpus "
                    "(wikipedia,gutenberg), written once to OUT/corpora/")
    ap.add_argument("--slice", default=SLICE, metavar="EVERY,PHASE,MCHARS",
                    help="which documents --wiki-books keeps: every EVERY-th from the PHASE-th "
                    "(0: the first), until MCHARS million characters")
    ap.add_argument("--minutes", default="10", help="wall-clock budgets, comma-separated")
    ap.add_argument("--objectives", default="mlm")
    ap.add_argument("--schedules", default="one-cycle")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="a config override for every run (repeatable): another shape than "
                    "the references' (model.preset=mini); its values name the runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/forecast"))
    ap.add_argument("--ledger", type=Path, default=LEDGER,
                    help="where finished runs are kept as small records across checkouts "
                         "(committed; RUN.json is read back wherever a run dir is)")
    ap.add_argument("--no-ledger", action="store_true", help="keep nothing")
    args = ap.parse_args()
    if args.no_ledger:
        args.ledger = None
    bench = Bench("forecast_check", args, threads=args.threads)
    if args.cost or args.references or args.table or args.check:
        if args.check:
            printed_table(bench, [r for r in (load(p, args.ledger) for p in args.check) if r])
        elif args.cost:
            cost_table(bench)
        elif args.table:
            shipped_table(bench)
        else:
            references_table(bench, args.references, args.ledger)
        bench.end()
        return 0
    out = args.out
    for kv in args.sets:
        if "=" not in kv:
            ap.error(f"--set {kv!r}: want KEY=VALUE (e.g. model.preset=mini)")
    shape = "".join(f"-{kv.split('=', 1)[1].replace('/', '_')}" for kv in args.sets)
    sched = Scheduler(args.parallel, args.threads)
    runs = []
    for corpus in _corpora(args.corpus, args.wiki_books, out, args.slice):
        for objective in args.objectives.split(","):
            data = out / "data" / f"{corpus.stem.replace(':', '-')}-{objective}"
            prep_job = f"prep-{data.name}"
            if not (data / "manifest.json").is_file():
                sched.add(prep_job, [sys.executable, "-m", "shoestring", "prep", str(corpus),
                                     "-o", str(data), "--objective", objective,
                                     "--overwrite"])
            for schedule in args.schedules.split(","):
                for minutes in args.minutes.split(","):
                    name = f"{data.name}{shape}-{schedule}-{minutes}m"
                    run = out / "runs" / name
                    runs.append(run)
                    if (run / "summary.json").is_file():
                        log(f"reusing {run}")
                        continue
                    sched.add(name, [
                        sys.executable, "-m", "shoestring", "train", "-d", str(data),
                        "-o", str(run), "--budget", f"{minutes}m", "--overwrite",
                        "--set", f"model.objective={objective}",
                        "--set", f"train.schedule={schedule}",
                        "--set", f"train.threads={args.threads}",
                        *(x for kv in args.sets for x in ("--set", kv))], after=[prep_job])
    failed = sched.run(out / "logs")
    records = []
    for run in runs:
        if (run / "summary.json").is_file() and (rec := run_record(run)) is not None:
            if args.ledger is not None:
                keep(rec, args.ledger)
            records.append(rec)
    printed_table(bench, records)
    bench.end()
    if failed:
        print(f"failed: {', '.join(failed)} (see {out / 'logs'})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
