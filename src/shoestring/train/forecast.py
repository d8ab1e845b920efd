"""What this run will reach: its final held-out loss, forecast from its own loss curve.

The law is Tissue et al. 2024 ("Scaling Law with Learning Rate Annealing"):

    L(s) = L0 + A · S1(s)^-α − C · S2(s)

where S1 is the area under the learning-rate schedule after ``s`` steps (the sum of the LR's
fraction of its peak, step by step) and S2 the annealing area: each step's fall of the LR
below the highest LR so far, carried forward with momentum λ (`MOMENTUM`) and summed. C is
measured on the run itself once its LR has begun to fall, whatever the schedule (one-cycle,
WSD, cosine, linear, constant); before that the forecast is the loss without the cool-down's
gain and says so (`Forecast.cooldown_ahead`). The schedule's future is known (it is keyed to
budget progress), so S1 and S2 at the last step are too; the forecast is the law there.

The law is fitted on the train loss. The held-out loss is the law plus the mean gap between
the run's last three periodic validations and the law at their steps (the gap of now: it
grows as a small corpus repeats); before the first validation the
forecast is of the train loss, and says so. The interval (90%) is residual-based: the fit is
repeated on moving-block bootstrap resamples of its residuals (blocks, because a loss curve's
noise is correlated from step to step), and the spread of the refitted forecasts is widened
by the backtest error: the law fitted on the first half of what has been seen, asked for the
present, missed by some fraction of the distance; the forecast's extrapolation is that many
times longer. Both parts are recorded (`Forecast.noise`, `Forecast.backtest`).

While the cool-down is still ahead (the default one-cycle schedule peaks at 75% of the budget,
so all three points come before it) the law cannot see the cool-down's gain. There, for an
objective and schedule with reference runs (`COLLAPSE`), the forecast is the collapse of loss
curves (Qiu et al. 2025): runs of one objective and schedule end at nearly the same fraction
of the loss they had at a given share of the budget, so the final held-out loss is the
held-out loss at the run's last validation times the references' ratio of their final loss to
theirs there (for a run that validates where they did, every tenth of the budget; otherwise
the train loss now, the mean of the last tenth of the steps seen, times their ratio to it),
and the 90% interval is Student's t prediction interval over the references' spread. Not for
a run that reads its data many more times than they did (`MAX_PASSES`): there the train loss
falls below the held-out loss and the run ends at another fraction of it.

Everything the fit needs is in `Curve`: running areas and the loss curve in at most
`MAX_BINS` bins of equal steps (merged pairwise as the run grows), small enough for every
checkpoint's state.json, so a resumed run forecasts from its whole history.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shoestring.config import TrainConfig
from shoestring.train.schedule import lr_factor

METHOD = ("Tissue et al. 2024 law L0 + A·S1^-α − C·S2 fitted on the train loss past its first "
          "quarter, plus the last three validations' mean gap; 90% interval: moving-block "
          "residual bootstrap combined with the first-half backtest's miss scaled to the "
          "extrapolation. Before the LR's cool-down, for an objective and schedule with "
          "reference runs: the last validation (else the train loss now) times the ratio at "
          "which they ended (loss-curve collapse), 90% interval: Student's t over the "
          "references")
MOMENTUM = 0.999  # λ of the annealing area, per step (Tissue et al.'s default)
POINTS = (0.10, 0.25, 0.50)  # budget progress at which the forecast is printed
MAX_BINS = 256
MIN_STEPS = 20  # fewer steps seen than this: too short to forecast
PACE_STEPS = 16  # steps whose median progress counts the steps to come
Z90 = 1.645
_ALPHAS = np.geomspace(0.02, 3.0, 48)
NOW_WINDOW = 0.1  # the train loss "now": the mean over the last tenth of the steps seen

# (final held-out loss / train loss now, train loss now / first loss, final held-out loss /
# the held-out loss at the last validation by then) at each point, one triple per reference
# configuration (one seed each), all with their objective's default recipe, schedule and shape
# (256×4) and validating every tenth of the budget (`VAL_EVERY`): `python
# bench/forecast_check.py --references RUN...` prints them, and `--table` the leave-one-out
# check of this table (docs/benchmarks/train.md). The collapse's base is the last validation
# (the third number) for a run that validates where they did, else the train loss now (the
# first): the runs part at the held-out/train gap at their end (MLM scores held-out at 25%
# masking and trains at 40%; CLM's train loss runs below held-out as its data repeats), and a
# validation carries the run's own gap. The second says how far the run had come (its
# regime): runs still on the first plateau (a calibration's points: 0.77–0.82 at 50%) end at
# 0.95–0.97 of their loss there, not 0.82, so references speak only for runs that have come
# as far, and not much further (`in_regime`). They apply only to a run whose schedule has the
# default shape (`same_schedule`) and that reads its data at most `MAX_PASSES` times.
# The runs, in this order, with the passes over their data, all kept whole in the bench's
# ledger (bench/data/forecast/): mlm — mixed-en 90 core-minutes (3.6e14 FLOPs,
# bench/objective_transfer.py, seed 0; 3.2), other Wikipedia articles 90 minutes (2.3), the
# 30-minute Wikipedia and Gutenberg slices rerun for their 1,107 and 1,145 steps (1.3, 1.5),
# then 30 minutes on other slices (`--slice 12,K,20`): Gutenberg K = 5 (3.5), Wikipedia K = 8,
# 10, 1 (3.5, 3.2, 3.4), Gutenberg K = 2, 6 (3.5, 3.4); clm — the Gutenberg and Wikipedia
# slices for 815 and 807 steps (1.0, 0.9), other Wikipedia articles 90 minutes (1.7), then 30
# minutes on Wikipedia K = 5 (2.1), Gutenberg K = 8, 3, 9 (2.4, 2.2, 2.5), Wikipedia K = 4, 7
# (2.0, 2.1). The last ten were issue 61's first unseen check (docs/benchmarks/train.md).
COLLAPSE: dict[tuple[str, str], dict[float, tuple[tuple[float, float, float], ...]]] = {
    ("mlm", "one-cycle"): {
        0.10: ((0.5800, 0.7340, 0.5880), (0.5156, 0.6762, 0.5384), (0.6367, 0.7810, 0.6404),
               (0.6138, 0.7410, 0.6260), (0.5535, 0.7211, 0.5646), (0.5747, 0.7496, 0.5748),
               (0.5635, 0.7602, 0.5780), (0.5605, 0.7544, 0.5633), (0.5829, 0.7146, 0.5862),
               (0.5645, 0.7187, 0.5744)),
        0.25: ((0.7154, 0.5950, 0.7124), (0.6548, 0.5324, 0.6682), (0.6919, 0.7187, 0.6741),
               (0.7007, 0.6491, 0.6869), (0.6984, 0.5714, 0.6974), (0.6889, 0.6254, 0.6819),
               (0.6772, 0.6325, 0.6751), (0.6821, 0.6199, 0.6689), (0.7243, 0.5752, 0.7126),
               (0.6999, 0.5796, 0.6971)),
        0.50: ((0.8078, 0.5270, 0.8613), (0.7439, 0.4686, 0.8289), (0.8109, 0.6132, 0.8442),
               (0.8149, 0.5582, 0.8741), (0.7772, 0.5135, 0.8498), (0.7908, 0.5448, 0.8494),
               (0.7840, 0.5464, 0.8437), (0.7831, 0.5399, 0.8370), (0.8148, 0.5113, 0.8484),
               (0.7844, 0.5172, 0.8550))},
    ("clm", "one-cycle"): {
        0.10: ((0.6842, 0.7646, 0.6915), (0.6819, 0.8058, 0.6899), (0.6723, 0.6741, 0.6740),
               (0.6791, 0.7578, 0.6865), (0.6974, 0.6993, 0.7020), (0.6874, 0.7152, 0.6936),
               (0.6992, 0.6947, 0.7059), (0.6696, 0.7700, 0.6741), (0.6760, 0.7527, 0.6878)),
        0.25: ((0.8112, 0.6448, 0.7873), (0.7836, 0.7012, 0.7668), (0.8085, 0.5605, 0.7750),
               (0.8063, 0.6383, 0.7780), (0.8217, 0.5935, 0.7944), (0.8159, 0.6026, 0.7940),
               (0.8170, 0.5945, 0.7983), (0.7970, 0.6470, 0.7674), (0.7902, 0.6438, 0.7706)),
        0.50: ((0.8929, 0.5859, 0.8945), (0.8742, 0.6285, 0.8793), (0.8797, 0.5151, 0.8711),
               (0.9187, 0.5602, 0.8976), (0.9128, 0.5343, 0.9036), (0.9190, 0.5350, 0.9074),
               (0.9146, 0.5311, 0.9058), (0.9139, 0.5642, 0.8931), (0.9049, 0.5622, 0.8963))},
}
VAL_EVERY = 0.1  # where the references validated (train.val_every's default)
# The passes over its train split a run may make by its end for the references to speak (they
# made 0.9–3.5): the runs of the first table that read theirs more ended higher, the more the
# further: MLM on WikiText-2 (~4.8 passes) at 0.833 of its train loss at 50% (the others then
# 0.807–0.824), on builtin:pydocs (8.8) at 0.854, CLM on builtin:pydocs (6.4) at 1.004 (the
# others 0.87–0.90): their train loss fell below the held-out loss. They are not references.
MAX_PASSES = 4.0
REGIME_MARGIN = 0.02  # how far above the references' highest now/first a run may be
# and how far below their lowest (`in_regime`), per objective: unbounded where no run that
# came further has missed (CLM: the 90-minute run, 0.07–0.09 below the others, ended at their
# ratio)
FAR_MARGIN: dict[str, float] = {"mlm": 0.04}
# Steps a run must have seen for the collapse: the first table's references had 78 or more by
# 25% and 155 or more by 50%; `make demo` on a loaded machine had 26 by 50% and ended at 0.90
# of its loss there, not 0.82 (its loss was still falling as fast as a start's).
MIN_COLLAPSE_STEPS = 50
MIN_REFERENCES = 3  # fewer: the spread of two says too little (a t interval on 1 dof)


@dataclass
class Areas:
    """The schedule's running areas after some steps (S1, the annealing momentum, S2)."""

    s1: float = 0.0
    momentum: float = 0.0
    s2: float = 0.0
    peak: float = 0.0  # the highest LR fraction so far
    drop: float = 0.0  # how far the last step's LR was below it

    def step(self, factor: float) -> None:
        """One step at ``factor`` of the peak LR. Annealing is the LR's fall below the highest
        LR so far (Tissue et al. count from the peak, η0 = ηmax): a warmup's rise is not
        annealing, and a cool-down to zero leaves no debt to pay back."""
        self.peak = max(self.peak, factor)
        drop = self.peak - factor
        self.momentum = MOMENTUM * self.momentum + (drop - self.drop)
        self.s1 += factor
        self.s2 += self.momentum
        self.drop = drop

    def after(self, factors: np.ndarray) -> Areas:
        """The areas once ``factors`` (the LR fractions of the steps to come) have run."""
        end = Areas(**asdict(self))
        for f in factors:
            end.step(float(f))
        return end


@dataclass
class Curve:
    """The run's loss curve as the forecast needs it: the areas so far, the train loss in bins
    of ``width`` steps (each ``[steps, Σloss, ΣS1, ΣS2]``), the validations (step, loss) and
    the forecasts made. Lives in the train state; a checkpoint stores it (`to_dict`)."""

    areas: Areas = field(default_factory=Areas)
    steps: int = 0
    width: int = 1
    bins: list[list[float]] = field(default_factory=list)
    validations: list[list[float]] = field(default_factory=list)
    forecasts: list[dict[str, Any]] = field(default_factory=list)
    lost: bool = False  # resumed from a checkpoint without a (readable) curve
    progress: float = 0.0  # budget progress after the last step
    paces: list[float] = field(default_factory=list)  # progress of each of the last steps

    def progressed(self, progress: float) -> None:
        """Budget progress after the step just added: the pace the future is counted at."""
        self.paces = [*self.paces[-(PACE_STEPS - 1):], progress - self.progress]
        self.progress = progress

    def add(self, factor: float, loss: float) -> None:
        """One optimizer step taken at ``factor`` of the peak LR, with train loss ``loss``."""
        self.steps += 1
        if self.lost:
            return
        self.areas.step(factor)
        if not self.bins or self.bins[-1][0] >= self.width:
            self.bins.append([0.0, 0.0, 0.0, 0.0])
        b = self.bins[-1]
        b[0] += 1
        b[1] += loss
        b[2] += self.areas.s1
        b[3] += self.areas.s2
        if len(self.bins) > MAX_BINS and self.bins[-1][0] >= self.width:
            self.bins = [[a + b for a, b in zip(self.bins[i], self.bins[i + 1])]
                         if i + 1 < len(self.bins) else self.bins[i]
                         for i in range(0, len(self.bins), 2)]
            self.width *= 2

    def validated(self, step: int, loss: float) -> None:
        self.validations.append([step, loss])

    def next_point(self) -> float | None:
        """The next progress at which to forecast (`POINTS`), None after the last."""
        done = {f["at"] for f in self.forecasts}
        return next((p for p in POINTS if p not in done), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, step: int = 0) -> Curve:
        """The curve a checkpoint saved after ``step`` steps; one marked ``lost`` when it has
        none that reads back (an older version's checkpoint, a damaged state.json): the
        forecast then says so instead of fitting a curve that starts mid-run."""
        try:
            curve = cls(areas=Areas(**d["areas"]), steps=int(d["steps"]), width=int(d["width"]),
                        bins=[[float(x) for x in b] for b in d["bins"]],
                        validations=[[float(x) for x in v] for v in d["validations"]],
                        forecasts=[dict(f) for f in d["forecasts"]],
                        progress=float(d["progress"]), paces=[float(x) for x in d["paces"]])
        except (KeyError, TypeError, ValueError):
            return cls(steps=step, lost=step > 0)
        if curve.steps != step or sum(b[0] for b in curve.bins) != step:
            return cls(steps=step, lost=True)
        return curve


@dataclass(frozen=True)
class Law:
    l0: float
    a: float
    alpha: float
    c: float

    def __call__(self, s1: np.ndarray | float, s2: np.ndarray | float) -> np.ndarray:
        return self.l0 + self.a * np.power(s1, -self.alpha) - self.c * np.asarray(s2)


def _profile(alpha: float, s1: np.ndarray, s2: np.ndarray, y: np.ndarray, sw: np.ndarray,
             anneals: bool) -> tuple[float, Law] | None:
    """The best (L0, A, C) at this α, linear least squares, and its weighted SSE; None when
    no fit has A > 0 and C ≥ 0 (C < 0 would mean annealing costs loss)."""
    x1 = np.power(s1, -alpha)
    for use_c in ((True, False) if anneals else (False,)):
        X = np.stack([np.ones_like(s1), x1] + ([-s2] if use_c else []), 1) * sw[:, None]
        coef, *_ = np.linalg.lstsq(X, y * sw, rcond=None)
        if coef[1] > 0 and (not use_c or coef[2] >= 0):
            return (float(((X @ coef - y * sw) ** 2).sum()),
                    Law(float(coef[0]), float(coef[1]), float(alpha),
                        float(coef[2]) if use_c else 0.0))
    return None


def fit_law(s1: np.ndarray, s2: np.ndarray, y: np.ndarray, w: np.ndarray) -> Law | None:
    """Weighted least squares (``w``: steps per bin): a grid over α, then the best α refined
    between its neighbours (the rest is linear). None when the loss does not fall with S1."""
    sw = np.sqrt(w)
    anneals = float(np.ptp(s2)) > 1e-9
    found = [(k, f) for k, a in enumerate(_ALPHAS)
             if (f := _profile(float(a), s1, s2, y, sw, anneals)) is not None]
    if not found:
        return None
    k, best = min(found, key=lambda kf: kf[1][0])
    lo, hi = float(_ALPHAS[max(k - 1, 0)]), float(_ALPHAS[min(k + 1, len(_ALPHAS) - 1)])
    for _ in range(20):  # golden section on the profile SSE
        a, b = hi - 0.618 * (hi - lo), lo + 0.618 * (hi - lo)
        fa, fb = (_profile(x, s1, s2, y, sw, anneals) for x in (a, b))
        for f in (fa, fb):
            if f is not None and f[0] < best[0]:
                best = f
        if fa is None or (fb is not None and fb[0] < fa[0]):
            lo = a
        else:
            hi = b
    return best[1]


@dataclass(frozen=True)
class Forecast:
    """The forecast final loss at some progress, with its 90% interval and what it rests on."""

    at: float  # the budget progress it was made at (a `POINTS` entry)
    step: int
    loss: float
    low: float
    high: float
    held_out: bool  # False: no validation yet, so it is the train loss's
    noise: float  # the bootstrap's 90% half-width (the collapse: the references' t interval)
    backtest: float  # the half-width from the backtest's miss, scaled to the extrapolation
    cooldown_ahead: bool  # the LR has yet to fall below its peak: C is not measured
    law: dict[str, float]  # the fitted L0, A, α, C (empty for the collapse)
    method: str = "law"  # or "collapse": the loss now times the reference runs' ratio
    now: float | None = None  # the train loss now (`loss_now`): what a finished run's ratio is of
    references: int = 0  # the reference runs the collapse rests on
    validated: float | None = None  # the last validation's loss, when the collapse is from it

    def describe(self) -> str:
        what = "held-out" if self.held_out else "train (no validation yet)"
        head = f"forecast final {what} loss {self.loss:.3f} (90%: {self.low:.3f}–{self.high:.3f})"
        if self.method == "collapse":
            base = (f"the held-out loss at the last validation ({self.validated:.3f})"
                    if self.validated is not None else f"the train loss now ({self.now:.3f})")
            return (f"{head}: {base} times the ratio at which {self.references} reference "
                    "runs of this objective and schedule ended (the cool-down is still ahead, "
                    "so the law cannot see its gain)")
        return head + ("; the LR's cool-down is still ahead and its gain cannot be measured "
                       "before it starts, so this is the loss without it"
                       if self.cooldown_ahead else "")

    def short(self) -> str:
        """The progress bar's form: "→ 4.62 ±0.08"."""
        return f"→ {self.loss:.2f} ±{(self.high - self.low) / 2:.2f}"

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def future_factors(cfg: TrainConfig, curve: Curve, progress: float) -> np.ndarray:
    """The LR fractions of the steps still to come once ``progress`` of the budget is used:
    as many steps as the recent pace buys (the median progress of the last `PACE_STEPS`
    steps: exact for a step budget, and blind to a first step that compiled for a minute),
    each at the schedule's value at its middle."""
    if progress <= 0 or progress >= 1:
        return np.zeros(0)
    pace = float(np.median(curve.paces)) if curve.paces else progress / max(curve.steps, 1)
    left = max(0, round((1 - progress) / max(pace, 1e-12)))
    mids = progress + (np.arange(left) + 0.5) * (1 - progress) / max(left, 1)
    return np.array([lr_factor(cfg, float(q)) for q in mids])


def _bin_means(curve: Curve) -> tuple[np.ndarray, ...]:
    """Per bin: S1, S2 and loss means, the steps in it, and the step it ends at."""
    b = np.array(curve.bins, dtype=float)
    return b[:, 2] / b[:, 0], b[:, 3] / b[:, 0], b[:, 1] / b[:, 0], b[:, 0], np.cumsum(b[:, 0])


def _tail(values: np.ndarray, w: np.ndarray) -> float:
    """The weighted mean of the last eighth of the points: where the curve is now."""
    k = max(1, len(values) // 8)
    return float(np.average(values[-k:], weights=w[-k:]))


def same_schedule(cfg: TrainConfig) -> bool:
    """Whether ``cfg``'s LR follows the default shape of its schedule (what `COLLAPSE`'s
    references ran), compared on the LR fractions themselves."""
    default = TrainConfig(budget=None, steps=1, schedule=cfg.schedule)
    return all(abs(lr_factor(cfg, q) - lr_factor(default, q)) < 1e-6
               for q in np.linspace(0.0, 1.0, 41))


# (final / now, now / first[, final / last validation]) of one finished run
Reference = tuple[float, ...]


def references(objective: str, cfg: TrainConfig, at: float,
               passes: float | None = None) -> tuple[Reference, ...]:
    """The references for a run of ``objective`` with ``cfg`` at point ``at`` that will have
    read its data ``passes`` times by its end (None: not known); none when its schedule's
    shape is not the default, it reads its data more than `MAX_PASSES` times, or fewer than
    `MIN_REFERENCES` runs were measured."""
    found = COLLAPSE.get((objective, cfg.schedule), {}).get(at, ())
    repeats = passes is not None and passes > MAX_PASSES
    return found if len(found) >= MIN_REFERENCES and same_schedule(cfg) and not repeats else ()


def in_regime(now: float, first: float | None, refs: tuple[Reference, ...],
              far: float | None = None) -> bool:
    """Whether a run whose loss fell from ``first`` to ``now`` is where the references were
    at that point: now / first at most `REGIME_MARGIN` above their highest (the plateau side:
    runs that had come less far ended at 0.95–0.97 of their loss, not 0.82) and, where ``far``
    is set (`FAR_MARGIN` of the objective), at most that far below their lowest. The far side
    parts the objectives: a CLM run 0.07–0.09 below the others ended at their ratio, and an
    MLM run 0.033 below; an MLM run 0.055–0.062 below all of them (33.6M tokens, twice the
    longest reference's) ended 9–18% lower and was missed (docs/benchmarks/train.md). A table
    that measures further widens the bound by holding such runs."""
    if not refs or not first or first <= 0:
        return False
    q = now / first
    low = -math.inf if far is None else min(r[1] for r in refs) - far
    return low <= q <= max(r[1] for r in refs) + REGIME_MARGIN


def held_out_base(cfg: TrainConfig, curve: Curve) -> float | None:
    """The held-out loss the collapse starts from: the run's last validation, when it
    validates every `VAL_EVERY` of its budget as the references did (their held-out ratio is
    of the validation at the same share of the budget); None otherwise."""
    if not curve.validations or abs(cfg.val_every - VAL_EVERY) > 1e-9:
        return None
    return float(curve.validations[-1][1])


def loss_now(curve: Curve) -> float:
    """The mean train loss over the last `NOW_WINDOW` of the steps seen (whole bins)."""
    b = np.array(curve.bins, dtype=float)
    recent = np.cumsum(b[:, 0]) > (1 - NOW_WINDOW) * curve.steps
    recent[-1] = True
    return float(b[recent, 1].sum() / b[recent, 0].sum())


def collapse(base: float, ratios: Sequence[float]) -> tuple[float, float]:
    """(forecast, 90% half-width): ``base`` (the held-out loss at the last validation, or the
    train loss now) times the references' mean ratio of their final loss to theirs, and
    Student's t prediction interval for one more run (k ≥ 2 references: t at 95% with k−1
    degrees of freedom, their spread times √(1 + 1/k))."""
    from scipy.stats import t

    r = np.asarray(ratios, dtype=float)
    spread = float(t.ppf(0.95, len(r) - 1)) * float(np.std(r, ddof=1))
    return base * float(r.mean()), base * spread * math.sqrt(1 + 1 / len(r))


def forecast(curve: Curve, future: np.ndarray, at: float, resamples: int = 64,
             seed: int = 0, refs: tuple[Reference, ...] = (),
             first: float | None = None, far: float | None = None,
             validated: float | None = None) -> Forecast | str:
    """The forecast from ``curve`` when the steps still to come run at LR fractions
    ``future``; a sentence saying why not when it cannot be made. ``refs`` (`references`)
    are used while the cool-down is still ahead, for a run whose loss has fallen from
    ``first`` (its first step's) as far as theirs had and, with ``far``, not much further
    (`in_regime`): from ``validated``, the held-out loss at the run's last validation, when
    it validates where they did (`held_out_base`), else from the train loss now."""
    if curve.lost:
        return ("no forecast: the checkpoint this run resumed from kept no loss curve (an "
                "older version wrote it, or its state.json was edited)")
    if curve.steps < MIN_STEPS:
        return f"too short to forecast: {curve.steps} steps seen (the fit needs {MIN_STEPS})"
    now, end = loss_now(curve), curve.areas.after(future)
    ahead = curve.areas.drop < 0.05 < end.drop  # the LR has yet to fall: C is not measured
    if (ahead and len(refs) >= 2 and curve.steps >= MIN_COLLAPSE_STEPS
            and in_regime(now, first, refs, far)):
        on_held = validated is not None and all(len(r) > 2 for r in refs)
        mid, half = (collapse(validated, [r[2] for r in refs]) if on_held
                     else collapse(now, [r[0] for r in refs]))
        return Forecast(at=at, step=curve.steps, loss=mid, low=mid - half, high=mid + half,
                        held_out=True, noise=half, backtest=0.0, cooldown_ahead=True, law={},
                        method="collapse", now=now, references=len(refs),
                        validated=validated if on_held else None)
    start = curve.steps // 4  # the first quarter seen is the initial transient: not the law
    all_s1, all_s2, all_y, all_w, ends = _bin_means(curve)
    keep = ends > start
    s1, s2, y, w = all_s1[keep], all_s2[keep], all_y[keep], all_w[keep]
    if len(y) < 6:
        return f"too short to forecast: {len(y)} points of the loss curve past its first quarter"
    law = fit_law(s1, s2, y, w)
    if law is None:
        return "the loss is not falling: no law to extrapolate"
    final = float(law(end.s1, end.s2))
    # the held-out gap now: the last three validations past the transient (or the last one);
    # the law at a validation's step is at the mean of its bin (bins hold sums, not steps)
    late = [v for v in curve.validations if v[0] > start] or curve.validations[-1:]
    at_bin = [min(int(np.searchsorted(ends, st)), len(ends) - 1) for st, _ in late[-3:]]
    gap = [v - float(law(all_s1[i], all_s2[i])) for (_, v), i in zip(late[-3:], at_bin)]
    held = bool(gap)
    offset = float(np.mean(gap)) if gap else 0.0
    # noise: refits on moving-block resamples of the residuals
    rng = np.random.default_rng(seed)
    fitted = law(s1, s2)
    resid = y - fitted
    block = max(2, len(y) // 8)
    finals = []
    for _ in range(resamples):
        starts = rng.integers(0, len(y) - block + 1, size=math.ceil(len(y) / block))
        r = np.concatenate([resid[k:k + block] for k in starts])[:len(y)]
        refit = fit_law(s1, s2, fitted + r, w)
        if refit is not None:
            finals.append(float(refit(end.s1, end.s2)))
    noise = Z90 * float(np.std(finals)) if len(finals) > 2 else abs(final) * 0.05
    backtest = _backtest(s1, s2, y, w, end, final)
    half = math.hypot(noise, backtest)
    mid = final + offset
    level = _tail(y, w) + offset  # where the held-out loss is now, by the law
    if not 0 < mid - half or half > level:
        return (f"the curve does not follow the law well enough yet: it would say {mid:.3g} "
                f"± {half:.3g}, for a loss now at {level:.3f}")
    return Forecast(at=at, step=curve.steps, loss=mid, low=mid - half, high=mid + half,
                    held_out=held, noise=noise, backtest=backtest,
                    cooldown_ahead=ahead,
                    law={k: round(v, 6) for k, v in asdict(law).items()}, now=now)


def _backtest(s1: np.ndarray, s2: np.ndarray, y: np.ndarray, w: np.ndarray, end: Areas,
              final: float) -> float:
    """The law fitted on the first half of the points, asked for the mean of the last
    eighth: its miss, as a fraction of the S1 distance it extrapolated (in log S1), times
    the forecast's own distance. 90% by `Z90` over the one miss's scale."""
    half = len(y) // 2
    early = fit_law(s1[:half], s2[:half], y[:half], w[:half])
    if early is None or half < 3:
        return abs(final) * 0.05
    miss = _tail(y, w) - _tail(early(s1, s2), w)
    reach = math.log(_tail(s1, w) / s1[half - 1])
    ahead = math.log(end.s1 / s1[-1]) if end.s1 > s1[-1] else 0.0
    return Z90 * abs(miss) * max(ahead / max(reach, 1e-9), 0.0) + 1e-4


def outcome(curve: Curve, achieved: float | None) -> dict[str, Any] | None:
    """summary.json's ``forecast``: every forecast made, each against the loss achieved
    (its error as a fraction, and whether the interval covered it); None if none was made."""
    if not curve.forecasts:
        return None
    points = []
    for f in curve.forecasts:
        row = dict(f)
        if "loss" in f and achieved is not None:
            row["error"] = round(f["loss"] / achieved - 1, 5)
            row["covered"] = f["low"] <= achieved <= f["high"]
        points.append(row)
    return {"method": METHOD, "achieved": achieved, "points": points}


def outcome_line(found: dict[str, Any] | None) -> str | None:
    """The results table's row: each forecast, and how it compares with the achieved loss."""
    if not found:
        return None
    parts = [f"at {f['at']:.0%} {f['loss']:.3f} ({f['low']:.3f}–{f['high']:.3f})"
             if "loss" in f else f"at {f['at']:.0%}: none ({f['note']})"
             for f in found["points"]]
    made = [f for f in found["points"] if "covered" in f]
    if made:
        parts.append(f"achieved {found['achieved']:.3f}: within "
                     f"{max(abs(f['error']) for f in made):.1%}, covered "
                     f"{sum(f['covered'] for f in made)} of {len(made)}")
    return "; ".join(parts)
