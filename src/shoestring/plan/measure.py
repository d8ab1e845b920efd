"""`plan --measure`: the MFU of the planned model's real training step on this machine.

The step is `train`'s own (`shoestring.train.timing.time_steps`: the same device and precision
choice, model, optimizers, objective, attention-kernel choice and micro-batching as a run), at
one micro-batch of the plan's (at most `MAX_ROWS` rows: a CPU would spend minutes on a full
batch of a large plan) per step, on random token ids (speed does not depend on which ids).
Warm-up steps are not timed. A step of one micro-batch carries the whole optimizer update, so
where the plan accumulates several micro-batches per step its MFU is, if anything, higher. It
runs uncompiled: `train` compiles runs long enough to win the compile back (`train.speed`),
which then run faster than measured here, so for those the measured MFU is a floor. MFU
(`model.flops.mfu`) is over the same measured peak the plan uses.
"""

from __future__ import annotations

from shoestring.config import Config, DataConfig, ModelConfig, TrainConfig
from shoestring.datasheets import Hardware

MAX_ROWS = 64
"""Rows per timed step at most."""


def measure_mfu(model_cfg: ModelConfig, vocab: int, seq_len: int, micro_batch: int,
                hw: Hardware, precision: str = "auto", seconds: float = 3.0) -> float:
    """Fraction of ``hw``'s peak that training this model reaches on this device: the real
    trainer's step on one micro-batch of ``micro_batch`` rows (at most `MAX_ROWS`), timed for
    ``seconds`` after the warm-up steps."""
    from shoestring.model.flops import mfu
    from shoestring.train.timing import time_steps

    micro = max(1, min(micro_batch, MAX_ROWS))
    cfg = Config(model=model_cfg, data=DataConfig(vocab_size=vocab, seq_len=seq_len),
                 train=TrainConfig(budget=None, steps=1, batch_size=micro,
                                   micro_batch_size=micro, precision=precision, compile=False))
    timing = time_steps(cfg, vocab, seq_len, seconds=seconds)
    peak, _ = hw.peak(precision)
    return mfu(timing.tokens_per_s, timing.flops_per_token, peak)
