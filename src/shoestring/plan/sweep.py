"""`shoestring sweep`: an IsoFLOP sweep on your own data, resumable.

For each FLOP budget C, several model sizes around the law's pick for C (factors of its
non-embedding parameter count: ¼×, ½×, 1×, 2×, 4× by default) are each trained to exactly C
FLOPs (a step count: steps × batch × seq_len × FLOPs-per-token ≈ C) on the prepared corpus,
and scored on its validation split. All sizes at one budget share batch size and learning
rate, so only N:D changes along an IsoFLOP curve.

Bookkeeping, so a sweep can be stopped and re-run:

- ``SWEEP_DIR/sweep.json``: the data dir, objective and base settings; a re-run must match it
  (budgets and sizes may be added);
- ``SWEEP_DIR/points.jsonl``: one line per *finished* point (appended, flushed and fsynced
  after the point's run and evaluation complete); a point already there is not rerun;
- ``SWEEP_DIR/runs/<point>/``: each point's run dir; an interrupted point (run dir but no
  line) is trained again from scratch.

``jobs`` > 1 trains that many points at once, each in its own process with the machine's
cores split between them (``train.threads``). The points are FLOP-budgeted, so this changes
only the wall time: on a CPU, small models use a core each better than they share two
(docs/planning.md). The parent process alone writes points.jsonl, as each point finishes.

With ``branched`` (`sweep --curves`, `plan --calibrate --curves`) a size's budgets are
learning-curve points rather than separate runs: one trunk per size trains at constant LR
(``runs/trunk-…``) and each budget is a short cool-down branched off it (`branch`), so the
lower budgets cost only their cool-down. The trunk's branches run in order; different sizes run in parallel.

`shoestring plan --fit SWEEP_DIR` fits the law to points.jsonl (`shoestring.plan.fit`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from shoestring import families
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_json_atomic
from shoestring.plan.laws import load_law
from shoestring.plan.planner import data_info, size_for_flops
from shoestring.plan.shapes import Shape

DEFAULT_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)
FORMAT = "shoestring-sweep/1"
COOLDOWN = 0.2  # a branch's last fifth cools down: matches a cosine run of its length
WARMUP = 0.05  # a trunk warms up over this fraction of its longest branch (capped below)


def parse_floats(text: str, where: str) -> list[float]:
    """``'1e13,4e13'`` → [1e13, 4e13] (positive numbers; a 'flops' suffix is allowed)."""
    out = []
    for part in str(text).split(","):
        part = part.strip().lower().removesuffix("flops").removesuffix("flop").strip()
        try:
            value = float(part)
        except ValueError:
            raise ShoestringError(f"'{part}' is not a number", where=where,
                                  fix="a comma-separated list, e.g. 1e13,4e13") from None
        if not math.isfinite(value) or value <= 0:
            raise ShoestringError(f"{part} must be a positive number", where=where)
        out.append(value)
    if not out:
        raise ShoestringError("empty list", where=where)
    return out


def read_points(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Finished points of a sweep dir (a torn last line, from a crash mid-write, is ignored)."""
    path = Path(sweep_dir) / "points.jsonl"
    if not Path(sweep_dir).is_dir():
        raise ShoestringError("sweep dir not found", where=str(sweep_dir),
                              fix="run `shoestring sweep --data DATA -o SWEEP_DIR` first")
    if not path.is_file():
        return []
    points = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return points


def _steps(c: float, shape: Shape, sizing: Any) -> int:
    return max(1, int(round(c / (shape.flops_per_token * sizing.batch * sizing.seq_len))))


def _level_shapes(c: float, sizing: Any, factors: list[float] | tuple[float, ...],
                  min_sizes: int, min_steps: int) -> list[tuple[float, Shape]]:
    """(factor, shape) for one budget: the shape nearest each factor × the pick among those
    that train at least ``min_steps`` steps on it, then, while fewer than ``min_sizes``
    distinct ones, the unused shape nearest the pick (factor 0: a fill-in)."""
    shapes = [s for s in sizing.shapes if _steps(c, s, sizing) >= min_steps]
    chosen: list[tuple[float, Shape]] = []
    if not shapes:
        return chosen
    pick_n = sizing.pick.params_non_embedding
    for f in sorted(factors):  # the shape nearest f × the pick in log N
        shape = min(shapes, key=lambda s: abs(math.log(s.params_non_embedding / (f * pick_n))))
        if all(shape is not s for _, s in chosen):
            chosen.append((f, shape))
    spare = sorted((s for s in shapes if all(s is not c2 for _, c2 in chosen)),
                   key=lambda s: abs(math.log(s.params_non_embedding / pick_n)))
    for shape in spare[: max(0, min_sizes - len(chosen))]:
        chosen.append((shape.params_non_embedding / pick_n, shape))
    return sorted(chosen, key=lambda fs: fs[1].params_non_embedding)


def plan_points(
    data_dir: str | Path,
    budgets: list[float],
    factors: list[float] | tuple[float, ...] = DEFAULT_FACTORS,
    law: str = "epoch",
    min_sizes: int = 0,
    min_steps: int = 1,
    floor: bool = True,
    branched: bool = False,
) -> list[dict[str, Any]]:
    """The sweep's points (no training): per budget, the shapes nearest factor × the pick
    (with ``min_sizes``, filled up to that many distinct shapes; with ``min_steps``, only
    shapes that train at least that many steps; ``floor=False`` allows budgets below the
    planner's floor, the smallest model on as many tokens as parameters: a sweep point may be
    undertrained, that is what an IsoFLOP curve measures). ``branched``: each shape's points
    are cool-down branches of one constant-LR trunk (`branch`)."""
    from shoestring.plan.prediction import bootstrap_from

    data = data_info(str(data_dir))
    family = families.get(data["objective"])  # the data dir's manifest names it
    the_law = load_law(law)
    boot = bootstrap_from(the_law, law)  # a calibration's law sizes by its IsoFLOP frontier
    frontier = boot.frontier if boot is not None else None
    points = []
    for c in budgets:
        sizing = size_for_flops(c, family, the_law, data, floor=floor, frontier=frontier)
        for f, shape in _level_shapes(c, sizing, factors, min_sizes, min_steps):
            steps = _steps(c, shape, sizing)
            tokens = steps * sizing.batch * sizing.seq_len
            m = shape.model
            points.append({
                "id": f"C{c:.3g}-{m.num_layers}x{m.hidden_size}".replace("+", ""),
                "budget_flops": c,
                "factor": f,
                "is_pick": shape is sizing.pick,
                "shape": shape.label,
                "model": shape.model_section(data["objective"]),
                "params": shape.params,
                "params_non_embedding": shape.params_non_embedding,
                "flops_per_token": shape.flops_per_token,
                "batch_size": sizing.batch,
                "lr": sizing.lr,
                "seq_len": sizing.seq_len,
                "steps": steps,
                "tokens": tokens,
                "flops": tokens * shape.flops_per_token,
            })
    return branch(points) if branched else points


def branch(points: list[dict[str, Any]], warmup: float = WARMUP,
           cooldown: float = COOLDOWN) -> list[dict[str, Any]]:
    """IsoFLOP points as learning curves (warmup-stable-decay, Hägele et al. 2024): all points
    of one shape share a trunk trained at constant LR after ``warmup_steps``, and each is a
    branch off it at ``branch_step`` that cools the LR to zero (1-sqrt) over its last
    ``cooldown`` of steps, ending at the point's FLOP level. A branch's loss is what a run of
    that length with that schedule reaches, so a point costs only its stretch of trunk and its
    cool-down (``cost_flops``) and the lower levels come almost free. The shape's points share
    the batch and LR of its top level (a trunk has one), so steps are recounted with them."""
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        by_shape.setdefault(p["shape"], []).append(p)
    out = []
    for label, group in by_shape.items():
        group.sort(key=lambda p: p["budget_flops"])
        top = group[-1]
        per_step = top["batch_size"] * top["seq_len"]
        steps = [max(3, round(p["budget_flops"] / (p["flops_per_token"] * per_step)))
                 for p in group]
        starts = [min(n - 1, max(2, round((1 - cooldown) * n))) for n in steps]
        warm = max(1, min(round(warmup * steps[-1]), starts[0] - 1))
        before = 0
        for p, n, start in zip(group, steps, starts):
            tokens = n * per_step
            out.append({**p, "batch_size": top["batch_size"], "lr": top["lr"], "steps": n,
                        "tokens": tokens, "flops": tokens * p["flops_per_token"],
                        "schedule": "wsd-branch", "trunk": f"trunk-{label}",
                        "branch_step": start, "warmup_steps": warm,
                        "cost_flops": (max(start - before, 0) + n - start) * per_step
                        * p["flops_per_token"]})
            before = max(before, start)
    return sorted(out, key=lambda p: (p["budget_flops"], p["params_non_embedding"]))


def cost(point: dict[str, Any]) -> float:
    """The FLOPs training this point adds: all of them, or a branch's trunk stretch and
    cool-down."""
    return float(point.get("cost_flops", point["flops"]))


def _check_spec(sweep_dir: Path, spec: dict[str, Any]) -> None:
    path = sweep_dir / "sweep.json"
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        for key in ("data_dir", "objective", "law", "overrides", "schedule"):
            if old.get(key) != spec.get(key):
                raise ShoestringError(
                    f"this sweep dir was started with {key} = {old.get(key)!r}, "
                    f"not {spec.get(key)!r}",
                    where=str(path),
                    fix="re-run with the same settings to resume, or use another -o",
                )
    elif sweep_dir.is_dir() and any(sweep_dir.iterdir()):
        raise ShoestringError("output folder exists and is not a shoestring sweep",
                              where=str(sweep_dir), fix="choose another -o")


def run_sweep(
    data_dir: str | Path,
    sweep_dir: str | Path,
    budgets: list[float],
    factors: list[float] | tuple[float, ...] = DEFAULT_FACTORS,
    law: str = "epoch",
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    eval_sequences: int = 4096,
    console: Console | None = None,
    min_sizes: int = 0,
    min_steps: int = 1,
    floor: bool = True,
    jobs: int = 1,
    branched: bool = False,
    price: Any = None,
) -> list[dict[str, Any]]:
    """Train and score every point not yet finished (``jobs`` at a time); returns all
    finished points. ``branched``: learning curves, one trunk per shape (`branch`); ``price``:
    this machine's seconds per point (`calibration_wall`), for the estimate up front."""
    console = console or Console(stderr=True)
    sweep_dir = Path(sweep_dir)
    data = data_info(str(data_dir))
    spec = {"format": FORMAT, "data_dir": data["dir"], "objective": data["objective"],
            "law": law, "overrides": list(overrides or []),
            "config": str(Path(config).resolve()) if config else None,
            **({"schedule": "wsd-branch"} if branched else {})}
    _check_spec(sweep_dir, spec)
    todo = plan_points(data_dir, budgets, factors, law, min_sizes, min_steps, floor, branched)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    spec_path = sweep_dir / "sweep.json"
    old = json.loads(spec_path.read_text(encoding="utf-8")) if spec_path.is_file() else {}
    spec["budgets"] = sorted(set(old.get("budgets", [])) | set(budgets))
    spec["factors"] = sorted(set(old.get("factors", [])) | set(factors))
    write_json_atomic(sweep_dir / "sweep.json", spec)

    train_points(sweep_dir, todo, data["dir"], families.get(data["objective"]), config=config,
                 overrides=overrides, eval_sequences=eval_sequences, jobs=jobs,
                 console=console, price=price)
    return read_points(sweep_dir)


def train_points(
    sweep_dir: str | Path,
    points: list[dict[str, Any]],
    data_dir: str,
    family: families.FamilySpec,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    eval_sequences: int = 4096,
    jobs: int = 1,
    console: Console | None = None,
    price: Any = None,
) -> None:
    """Train and score each point not yet in ``sweep_dir/points.jsonl`` into
    ``sweep_dir/runs/<id>``, ``jobs`` at a time, appending each as it finishes; ``price``
    (`calibration_wall.WallPrice`) estimates their seconds up front.

    The one way a point is trained, for sweeps, calibrations and the benches that retrain a
    calibration's points (another seed, say): a point's own ``overrides`` list, if it has one,
    is applied after the common ``overrides``. A failed point stops the rest; points already
    running finish and are recorded, so a re-run resumes.
    """
    console = console or Console(stderr=True)
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    finished = read_points(sweep_dir)
    done = {p["id"] for p in finished}
    pending = [p for p in points if p["id"] not in done]
    counted = itertools.count(1)  # [k/n]: k points finished once this one is (issue 62)
    for point in points:
        if point["id"] in done:
            console.print(f"[{next(counted)}/{len(points)}] {point['id']}: done already, "
                          "skipped")
    eta = _Estimate(pending, finished, console, price)

    def announce(point: dict[str, Any]) -> None:
        console.print(f"[{next(counted)}/{len(points)}] {point['id']}: "
                      f"{point['params_non_embedding']:,} non-embedding params, {point['steps']:,} "
                      f"steps × {point['batch_size']} × {point['seq_len']} = {point['tokens']:,} "
                      f"tokens, {point['flops']:.3g} FLOPs")

    def record(point: dict[str, Any], result: dict[str, Any]) -> None:
        with open(sweep_dir / "points.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({**point, **result}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        console.print(f"    {point['id']}: validation loss {result['val_loss']:.4f} "
                      f"({result.get('train_seconds') or 0:.0f}s)")
        eta.finished(point)

    threads = None
    if jobs > 1:
        import torch

        threads = max(1, (os.cpu_count() or torch.get_num_threads()) // jobs)
    chains: dict[str, list[tuple[dict[str, Any], tuple]]] = {}
    for point in pending:  # a trunk's branches in order, one after another
        job = (point, str(config) if config else None,
               [*(overrides or []), *point.get("overrides", [])], data_dir, family,
               str(sweep_dir / "runs"), eval_sequences, threads)
        chains.setdefault(point.get("trunk") or point["id"], []).append((point, job))
    if jobs <= 1 or len(pending) <= 1:
        for chain in chains.values():
            for point, job in chain:
                announce(point)
                record(point, train_point(*job, console=console))
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    console.print(f"{len(pending)} points, {jobs} at a time, {threads} thread(s) each"
                  + (f" ({len(chains)} trunks, each one's branches in turn)"
                     if len(chains) < len(pending) else ""))
    ctx = multiprocessing.get_context("spawn")
    error: BaseException | None = None
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, max_tasks_per_child=1) as pool:
        def submit(chain: list) -> Any:
            point, job = chain.pop(0)
            return pool.submit(train_point, *job), (point, chain)

        futures = dict(submit(chain) for chain in chains.values())
        remaining = set(futures)
        while remaining:
            done_now, remaining = wait(remaining, return_when=FIRST_COMPLETED)
            for fut in done_now:
                point, chain = futures[fut]
                if fut.cancelled():
                    continue
                if fut.exception() is not None:
                    # points not started are dropped; running ones finish and are recorded
                    error = error or fut.exception()
                    for other in remaining:
                        other.cancel()
                    continue
                announce(point)
                record(point, fut.result())
                if chain and error is None:
                    nxt, entry = submit(chain)
                    futures[nxt] = entry
                    remaining.add(nxt)
    if error is not None:
        raise error


class _Estimate:
    """The wall time the pending points will take: a calibration is minutes to hours of runs,
    and the plan's assumed MFU is far from what its small points reach on a CPU, so the
    estimate is measured. With a ``price`` (`calibration_wall.WallPrice`: this machine's
    seconds per point, measured before a wall-clock budget's calibration was sized) it is
    given up front and then scaled by how this call's points compare with it. Without one,
    up front from the points this dir trained before (when there are any), and after each
    point by fitting this call's elapsed seconds to a price per point plus seconds per FLOP —
    a small point is mostly its fixed price (starting, checkpoints, scoring), so the seconds
    per FLOP of the first, smallest points alone would overstate the rest several times; while
    every point so far cost the same FLOPs that split is unknown, and the rate so far is
    given as the bound it is."""

    def __init__(self, pending: list[dict[str, Any]], finished: list[dict[str, Any]],
                 console: Console, price: Any = None) -> None:
        self.todo = {p["id"]: p for p in pending}
        self.console, self.price = console, price
        self.start, self.done, self.count = time.perf_counter(), 0.0, 0
        self.samples: list[tuple[int, float, float]] = []  # (points, FLOPs, seconds) so far
        self.trained: list[dict[str, Any]] = []
        timed = [p for p in finished if p.get("train_seconds")]
        if not pending:
            return
        left = sum(cost(p) for p in pending)
        line = f"{len(pending)} points to train, {left:.3g} FLOPs"
        if price is not None:
            line += (f": ~{price.seconds(pending) / 60:.1f} min of training and scoring at "
                     "the speed measured here")
        elif timed:  # training seconds only: scoring and setup add to it
            rate = sum(p["train_seconds"] for p in timed) / sum(cost(p) for p in timed)
            line += (f": ~{rate * left / 60:.1f} min of training at the rate of "
                     f"the {len(timed)} points trained here before, plus scoring")
        else:
            line += "; the time left is estimated after the first point"
        console.print(line, highlight=False, soft_wrap=True)

    def finished(self, point: dict[str, Any]) -> None:
        self.todo.pop(point["id"], None)
        self.trained.append(point)
        self.done += cost(point)
        self.count += 1
        elapsed = time.perf_counter() - self.start
        self.samples.append((self.count, self.done, elapsed))
        if not self.todo:
            return
        rest = list(self.todo.values())
        left = sum(map(cost, rest))
        if self.price is not None:
            ratio = elapsed / max(self.price.seconds(self.trained), 1e-9)
            minutes, how = (self.price.seconds(rest) * ratio / 60,
                            f"the measured speed × {ratio:.2g}, how this call's points compare")
        else:
            fixed, per_flop = _fixed_and_rate(self.samples)
            if per_flop is None:
                minutes = elapsed / self.done * left / 60
                how = ("at most: this call's seconds per FLOP so far, which larger points beat")
            else:
                minutes = (fixed * len(rest) + per_flop * left) / 60
                how = f"{fixed:.0f} s a point plus this call's seconds per FLOP"
        self.console.print(f"    ~{minutes:.1f} min left for {len(rest)} point(s) "
                           f"({left:.3g} FLOPs; {how})", highlight=False, soft_wrap=True)


def _fixed_and_rate(samples: list[tuple[int, float, float]]
                    ) -> tuple[float, float | None]:
    """Seconds = fixed × points + rate × FLOPs, least squares through the cumulative
    ``samples`` (points, FLOPs, seconds) so far: (fixed, rate), or (0, None) while the points'
    FLOPs cannot tell the two apart (all within a factor of 2) or the fit is not positive."""
    flops = [f for _, f, _ in samples]
    each = [b - a for a, b in zip([0.0, *flops], flops)]
    if len(samples) < 2 or max(each) < 2 * min(each):
        return 0.0, None
    sxx = sum(k * k for k, _, _ in samples)
    sxy = sum(k * f for k, f, _ in samples)
    syy = sum(f * f for _, f, _ in samples)
    det = sxx * syy - sxy * sxy
    if det <= 1e-9 * sxx * syy:
        return 0.0, None
    bx = sum(k * t for k, _, t in samples)
    by = sum(f * t for _, f, t in samples)
    fixed, rate = (syy * bx - sxy * by) / det, (sxx * by - sxy * bx) / det
    return (fixed, rate) if fixed >= 0 and rate > 0 else (0.0, None)


def train_point(point: dict[str, Any], config: str | None, overrides: list[str],
                 data_dir: str, family: families.FamilySpec, runs: str, eval_sequences: int,
                 threads: int | None, console: Console | None = None) -> dict[str, Any]:
    """Train one point to its step count (a branch: its trunk's stretch, then its cool-down)
    and score it, in ``runs/<id>``; in a worker process when jobs > 1 (then quiet, with
    ``threads`` CPU threads for training and scoring alike)."""
    from shoestring.eval.held_out import held_out_loss

    if threads:
        import torch

        torch.set_num_threads(threads)
    console = console or Console(stderr=True, quiet=True)
    sets = [f"model.{k}={v}" for k, v in point["model"].items()]
    sets += ["train.budget=null", f"train.batch_size={point['batch_size']}",
             f"train.lr={point['lr']}"]
    sets += [f"train.threads={threads}"] if threads else []
    run_dir = Path(runs) / point["id"]
    start = time.perf_counter()
    if "branch_step" in point:
        summary = _train_branch(point, config, [*sets, *overrides], data_dir, run_dir, console)
    else:
        summary = _train(config, [*sets, f"train.steps={point['steps']}", *overrides],
                         data_dir, run_dir, console)
    seconds = time.perf_counter() - start
    loss = held_out_loss(family, run_dir, eval_sequences, point["seq_len"], console)
    return {"val_loss": loss, "final_train_loss": summary.get("final_train_loss"),
            "train_seconds": summary.get("train_seconds") if "branch_step" not in point
            else round(seconds, 3), "mfu": summary.get("mfu"),
            "tokens": summary.get("tokens", point["tokens"]), "run": str(run_dir)}


def _train(config: str | None, sets: list[str], data_dir: str, run_dir: Path,
           console: Console, resume: bool = False) -> dict[str, Any]:
    from shoestring.config import load_config
    from shoestring.train.loop import train

    return train(load_config(config, sets), data_dir, run_dir, overwrite=not resume,
                 console=console, resume=resume)


def _train_branch(point: dict[str, Any], config: str | None, sets: list[str], data_dir: str,
                  run_dir: Path, console: Console) -> dict[str, Any]:
    """Bring the shape's trunk to the branch's step at constant LR (resumed where it stands,
    retrained if it has passed it), copy it, and cool the copy down to the point's steps.

    Both are the loop's own resume, which reproduces an uninterrupted run's steps, so a branch
    equals a warmup-stable-decay run of its length trained from scratch."""
    import shutil

    from shoestring.train.checkpoint import latest_checkpoint

    trunk = run_dir.parent / point["trunk"]
    start, steps, warm = point["branch_step"], point["steps"], point["warmup_steps"]
    at = latest_checkpoint(trunk) if trunk.is_dir() else None
    at_step = at.state["step"] if at is not None else 0
    if at_step != start:
        resume = 0 < at_step < start
        _train(config, [*sets, f"train.steps={start}", "train.schedule=constant",
                        f"train.warmup={warm / start!r}", "train.val_every=0"],
               data_dir, trunk, console, resume=resume)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    shutil.copytree(trunk, run_dir, ignore=shutil.ignore_patterns("final"))
    return _train(config, [*sets, f"train.steps={steps}", "train.schedule=wsd",
                           f"train.warmup={warm / steps!r}",
                           f"train.decay={(steps - start) / steps!r}", "train.val_every=0"],
                  data_dir, run_dir, console, resume=True)


def fit_sweep(sweep_dir: str | Path, out: str | Path | None = None,
              plots: bool = True) -> dict[str, Any]:
    """Fit the law to a sweep's finished points; write the law file and the PNG plots."""
    from shoestring.fsutil import write_text_atomic
    from shoestring.plan import fit
    from shoestring.plan.laws import LAWS, law_to_yaml

    sweep_dir = Path(sweep_dir)
    points = read_points(sweep_dir)
    spec_path = sweep_dir / "sweep.json"
    spec = json.loads(spec_path.read_text(encoding="utf-8")) if spec_path.is_file() else {}
    objective = spec.get("objective") or (points[0]["model"]["objective"] if points else "mlm")
    frontier = fit.isoflop_frontier(points)
    result = fit.fit_law(
        [p["params_non_embedding"] for p in points], [p["tokens"] for p in points],
        [p["val_loss"] for p in points], name=f"fit:{sweep_dir.name}", objective=objective,
        source=f"shoestring plan --fit {sweep_dir} ({len(points)} points, data "
        f"{spec.get('data_dir', '?')})",
        exponent=frontier.a if frontier is not None and frontier.usable else None,
    )
    minima = list(frontier.minima) if frontier is not None else fit.isoflop_minima(points)
    law = result.law
    extra = {
        "fit": {
            "points": result.points, "huber": result.huber, "rmse_log_loss": result.rmse_log,
            "n_opt_exponent": law.beta / (law.alpha + law.beta),
            "tied_to_isoflop": result.exponent is not None,
            "at_bounds": list(result.at_bounds),
            "isoflop_minima": [{"flops": m.flops, "params": m.params, "loss": m.loss,
                                "edge": m.edge} for m in minima],
            "isoflop_exponent": frontier.a if frontier else None,
            "isoflop_exponent_interval": list(frontier.exponent_interval()) if frontier else None,
        }
    }
    out_path = Path(out) if out is not None else sweep_dir / "law.yaml"
    write_text_atomic(out_path, law_to_yaml(law, extra))
    written = [out_path]
    if plots:
        from shoestring.plan import plots as P

        pdir = sweep_dir / "plots"
        budgets = [float(p["budget_flops"]) for p in points]
        written += [
            P.plot_isoflops(points, minima, law, pdir / "isoflops.png"),
            P.plot_frontier(minima, law, list(LAWS.values()), (min(budgets), max(budgets)),
                            pdir / "frontier.png"),
            P.plot_predicted(points, law, pdir / "predicted_vs_observed.png"),
        ]
    return {"law": law, "fit": extra["fit"], "written": [str(p) for p in written]}


def fit_table(result: dict[str, Any]):
    """The fitted law for people."""
    from rich.table import Table

    law, f = result["law"], result["fit"]
    t = Table(title=f"fitted law ({f['points']} points)", show_header=False)
    t.add_row("L(N, D)",
              f"{law.E:.4g} + {law.A:.4g}/N^{law.alpha:.4f} + {law.B:.4g}/D^{law.beta:.4f}")
    t.add_row("fit quality", f"RMSE of log-loss {f['rmse_log_loss']:.4f} (Huber {f['huber']:.3g})")
    t.add_row("N_opt ∝ C^a", f"a = {f['n_opt_exponent']:.3f} from the law"
              + (f", {f['isoflop_exponent']:.3f} from the IsoFLOP minima"
                 if f["isoflop_exponent"] is not None else ""))
    if f.get("isoflop_exponent_interval"):
        lo, hi = f["isoflop_exponent_interval"]
        t.add_row("", f"90% interval of the IsoFLOP exponent {lo:.3f}–{hi:.3f}"
                  + ("; the law's exponents are tied to it" if f.get("tied_to_isoflop") else ""))
    if f.get("at_bounds"):
        t.add_row("at a bound", "; ".join(f["at_bounds"]) + " (the points do not pin it)")
    for m in f["isoflop_minima"]:
        edge = f" (at the {m['edge']} edge of the sizes swept)" if m.get("edge") else ""
        t.add_row(f"IsoFLOP minimum at {m['flops']:.3g}",
                  f"N = {m['params']:,.0f}, loss {m['loss']:.4f}{edge}")
    t.add_row("written", "\n".join(result["written"]))
    t.add_row("use it", f"shoestring plan ... --law {result['written'][0]}")
    return t


def points_table(points: list[dict[str, Any]]):
    """Finished sweep points for people, pick marked."""
    from rich.table import Table

    t = Table(title="IsoFLOP sweep")
    for col in ("budget FLOPs", "shape", "non-emb params", "tokens", "tokens/param", "val loss",
                ""):
        t.add_column(col)
    for p in sorted(points, key=lambda p: (p["budget_flops"], p["params_non_embedding"])):
        t.add_row(f"{p['budget_flops']:.3g}", p["shape"], f"{p['params_non_embedding']:,}",
                  f"{p['tokens']:,}", f"{p['tokens'] / p['params_non_embedding']:.1f}",
                  f"{p['val_loss']:.4f}", "planner's pick" if p.get("is_pick") else "")
    return t
