"""Memory per device and the parallel layout that makes a model fit.

When the distributed package's own memory model (`shoestring.dist.memory`) is installed the
planner uses it; otherwise this simple estimate, which the plan labels as such:

- model states, mixed precision with fp32 master weights and AdamW: 4 (weights) + 4 (grads)
  + 8 (two moments) = 16 bytes per parameter (the ZeRO paper's accounting), divided by the
  data-parallel degree under ZeRO-3 and by tensor × pipeline degrees;
- activations per layer and sequence, bf16, with fused (flash/SDPA) attention:
  s·b·H·(10 + 24/t) bytes (Korthikanti et al. 2022, "Reducing Activation Recomputation in
  Large Transformer Models", eq. 2 without the attention-score term that fused attention
  removes); with activation checkpointing only each layer's input (2·s·b·H) is kept, plus one
  layer's worth during recompute; a 1F1B pipeline's first stage holds as many micro-batches as
  stages, i.e. every layer's activations once;
- the logits (bf16 + fp32 for the loss) at the positions where the head runs.

The layout preference, cheapest communication first: one device (or plain data parallelism),
ZeRO-3 sharding, tensor parallelism inside a node, pipeline parallelism across nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from shoestring.errors import ShoestringError

GB = 2**30
STATE_BYTES = 16  # fp32 weights + fp32 grads + AdamW m and v


@dataclass(frozen=True)
class Layout:
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
        return {**asdict(self), "launch": self.launch()}

    def launch(self) -> str:
        """The `train` flags for this layout (torchrun when more than one device)."""
        if self.dp * self.tp * self.pp == 1:
            return ""
        flags = f"--parallel dp={self.dp},tp={self.tp},pp={self.pp} --zero {self.zero}"
        return flags + (" --ac full" if self.checkpointing else "")


def estimate_bytes(
    params: int,
    layers: int,
    hidden: int,
    vocab: int,
    seq_len: int,
    micro_batch: int,
    head_fraction: float,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    zero: int = 0,
    checkpointing: bool = False,
) -> dict[str, float]:
    """Peak bytes per device, by part (the simple model above)."""
    model_shards = tp * pp * (dp if zero == 3 else 1)
    states = STATE_BYTES * params / model_shards
    sbh = seq_len * micro_batch * hidden
    if checkpointing:
        acts = 2 * sbh * layers + sbh * (10 + 24 / tp)
    else:
        acts = sbh * (10 + 24 / tp) * layers  # 1F1B: stage 0 holds pp micro-batches
    logits = 6 * seq_len * micro_batch * head_fraction * vocab / tp
    return {"model_states": states, "activations": acts, "logits": logits}


def _usable_bytes(memory_gb: float, is_cpu: bool) -> float:
    if is_cpu:
        return 0.8 * memory_gb * GB
    return max(0.5, 0.92 * memory_gb - 1.0) * GB  # CUDA context, allocator fragmentation


def plan_layout(
    params: int,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int,
    seq_len: int,
    global_batch: int,
    head_fraction: float,
    devices: int,
    devices_per_node: int,
    memory_gb: float,
    is_cpu: bool = False,
    estimator: Callable[..., dict[str, float]] | None = None,
    estimator_name: str = "simple estimate (shoestring.plan.memory)",
) -> Layout:
    """The least-communication layout whose estimated memory fits one device.

    ``estimator(dp=, tp=, pp=, zero=, micro_batch=, checkpointing=)`` → bytes by part; the
    default is the simple model in this module's docstring.
    """
    usable = _usable_bytes(memory_gb, is_cpu)
    if estimator is None:
        def estimator(dp, tp, pp, zero, micro_batch, checkpointing):  # noqa: ANN001, ANN202
            return estimate_bytes(params, layers, hidden, vocab, seq_len, micro_batch,
                                  head_fraction, dp, tp, pp, zero, checkpointing)
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
    best: Layout | None = None
    for dp, tp, pp, zero, kind in options:
        per_rank = max(1, global_batch // dp)
        # micro-batches that divide the per-device batch exactly, largest first
        micros = [m for m in range(per_rank, 0, -1) if per_rank % m == 0]
        for checkpointing in (False, True):
            for micro in micros:
                try:
                    parts = estimator(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=micro,
                                      checkpointing=checkpointing)
                except ShoestringError:  # a layout the distributed package cannot run
                    break
                total = sum(parts.values())
                layout = Layout(
                    dp, tp, pp, zero, micro, per_rank // micro, checkpointing,
                    round(total / GB, 3), {k: round(v / GB, 3) for k, v in parts.items()},
                    total <= usable, kind, estimator_name,
                )
                if layout.fits:
                    return layout
                if best is None or total < best.memory_gb * GB:
                    best = layout
    assert best is not None
    return best


def layout_for(model_cfg: Any, **kwargs: Any) -> Layout:
    """`plan_layout`, with the distributed package's per-rank memory model
    (`shoestring.dist.memory.memory_per_rank`) when it is installed, else the simple one."""
    try:
        from shoestring.dist.memory import memory_per_rank
    except ImportError:
        return plan_layout(**kwargs)

    def estimator(dp, tp, pp, zero, micro_batch, checkpointing):  # noqa: ANN001, ANN202
        parts = memory_per_rank(
            model_cfg, kwargs["vocab"], kwargs["seq_len"], micro_batch,
            f"dp={dp},tp={tp},pp={pp}", zero=zero, ac="full" if checkpointing else "none",
        )
        return {k: float(parts[k]) for k in
                ("params", "params_transient", "grads", "optimizer", "activations")}

    return plan_layout(**kwargs, estimator=estimator,
                       estimator_name="shoestring.dist.memory (per-rank model)")
