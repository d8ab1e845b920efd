"""summary.json: what a finished run trained, how fast, and how well (docs/training.md has
every field). One record, built once from the run's state when its clock has stopped."""

from __future__ import annotations

import os
import platform
import sys

import torch

from shoestring import __version__
from shoestring.device import peak_note
from shoestring.model.flops import mfu
from shoestring.train import forecast
from shoestring.train.run import Run
from shoestring.train.state import TrainState


def run_summary(r: Run, s: TrainState, train_seconds: float, save_seconds: float,
             val_loss: float | None) -> dict:
    """summary.json: what was trained, how fast, and how well (docs/training.md)."""
    dev, parallel = r.dev, r.parallel
    tps = s.tokens / max(train_seconds, 1e-9)
    return {
        "data_dir": str(r.data.path.resolve()),
        "objective": r.cfg.model.objective,
        "steps": s.step,
        "tokens": s.tokens,
        "skipped_steps": s.skipped,
        "train_seconds": round(train_seconds, 3),
        "save_seconds": round(save_seconds, 3),
        "setup_seconds": round(r.setup_seconds, 3),  # before the clock: not the budget's
        "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / parallel.world,
        "flops_per_token": r.flops_per_token,
        "total_flops": r.flops_per_token * s.tokens,
        "mfu": r.window.mfu(tps),
        # per device: its share of the work over its own peak
        "mfu_per_device": [mfu(tps / parallel.world, r.flops_per_token, pk) for pk in r.peaks],
        "mfu_note": peak_note(r.window.mfu(tps), r.window.job_peak),  # why, when above 1
        "peak_flops": dev.peak_flops,
        "mfu_datasheet": r.window.mfu_datasheet(tps),
        "datasheet_peak_flops": dev.datasheet_flops,
        "datasheet_device": dev.datasheet_name,
        "device": dev.name,
        "dtype": str(dev.dtype).removeprefix("torch."),
        "layout": parallel.layout.describe(),
        "attention": r.speed.attention,
        "compiled": r.speed.compile,
        "speed_choices": r.speed.why,  # why this kernel, why (not) compiled
        "cpu_load": None if r.load_start is None else {  # a wall-clock run on a shared CPU
            "start": round(r.load_start, 2), "end": round(os.getloadavg()[0], 2),
            "cores": os.cpu_count() or 1},
        "first_step_s": round(r.first_step_s, 3),
        "world_size": parallel.world,
        "micro_batch": r.micro,
        "params": r.n_params[0],
        "params_non_embedding": r.n_params[1],
        "memory_measured": r.memory,
        "first_loss": s.first_loss,
        "final_train_loss": s.tail_loss(),
        "val_loss_subset": val_loss,
        "forecast": forecast.outcome(s.curve, val_loss if val_loss is not None
                                     else s.tail_loss()),
        "budget": r.budget.describe(),
        "resumed": r.resumed,
        "versions": {
            "shoestring": __version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }
