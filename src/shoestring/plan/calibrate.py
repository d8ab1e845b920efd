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
loss follows a power law is said before any point trains, with the smallest budget that
reaches it (`regime_preview`), and in the plan (`prediction.regime`). A fit that cannot pin
the law (`unpinned`) does not discard what was trained: the plan uses the centring law scaled
to the points, with the interval they imply (`prior_fit`), and says so.

The sweep lives in a calibration dir keyed by the data dir's fingerprint and the settings
(objective, centring law, overrides, eval rows, minimum steps), so a second calibration on the
same data and settings reuses every finished point — a larger budget adds its levels beside
them, and all points of the dir are fitted. ``--history RUN...`` adds finished runs (their N,
D and achieved held-out loss) and other sweep dirs to the fit.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from shoestring.config import EvalConfig
from shoestring.data.datadir import DataDir
from shoestring.errors import Interrupted, ShoestringError, TrainingInterrupted
from shoestring.fsutil import write_text_atomic
from shoestring.plan import prediction
from shoestring.plan.calibration_wall import WallPrice, measure_wall
from shoestring.plan.fit import BootstrapFit, bootstrap_fit, point_width, scaled_fit
from shoestring.plan.laws import law_to_yaml, load_law
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
    """The smallest top level whose sweep is feasible (bisection on log C); it depends on the
    data and the settings alone, so it is worked out once per data fingerprint (`key`)."""
    return _smallest_top_of(data_dir, spec, spec.key(data_dir))


@functools.lru_cache(maxsize=64)
def _smallest_top_of(data_dir: str, spec: CalibrationSpec, key: str) -> float | None:
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
    preview: dict[str, Any] | None = None  # said before training (`regime_preview`)

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
    preview = regime_preview(data_dir, spec, levels)
    if preview is not None:
        console.print(preview["said"], highlight=False)
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
        cap_s=spec.share * seconds if wall is not None and seconds is not None else None,
        preview=preview)


def regime_preview(data_dir: str, spec: CalibrationSpec, levels: list[float]
                   ) -> dict[str, Any] | None:
    """What is known before a point trains (None when the top level is in the objective's
    power-law regime, or no boundary is known for it): how many decades the top level sits
    below the regime (`prediction.LAW_REGIME_FLOPS`), the noise a calibration point was
    measured to carry (`prediction.POINT_NOISE`), and the smallest budgets whose calibration
    — sized by `calibration_points`, as this one was — puts its top level, and all its
    levels, in the regime. ``said``: the two lines for people."""
    objective = data_info(data_dir)["objective"]
    boundary = prediction.LAW_REGIME_FLOPS.get(objective)
    if boundary is None or levels[-1] >= boundary:
        return None
    top, low = (regime_budget(data_dir, spec, boundary, k) for k in (-1, 0))
    noise = prediction.POINT_NOISE
    below = math.log10(boundary / levels[-1])
    need = (f"a budget of {top:.2g} FLOPs or more puts the top level in the regime"
            + (f" ({low:.2g}: all {len(levels)} levels)" if low else "")
            if top else "no budget this data allows reaches the regime")
    said = (f"below the regime: the top level, {levels[-1]:.3g} FLOPs, is {below:.2f} decades "
            f"under the ~{boundary:.2g} where {objective.upper()} loss follows a power law; a "
            f"point moves {noise['seed_median']:g}–{noise['seed_max']:g} nats with the seed "
            f"and {noise['warmup_step']:g} with a sub-step warmup change (measured at "
            f"{noise['flops']:.2g} FLOPs), so the fit may not pin the law.\n{need}; unpinned, "
            f"the plan falls back to the '{spec.law}' law scaled to these points")
    return {"boundary_flops": boundary, "top_flops": levels[-1], "decades_below": below,
            "budget_for_top_flops": top, "budget_for_all_levels_flops": low, "said": said}


def regime_budget(data_dir: str, spec: CalibrationSpec, boundary: float, level: int = -1
                  ) -> float | None:
    """The smallest budget (two figures, rounded up) whose calibration's ``level`` (-1: the
    top, 0: the lowest) is at least ``boundary`` FLOPs, sized by `calibration_points` itself
    (the share, the span narrowed where the share cannot buy it, the steps a point needs);
    None when none up to 1e30 FLOPs does. The search starts at ``boundary`` (a budget buys
    levels below itself), so every budget states the same answer."""
    def level_of(budget: float) -> float:
        try:
            points = calibration_points(data_dir, budget, spec)
        except ShoestringError:
            return 0.0
        return sorted({p["budget_flops"] for p in points})[level]

    low = high = boundary
    while (reached := level_of(high)) < boundary:
        if high > 1e30:
            return None
        low, high = high, high * max(2.0, boundary / max(reached, 1.0))
    while high / low > 1.002:  # bisection in log
        mid = math.sqrt(low * high)
        low, high = (low, mid) if level_of(mid) >= boundary else (mid, high)
    # two figures, rounded up; the sizing shrinks a top level that overshoots in 3% steps, so
    # a budget's top level is not monotone in it: up until this one and 3% more both reach
    step = 10 ** (math.floor(math.log10(high)) - 1)
    need = math.ceil(high / step) * step
    while level_of(need) < boundary or level_of(need * 1.03) < boundary:
        need += step
    return float(f"{need:.2g}")


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
                    **({"params": summary["params"]} if "params" in summary else {}),
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


def write_law(boot: BootstrapFit, path: str | Path,
              extra: dict[str, Any] | None = None) -> Path:
    """The law planned with and its bootstrap, so `plan --law FILE` gives the same intervals
    (``extra``: more sections, e.g. ``fallback``: why it is the prior law, not the fit)."""
    write_text_atomic(Path(path), law_to_yaml(boot.fit.law, {
        "bootstrap": prediction.bootstrap_to_dict(boot), **(extra or {})}))
    return Path(path)


def prior_fit(points: list[dict[str, Any]], objective: str, spec: CalibrationSpec
              ) -> BootstrapFit:
    """The law the calibration centred its sizes on (``spec.law``), scaled to the measured
    points (`fit.scaled_fit`: its exponents and compute-optimal split, the points' level and
    scatter), for a calibration whose own fit cannot pin L(N, D) (`unpinned`). N is counted
    as the prior counts it; a point without that count (a run from before summaries kept
    it) is left out."""
    prior = load_law(spec.law)
    unique = [p for p in {p["id"]: p for p in points}.values()
              if prior.params != "total" or p.get("params")]
    return scaled_fit(prior, [prior.count(p.get("params") or 0, p["params_non_embedding"])
                              for p in unique],
                      [p["tokens"] for p in unique], [p["val_loss"] for p in unique],
                      budgets=[p.get("budget_flops") for p in unique],
                      resamples=spec.resamples, seed=spec.seed, objective=objective,
                      source=f"the '{prior.name}' law (the calibration's centre) scaled to "
                             f"{len(unique)} calibration points: their own fit was not pinned")


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
    used, fallback = boot, None
    if cal is not None:  # what was trained is planned with, pinned or not
        cal.boot, cal.history = boot, [str(h) for h in history or []]
        why = unpinned(boot, total)
        if why is not None:
            used = prior_fit(points, objective, spec)
            fallback = fallback_record(boot, used, why, cal.dir, spec)
            console.print(fallback["said"], highlight=False)
        write_law(used, cal.dir / "law.yaml", {"fallback": fallback} if fallback else None)
    else:  # --history alone spent nothing: refuse, naming what would pin it
        _check_usable(boot, total)
    spent = round(spent_s + time.perf_counter() - started, 1)  # one figure, note and tree alike
    rest = _remaining(req, base, cal, spent)
    tree = make_plan(rest, console, fitted=used)
    meta = tree["plan"]
    meta["budget"]["input"] = str(req.budget)
    meta["budget"]["total_flops"] = total
    if cal is not None:
        meta["calibration"] = cal.to_dict()
        meta["calibration"]["law_file"] = str(cal.dir / "law.yaml")
        meta["calibration"]["spent_before_plan_s"] = spent
        meta["notes"].insert(0, calibration_note(cal, budget, spent))
        meta["calibration"]["law_used"] = "prior" if fallback else "fitted"
        if cal.preview is not None:
            meta["calibration"]["regime"] = cal.preview
    if fallback is not None:
        _mark_fallback(meta, fallback)
    if history:
        meta["history"] = {"runs": [str(h) for h in history], "points": len(points)}
    found = meta["prediction"].get("regime")  # worked out once, by `prediction.fitted`
    below = prediction.regime_note(found) if found is not None else None
    leans = degenerate(boot) if fallback is None else None  # a fallback said why already
    after = (cal is not None) + (fallback is not None)  # after the fallback and the cost
    for warning in (biased(used), leans, below):
        if warning is not None:
            meta["notes"].insert(after, warning)
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


def _check_usable(boot: BootstrapFit, flops: float) -> None:
    """Refuse a law fitted on --history alone with no compute-optimal size (its closed form
    under- or overflows): points that do not pin L(N, D) cannot plan a budget, and nothing
    was spent on them (a calibration falls back to its prior law instead: `unpinned`)."""
    why = unpinned(boot, flops)
    if why is not None and "no compute-optimal size" in why:
        raise ShoestringError(
            f"{why}: the points do not pin how loss falls with N and D", where="--history",
            fix="add finished runs of several sizes with --history, or calibrate "
            "(`plan --calibrate`)")


def unpinned(boot: BootstrapFit, flops: float) -> str | None:
    """Why the fitted law cannot plan ``flops``, or None when it can: its closed form has no
    compute-optimal size (it under- or overflows: a term's constant vanished), its interval
    there is not finite, or an exponent sits on its bound with no IsoFLOP frontier to size
    by instead — then the law's N:D split, which sizes the plan, is the bound's, not the
    points'. (E on its floor is not among them: it moves the loss, not the size, and the
    plan's notes say it.)"""
    law = boot.fit.law
    shown = (f"the law fitted on {boot.fit.points} points (L = {law.E:.3g} + {law.A:.3g}/"
             f"N^{law.alpha:.3g} + {law.B:.3g}/D^{law.beta:.3g})")
    try:
        n_opt, d_opt = law.optimal(flops)
        with np.errstate(all="ignore"):
            p = boot.predict(n_opt, d_opt)
    except (ZeroDivisionError, OverflowError, ValueError):
        n_opt = d_opt = float("nan")
    if not all(math.isfinite(x) and x > 0 for x in (n_opt, d_opt)):
        return f"{shown} is degenerate and has no compute-optimal size"
    if not (math.isfinite(p.low) and math.isfinite(p.high)):
        return f"{shown} has no finite interval at its own compute-optimal size"
    exponents = [b for b in boot.fit.at_bounds if b.startswith(("α", "β"))]
    if exponents and (boot.frontier is None or not boot.frontier.usable):
        return (f"{shown} has {' and '.join(exponents)} and no IsoFLOP frontier, so its "
                "compute-optimal size would be the bound's, not the points'")
    return None


def fallback_record(fitted: BootstrapFit, used: BootstrapFit, why: str, kept: Path,
                    spec: CalibrationSpec) -> dict[str, Any]:
    """What the plan and the law file record when a calibration falls back (`prior_fit`):
    which law, why, the fit it replaced, and the line said to the user (``said``)."""
    prior = load_law(spec.law)
    scale = used.fit.law.E / prior.E
    said = (f"the calibration could not pin the law: {why}. Its {fitted.fit.points} points "
            f"are kept in {kept} (a larger budget reuses them); the plan below uses the prior "
            f"'{prior.name}' law scaled ×{scale:.3g} to them, with the interval that implies "
            f"(their scatter around it, {used.fit.rmse_log:.3f} in ln-loss, and its backtest)")
    return {"law": used.fit.law.name, "prior": prior.name, "reason": why, "scale": scale,
            "rmse_log_loss": used.fit.rmse_log, "points": used.fit.points,
            "points_kept_in": str(kept), "said": said,
            "fitted_law": {**{k: getattr(fitted.fit.law, k) for k in ("E", "A", "B", "alpha",
                                                                      "beta")},
                           "at_bounds": list(fitted.fit.at_bounds)}}


def _mark_fallback(meta: dict[str, Any], fallback: dict[str, Any]) -> None:
    """Say in the plan tree that it was planned with the prior law, and why: the first note
    (before the calibration's cost), ``plan.law_source``, and the prediction's and size
    rule's basis."""
    meta["law_source"] = {"law": fallback["law"], "from": "prior",
                          "reason": fallback["reason"]}
    meta["notes"].insert(0, fallback["said"])
    pred, rule = meta["prediction"], meta["size_rule"]
    pred["basis"] = (f"the prior '{fallback['prior']}' law scaled to the calibration's "
                     f"{fallback['points']} points (their own fit was not pinned): "
                     + pred["basis"])
    rule["basis"] = (f"the shape with the lowest loss under the prior '{fallback['prior']}' "
                     "law (its N:D split; the calibration's fit could not pin one)")


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
