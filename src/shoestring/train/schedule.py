"""Learning-rate schedules keyed to budget progress (a fraction in [0, 1])."""

from __future__ import annotations


def one_cycle(progress: float, peak_at: float) -> float:
    """Cramming's budget-triangular schedule: linear up to 1 at ``peak_at``, linear down to 0.

    Returns the multiplier of the peak learning rate.
    """
    p = min(max(progress, 0.0), 1.0)
    if p < peak_at:
        return p / peak_at
    if peak_at >= 1.0:
        return 1.0
    return (1.0 - p) / (1.0 - peak_at)
