"""The trainer's own step, timed in this process: what `plan` measures a shape's speed with
(`plan/measure.py`), so a plan's seconds are `train`'s seconds — the same `build_step` (device,
precision, layout, optimizers, attention kernel, compile choice) and the same `train_step`."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from shoestring.config import Config
from shoestring.dist.layout import layout_from_config
from shoestring.dist.parallelism import Parallelism
from shoestring.train.run import build_step, train_step
from shoestring.train.schedule import lr_factor
from shoestring.train.state import TrainState


@dataclass(frozen=True)
class StepTiming:
    """What `time_steps` measured: the trainer's own step, on this machine."""

    steps: int  # timed steps (after the warm-up ones)
    seconds: float
    tokens_per_s: float
    flops_per_token: float
    peak_flops: float  # the device's measured peak, the one `train` quotes MFU against
    mfu: float  # against that peak
    micro_batch: int
    speed: str  # the attention kernel and compile choices, as the run log prints them


def time_steps(cfg: Config, vocab: int, seq_len: int, *, seconds: float = 3.0,
               warmup: int = 2, min_steps: int = 3) -> StepTiming:
    """Time `train_step` — the step `train` runs, built by the same `build_step` (device and
    precision choice, model, layout, optimizers, attention kernel, compile choice, loss
    scaler) — for ``cfg`` in this process, on random token ids held in memory (a step's speed
    does not depend on which ids; the loader's wait, which `train` reports as ``data_wait``,
    is left out). The batch is ``cfg.train.batch_size`` with its micro-batches; warm-up steps
    (and a compilation, if ``cfg.train.compile`` asks for one) are not timed. Nothing is
    written and the caller's RNG streams are untouched."""
    layout = layout_from_config(cfg.parallel, 1)
    parallel = Parallelism.start(cfg, layout, vocab)
    try:
        with torch.random.fork_rng(devices=[]):
            r = build_step(cfg, vocab, seq_len, {}, parallel)
            rows = itertools.cycle([torch.randint(8, vocab, (r.quantum, seq_len),
                                                  generator=r.gen) for _ in range(2)])
            # ``warmup`` untimed steps, then steps until ``min_steps`` and ``seconds`` are both
            # reached, at the whole batch and the schedule's first learning rate; the device
            # is synchronized before the clock starts and before it stops
            tc, s = r.cfg.train, TrainState()
            bsz, lr = tc.batch_size, tc.lr * lr_factor(tc, 0.0)
            r.parallel.train_mode(True)
            sync = torch.cuda.synchronize if r.dev.device.type == "cuda" else (lambda: None)
            for _ in range(warmup):
                train_step(r, rows, s, bsz, lr)
            sync()
            start, steps, tokens = time.perf_counter(), 0, s.tokens
            while steps < min_steps or time.perf_counter() - start < seconds:
                train_step(r, rows, s, bsz, lr)
                steps += 1
            sync()
            elapsed = time.perf_counter() - start
            tps = (s.tokens - tokens) / elapsed  # a skipped (non-finite) step trains no tokens
            return StepTiming(steps, elapsed, tps, r.flops_per_token, r.dev.peak_flops,
                              r.window.mfu(tps), r.micro, r.speed.describe())
    finally:
        parallel.close()
