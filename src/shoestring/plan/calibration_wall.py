"""A calibration's wall clock on this machine, measured before the calibration is sized.

A wall-clock budget buys FLOPs at the plan's MFU (30% assumed unless --mfu or --measure), but a
calibration's points are the smallest models there are: on a CPU they reach 0.2–2% of the peak,
and each point also pays a price in seconds that no FLOP count shows (starting the run, its
checkpoints, its validations, scoring it on the held-out rows). Sized in FLOPs at 30%,
`plan --calibrate --budget 5m` on a tiny corpus was accepted and then ran ~45 min (issue 62).
So a wall-clock budget prices its calibration in seconds measured here first:

- each shape's seconds per FLOP: the trainer's own step (`train.timing.time_steps`) at the
  smallest, a middle and the largest shape the sweep may train, interpolated in log–log
  between them (MFU grows smoothly with the width);
- the fixed price of a point: a real point of the smallest and of the largest shape
  (``min_steps`` steps each) trained and scored as the sweep trains and scores
  (`sweep.train_point`), less their few training FLOPs at the measured rate — what starting
  a run, its validations, checkpoints and scoring cost, which grows with the shape's
  forward FLOPs, so it is interpolated linearly in FLOPs per token between the two.

A point costs its fixed price (twice for a `--curves` branch: its trunk stretch and its
cool-down are two runs) plus its training FLOPs at its shape's rate. The measurement is kept beside the calibration dir
(``KEY.wall.json``), so the same command on the same data reuses it.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from shoestring import families
from shoestring.fsutil import write_json_atomic
from shoestring.plan.sweep import cost

RATE_SECONDS = 1.0
"""Timed seconds per shape and try (after the warm-up steps): its shapes step in ms. The
faster of two tries counts: on a shared machine one short window can be several times slow
(a first, cold one was 25× in a check), and an estimate from it would refuse for nothing."""
WARMUP_STEPS = 3


@dataclass(frozen=True)
class WallPrice:
    """Seconds a calibration's points take here (see the module's docstring)."""

    fixed: tuple[tuple[float, float], ...]  # (FLOPs per token, a point's seconds but training)
    rates: tuple[tuple[float, float], ...]  # (FLOPs per token, seconds per training FLOP)
    measured_s: float = 0.0  # what measuring took in this call (0: reused)

    def rate(self, flops_per_token: float) -> float:
        """Seconds per FLOP of a shape, interpolated in log–log between the measured ones."""
        return math.exp(_between(self.rates, math.log(flops_per_token), log=True))

    def point_seconds(self, point: dict[str, Any]) -> float:
        """One point's wall clock: its shape's fixed price (twice for a branch: two runs)
        and its training FLOPs at its shape's rate."""
        runs = 2 if "branch_step" in point else 1
        fpt = point["flops_per_token"]
        return runs * max(0.0, _between(self.fixed, fpt)) + self.rate(fpt) * cost(point)

    def seconds(self, points: list[dict[str, Any]]) -> float:
        """The wall clock of training and scoring ``points`` one after another."""
        return sum(map(self.point_seconds, points))

    def to_dict(self) -> dict[str, Any]:
        return {"fixed": [list(f) for f in self.fixed], "rates": [list(r) for r in self.rates]}


def _between(table: tuple[tuple[float, float], ...], x: float, log: bool = False) -> float:
    """``table``'s value at ``x`` (sorted by x; ``log``: both in logs), linear between its
    rows and flat past its ends."""
    xs = [math.log(a) if log else a for a, _ in table]
    ys = [math.log(b) if log else b for _, b in table]
    if x <= xs[0] or len(xs) == 1:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_left(xs, x)
    return ys[i - 1] + (x - xs[i - 1]) / (xs[i] - xs[i - 1]) * (ys[i] - ys[i - 1])


RATE_ROWS = 16
"""Rows of the timed step at most: one micro-batch's update costs what each of an
accumulated step's does, and a large batch would spend seconds a step on a CPU."""


def _seconds_per_flop(point: dict[str, Any], vocab: int, config: str | Path | None,
                      overrides: list[str]) -> float:
    """The trainer's step for this point's shape and batch, timed here: seconds per FLOP.
    Its `--set`s are `sweep.train_point`'s, at one micro-batch of at most `RATE_ROWS` rows
    per step."""
    from shoestring.config import load_config
    from shoestring.train.timing import time_steps

    rows = min(point["batch_size"], RATE_ROWS)
    cfg = load_config(config, [f"model.{k}={v}" for k, v in point["model"].items()]
                      + ["train.budget=null", f"train.lr={point['lr']}", "train.steps=1",
                         *overrides, f"train.batch_size={rows}", f"train.micro_batch_size={rows}"])
    best = max(time_steps(cfg, vocab, point["seq_len"], seconds=RATE_SECONDS,
                          warmup=WARMUP_STEPS).tokens_per_s for _ in range(2))
    return 1.0 / (best * point["flops_per_token"])


def _probe(point: dict[str, Any], steps: int, data: dict[str, Any], runs: Path,
           config: str | Path | None, overrides: list[str], eval_sequences: int
           ) -> tuple[float, float]:
    """One real point of ``point``'s shape and ``steps`` steps, trained and scored as the
    sweep does: (its wall clock, its training FLOPs)."""
    from shoestring.plan.sweep import train_point

    tokens = steps * point["batch_size"] * point["seq_len"]
    probe = {k: v for k, v in point.items()
             if k not in ("cost_flops", "branch_step", "warmup_steps", "trunk", "schedule")}
    probe.update(id=f"wall-probe-{point['shape']}", steps=steps, tokens=tokens,
                 flops=tokens * point["flops_per_token"])
    began = time.perf_counter()
    train_point(probe, str(config) if config else None, overrides, data["dir"],
                 families.get(data["objective"]), str(runs), eval_sequences, None,
                 console=Console(quiet=True))
    return time.perf_counter() - began, probe["flops"]


def measure_wall(data_dir: str, candidates: list[dict[str, Any]], cal_dir: Path,
                 config: str | Path | None, overrides: list[str], eval_sequences: int,
                 min_steps: int, console: Console) -> WallPrice:
    """The price in seconds of this calibration's points on this machine: measured over the
    shapes of ``candidates`` (every point the sweep may train), or read from the last
    measurement beside ``cal_dir`` for the same data and settings when it spans their
    largest shape."""
    from shoestring.plan.planner import data_info

    path = cal_dir.parent / f"{cal_dir.name}.wall.json"
    widest = max(p["flops_per_token"] for p in candidates)
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        kept = WallPrice(*(tuple((float(a), float(b)) for a, b in saved[k])
                           for k in ("fixed", "rates")))
        if widest <= 1.25 * kept.fixed[-1][0]:  # a larger budget's larger shapes: measured
            return kept
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass  # none yet, or unreadable: measured again
    start = time.perf_counter()
    data = data_info(data_dir)
    by_shape = {p["shape"]: p for p in sorted(candidates, key=lambda p: p["batch_size"])}
    shapes = sorted(by_shape.values(), key=lambda p: p["flops_per_token"])
    anchors = [shapes[i] for i in sorted({0, len(shapes) // 2, len(shapes) - 1})]
    ends = [shapes[i] for i in sorted({0, len(shapes) - 1})]
    console.print(f"measuring this machine's calibration speed: the trainer's step at "
                  f"{len(anchors)} of the {len(shapes)} shapes, and {len(ends)} real "
                  f"point{'s' if len(ends) > 1 else ''} of {min_steps} steps trained and "
                  "scored …", highlight=False)
    cal_dir.parent.mkdir(parents=True, exist_ok=True)
    runs = Path(tempfile.mkdtemp(prefix=".wall-probe-", dir=cal_dir.parent))
    try:  # the real points first: they also warm the process (kernels, threads, caches)
        probes = [_probe(p, min_steps, data, runs, config, overrides, eval_sequences)
                  for p in ends]
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    rates = tuple((p["flops_per_token"], _seconds_per_flop(p, data["vocab_size"], config,
                                                           overrides)) for p in anchors)
    rated = WallPrice(((1.0, 0.0),), rates)
    fixed = tuple((p["flops_per_token"], max(0.0, wall - rated.rate(p["flops_per_token"]) * flops))
                  for p, (wall, flops) in zip(ends, probes))
    price = WallPrice(fixed, rates, time.perf_counter() - start)
    write_json_atomic(path, price.to_dict())
    return price
