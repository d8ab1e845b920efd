"""`shoestring plan --calibrate`: fit the law on your data and hardware, then plan with it.

A stated share of the budget (15% by default) buys a small IsoFLOP sweep (`plan/sweep.py`):
``levels`` compute levels (3) spaced evenly in log over ``decades`` (1.5), each with
``sizes`` distinct model sizes (5) around the published law's pick, every point a real
`train` to a FLOP budget (so the points do not depend on how busy the machine is) scored on
the same held-out rows with the same fixed masks `shoestring eval` uses. With ``branched``
each size is a learning curve instead: one constant-LR trunk whose cool-down branches end at
its levels (warmup-stable-decay, `sweep.branch`), the lower levels costing only their
cool-downs. The top level is the largest for which the whole sweep's training
fits in the share. L(N, D) is fitted to the points with bootstrap intervals (`plan/fit.py`)
and the rest of the budget is planned with that law; a top level below where the objective's
loss follows a power law is said in the plan (`prediction.regime`).

The sweep lives in a calibration dir keyed by the data dir's fingerprint and the settings
(objective, centring law, overrides, eval rows, minimum steps), so a second calibration on the
same data and settings reuses every finished point — a larger budget adds its levels beside
them, and all points of the dir are fitted. ``--history RUN...`` adds finished runs (their N,
D and achieved held-out loss) and other sweep dirs to the fit.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from shoestring.config import EvalConfig
from shoestring.data.datadir import DataDir
from shoestring.errors import Interrupted, ShoestringError, TrainingInterrupted
from shoestring.fsutil import write_text_atomic
from shoestring.plan import prediction
from shoestring.plan.calibration_wall import WallPrice, measure_wall
from shoestring.plan.fit import BootstrapFit, bootstrap_fit, point_width
from shoestring.plan.laws import law_to_yaml
from shoestring.plan.planner import PlanRequest, data_info, make_plan
from shoestring.plan.sweep import COOLDOWN, cost, plan_points, read_points, run_sweep
from shoestring.units import BudgetSpec, with_article


@dataclass(frozen=True)
class CalibrationSpec:
    """How much to spend and how to spread it (the issue's minimums are the defaults)."""

    share: float = 0.15  # at most this fraction of the budget's FLOPs
    levels: int = 3  # compute levels …
    decades: float = 1.5  # … spanning this many decades where the share buys it,
    min_decades: float = 1.0  # … and no fewer than these where it does not
    sizes: int = 5  # distinct model sizes per level
    min_steps: int = 10  # a point trains at least this many optimizer steps
    eval_sequences: int = EvalConfig().max_sequences  # eval's own default: the same rows
    law: str = "epoch"  # centres the sizes at each level
    overrides: tuple[str, ...] = ()
    resamples: int = 200
    seed: int = 0
    jobs: int = 1  # points trained at once (plan/sweep.py); changes the wall time only
    # learning curves (`plan --calibrate --curves`): a size's levels are cool-downs branched
    # off one constant-LR trunk; off by default, docs/planning.md says why
    branched: bool = False

    def check(self) -> None:
        if not 0 < self.share < 1:
            raise ShoestringError(f"the calibration share must be in (0, 1); got {self.share}",
                                  where="--calibrate-share", fix="e.g. 0.15 (15% of the budget)")
        if self.jobs < 1:
            raise ShoestringError(f"jobs must be at least 1; got {self.jobs}", where="--jobs",
                                  fix="e.g. --jobs 2: two calibration points at a time")
        if self.levels < 2 or self.sizes < 5 or self.decades <= 0 or self.min_decades <= 0:
            raise ShoestringError("a calibration needs at least 2 levels of 5 sizes over a "
                                  "positive span of decades", where="calibration settings")

    @property
    def least_decades(self) -> float:
        """The narrowest span this calibration accepts."""
        return min(self.min_decades, self.decades)

    def key(self, data_dir: str) -> str:
        """The calibration dir's name: data fingerprint + every setting that changes a point."""
        data = data_info(data_dir)
        manifest = DataDir(data_dir).manifest
        fingerprint = manifest.get("fingerprint") or json.dumps(
            [manifest.get("tokenizer"), manifest.get("splits")], sort_keys=True)
        settings = [fingerprint, data["objective"], self.law, list(self.overrides),
                    self.eval_sequences, self.min_steps]
        blob = json.dumps(settings + (["wsd-branch"] if self.branched else []), sort_keys=True)
        return f"{data['objective']}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _points(data_dir: str, top: float, spec: CalibrationSpec) -> list[dict[str, Any]] | None:
    """The sweep's points under ``top``, or None when a level has fewer than ``spec.sizes``
    sizes that train ``spec.min_steps`` steps (or the law refuses the budget). The levels are
    evenly spaced in log over ``spec.decades`` up to ``top``."""
    step = spec.decades / (spec.levels - 1)
    levels = [float(f"{top / 10 ** (step * k):.4g}") for k in reversed(range(spec.levels))]
    try:
        points = plan_points(data_dir, levels, law=spec.law,
                             min_sizes=spec.sizes, min_steps=spec.min_steps, floor=False,
                             branched=spec.branched)
    except ShoestringError:
        return None
    per_level = Counter(p["budget_flops"] for p in points)
    if len(per_level) < spec.levels or min(per_level.values()) < spec.sizes:
        return None
    return points


def _smallest_top(data_dir: str, spec: CalibrationSpec) -> float | None:
    """The smallest top level whose sweep is feasible (bisection on log C)."""
    low, high = 3.0, 24.0
    if _points(data_dir, 10 ** high, spec) is None:
        return None
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (low, mid) if _points(data_dir, 10 ** mid, spec) is not None else (mid, high)
    return 10 ** high


class CalibrationTooSmall(ShoestringError):
    """The budget cannot buy the narrowest calibration; ``need_flops`` is what would (and
    ``need_s``, with a wall price: the seconds of this machine that would)."""

    def __init__(self, budget_flops: float, need_flops: float | None, spec: CalibrationSpec,
                 budget: str = "", fix: str = "", need_s: float | None = None) -> None:
        self.budget_flops, self.need_flops, self.spec = budget_flops, need_flops, spec
        self.need_s = need_s
        need = f"{need_flops:.3g} FLOPs" if need_flops else "far more"
        super().__init__(
            f"budget too small to calibrate: {spec.share:.0%} of {budget or ''}"
            f"{budget_flops:.3g} FLOPs{')' if budget else ''} cannot train {spec.sizes} model "
            f"sizes at {spec.levels} compute levels spanning {spec.least_decades:g} "
            f"decade{'' if spec.least_decades == 1 else 's'} or more, each at least {spec.min_steps} steps",
            where="--budget",
            fix=fix or f"give at least {need}, raise --calibrate-share, or plan without "
                       "--calibrate")


def _spans(spec: CalibrationSpec) -> list[float]:
    """The spans to try, widest first: the asked one, then quarter decades down to the least."""
    spans = [spec.decades]
    while spans[-1] - 0.25 > spec.least_decades + 1e-9:
        spans.append(round(spans[-1] - 0.25, 6))
    return spans + ([spec.least_decades] if spans[-1] > spec.least_decades else [])


def calibration_points(data_dir: str, budget_flops: float, spec: CalibrationSpec,
                       wall: WallPrice | None = None, seconds: float | None = None
                       ) -> list[dict[str, Any]]:
    """The sweep a budget pays for: the widest span (``spec.decades``, narrowed by quarter
    decades to ``spec.min_decades`` when the share cannot buy it) and within it the largest
    top level whose points cost at most ``spec.share`` of the budget — of its FLOPs, and with
    a ``wall`` price of its ``seconds`` too (what the points take on this machine,
    `calibration_wall`). A budget too small for the narrowest span is refused with its
    minimum (`CalibrationTooSmall`)."""
    spec.check()
    need: tuple[float | None, float | None] = (None, None)
    for decades in _spans(spec):
        points, need = _widest(data_dir, budget_flops, replace(spec, decades=decades), wall,
                               seconds)
        if points is not None:
            return points
    raise CalibrationTooSmall(budget_flops, need[0], spec, need_s=need[1])


def _widest(data_dir: str, budget_flops: float, spec: CalibrationSpec,
            wall: WallPrice | None = None, seconds: float | None = None
            ) -> tuple[list[dict[str, Any]] | None, tuple[float | None, float | None]]:
    """The sweep at ``spec.decades`` the share pays for, else None and the budget it needs
    (FLOPs, and seconds with a ``wall`` price)."""
    cap = spec.share * budget_flops
    ratio = sum(10 ** (-spec.decades * k / (spec.levels - 1)) for k in range(spec.levels))
    if spec.branched:  # a trunk to the top and each level's cool-down
        ratio = 1 - COOLDOWN + COOLDOWN * ratio
    smallest = _smallest_top(data_dir, spec)
    if smallest is None:
        return None, (None, None)

    def fits(points: list[dict[str, Any]] | None) -> bool:
        return points is not None and sum(map(cost, points)) <= cap and (
            wall is None or seconds is None or wall.seconds(points) <= spec.share * seconds)

    top = max(cap / (spec.sizes * ratio), smallest)  # a step's rounding or a filled-in size
    if wall is not None and not fits(_points(data_dir, top, spec)):
        low, high = math.log(smallest), math.log(top)  # the largest top the seconds pay for
        for _ in range(16):
            mid = (low + high) / 2
            low, high = (mid, high) if fits(_points(data_dir, math.exp(mid), spec)) else (low, mid)
        top = math.exp(high)
    tops = [top * 0.97**k for k in range(40) if top * 0.97**k > smallest] + [smallest]
    for top in tops:  # can overshoot: shrink
        points = _points(data_dir, top, spec)
        if fits(points):
            return points, (None, None)
    least = _points(data_dir, smallest, spec) or []
    return None, (sum(map(cost, least)) / spec.share or None,
                  wall.seconds(least) / spec.share if wall is not None and least else None)


@dataclass
class Calibration:
    """What the calibration spent and found."""

    dir: Path
    points: list[dict[str, Any]]  # this budget's levels
    all_points: list[dict[str, Any]]  # every point fitted (the dir's, plus --history)
    flops: float  # the FLOPs of this budget's levels (reused points included)
    flops_now: float  # of which trained by this call
    wall_s: float  # wall clock of this call's sweep (training and scoring)
    train_s: float  # training seconds of the points trained now
    share: float
    budget_flops: float
    boot: BootstrapFit | None = None
    history: list[str] = field(default_factory=list)
    estimated_wall_s: float | None = None  # at the speed measured before (wall budgets)
    cap_s: float | None = None  # the share of a wall-clock budget's seconds

    def to_dict(self) -> dict[str, Any]:
        levels = sorted({p["budget_flops"] for p in self.points})
        return {
            "dir": str(self.dir), "share": self.share, "budget_flops": self.budget_flops,
            "flops": self.flops, "flops_share": self.flops / self.budget_flops,
            "within_share": self.flops <= self.share * self.budget_flops,
            "flops_trained_now": self.flops_now, "reused_points":
                sum(1 for p in self.points if p.get("reused")),
            "wall_s": round(self.wall_s, 1), "train_s": round(self.train_s, 1),
            "levels": levels, "sizes_per_level": len(self.points) // max(len(levels), 1),
            "points": len(self.points), "fitted_points": len(self.all_points),
            "history": self.history,
            **({"estimated_wall_s": round(self.estimated_wall_s, 1)}
               if self.estimated_wall_s is not None else {}),
            **({"share_of_budget_s": round(self.cap_s, 1)} if self.cap_s is not None else {}),
            "trunks": len({p["trunk"] for p in self.points if p.get("trunk")}),
            "decades": math.log10(levels[-1] / levels[0]) if len(levels) > 1 else 0.0,
        }


def calibration_dir(data_dir: str, spec: CalibrationSpec, root: str | Path | None) -> Path:
    """Where this data's calibration with these settings lives (default: beside the data)."""
    base = Path(root) if root is not None else Path(data_dir).parent / "calibration"
    return base / spec.key(data_dir)


def wall_price(data_dir: str, budget_flops: float, spec: CalibrationSpec,
               root: str | Path | None, config: str | Path | None,
               console: Console) -> WallPrice:
    """This machine's seconds for the points a calibration of at most ``budget_flops`` may
    train (`calibration_wall`): measured over the shapes of the sweeps from the smallest one
    this data allows to the one the FLOPs buy."""
    data_dir = str(Path(data_dir).resolve())
    candidates: list[dict[str, Any]] = []
    for decades in _spans(spec):
        narrow = replace(spec, decades=decades)
        smallest = _smallest_top(data_dir, narrow)
        if smallest is None:
            continue
        top = max(spec.share * budget_flops / spec.sizes, smallest)
        for level in (smallest, top):
            candidates += _points(data_dir, level, narrow) or []
    if not candidates:  # no sweep at all: the FLOP sizing refuses it by name
        raise CalibrationTooSmall(budget_flops, None, spec)
    return measure_wall(data_dir, candidates, calibration_dir(data_dir, spec, root), config,
                        list(spec.overrides), spec.eval_sequences, spec.min_steps, console)


def calibrate(data_dir: str | Path, budget_flops: float, spec: CalibrationSpec,
              root: str | Path | None = None, config: str | Path | None = None,
              console: Console | None = None, wall: WallPrice | None = None,
              seconds: float | None = None) -> Calibration:
    """Run (or reuse) the calibration sweep for this budget (with a ``wall`` price, at most
    its share of ``seconds`` too); returns its points and cost."""
    console = console or Console(stderr=True)
    data_dir = str(Path(data_dir).resolve())
    points = calibration_points(data_dir, budget_flops, spec, wall, seconds)
    cal_dir = calibration_dir(data_dir, spec, root)
    done = {p["id"] for p in read_points(cal_dir)} if cal_dir.is_dir() else set()
    levels = sorted({p["budget_flops"] for p in points})
    span = math.log10(levels[-1] / levels[0])
    if span < spec.decades - 1e-3:
        console.print(f"the budget's {spec.share:.0%} buys a calibration over {span:.2f} "
                      f"decades, not {spec.decades:g}: the law reaches less far, and its "
                      "interval says so")
    console.print(f"calibrating in {cal_dir}: {len(points)} points at {len(levels)} levels "
                  f"({', '.join(f'{c:.3g}' for c in levels)} FLOPs), "
                  f"{sum(map(cost, points)):.3g} FLOPs of {spec.share:.0%} × "
                  f"{budget_flops:.3g}; {len(done & {p['id'] for p in points})} reused")
    if wall is not None and seconds is not None:
        console.print(f"the {spec.share:.0%} share of the {seconds / 60:.3g} min budget is "
                      f"{spec.share * seconds / 60:.3g} min here", highlight=False)
    estimate = wall.seconds([p for p in points if p["id"] not in done]) if wall else None
    start = time.perf_counter()
    ids = {p["id"] for p in points}
    try:
        finished = run_sweep(data_dir, cal_dir, levels, law=spec.law, config=config,
                             overrides=list(spec.overrides), eval_sequences=spec.eval_sequences,
                             console=console, min_sizes=spec.sizes, min_steps=spec.min_steps,
                             floor=False, jobs=spec.jobs, branched=spec.branched,
                             price=wall)
    except (KeyboardInterrupt, TrainingInterrupted):  # Ctrl-C in a point's training or scoring
        kept = len(ids & {p["id"] for p in read_points(cal_dir)})
        raise Interrupted(f"calibration interrupted: {kept} of {len(points)} points are finished "
                          f"and kept in {cal_dir} (a point cut short starts over); the same "
                          "command reuses them and trains the rest") from None
    wall = time.perf_counter() - start
    mine = [{**p, "reused": p["id"] in done} for p in finished if p["id"] in ids]
    return Calibration(
        cal_dir, mine, finished, sum(map(cost, mine)),
        sum(cost(p) for p in mine if not p["reused"]), wall,
        sum(p.get("train_seconds") or 0.0 for p in mine if not p["reused"]), spec.share,
        budget_flops, estimated_wall_s=estimate,
        cap_s=spec.share * seconds if wall is not None and seconds is not None else None)


# ----------------------------------------------------------------------------- history


def history_points(paths: list[str | Path], objective: str | None) -> list[dict[str, Any]]:
    """(N, D, held-out loss) points from finished runs (summary.json + eval) and sweep dirs;
    a run without a held-out eval, or of another objective, is refused by name."""
    from shoestring.rundir import RunDir, read_json_object

    out: list[dict[str, Any]] = []
    for path in map(Path, paths):
        if (path / "points.jsonl").is_file() or (path / "sweep.json").is_file():
            out += [{**p, "source": str(path)} for p in read_points(path)
                    if objective is None or p["model"]["objective"] == objective]
            continue
        run = RunDir(path)
        summary = run.read_summary()
        loss = prediction.held_out(read_json_object(run.eval_path)
                                   or read_json_object(run.decoder_eval_path))
        if loss is None:
            raise ShoestringError("the run has no held-out loss to learn from", where=str(path),
                                  fix=f"run `shoestring eval {path}` first")
        if objective is not None and summary.get("objective", objective) != objective:
            kind = with_article(str(summary.get("objective")))
            raise ShoestringError(f"{kind} run cannot refit {with_article(objective)} law",
                                  where=str(path), fix="drop this run")
        model = (run.read_config_dict() or {}).get("model")
        out.append({"id": f"run:{path}", "params_non_embedding": summary["params_non_embedding"],
                    "tokens": summary["tokens"], "val_loss": loss, "source": str(path),
                    "budget_flops": summary.get("total_flops"),
                    **({"model": model} if isinstance(model, dict) else {})})
    return out


def fit_points(points: list[dict[str, Any]], objective: str, name: str,
               spec: CalibrationSpec) -> BootstrapFit:
    """L(N, D) with bootstrap intervals on these points (the same id counted once): the
    IsoFLOP minima of each compute level (approach 2) and the law with its exponents tied to
    theirs (approach 3), resampled within each level (`fit.bootstrap_fit`)."""
    unique = list({p["id"]: p for p in points}.values())
    return bootstrap_fit([p["params_non_embedding"] for p in unique],
                         [p["tokens"] for p in unique], [p["val_loss"] for p in unique],
                         budgets=[p.get("budget_flops") for p in unique],
                         widths=[point_width(p) for p in unique],
                         resamples=spec.resamples, seed=spec.seed, name=name,
                         objective=objective,
                         source=f"shoestring plan --calibrate/--history ({len(unique)} points)")


def write_law(boot: BootstrapFit, path: str | Path) -> Path:
    """The fitted law with its bootstrap, so `plan --law FILE` gives the same intervals."""
    write_text_atomic(Path(path), law_to_yaml(boot.fit.law,
                                              {"bootstrap": prediction.bootstrap_to_dict(boot)}))
    return Path(path)


# ------------------------------------------------------------------------------ the plan


def calibrated_plan(req: PlanRequest, spec: CalibrationSpec, calibrate_data: bool = True,
                    history: list[str] | None = None, root: str | Path | None = None,
                    config: str | Path | None = None,
                    console: Console | None = None, spent_s: float = 0.0,
                    without: str = "plan without --calibrate") -> dict[str, Any]:
    """`plan --calibrate` / `--history`: calibrate (if asked), fit with intervals, and plan
    the budget left after the calibration with the fitted law. A wall-clock budget is left
    what this call did not spend — measuring the machine, calibrating, fitting — nor the
    ``spent_s`` seconds the caller spent on it before (`cram --auto`: preparing the data);
    one too small to calibrate is refused in minutes of this machine, and ``without`` says
    how the caller's command does without calibrating."""
    started = time.perf_counter()
    if req.data is None:
        raise ShoestringError("calibration and --history fit a law on your data",
                              where="--data", fix="pass the prepared data dir: --data DATA")
    budget = req.budget
    if budget.kind not in ("flops", "seconds"):
        raise ShoestringError(f"--calibrate needs a FLOP or wall-clock budget, not {budget.kind}",
                              where="--budget", fix="e.g. --budget 1e14flops or --budget 30m")
    if calibrate_data and budget.kind == "flops":  # refuse a budget too small up front
        calibration_points(str(req.data), budget.amount, spec)
    base = make_plan(req, console)  # checks the request; the budget in FLOPs
    total = float(base["plan"]["budget"]["flops"])
    wall, seconds = None, budget.amount if budget.kind == "seconds" else None
    if calibrate_data and seconds is not None:
        try:
            if req.mfu is None:  # the assumed MFU is far from the calibration's: measure it
                wall = wall_price(str(req.data), total, spec, root, config, console)
            calibration_points(str(req.data), total, spec, wall, seconds)
        except CalibrationTooSmall as e:
            raise _in_seconds(e, seconds, total,
                              spent_s + time.perf_counter() - started, without) from None
    objective = base["plan"]["objective"]
    cal = (calibrate(req.data, total, spec, root, config, console, wall, seconds)
           if calibrate_data else None)
    points = (cal.all_points if cal else []) + history_points(history or [], objective)
    boot = fit_points(points, objective, "calibrated" if cal else "history", spec)
    if cal is not None:
        cal.boot, cal.history = boot, [str(h) for h in history or []]
        write_law(boot, cal.dir / "law.yaml")
    _check_usable(boot, total, cal.dir if cal else None)
    spent = round(spent_s + time.perf_counter() - started, 1)  # one figure, note and tree alike
    rest = _remaining(req, base, cal, spent)
    tree = make_plan(rest, console, fitted=boot)
    meta = tree["plan"]
    meta["budget"]["input"] = str(req.budget)
    meta["budget"]["total_flops"] = total
    if cal is not None:
        meta["calibration"] = cal.to_dict()
        meta["calibration"]["law_file"] = str(cal.dir / "law.yaml")
        meta["calibration"]["spent_before_plan_s"] = spent
        meta["notes"].insert(0, calibration_note(cal, budget, spent))
    if history:
        meta["history"] = {"runs": [str(h) for h in history], "points": len(points)}
    found = meta["prediction"].get("regime")  # worked out once, by `prediction.fitted`
    below = prediction.regime_note(found) if found is not None else None
    for warning in (biased(boot), degenerate(boot), below):  # after the calibration's cost
        if warning is not None:
            meta["notes"].insert(1 if cal is not None else 0, warning)
    return tree


def _in_seconds(e: CalibrationTooSmall, seconds: float, flops: float, spent_s: float,
                without: str) -> CalibrationTooSmall:
    """A wall-clock budget too small to calibrate, refused in the user's unit: the minutes
    whose share pays for the smallest calibration at the seconds measured here (or, with
    --mfu and no such price, that buy its FLOPs at the plan's rate), plus what was spent
    before (preparing, measuring) — the calibration's wall clock is more than its FLOPs."""
    rate = flops / seconds  # the plan bought the whole budget's seconds at this rate
    if e.need_flops is None:
        fix = f"{without}: no budget of this machine calibrates on this data"
    elif e.need_s is not None and e.need_s > e.need_flops / rate:
        minutes = math.ceil((e.need_s + spent_s) / 60)
        fix = (f"give --budget {minutes}m or more on this machine (its {e.spec.share:.0%} "
               f"share pays for the smallest calibration, {e.need_s * e.spec.share / 60:.1f} "
               f"min at the speed measured here, plus the {spent_s:.0f} s spent before), "
               f"raise --calibrate-share, or {without}")
    else:
        minutes = math.ceil((e.need_flops / rate + spent_s) / 60)
        fix = (f"give --budget {minutes}m or more on this machine ({e.need_flops:.3g} FLOPs at "
               f"the plan's {rate:.3g} FLOP/s, plus the {spent_s:.0f} s spent before), "
               f"raise --calibrate-share, or {without}")
    return CalibrationTooSmall(e.budget_flops, e.need_flops, e.spec,
                               budget=f"{seconds / 60:.3g} min here (", fix=fix)


def _check_usable(boot: BootstrapFit, flops: float, where: Path | None) -> None:
    """Refuse a fitted law with no compute-optimal size (its closed form under- or
    overflows): points that do not pin L(N, D) cannot plan a budget."""
    law = boot.fit.law
    try:
        n_opt = law.optimal(flops)[0]
    except (ZeroDivisionError, OverflowError, ValueError):
        n_opt = float("nan")
    if not (math.isfinite(n_opt) and n_opt > 0):
        raise ShoestringError(
            f"the law fitted on {boot.fit.points} points is degenerate (L = {law.E:.3g} + "
            f"{law.A:.3g}/N^{law.alpha:.3g} + {law.B:.3g}/D^{law.beta:.3g}) and has no "
            "compute-optimal size: the points do not pin how loss falls with N and D",
            where=str(where) if where else "--history",
            fix="calibrate with a larger budget (more steps per point), or add finished runs "
            "of several sizes with --history")


def degenerate(boot: BootstrapFit) -> str | None:
    """A warning when a constant of the fit ended on its bound (E at its floor, an exponent
    at 0.05 or 1.5) or the IsoFLOP minima give no usable frontier: the points do not pin that
    part of L(N, D), so the plan leans on the bound there, not on the data."""
    parts = list(boot.fit.at_bounds)
    if boot.frontier is None or not boot.frontier.usable:
        parts.append("no IsoFLOP frontier with 0 < a < 1, so the law sizes the plan"
                     if boot.frontier is not None else "")
    elif boot.frontier.source == "prior":
        parts.append("one IsoFLOP minimum inside the sizes swept, so N_opt ∝ C^a takes the "
                     "published laws' a")
    parts = [p for p in parts if p]
    if not parts:
        return None
    return (f"the fit leans on its bounds ({'; '.join(parts)}): the points do not pin that "
            "part of L(N, D) — more levels or more steps per point would — and the interval "
            "is only as good as the points")


BIAS_FLOOR = 0.05  # ln-loss: a one-sided backtest miss smaller than this is not flagged


def biased(boot: BootstrapFit) -> str | None:
    """A warning when the backtest missed every held-out point on the same side, by more than
    5% on average and more than twice the fit's own scatter: the calibration's levels do not
    lie on one power law (the lowest are short runs still near unigram statistics, whose loss
    falls slower per decade than later), so the plan, which extrapolates further, is likely
    off the same way. Said in the plan rather than corrected: the size of the bend past the
    top level is not known from the points."""
    bt = boot.backtest
    if not bt or "min_log_error" not in bt:  # none, or a law file from before the signs
        return None
    one_sided = bt["min_log_error"] > 0 or bt["max_log_error"] < 0
    mean = bt["mean_log_error"]
    if not one_sided or abs(mean) <= max(BIAS_FLOOR, 2 * boot.fit.rmse_log):
        return None
    side = "high" if mean > 0 else "low"
    return (f"the fit without its top level predicted that level {side} at every point "
            f"({math.expm1(mean):+.0%} on average, {bt['decades']:.2f} decades out): the "
            f"calibration's levels bend off one power law, so expect this plan's point "
            f"prediction to be {side} as well, and more so the further it extrapolates; a "
            "larger --calibrate-share or budget puts the levels past the bend")


def _remaining(req: PlanRequest, base: dict[str, Any], cal: Calibration | None,
               spent_s: float) -> PlanRequest:
    """The request for what is left: FLOPs minus the calibration's; a wall-clock budget minus
    every second spent on it so far (``spent_s``: the calibration, measuring, fitting and what
    the caller spent before), at the MFU the calibration's largest points measured (unless
    --mfu was given)."""
    b = base["plan"]["budget"]
    if cal is None:
        return req
    if req.budget.kind == "flops":
        left = f"{b['flops'] - cal.flops:.6g}"
        return replace(req, budget=BudgetSpec("flops", float(left), f"{left}flops"))
    seconds = req.budget.amount - spent_s
    if seconds <= 0:
        raise ShoestringError(
            f"{spent_s:.0f} s went before the plan's run (the calibration took "
            f"{cal.wall_s:.0f} s of it): the whole budget",
            where="--budget", fix="give a longer budget or a FLOP budget")
    top = max(p["budget_flops"] for p in cal.points)
    mfus = sorted(p["mfu"] for p in cal.points if p["budget_flops"] == top and p.get("mfu"))
    mfu = req.mfu if req.mfu is not None else (mfus[len(mfus) // 2] if mfus else None)
    left = f"{seconds:.3f}"
    return replace(req, budget=BudgetSpec("seconds", float(left), f"{left}s"), mfu=mfu,
                   measure=False if mfu else req.measure)


def calibration_note(cal: Calibration, budget: BudgetSpec, spent_s: float | None = None
                     ) -> str:
    """What the calibration cost, and whether it stayed within its share."""
    d = cal.to_dict()
    within = "within" if d["within_share"] else "OVER"
    wall = f"{cal.wall_s:.0f} s wall here"
    if cal.estimated_wall_s is not None:
        wall += f" (~{cal.estimated_wall_s:.0f} s estimated at the speed measured first)"
    if budget.kind == "seconds":
        wall += f" ({cal.wall_s / budget.amount:.0%} of the {budget.amount:.0f} s budget"
        wall += (f"; {spent_s:.0f} s spent before the plan's run in all, all of it off the "
                 "budget)" if spent_s is not None else ")")
    curves = (f", cool-down branches of {d['trunks']} constant-LR runs" if d["trunks"]
              else "")
    return (f"calibration: {d['points']} points ({d['sizes_per_level']} sizes × "
            f"{len(d['levels'])} levels, {d['decades']:.2f} decades{curves}; "
            f"{d['reused_points']} reused) cost {cal.flops:.3g} FLOPs = "
            f"{d['flops_share']:.1%} of the budget, "
            f"{within} its {cal.share:.0%} share; {wall}; the rest of the budget is planned "
            f"with the law fitted on {d['fitted_points']} points")
