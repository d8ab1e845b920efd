"""Learning-rate schedules keyed to budget progress (a fraction in [0, 1]).

Each returns the multiplier of the peak learning rate. Keying to progress rather than to a
step count is what lets a wall-clock budget get a complete schedule however fast the machine
turns out to be (Cramming's budget-aware schedules).
"""

from __future__ import annotations

import math

from shoestring.config import TrainConfig


def one_cycle(progress: float, peak_at: float) -> float:
    """Cramming's budget-triangular schedule: linear up to 1 at ``peak_at``, linear down to 0."""
    p = min(max(progress, 0.0), 1.0)
    if p < peak_at:
        return p / peak_at
    if peak_at >= 1.0:
        return 1.0
    return (1.0 - p) / (1.0 - peak_at)


def _warm(p: float, warmup: float) -> float | None:
    return p / warmup if p < warmup else None


def wsd(progress: float, warmup: float, decay: float, floor: float = 0.0) -> float:
    """Warmup-stable-decay (Hägele et al. 2024): linear warmup, constant, then a 1-sqrt
    cool-down over the last ``decay`` fraction down to ``floor``."""
    p = min(max(progress, 0.0), 1.0)
    if (w := _warm(p, warmup)) is not None:
        return w
    start = 1.0 - decay
    if p < start:
        return 1.0
    return floor + (1.0 - floor) * (1.0 - math.sqrt((p - start) / decay))


def cosine(progress: float, warmup: float, floor: float = 0.0) -> float:
    """Linear warmup, then half a cosine from 1 down to ``floor``."""
    p = min(max(progress, 0.0), 1.0)
    if (w := _warm(p, warmup)) is not None:
        return w
    t = (p - warmup) / (1.0 - warmup)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def linear(progress: float, warmup: float, floor: float = 0.0) -> float:
    """Linear warmup, then linear decay to ``floor`` (the transformers default schedule)."""
    p = min(max(progress, 0.0), 1.0)
    if (w := _warm(p, warmup)) is not None:
        return w
    return floor + (1.0 - floor) * (1.0 - p) / (1.0 - warmup)


def constant(progress: float, warmup: float) -> float:
    p = min(max(progress, 0.0), 1.0)
    w = _warm(p, warmup)
    return 1.0 if w is None else w


def lr_factor(cfg: TrainConfig, progress: float) -> float:
    """The configured schedule's multiplier at ``progress``."""
    if cfg.schedule == "one-cycle":
        return one_cycle(progress, cfg.lr_peak_at)
    if cfg.schedule == "wsd":
        return wsd(progress, cfg.warmup, cfg.decay, cfg.min_lr_ratio)
    if cfg.schedule == "cosine":
        return cosine(progress, cfg.warmup, cfg.min_lr_ratio)
    if cfg.schedule == "linear":
        return linear(progress, cfg.warmup, cfg.min_lr_ratio)
    return constant(progress, cfg.warmup)


def batch_at(cfg: TrainConfig, progress: float, quantum: int | None = None) -> int:
    """Sequences in the step at ``progress``: Cramming's linear ramp from one micro-step to
    ``batch_size`` by ``batch_ramp`` of the budget, in whole micro-steps; flat if no ramp.

    A micro-step is ``quantum`` sequences: one micro-batch on every data-parallel rank
    (``dp × micro_batch``); one micro-batch in one process.
    """
    step = quantum or cfg.micro_batch()
    if cfg.batch_ramp <= 0 or progress >= cfg.batch_ramp:
        return cfg.batch_size
    target = cfg.batch_size * progress / cfg.batch_ramp
    return max(step, min(cfg.batch_size, int(round(target / step)) * step))
