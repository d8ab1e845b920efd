"""The metrics window: what the loop sums between two log lines, the record it writes, the
progress bar's fields, and the MFU of every training figure (`model.flops.mfu`).

MFU is achieved FLOP/s (tokens/s × FLOPs per token) over the sum of the job's devices'
measured peaks (= per-device MFU when the devices are alike); ``mfu_datasheet`` is the same
over the vendor's datasheet peak on a known GPU (shoestring.datasheets), else absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from shoestring.model.flops import mfu
from shoestring.train.state import TrainState
from shoestring.units import format_duration

_ZERO_SUMS = {"tokens": 0, "loss": 0.0, "steps": 0, "wait": 0.0, "gnorm": 0.0}


@dataclass
class Window:
    flops_per_token: float
    job_peak: float  # FLOP/s: the sum of every device's measured peak
    datasheet_peak: float | None  # FLOP/s of the job by the datasheet, when the card is known
    world_size: int | None = None  # recorded in each line of a distributed run
    start: float = 0.0  # budget clock at the window's start
    sums: dict[str, float] = field(default_factory=_ZERO_SUMS.copy)

    def reset(self, start: float) -> None:
        self.start, self.sums = start, _ZERO_SUMS.copy()

    @property
    def steps(self) -> int:
        return int(self.sums["steps"])

    def waited(self, seconds: float) -> None:
        """Time the step spent waiting for its batch (the loader's share of the window)."""
        self.sums["wait"] += seconds

    def add(self, tokens: int, loss: float, grad_norm: float) -> None:
        for key, value in (("tokens", tokens), ("loss", loss), ("steps", 1),
                           ("gnorm", grad_norm)):
            self.sums[key] += value

    def mfu(self, tokens_per_s: float) -> float:
        return mfu(tokens_per_s, self.flops_per_token, self.job_peak)

    def mfu_datasheet(self, tokens_per_s: float) -> float | None:
        return mfu(tokens_per_s, self.flops_per_token, self.datasheet_peak) \
            if self.datasheet_peak else None

    def record(self, s: TrainState, progress: float, lr: float, batch_size: int) -> dict[str, Any]:
        """The metrics.jsonl line for the window that ends now; starts the next window."""
        span = max(s.elapsed - self.start, 1e-9)
        tps = self.sums["tokens"] / span
        steps = self.sums["steps"]
        record: dict[str, Any] = {
            "step": s.step, "progress": round(progress, 5), "loss": self.sums["loss"] / steps,
            "lr": lr, "batch_size": batch_size, "tokens": s.tokens,
            "flops": s.tokens * self.flops_per_token, "tokens_per_s": tps, "mfu": self.mfu(tps),
            "grad_norm": self.sums["gnorm"] / steps,
            "data_wait": min(1.0, self.sums["wait"] / span), "skipped": s.skipped,
            "elapsed_s": s.elapsed,
        }
        if self.world_size is not None:
            record["world_size"] = self.world_size
        if self.datasheet_peak:
            record["mfu_datasheet"] = self.mfu_datasheet(tps)
        self.reset(s.elapsed)
        return record

    def bar(self, s: TrainState, progress: float) -> dict[str, Any]:
        """The progress bar's fields: the run's average tokens/s and MFU so far (the
        summary's), the tail loss ("–" before any step), and the time left at this pace."""
        loss = s.tail_loss()
        avg = s.tokens / max(s.elapsed, 1e-9)
        left = format_duration(s.elapsed / progress - s.elapsed) if progress > 0 else "?"
        return {"completed": progress, "loss": f"{loss:.3f}" if math.isfinite(loss) else "–",
                "tps": avg, "mfu": self.mfu(avg), "left": left}
