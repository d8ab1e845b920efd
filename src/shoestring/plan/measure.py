"""`plan --measure`: the MFU of a short real training burst of the planned model here.

Real model, real AdamW step, the objective's real loss, bf16 autocast as `train` would pick,
on random token ids (speed does not depend on which ids). Warm-up steps are not timed. MFU is
tokens/s × FLOPs per token / the same measured matmul peak the plan uses.
"""

from __future__ import annotations

import time

import torch

from shoestring.config import ModelConfig, TrainConfig
from shoestring.hardware import Hardware
from shoestring.plan.shapes import flops_per_token


def measure_mfu(
    model_cfg: ModelConfig,
    vocab: int,
    seq_len: int,
    micro_batch: int,
    hw: Hardware,
    precision: str = "auto",
    seconds: float = 3.0,
    warmup: int = 2,
    max_batch: int = 64,
) -> float:
    """Fraction of ``hw``'s peak that training this model reaches on this device."""
    from shoestring.device import select_device
    from shoestring.model import build_model
    from shoestring.train.objectives import objective_for

    dev = select_device(precision, measure_peak=False)
    tc = TrainConfig(budget=None, steps=1)
    batch = max(1, min(micro_batch, max_batch))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model(model_cfg, vocab).to(dev.device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator(device=dev.device).manual_seed(0)
        ids = torch.randint(8, vocab, (batch, seq_len), device=dev.device, generator=gen)
        objective = objective_for(model_cfg.objective, seq_len, vocab, {}, tc.mask_rate,
                                  model_cfg.sparse_prediction)

        def step() -> None:
            with dev.autocast():
                loss = objective.loss(model, objective.make_batch(ids, gen))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        sync = torch.cuda.synchronize if dev.device.type == "cuda" else (lambda: None)
        for _ in range(warmup):
            step()
        sync()
        start, n = time.perf_counter(), 0
        while n < 3 or time.perf_counter() - start < seconds:
            step()
            n += 1
        sync()
        elapsed = time.perf_counter() - start
    fpt = flops_per_token(model_cfg, vocab, seq_len, tc.mask_rate)
    peak, _ = hw.peak("auto" if precision == "auto" else precision)
    return n * batch * seq_len * fpt / elapsed / peak
