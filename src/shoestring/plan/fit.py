"""Fit L(N, D) = E + A/N^α + B/D^β to measured losses, as Hoffmann et al. (2022) did, made
robust for a calibration's few points (docs/planning.md, "How the law is fitted").

Approach 3 of the Chinchilla paper: with a = log A, b = log B, e = log E, minimize

    Σ_i Huber_δ( LSE(a − α log N_i, b − β log D_i, e) − log L_i ),   δ = 1e-3,

from a grid of initializations (α, β ∈ {0, 0.5, …, 2}, e ∈ {−1, −0.5, …, 1},
a, b ∈ {0, 5, …, 25}), keeping the best. The grid is scored in one vectorized pass, the best
``starts`` points are refined at once (batched Levenberg–Marquardt) and L-BFGS-B polishes the
best of them: the optimum is the same on every problem we tried and the fit takes a second,
not minutes. Unlike the paper the fit is bounded — α, β ∈ [0.05, 1.5], E between 0.01 nats
and the lowest loss measured — because 15 short runs at 3 levels otherwise run E to 1e-24
while β → 0.09 (BENCHMARKS.md's wiki-books calibration).

Approach 2 is here too: at each FLOP budget a parabola in log N through the losses of the
IsoFLOP sweep gives the loss-minimizing N (clamped to the sizes swept, and marked, when the
vertex lies outside them: then it is a bound, not a measurement); a power law through the
minima inside the sizes gives N_opt ∝ C^a (``Frontier``), or with only one inside, the
published exponent anchored at it (``prior_exponent``).
With a sweep's levels (``bootstrap_fit(budgets=...)``) the law's exponents are tied to that a
(β/(α+β) = a), so its compute-optimal split follows the measured minima, and the planner sizes
the model by the frontier itself.

Intervals (``bootstrap_fit``): the fit is repeated on bootstrap resamples of the points (drawn
with replacement within each compute level, seeded), all refitted at once (a batched
Levenberg–Marquardt on the Huber loss, projected into the bounds, warm-started from the full
fit), each tied to its own draw of a from a residual bootstrap of the parabolas, so 200
resamples take about a second. A prediction's 90% interval is the 5th–95th percentile of the
resampled laws' losses, each multiplied by one of the full fit's log residuals (scaled by
√(n/(n−k)) for the k constants fitted), so it covers the scatter of a new run around the law
as well as the law's own uncertainty. Outside the fitted span of N, D and C = 6·N·D the
prediction is flagged as an extrapolation and the interval's half-widths are multiplied by
1 + the decades extrapolated: the bootstrap cannot see a law that bends past its data.

``scaled_fit`` is the one-constant fit for points that do not pin the five: a given law
(the published prior a calibration centred on) times a scale fitted to them, with the same
kind of interval (`calibrate.prior_fit`, docs/planning.md).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from shoestring.errors import ShoestringError
from shoestring.plan.laws import LAWS, Law

HUBER_DELTA = 1e-3
ALPHA_GRID = (0.0, 0.5, 1.0, 1.5, 2.0)
E_GRID = (-1.0, -0.5, 0.0, 0.5, 1.0)
AB_GRID = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)


def _split(law: Law) -> float:
    """a in N_opt ∝ C^a of a law's closed form (`Law.optimal`): β/(α+β)."""
    return law.beta / (law.alpha + law.beta)


# a in N_opt ∝ C^a as published, for a sweep that measured one IsoFLOP minimum only
PUBLISHED_EXPONENTS = {
    "Hoffmann et al. 2022, approach 1 (Table 2)": 0.50,
    "Hoffmann et al. 2022, approach 2 (Table 2)": 0.49,
    "Hoffmann et al. 2022, approach 3 (Table 2)": 0.46,
    "Besiroglu et al. 2024, Epoch's refit of approach 3 (the default law)": _split(LAWS["epoch"]),
    "DeepSeek LLM 2024, model scale M_opt ∝ C^0.5243": 0.5243,
}


def prior_exponent() -> tuple[float, float, float]:
    """(a, low, high) of N_opt ∝ C^a when a sweep measured only one IsoFLOP minimum: the
    default law's (Epoch's refit, 0.513) and the published values' range as its interval
    (``PUBLISHED_EXPONENTS``)."""
    values = PUBLISHED_EXPONENTS.values()
    return _split(LAWS["epoch"]), min(values), max(values)


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Huber loss and its derivative, elementwise."""
    a = np.abs(r)
    quad = a <= delta
    loss = np.where(quad, 0.5 * r * r, delta * (a - 0.5 * delta))
    grad = np.where(quad, r, delta * np.sign(r))
    return loss, grad


def _objective(theta: np.ndarray, logn: np.ndarray, logd: np.ndarray, logl: np.ndarray,
               delta: float) -> tuple[float, np.ndarray]:
    lse, w = _batch_terms(theta[None, :], logn, logd)
    loss, g = _huber(lse[0] - logl, delta)
    w = w[:, 0]
    grad = np.array([(g * w[0]).sum(), (g * w[1]).sum(), (g * w[2]).sum(),
                     -(g * w[0] * logn).sum(), -(g * w[1] * logd).sum()])
    return float(loss.sum()), grad


def _grid_scores(grid: np.ndarray, logn: np.ndarray, logd: np.ndarray, logl: np.ndarray,
                 delta: float) -> np.ndarray:
    a, b, e, alpha, beta = (grid[:, i : i + 1] for i in range(5))
    e_full = np.broadcast_to(e, (len(grid), len(logn)))
    terms = np.stack([a - alpha * logn, b - beta * logd, e_full])
    lse = np.logaddexp.reduce(terms, axis=0)
    return _huber(lse - logl, delta)[0].sum(axis=1)


@dataclass(frozen=True)
class FitResult:
    law: Law
    huber: float
    rmse_log: float  # root-mean-square error of log-loss over the points
    points: int
    theta: tuple[float, ...] = ()  # (log A, log B, log E, α, β) as fitted
    exponent: float | None = None  # the approach-2 N_opt exponent β/(α+β) was tied to, if any
    at_bounds: tuple[str, ...] = ()  # the constants that ended on a bound, for people

    @property
    def constants(self) -> int:
        """How many constants were fitted (4 when β is tied to α by the exponent)."""
        return 5 if self.exponent is None else 4


def fit_law(
    params: np.ndarray | list[float],
    tokens: np.ndarray | list[float],
    losses: np.ndarray | list[float],
    name: str = "fitted",
    objective: str = "mlm",
    starts: int = 16,
    source: str = "",
    exponent: float | None = None,
) -> FitResult:
    """The Chinchilla fit of L(N, D) to (N, D, loss) points (at least 5, more is better),
    inside the physical bounds below; with ``exponent`` (approach 2's a in N_opt ∝ C^a) the
    exponents are tied, β = α·a/(1−a), so the law's compute-optimal split follows the IsoFLOP
    minima and one constant fewer is fitted."""
    n = np.asarray(params, dtype=np.float64)
    d = np.asarray(tokens, dtype=np.float64)
    l = np.asarray(losses, dtype=np.float64)
    if not (len(n) == len(d) == len(l)):
        raise ValueError("params, tokens and losses must have the same length")
    if len(n) < 5:
        raise ShoestringError(
            f"a law has 5 constants; the sweep has only {len(n)} finished points",
            fix="run more sweep points (several sizes at two or more budgets)",
        )
    if (n <= 0).any() or (d <= 0).any() or (l <= 0).any() or not np.isfinite(l).all():
        raise ShoestringError("sweep points need positive N, D and finite positive losses")
    logn, logd, logl = np.log(n), np.log(d), np.log(l)
    ratio = _ratio(exponent)
    if ratio is None:
        grid = np.array(list(itertools.product(AB_GRID, AB_GRID, E_GRID, ALPHA_GRID,
                                               ALPHA_GRID)))
    else:
        grid = np.array([(*g, ratio * g[3]) for g in
                         itertools.product(AB_GRID, AB_GRID, E_GRID, ALPHA_GRID)])
    grid = _project(grid, logl, ratio)
    inits = grid[np.argsort(_grid_scores(grid, logn, logd, logl, HUBER_DELTA))[:starts]]
    # the batched refit from every start, then L-BFGS from the best
    starts_fit = _batch_refit(inits, logn, logd, logl, np.ones((len(inits), len(n))),
                              ratio=None if ratio is None else np.full(len(inits), ratio))
    inits = starts_fit[np.argsort(_grid_scores(starts_fit, logn, logd, logl, HUBER_DELTA))[:1]]
    best = _fit_theta(logn, logd, logl, HUBER_DELTA, inits, ratio)
    a, b, e, alpha, beta = best[1]
    law = Law(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=float(alpha),
              beta=float(beta), params="non_embedding", name=name,
              source=source or f"fitted on {len(n)} points", objective=objective)
    pred = np.log([law.loss(ni, di) for ni, di in zip(n, d)])
    return FitResult(law, best[0], float(np.sqrt(np.mean((pred - logl) ** 2))), len(n),
                     tuple(float(x) for x in best[1]),
                     None if ratio is None else ratio / (1 + ratio),
                     _at_bounds(best[1], logl, ratio))


def _at_bounds(theta: np.ndarray, logl: np.ndarray, ratio: float | None) -> tuple[str, ...]:
    """The constants a fit left on a bound (the points did not pin them), for people."""
    e_lo, e_hi, _, _ = _limits(logl, None)
    out = []
    if theta[2] <= e_lo + 1e-3:
        out.append(f"E at its floor ({E_FLOOR:g})")
    elif theta[2] >= e_hi - 1e-3:
        out.append(f"E at the lowest loss measured ({math.exp(e_hi):.4g})")
    for name, x in (("α", theta[3]), ("β", theta[4])):
        for bound in EXPONENT_BOUNDS:
            if abs(x - bound) <= 1e-3 * bound:
                out.append(f"{name} at its bound {bound:g}")
    return tuple(out)


# Bounds that keep the fit physical (Chinchilla's approach 3 is unbounded; on 15 short runs
# at 3 levels that lets E run to 1e-24 while β → 0.09 and B absorbs the loss level, the
# degenerate fit of BENCHMARKS.md). The exponents stay in [0.05, 1.5]: a negative or vanishing
# exponent says loss does not fall with N or D, and published fits lie in 0.07–0.8 (Kaplan
# et al. 2020's 0.076/0.095 to Hoffmann et al.'s 0.34/0.28 and their approach-2 refits). E,
# the irreducible loss, lies below every loss measured (no run beats the entropy of the text)
# and above E_FLOOR: a floor in nats, not a prior on its value — it only stops log E running
# to −∞ where the points do not pin E, and the plan says so when E ends on it.
EXPONENT_BOUNDS = (0.05, 1.5)
E_FLOOR = 0.01
# The approach-2 exponent a = β/(α+β) tied into approach 3 (β = α·a/(1−a)) is kept inside
# these bounds: beyond them one of the two terms would own the whole compute-optimal split.
TIE_BOUNDS = (0.05, 0.95)
_TIGHT = {"maxiter": 2000, "gtol": 1e-10, "ftol": 1e-14}


def _ratio(exponent: float | None) -> float | None:
    """β/α for a tied N_opt exponent a = β/(α+β) (None: untied)."""
    if exponent is None:
        return None
    a = min(max(exponent, TIE_BOUNDS[0]), TIE_BOUNDS[1])
    return a / (1 - a)


def _limits(logl: np.ndarray, ratio: np.ndarray | float | None
            ) -> tuple[float, float, Any, Any]:
    """(log E low, log E high, α low, α high); with a tie (β = ratio·α) α's range keeps β
    inside the exponent bounds too."""
    e_lo = math.log(E_FLOOR)
    e_hi = max(float(np.min(logl)) - 1e-6, e_lo + 1e-6)
    lo, hi = EXPONENT_BOUNDS
    if ratio is None:
        return e_lo, e_hi, lo, hi
    r = np.asarray(ratio, dtype=np.float64)
    return e_lo, e_hi, np.maximum(lo, lo / r), np.minimum(hi, hi / r)


def _project(t: np.ndarray, logl: np.ndarray, ratio: np.ndarray | float | None) -> np.ndarray:
    """Constants (rows of a, b, e, α, β) clipped into the bounds, β tied to α if asked."""
    t = np.array(t, dtype=np.float64, copy=True)
    e_lo, e_hi, a_lo, a_hi = _limits(logl, ratio)
    t[..., 2] = np.clip(t[..., 2], e_lo, e_hi)
    t[..., 3] = np.clip(t[..., 3], a_lo, a_hi)
    if ratio is None:
        t[..., 4] = np.clip(t[..., 4], *EXPONENT_BOUNDS)
    else:
        t[..., 4] = np.asarray(ratio) * t[..., 3]
    return t


def _fit_theta(logn: np.ndarray, logd: np.ndarray, logl: np.ndarray, delta: float,
               inits: np.ndarray, ratio: float | None = None) -> tuple[float, np.ndarray]:
    """The best bounded L-BFGS optimum from the given starting points (with ``ratio``, over
    a, b, e, α with β = ratio·α)."""
    from scipy.optimize import minimize

    e_lo, e_hi, a_lo, a_hi = _limits(logl, ratio)
    if ratio is None:
        bounds = [(None, None)] * 2 + [(e_lo, e_hi), (a_lo, a_hi), EXPONENT_BOUNDS]

        def f(x: np.ndarray) -> tuple[float, np.ndarray]:
            return _objective(x, logn, logd, logl, delta)
    else:
        bounds = [(None, None)] * 2 + [(e_lo, e_hi), (float(a_lo), float(a_hi))]

        def f(x: np.ndarray) -> tuple[float, np.ndarray]:
            value, g = _objective(np.append(x, ratio * x[3]), logn, logd, logl, delta)
            return value, np.array([g[0], g[1], g[2], g[3] + ratio * g[4]])

    best: tuple[float, np.ndarray] | None = None
    for x0 in _project(inits, logl, ratio):
        res = minimize(f, x0[: len(bounds)], jac=True, method="L-BFGS-B", options=_TIGHT,
                       bounds=bounds)
        x = res.x if ratio is None else np.append(res.x, ratio * res.x[3])
        if best is None or res.fun < best[0]:
            best = (float(res.fun), x)
    assert best is not None
    return best


def _theta_losses(thetas: np.ndarray, n: float, d: float) -> np.ndarray:
    """L(n, d) under each row of constants (a, b, e, α, β), computed in log space."""
    a, b, e, alpha, beta = thetas.T
    return np.exp(np.logaddexp.reduce(
        np.stack([a - alpha * math.log(n), b - beta * math.log(d), e]), axis=0))


@dataclass(frozen=True)
class Span:
    """The range the points cover: non-embedding N, tokens D and C = 6·N·D."""

    n: tuple[float, float]
    d: tuple[float, float]
    c: tuple[float, float]

    def outside(self, n: float, d: float) -> list[tuple[str, float]]:
        """(why, decades past the span) for each of N, D, C outside it (1% tolerance)."""
        out = []
        for name, value, (lo, hi) in (("N", n, self.n), ("D", d, self.d),
                                      ("C", 6 * n * d, self.c)):
            if value > hi * 1.01:
                out.append((f"{name} = {value:.3g} is {value / hi:.3g}× the largest fitted "
                            f"({hi:.3g})", math.log10(value / hi)))
            elif value < lo / 1.01:
                out.append((f"{name} = {value:.3g} is {lo / value:.3g}× below the smallest "
                            f"fitted ({lo:.3g})", math.log10(lo / value)))
        return out


@dataclass(frozen=True)
class Prediction:
    """A predicted held-out loss with its interval and where it extrapolates."""

    loss: float
    low: float
    high: float
    level: float
    extrapolated: bool
    outside: tuple[str, ...]
    widened_by: float  # the half-width factor applied for extrapolation (1: none)
    backtest_margin: float = 0.0  # ln-loss half-width the calibration's backtest asked for


@dataclass(frozen=True)
class BootstrapFit:
    """The full fit, the resampled constants and the span of the points."""

    fit: FitResult
    thetas: np.ndarray  # (resamples, 5): a, b, e, α, β of each resample's fit
    residuals: np.ndarray  # log residuals of the full fit, scaled for the constants fitted
    span: Span
    level: float
    seed: int
    frontier: Frontier | None = None  # approach 2, when the points came from IsoFLOP levels
    backtest: dict[str, Any] | None = None  # see `_backtest`
    # (level, lowest loss measured there) per IsoFLOP level, ascending: the loss envelope
    envelope: tuple[tuple[float, float], ...] = ()

    def predict(self, n: float, d: float) -> Prediction:
        """Loss at N non-embedding parameters and D tokens, with the interval (see module)."""
        loss = self.fit.law.loss(n, d)
        rng = np.random.default_rng(self.seed + 1)
        draws = _theta_losses(self.thetas, n, d) * np.exp(
            rng.choice(self.residuals, size=len(self.thetas)))
        tail = (1 - self.level) / 2
        low, high = (float(x) for x in np.quantile(draws, [tail, 1 - tail]))
        low, high = min(low, loss), max(high, loss)
        outside = self.span.outside(n, d)
        decades = max((dec for _, dec in outside), default=0.0)
        widen, margin = 1 + decades, 0.0
        if outside:
            low, high = loss - (loss - low) * widen, loss + (high - loss) * widen
            if self.backtest is not None:
                # at least the error the fit made extrapolating its own top level, per decade
                margin = self.backtest["log_error_per_decade"] * decades
                low, high = min(low, loss * math.exp(-margin)), max(high, loss * math.exp(margin))
        return Prediction(loss, max(low, 0.0), high, self.level, bool(outside),
                          tuple(why for why, _ in outside), widen, margin)


def _batch_terms(t: np.ndarray, logn: np.ndarray, logd: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """log L of each row of constants at each point (B, n), and the softmax weights of its
    three terms (3, B, n): the derivative of the log-sum-exp."""
    a, b, e, alpha, beta = (t[:, i : i + 1] for i in range(5))
    terms = np.stack([a - alpha * logn, b - beta * logd, np.broadcast_to(e, (len(t), len(logn)))])
    top = terms.max(axis=0)
    w = np.exp(terms - top)
    s = w.sum(axis=0)
    return top + np.log(s), w / s


def _batch_refit(theta0: np.ndarray, logn: np.ndarray, logd: np.ndarray, logl: np.ndarray,
                 weights: np.ndarray, iters: int = 200,
                 ratio: np.ndarray | None = None) -> np.ndarray:
    """The Huber fit for every resample at once (``weights``: (B, n) counts of each point;
    ``ratio``: (B,) β/α ties, one per resample, or None): Levenberg–Marquardt on iteratively
    reweighted least squares (the Huber weights min(1, δ/|r|)), each resample with its own
    damping, from the full fit's constants, each step projected into the bounds. On 200
    resamples this takes a fraction of a second and reaches the same or a lower Huber loss
    than L-BFGS per resample, which took a minute on a busy CPU."""
    def huber(t: np.ndarray) -> np.ndarray:
        return (_huber(_batch_terms(t, logn, logd)[0] - logl, HUBER_DELTA)[0] * weights).sum(1)

    t = _project(np.broadcast_to(theta0, (len(weights), 5)), logl, ratio)
    k = 5 if ratio is None else 4
    damping = np.full(len(weights), 1e-2)
    f = huber(t)
    for _ in range(iters):
        lse, w = _batch_terms(t, logn, logd)
        r = lse - logl
        d_alpha = -w[0] * logn
        if ratio is None:
            jac = np.stack([w[0], w[1], w[2], d_alpha, -w[1] * logd], axis=-1)
        else:  # β = ratio·α: α's column carries both terms
            jac = np.stack([w[0], w[1], w[2], d_alpha - ratio[:, None] * w[1] * logd], axis=-1)
        q = weights * np.minimum(1.0, HUBER_DELTA / np.maximum(np.abs(r), 1e-12))
        a = np.einsum("bni,bn,bnj->bij", jac, q, jac)
        g = np.einsum("bni,bn->bi", jac, q * r)
        diag = np.einsum("bii->bi", a)
        m = a + damping[:, None, None] * (np.eye(k) * (diag[:, None, :] + 1e-9))
        step = -(np.linalg.pinv(m) @ g[..., None])[..., 0]  # a term with no weight: singular
        trial = t.copy()
        trial[:, :k] += step
        trial = _project(trial, logl, ratio)
        f_trial = huber(trial)
        better = f_trial < f
        t[better], f[better] = trial[better], f_trial[better]
        damping = np.where(better, damping / 3, damping * 4)
    return t


def _groups(budgets: list[float | None] | None, count: int) -> list[np.ndarray]:
    """Indices of the points at each compute level (a point without a level is its own)."""
    if budgets is None:
        return [np.arange(count)]
    by: dict[Any, list[int]] = {}
    for i, c in enumerate(budgets):
        by.setdefault(("C", float(c)) if c is not None else ("point", i), []).append(i)
    return [np.array(v) for v in by.values()]


def _resample(rng: np.random.Generator, groups: list[np.ndarray], count: int,
              stratified: bool) -> np.ndarray:
    """Counts of each point in one bootstrap resample with at least 5 distinct points;
    ``stratified``: drawn within each compute level, keeping every level's size and at least
    3 distinct sizes where it had them (so each level still has an IsoFLOP parabola)."""
    while True:
        if not stratified:
            counts = np.bincount(rng.integers(0, count, count), minlength=count)
        else:
            counts = np.zeros(count, dtype=np.int64)
            for g in groups:
                need = min(3, len(g))
                while True:
                    draw = np.bincount(rng.integers(0, len(g), len(g)), minlength=len(g))
                    if (draw > 0).sum() >= need:
                        break
                counts[g] += draw
        if (counts > 0).sum() >= 5:
            return counts


def bootstrap_fit(
    params: np.ndarray | list[float],
    tokens: np.ndarray | list[float],
    losses: np.ndarray | list[float],
    resamples: int = 200,
    seed: int = 0,
    level: float = 0.9,
    budgets: list[float | None] | None = None,
    widths: list[float | None] | None = None,
    **fit_kw: Any,
) -> BootstrapFit:
    """``fit_law`` plus its refits on ``resamples`` bootstrap resamples of the points (each
    resample with at least 5 distinct points; all refitted at once by ``_batch_refit``).

    With ``budgets`` (each point's compute level: an IsoFLOP sweep) the fit is the two
    approaches together: the IsoFLOP minima give N_opt ∝ C^a (approach 2, ``Frontier``), the
    law is fitted with its exponents tied to that a (β/(α+β) = a), and the resamples are drawn
    within each level, each with its own minima, its own a and its own tied refit — so the
    interval carries the exponent's uncertainty as well as the scatter. ``widths`` (each
    point's hidden units per layer, None where unknown) bound the shapes the frontier sizes.
    With ``budgets`` of three or more levels the fit is also backtested (`_backtest`), and
    predictions past the span are at least as uncertain as that backtest was wrong.
    """
    n, d, l = (np.asarray(x, dtype=np.float64) for x in (params, tokens, losses))
    groups = _groups(budgets, len(n))
    prior = prior_exponent()
    front, full = _tied_fit(n, d, l, budgets, fit_kw)
    usable = front is not None and 0 < front[1] < 1
    logn, logd, logl = np.log(n), np.log(d), np.log(l)
    law = full.law
    rng = np.random.default_rng(seed)
    weights = np.array([_resample(rng, groups, len(n), budgets is not None)
                        for _ in range(resamples)], dtype=np.float64)
    draws = np.full((resamples, 2), np.nan)
    ratio = None
    if budgets is not None:
        draws = _frontier_draws(n, l, budgets, groups, rng, resamples, prior[1:])
        if usable:  # a resample without a frontier keeps the full fit's exponent
            a_i = np.where(np.isfinite(draws[:, 1]) & (draws[:, 1] > 0) & (draws[:, 1] < 1),
                           draws[:, 1], front[1])
            ratio = np.array([_ratio(float(x)) for x in a_i])
    thetas = _batch_refit(np.array(full.theta)[None, :], logn, logd, logl, weights,
                          ratio=ratio)
    pred = np.log([law.loss(ni, di) for ni, di in zip(n, d)])
    resid = (logl - pred) * math.sqrt(len(n) / max(len(n) - full.constants, 1))
    span = _span(n, d)
    frontier = (Frontier(front[0], front[1], tuple(front[2]), draws, level, front[3],
                         width_range(widths))
                if front is not None else None)
    checked = (_backtest(n, d, l, budgets, lambda *keep: _tied_fit(*keep, fit_kw)[1].law)
               if budgets is not None else None)
    return BootstrapFit(full, np.array(thetas), resid, span, level, seed, frontier, checked,
                        _envelope(budgets, groups, l))


def _envelope(budgets: list[float | None] | None, groups: list[np.ndarray], l: np.ndarray
              ) -> tuple[tuple[float, float], ...]:
    """(level, lowest loss measured there) per IsoFLOP level, ascending (``BootstrapFit``)."""
    if budgets is None:
        return ()
    return tuple(sorted((float(budgets[g[0]]), float(l[g].min())) for g in groups
                        if budgets[g[0]] is not None))


def scaled_fit(law: Law, params: np.ndarray | list[float], tokens: np.ndarray | list[float],
               losses: np.ndarray | list[float], budgets: list[float | None] | None = None,
               resamples: int = 200, seed: int = 0, level: float = 0.9,
               name: str = "", source: str = "", objective: str = "mlm") -> BootstrapFit:
    """``law`` with one constant fitted to the points: a common scale s, L = s·law(N, D)
    (least squares in ln-loss: ln s is the mean of ln(measured / law)), with the interval
    that implies, as a ``BootstrapFit`` the planner reads like any other. N is as ``law``
    counts it (`Law.count`); its loss is then ``objective``'s on your data. The exponents,
    and so the law's compute-optimal split, stay the law's; the points set its level. The
    interval: ln s refitted on ``resamples`` resamples (within each level, as
    `bootstrap_fit` draws them), times the points' own log residuals
    around the scaled law (scaled by √(n/(n−1))) — however far the law's shape misses these
    points is that wide — and, with three or more levels, the backtest of the same fit
    without its top level (`_backtest`), which widens predictions past the points. Why a
    scale and not an added constant: the loss is per token of *your* tokenizer and
    objective, and a change of either scales nats per token; a scale also keeps every
    prediction positive."""
    if law.E <= 0:  # the constants are kept as logs
        raise ShoestringError(f"the '{law.name}' law has E = {law.E}: it cannot be scaled",
                              where="--law", fix="centre the calibration on epoch or chinchilla")
    n, d, l = (np.asarray(x, dtype=np.float64) for x in (params, tokens, losses))
    gap = _log_gap(law, n, d, l)
    groups = _groups(budgets, len(n))
    rng = np.random.default_rng(seed)
    weights = np.array([_resample(rng, groups, len(n), budgets is not None)
                        for _ in range(resamples)], dtype=np.float64)
    shift = float(gap.mean())
    base = np.log([law.A, law.B, law.E])
    thetas = np.array([[*(base + float(np.average(gap, weights=w))), law.alpha, law.beta]
                       for w in weights])
    scaled = replace(_scale(law, shift), name=name or f"{law.name}-scaled",
                     source=source or f"the '{law.name}' law scaled to {len(n)} points",
                     objective=objective)
    resid = (gap - shift) * math.sqrt(len(n) / max(len(n) - 1, 1))
    full = FitResult(scaled, float(_huber(gap - shift, HUBER_DELTA)[0].sum()),
                     float(np.sqrt(np.mean((gap - shift) ** 2))), len(n),
                     (*(float(x) for x in base + shift), law.alpha, law.beta))
    checked = (_backtest(n, d, l, budgets,
                         lambda kn, kd, kl, _: _scale(law, float(_log_gap(law, kn, kd, kl).mean())))
               if budgets is not None else None)
    return BootstrapFit(full, thetas, resid, _span(n, d), level, seed, None, checked,
                        _envelope(budgets, groups, l))


def _scale(law: Law, shift: float) -> Law:
    """``law`` times e^shift (every term scaled: the same exponents and split)."""
    s = math.exp(shift)
    return replace(law, E=law.E * s, A=law.A * s, B=law.B * s)


def _log_gap(law: Law, n: np.ndarray, d: np.ndarray, l: np.ndarray) -> np.ndarray:
    """ln(measured / law) at each point."""
    return np.log(l) - np.log([law.loss(ni, di) for ni, di in zip(n, d)])


def _tied_fit(n: np.ndarray, d: np.ndarray, l: np.ndarray, budgets: list[float | None] | None,
              fit_kw: dict[str, Any]) -> tuple[tuple | None, FitResult]:
    """Approach 2's frontier (with ``budgets``) and the law fitted with its exponents tied to
    the frontier's a when that is usable (0 < a < 1), else free."""
    front = (_frontier(n, l, budgets, _groups(budgets, len(n)), prior_exponent()[0])
             if budgets is not None else None)
    usable = front is not None and 0 < front[1] < 1
    return front, fit_law(n, d, l, exponent=front[1] if usable else None, **fit_kw)


def _span(n: np.ndarray, d: np.ndarray) -> Span:
    c = 6 * n * d
    return Span((float(n.min()), float(n.max())), (float(d.min()), float(d.max())),
                (float(c.min()), float(c.max())))


def _backtest(n: np.ndarray, d: np.ndarray, l: np.ndarray, budgets: list[float | None],
              refit: Callable[[np.ndarray, np.ndarray, np.ndarray, list[float | None]], Law]
              ) -> dict[str, Any] | None:
    """Fit without the top compute level (``refit``: the same fit on fewer points, their
    levels) and predict it: how wrong this fit is when it
    extrapolates, on your own data (None with fewer than three levels). A plan extrapolates
    further past the top level; the bootstrap covers the scatter and the exponent, not a law
    whose form misfits the points (short runs near unigram statistics bend the curve), so the
    backtest's worst error per decade extrapolated bounds the interval from below."""
    levels = sorted({b for b in budgets if b is not None})
    if len(levels) < 3:
        return None
    top = levels[-1]
    keep = np.array([b is not None and b < top for b in budgets])
    held = np.array([b == top for b in budgets])
    sub = refit(n[keep], d[keep], l[keep], [b for b, k in zip(budgets, keep) if k])
    span = _span(n[keep], d[keep])
    errors, rates, spans = [], [], []
    for ni, di, li in zip(n[held], d[held], l[held]):
        err = math.log(sub.loss(ni, di) / li)
        dec = max((x for _, x in span.outside(ni, di)), default=0.0)
        errors.append(err)
        spans.append(dec)
        if dec > 0:
            rates.append(abs(err) / dec)
    if not rates:
        return None
    return {"held_out_flops": float(top), "points": int(held.sum()),
            "mean_log_error": float(np.mean(errors)),
            "min_log_error": float(np.min(errors)), "max_log_error": float(np.max(errors)),
            "max_abs_log_error": float(np.max(np.abs(errors))),
            "decades": float(max(spans)), "log_error_per_decade": float(max(rates))}


# ----------------------------------------------------------------------- approach 2


@dataclass(frozen=True)
class IsoFlopMinimum:
    flops: float
    params: float  # loss-minimizing N on this budget's parabola (clamped to the sizes swept)
    loss: float
    coeffs: tuple[float, float, float]  # loss = c0·x² + c1·x + c2, x = ln N
    edge: str = ""  # "below"/"above": the minimum is not inside the sizes swept
    vertex: float | None = None  # the parabola's own vertex N (None: it opens downward)
    sizes: tuple[float, float] = (0.0, 0.0)  # smallest and largest N swept at this budget

    def describe(self) -> str:
        """Where this level's minimum lies, for people."""
        where = f"N* = {self.params:,.0f} at {self.flops:.3g} FLOPs"
        if not self.edge:
            return where
        side = "smallest" if self.edge == "below" else "largest"
        why = (f"the parabola's vertex ({self.vertex:,.0f}) lies {self.edge} the sizes swept"
               if self.vertex is not None else "the losses curve downward (no vertex)")
        return (f"{where}: at the {side} size swept — {why}, so the minimum is only known "
                f"to lie {self.edge} {self.params:,.0f}")


def _level_minimum(c: float, x: np.ndarray, y: np.ndarray) -> IsoFlopMinimum | None:
    """The parabola in x = ln N through one level's losses and its minimum; None with fewer
    than 3 distinct sizes."""
    if len(set(np.round(x, 6))) < 3:
        return None
    coeffs = np.polyfit(x, y, 2)
    c0, c1, _ = coeffs
    lo, hi = float(x.min()), float(x.max())
    vertex = -c1 / (2 * c0) if c0 > 0 else None
    if vertex is not None and lo <= vertex <= hi:
        xm, edge = vertex, ""
    elif vertex is not None:
        xm, edge = (lo, "below") if vertex < lo else (hi, "above")
    else:  # opens downward: the lower end of the two is the level's best
        xm = lo if np.polyval(coeffs, lo) <= np.polyval(coeffs, hi) else hi
        edge = "below" if xm == lo else "above"
    return IsoFlopMinimum(float(c), float(math.exp(xm)), float(np.polyval(coeffs, xm)),
                          tuple(float(k) for k in coeffs), edge,
                          float(math.exp(vertex)) if vertex is not None else None,
                          (float(math.exp(lo)), float(math.exp(hi))))


def _minima(n: np.ndarray, l: np.ndarray, budgets: list[float | None],
            groups: list[np.ndarray]) -> list[IsoFlopMinimum]:
    """Each compute level's minimum (`_level_minimum`), in the order of ``groups``."""
    return [m for g in groups if budgets[g[0]] is not None
            and (m := _level_minimum(float(budgets[g[0]]), np.log(n[g]), l[g])) is not None]


def _frontier(n: np.ndarray, l: np.ndarray, budgets: list[float | None],
              groups: list[np.ndarray], prior: float | None = None
              ) -> tuple[float, float, list[IsoFlopMinimum], str] | None:
    """(k, a, minima, source) of N_opt = k·C^a; None without a usable line.

    Only minima inside the sizes swept are measurements: an edge minimum is a bound (N* lies
    somewhere below the smallest size, or above the largest), and treating the edge as N*
    flattens or steepens the slope by as much as the sizes were misplaced. So a is fitted
    through the inside minima when there are ≥ 2 (``source`` "minima"); with exactly one,
    the line is anchored there with the ``prior`` exponent (``source`` "prior"); else None."""
    minima = sorted(_minima(n, l, budgets, groups), key=lambda m: m.flops)
    inside = [m for m in minima if not m.edge]
    fit = power_law([m.flops for m in inside], [m.params for m in inside])
    if fit is not None:
        return fit[0], fit[1], minima, "minima"
    if len(inside) == 1 and prior is not None:
        return inside[0].params / inside[0].flops**prior, prior, minima, "prior"
    return None


def _frontier_draws(n: np.ndarray, l: np.ndarray, budgets: list[float | None],
                    groups: list[np.ndarray], rng: np.random.Generator, resamples: int,
                    prior_range: tuple[float, float] | None = None) -> np.ndarray:
    """(ln k, a) of the frontier refitted on ``resamples`` residual-bootstrap copies of the
    sweep: each level's parabola plus residuals drawn from all levels' (pooled, scaled by
    √(n/(n−p)) for the p parabola constants). The sizes of a sweep are chosen, not sampled,
    so the residuals are what is resampled (a case resample of 5 sizes leaves a parabola
    through 3 and its vertex anywhere); NaN where a copy has no frontier. A copy with one
    inside minimum is anchored there with an exponent drawn uniformly from ``prior_range``
    (the published laws' spread), so the interval says how little one minimum pins."""
    fitted = np.full(len(n), np.nan)
    constants = 0
    for g in groups:
        c = budgets[g[0]]
        if c is None or len(set(np.round(np.log(n[g]), 6))) < 3:
            continue
        fitted[g] = np.polyval(np.polyfit(np.log(n[g]), l[g], 2), np.log(n[g]))
        constants += 3
    draws = np.full((resamples, 2), np.nan)
    have = np.isfinite(fitted)
    if have.sum() <= constants:
        return draws
    resid = (l - fitted)[have] * math.sqrt(have.sum() / (have.sum() - constants))
    for i in range(resamples):
        copy = l.copy()
        copy[have] = fitted[have] + rng.choice(resid, size=int(have.sum()))
        prior = float(rng.uniform(*prior_range)) if prior_range else None
        got = _frontier(n, copy, budgets, groups, prior)
        if got is not None:
            draws[i] = math.log(got[0]), got[1]
    return draws


@dataclass(frozen=True)
class Frontier:
    """Chinchilla's approach 2 on the sweep: N_opt(C) = k·C^a through the IsoFLOP minima
    (C in the sweep's FLOPs: the exact count `train` spends), with its bootstrap."""

    k: float
    a: float
    minima: tuple[IsoFlopMinimum, ...]
    draws: np.ndarray  # (resamples, 2): ln k and a of each resample's frontier (NaN: none)
    level: float = 0.9
    source: str = "minima"  # "minima": a fitted through ≥ 2 inside minima; "prior": one, a assumed
    # hidden units per layer of the shapes swept (lowest, highest); None: not known
    widths: tuple[float, float] | None = None

    @property
    def usable(self) -> bool:
        """Whether it can choose a size: N_opt and D_opt = C/(6·N_opt) both grow with C."""
        return 0 < self.a < 1

    @property
    def top(self) -> float:
        return max(m.flops for m in self.minima)

    def params(self, flops: float) -> float:
        return self.k * flops**self.a

    def _tails(self, values: np.ndarray) -> tuple[float | None, float | None]:
        """The level's percentiles of the finite values (None, None: no resample had one)."""
        values = values[np.isfinite(values)]
        tail = (1 - self.level) / 2
        if not len(values):
            return None, None
        return tuple(float(x) for x in np.quantile(values, [tail, 1 - tail]))  # type: ignore

    def exponent_interval(self) -> tuple[float, float]:
        """The bootstrap interval of a (the level's percentiles of the resamples' a)."""
        lo, hi = self._tails(self.draws[:, 1])
        return (self.a, self.a) if lo is None else (min(lo, self.a), max(hi, self.a))

    def params_interval(self, flops: float) -> tuple[float, float]:
        """The bootstrap interval of N_opt at ``flops``."""
        lo, hi = self._tails(np.exp(self.draws[:, 0] + self.draws[:, 1] * math.log(flops)))
        n = self.params(flops)
        return (n, n) if lo is None else (min(lo, n), max(hi, n))

    def edges(self) -> list[str]:
        return [m.describe() for m in self.minima if m.edge]

    def fits_width(self, hidden: int, layers: int) -> bool:
        """Whether a shape's hidden units per layer lie within those swept (1% tolerance):
        N_opt is measured on shapes of those proportions, and at a fixed N a shallower, wider
        shape can train markedly worse (docs/planning.md, "How the law is fitted")."""
        if self.widths is None:
            return True
        lo, hi = self.widths
        return lo / 1.01 <= hidden / max(layers, 1) <= hi * 1.01

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "a": self.a, "level": self.level, "source": self.source,
                "minima": [{"flops": m.flops, "params": m.params, "loss": m.loss,
                            "coeffs": list(m.coeffs), "edge": m.edge, "vertex": m.vertex,
                            "sizes": list(m.sizes)} for m in self.minima],
                "draws": [[float(x) for x in row] for row in self.draws],
                **({"widths": list(self.widths)} if self.widths is not None else {})}

    @staticmethod
    def from_dict(tree: dict[str, Any]) -> Frontier:
        minima = tuple(IsoFlopMinimum(float(m["flops"]), float(m["params"]), float(m["loss"]),
                                      tuple(float(c) for c in m["coeffs"]), str(m["edge"]),
                                      None if m["vertex"] is None else float(m["vertex"]),
                                      tuple(float(x) for x in m["sizes"]))
                       for m in tree["minima"])
        widths = tree.get("widths")
        return Frontier(float(tree["k"]), float(tree["a"]), minima,
                        np.array(tree["draws"], dtype=np.float64).reshape(-1, 2),
                        float(tree["level"]), str(tree.get("source", "minima")),
                        None if widths is None else (float(widths[0]), float(widths[1])))


def _sweep(points: list[dict], key_n: str) -> tuple[list[float], np.ndarray, np.ndarray]:
    """Sweep points (dicts with ``budget_flops``, ``val_loss`` and N) → budgets, N, losses."""
    return ([float(p["budget_flops"]) for p in points],
            np.array([p[key_n] for p in points], dtype=np.float64),
            np.array([p["val_loss"] for p in points], dtype=np.float64))


def isoflop_minima(points: list[dict], key_n: str = "params_non_embedding") -> list[IsoFlopMinimum]:
    """Parabola in ln N through each budget's losses (≥3 sizes) → its minimum; a minimum
    outside the sizes swept (or a parabola opening downward) is clamped to the nearest edge
    and marked (``edge``)."""
    budgets, n, l = _sweep(points, key_n)
    groups = _groups(budgets, len(n))
    got = _frontier(n, l, budgets, groups, prior_exponent()[0])
    return got[2] if got is not None else _minima(n, l, budgets, groups)


def isoflop_frontier(points: list[dict], key_n: str = "params_non_embedding",
                     resamples: int = 200, seed: int = 0, level: float = 0.9
                     ) -> Frontier | None:
    """Approach 2 on sweep points (dicts with ``budget_flops``, ``val_loss`` and N), with a
    bootstrap within each level; None with fewer than 2 levels of ≥3 sizes."""
    budgets, n, l = _sweep(points, key_n)
    groups = _groups(budgets, len(n))
    prior = prior_exponent()
    front = _frontier(n, l, budgets, groups, prior[0])
    if front is None:
        return None
    draws = _frontier_draws(n, l, budgets, groups, np.random.default_rng(seed), resamples,
                            prior[1:])
    return Frontier(front[0], front[1], tuple(front[2]), draws, level, front[3],
                    width_range([point_width(p) for p in points]))


def point_width(point: dict) -> float | None:
    """A sweep point's or run's hidden units per layer (None when its shape is not recorded)."""
    model = point.get("model")
    if not isinstance(model, dict) or not model.get("num_layers"):
        return None
    return float(model["hidden_size"]) / float(model["num_layers"])


def width_range(widths: list[float | None] | None) -> tuple[float, float] | None:
    """(lowest, highest) of the known widths; None when none is known."""
    known = [w for w in widths or () if w is not None and w > 0]
    return (min(known), max(known)) if known else None


def power_law(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """(k, a) with y = k·x^a, least squares in log-log; None with fewer than 2 distinct x."""
    if len(set(xs)) < 2:
        return None
    a, logk = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(math.exp(logk)), float(a)
