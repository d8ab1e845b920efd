"""Did pretraining pay? The from-scratch control and the statistics that compare with it.

The control is the same architecture fine-tuned from random initialization with the same
protocol, the same seeds and the same code (``run_task`` with
``TaskSettings(from_scratch=True)``). Seed ``s`` of both arms sees the same batches in the
same order and starts its classifier head from the same draw, so the two arms are *paired* by
seed: the comparison is over per-seed differences, which cancels the part of the
seed-to-seed spread both arms share.

A difference is reported with a 95% confidence interval from Student's t over the paired
differences; it is "within noise" when that interval contains zero. With one seed there is no
interval and the difference is always flagged as unresolved.

The default number of seeds (``seeds_for``) follows one rule, stated in docs/eval.md: small dev
sets (under 2,000 examples: CoLA, SST-2, MRPC, RTE, STS-B, most users' own tasks) get 5 seeds,
larger ones 3. The dev-set size is what drives it because both the sampling error of a dev
score and the fine-tuning instability (Mosbach et al. 2021, "On the stability of fine-tuning
BERT") grow as the data shrink. When a report still finds a difference within noise it also
says how many seeds the observed spread would need to resolve it (``seeds_needed``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["SMALL_DEV", "compare_arms", "seeds_for", "seeds_needed", "t95"]

SMALL_DEV = 2000  # examples in the first evaluation split below which a task is "small"


def seeds_for(dev_examples: int) -> int:
    """Default fine-tuning seeds for a task whose first evaluation split has this many rows."""
    return 5 if dev_examples < SMALL_DEV else 3


def t95(dof: int) -> float:
    """Student's t at 97.5% with ``dof`` degrees of freedom: a two-sided 95% interval's factor."""
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


def seeds_needed(std_diff: float, difference: float, cap: int = 50) -> int | None:
    """Seeds a paired comparison needs for its 95% interval to exclude zero, given the
    observed spread of per-seed differences; None when no count up to ``cap`` would do
    (the difference is too small against its spread to resolve cheaply, or there is none:
    both arms scored the same on every seed)."""
    if difference == 0:
        return None
    if std_diff == 0:
        return 2
    for k in range(2, cap + 1):
        if t95(k - 1) * std_diff / math.sqrt(k) < abs(difference):
            return k
    return None


def compare_arms(pretrained: list[dict[str, Any]], scratch: list[dict[str, Any]],
                 split: str) -> dict[str, Any]:
    """Paired comparison of one split's score (×100): per-seed records of both arms, matched
    by seed. Returns the medians, the mean paired difference, its 95% CI and the verdict."""
    by_seed = {r["seed"]: r["splits"][split]["score"] for r in scratch}
    pairs = [(100 * r["splits"][split]["score"], 100 * by_seed[r["seed"]])
             for r in pretrained if r["seed"] in by_seed]
    if not pairs:
        raise ValueError("the two arms share no seed")
    pre, scr = np.array(pairs).T
    diff = pre - scr
    k = len(diff)
    out: dict[str, Any] = {
        "seeds": k,
        "pretrained_median": float(np.median(pre)),
        "scratch_median": float(np.median(scr)),
        "difference_mean": float(diff.mean()),
        "difference_median": float(np.median(diff)),
        "difference_std": float(diff.std(ddof=1)) if k > 1 else None,
    }
    if k < 2:
        out.update(ci95=None, within_noise=True, seeds_needed=None,
                   verdict="one seed: no interval, run more seeds (--seeds)")
        return out
    half = t95(k - 1) * out["difference_std"] / math.sqrt(k)
    lo, hi = out["difference_mean"] - half, out["difference_mean"] + half
    within = lo <= 0.0 <= hi
    out.update(ci95=[float(lo), float(hi)], within_noise=bool(within))
    if within:
        need = seeds_needed(out["difference_std"], out["difference_mean"])
        out["seeds_needed"] = need
        if out["difference_std"] == 0 and out["difference_mean"] == 0:
            out["verdict"] = "no difference: both arms scored the same on every seed"
        else:
            out["verdict"] = ("within noise" + (f" (about {need} seeds would resolve a "
                              "difference this size)" if need else " (too small to resolve "
                              "with seeds)"))
    else:
        out["seeds_needed"] = None
        out["verdict"] = "pretraining helps" if lo > 0 else "pretraining hurts"
    return out
