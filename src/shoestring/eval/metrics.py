"""Task metrics, computed by scikit-learn and scipy (the implementations papers report with).

Scores are returned as fractions in [0, 1] (correlations in [-1, 1]); reports multiply by
100 the way the GLUE leaderboard prints them. Each task names one *main* metric (the one that
enters the GLUE average); tasks with two metrics (MRPC, QQP: F1 and accuracy; STS-B: Pearson
and Spearman) use their mean as the main score, the GLUE leaderboard's convention.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

__all__ = ["METRICS", "compute_metrics", "main_score"]


def _corr(fn: Callable) -> Callable[[np.ndarray, np.ndarray], float]:
    def score(y: np.ndarray, p: np.ndarray) -> float:
        # A constant prediction has no correlation: scipy warns and returns nan; we report 0.
        if np.std(p) == 0 or np.std(y) == 0:
            return 0.0
        r = float(fn(y, p)[0])
        return 0.0 if math.isnan(r) else r

    return score


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "mcc": lambda y, p: float(matthews_corrcoef(y, p)),
    "accuracy": lambda y, p: float(accuracy_score(y, p)),
    # Binary F1 of the positive class (label index 1), as GLUE scores MRPC and QQP.
    "f1": lambda y, p: float(f1_score(y, p, pos_label=1, average="binary", zero_division=0.0)),
    "macro_f1": lambda y, p: float(f1_score(y, p, average="macro", zero_division=0.0)),
    "pearson": _corr(pearsonr),
    "spearman": _corr(spearmanr),
}


def compute_metrics(names: Sequence[str], labels: Sequence, predictions: Sequence) -> dict[str, float]:
    """``{name: score}`` for each metric name in ``names`` (see ``METRICS``).

    Classification: ``labels``/``predictions`` are class indices; regression: floats.
    """
    y, p = np.asarray(labels), np.asarray(predictions)
    if y.shape != p.shape:
        raise ValueError(f"labels {y.shape} and predictions {p.shape} differ in shape")
    if len(y) == 0:
        raise ValueError("no examples to score")
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(METRICS)}")
    return {n: METRICS[n](y, p) for n in names}


def main_score(scores: dict[str, float], names: Sequence[str]) -> float:
    """The task's single number: the mean of its metrics (one metric: that metric)."""
    return float(np.mean([scores[n] for n in names]))
