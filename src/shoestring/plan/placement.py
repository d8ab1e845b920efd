"""The parallel layout that makes a model fit: the planner's search over layouts.

Memory per device comes from the one memory model, `shoestring.dist.memory.memory_per_rank`
(the per-rank bytes `train` checks before it starts), so the plan and the trainer agree on
what fits. The layout preference, cheapest communication first: one device (or plain data
parallelism), ZeRO-3 sharding, tensor parallelism inside a node, pipeline parallelism across
nodes; for each, the largest micro-batch that divides the per-device batch and fits, then the
same with full activation checkpointing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from shoestring.dist.layout import make_layout
from shoestring.dist.memory import memory_per_rank
from shoestring.errors import ShoestringError

GB = 2**30
MEMORY_MODEL = "shoestring.dist.memory (per-rank model)"  # what PlannedLayout.model names


@dataclass(frozen=True)
class PlannedLayout:
    """A layout the planner chose (or the least bad when nothing fits), with its memory."""

    dp: int
    tp: int
    pp: int
    zero: int  # 0 = plain DDP, 3 = ZeRO-3 / FSDP full sharding
    micro_batch: int  # sequences per device per forward/backward
    grad_accum: int
    checkpointing: bool
    memory_gb: float  # estimated peak per device
    breakdown: dict[str, float]
    fits: bool
    kind: str  # a sentence for people
    model: str  # which memory model produced the numbers

    def to_dict(self) -> dict:
        return asdict(self)

    def parallel_section(self) -> dict | None:
        """The config's ``parallel:`` section for this layout (None on one device), which
        `train --plan` reads: no flags to paste."""
        if self.dp * self.tp * self.pp == 1:
            return None
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "zero": self.zero,
                "ac": "full" if self.checkpointing else "none"}


def layout_for(model_cfg: Any, vocab: int, seq_len: int, global_batch: int, devices: int,
               devices_per_node: int, memory_gb: float, is_cpu: bool = False) -> PlannedLayout:
    """The least-communication layout for ``model_cfg`` (a ModelConfig) whose memory, by the
    one memory model, fits one device."""
    layers, heads = model_cfg.num_layers, model_cfg.num_heads
    # usable: 80% of a CPU machine's memory; a GPU's less its CUDA context and fragmentation
    usable = (0.8 * memory_gb if is_cpu else max(0.5, 0.92 * memory_gb - 1.0)) * GB
    nodes = max(1, devices // max(1, devices_per_node))
    options: list[tuple[int, int, int, int, str]] = []  # dp, tp, pp, zero, kind
    if devices == 1:
        options.append((1, 1, 1, 0, "one device"))
    else:
        options.append((devices, 1, 1, 0, f"data parallel over {devices} devices (DDP)"))
        options.append((devices, 1, 1, 3, f"ZeRO-3 (FSDP) over {devices} devices"))
        for tp in (2, 4, 8):
            if tp <= devices_per_node and heads % tp == 0 and devices % tp == 0:
                options.append((devices // tp, tp, 1, 3,
                                f"tensor parallel {tp} inside a node × ZeRO-3 over "
                                f"{devices // tp}"))
        if nodes > 1:
            for pp in range(2, nodes + 1):
                if nodes % pp or layers % pp:
                    continue
                tp = min(devices_per_node, 8)
                while heads % tp:
                    tp //= 2
                dp = devices // (tp * pp)
                if dp >= 1:
                    options.append((dp, tp, pp, 3 if dp > 1 else 0,
                                    f"pipeline {pp} across nodes × tensor parallel {tp} × "
                                    f"data parallel {dp}"))
    best: PlannedLayout | None = None
    for dp, tp, pp, zero, kind in options:
        per_rank = max(1, global_batch // dp)
        # micro-batches that divide the per-device batch exactly, largest first
        micros = [m for m in range(per_rank, 0, -1) if per_rank % m == 0]
        for checkpointing in (False, True):
            for micro in micros:
                try:
                    est = memory_per_rank(model_cfg, vocab, seq_len, micro, make_layout(
                        {"dp": dp, "tp": tp, "pp": pp}, zero=zero,
                        ac="full" if checkpointing else "none"))
                except ShoestringError:  # a layout the distributed package cannot run
                    break
                parts = {k: float(est[k]) for k in
                         ("params", "params_transient", "grads", "optimizer", "activations")}
                total = sum(parts.values())
                layout = PlannedLayout(
                    dp, tp, pp, zero, micro, per_rank // micro, checkpointing,
                    round(total / GB, 3), {k: round(v / GB, 3) for k, v in parts.items()},
                    total <= usable, kind, MEMORY_MODEL,
                )
                if layout.fits:
                    return layout
                if best is None or total < best.memory_gb * GB:
                    best = layout
    assert best is not None
    return best

