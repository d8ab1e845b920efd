"""Compute-optimal batch size and peak learning rate as functions of the compute budget.

DeepSeek-AI (2024), "DeepSeek LLM: Scaling Open-Source Language Models with Longtermism",
arXiv:2401.02954, §3.1, fitted on decoder LMs trained with AdamW at budgets from 1e17 FLOPs up:

    B_opt = 0.292 · C^0.3271 tokens,     η_opt = 0.3118 · C^−0.1250,

C being *their* compute: non-embedding FLOPs per token (attention included) × tokens. Two
things do not carry over to this planner as they stand. Its budgets are 1e11–1e16 FLOPs
(CPUs and small GPUs), four to six decades below their fit, where the constants are an
extrapolation; and its C counts every training FLOP `train` counts (the output head
included), a different unit. So the planner keeps **their exponents** (how the optimum moves
with compute) and **anchors the constants at the recipe**: the batch and peak LR this project
trained and measured (`docs/recipe.md`: 32 × 128-token sequences, the recipe's default, whose
batch ramp 16 → 32 the ablations of 2026-11-24 found within noise; peak LR 2e-3, which they
kept against 1e-3 and 4e-3) at the compute of those measurements (`RECIPE_FLOPS`):

    B(C) = 4,096 · (C / 7.8e13)^0.3271 tokens,   η(C) = 2e-3 · (C / 7.8e13)^−0.125.

At the anchor the raw constants would give 10,200 tokens and 5.7e-3; DeepSeek report a wide
band of near-optimal batch sizes and LRs around their fit, and the recipe's own ablation found
4e-3 slightly better on loss but worse downstream, so the anchor is the recipe, not the raw law.

Limits: both laws are for AdamW (DeepSeek fitted them with a multi-step LR schedule; the recipe
runs one-cycle, which the anchor measured); the LR is capped at `LR_MAX`, the
highest peak LR the recipe ablations trained (small budgets would otherwise ask for more).
Inside DeepSeek's fitted range (1e17+ FLOPs) their own constants are the evidence, and they
give 2.5× the anchored batch and 2.8× the anchored LR at any C (the exponents are shared): the
anchor is the recipe's choice, which matters where this project trains (below 1e17).
"""

from __future__ import annotations

from dataclasses import dataclass

DEEPSEEK_SOURCE = ("DeepSeek-AI (2024), 'DeepSeek LLM: Scaling Open-Source Language Models with "
                   "Longtermism', arXiv:2401.02954, §3.1")
BATCH_EXPONENT = 0.3271
"""B_opt ∝ C^0.3271 (DeepSeek LLM, eq. 1)."""
LR_EXPONENT = -0.1250
"""η_opt ∝ C^−0.125 (DeepSeek LLM, eq. 1)."""

RECIPE_FLOPS = 7.8e13
"""The compute the recipe's batch and LR were measured at: the default arm of the recipe
ablations (BENCHMARKS.md, "Recipe ablations", 2026-11-24), 3,821,568 tokens × 20.5 MFLOP per
token (the default encoder with the 0.25 mask rate it had then) = 7.8e13 FLOPs in 10 minutes
of one core. The LR arms (1e-3, 2e-3, 4e-3) ran at the same compute."""
RECIPE_BATCH_TOKENS = 32 * 128
"""The recipe's batch at that compute: 32 sequences of 128 tokens (TrainConfig/DataConfig)."""
RECIPE_LR = 2e-3
"""The recipe's peak LR at that compute (docs/recipe.md, "Ablations")."""
LR_MAX = 4e-3
"""The highest peak LR the recipe ablations trained (stable, lower loss, worse transfer)."""
MIN_BATCH_SEQUENCES = 8
"""Fewer sequences per step makes the gradient noise of a step dominate (and the per-step
overheads): the planner never plans a smaller batch."""


@dataclass(frozen=True)
class Hyper:
    """The planned optimizer settings for one budget, with where each number came from."""

    batch_sequences: int
    lr: float
    law_batch_tokens: float  # the anchored law's batch, before clamps and rounding
    law_lr: float  # the anchored law's LR, before the clamp
    batch_clamp: str | None  # why the batch differs from the law's, if it does
    lr_clamp: str | None
    recipe_lr: float = RECIPE_LR  # the LR the law is anchored at (the family's recipe)

    def to_dict(self) -> dict[str, object]:
        return {
            "batch_sequences": self.batch_sequences, "lr": self.lr,
            "law_batch_tokens": self.law_batch_tokens, "law_lr": self.law_lr,
            "batch_clamp": self.batch_clamp, "lr_clamp": self.lr_clamp,
            "source": f"{DEEPSEEK_SOURCE}: exponents {BATCH_EXPONENT} (batch) and "
                      f"{LR_EXPONENT} (LR), anchored at the recipe ({RECIPE_BATCH_TOKENS:,} "
                      f"tokens, peak LR {self.recipe_lr:g} at {RECIPE_FLOPS:.2g} FLOPs)",
        }


def batch_tokens(flops: float) -> float:
    """Compute-optimal global batch in tokens: DeepSeek's exponent, anchored at the recipe."""
    return RECIPE_BATCH_TOKENS * (flops / RECIPE_FLOPS) ** BATCH_EXPONENT


def peak_lr(flops: float, recipe_lr: float = RECIPE_LR) -> float:
    """Compute-optimal AdamW peak LR: DeepSeek's exponent, anchored at the recipe's LR (a
    family's own where its training recipe sets one: RTD's 5e-4)."""
    return recipe_lr * (flops / RECIPE_FLOPS) ** LR_EXPONENT


def _round_batch(batch: int, devices: int) -> int:
    """A multiple of ``devices`` whose per-device share has small divisors (micro-batches that
    divide it): a multiple of 8 from 16 up, of 4 from 4 up."""
    per = max(1, batch // devices)
    step = 8 if per >= 16 else 4 if per >= 4 else 1
    per = max(step, int(round(per / step)) * step)
    return per * devices


def plan_hyper(flops: float, seq_len: int, devices: int = 1,
               train_sequences: int | None = None, recipe_lr: float = RECIPE_LR) -> Hyper:
    """Batch (sequences) and peak LR for a budget of ``flops``.

    The batch is the law's, in whole sequences, at least `MIN_BATCH_SEQUENCES` and one per
    device, rounded so micro-batches divide it, and at most the corpus' ``train_sequences``
    (a step larger than an epoch would see some sequences twice in one step). Memory does not
    bound the global batch: the layout accumulates micro-batches that fit (`placement`).
    """
    law_tokens = batch_tokens(flops)
    want = max(1, int(round(law_tokens / seq_len)))
    batch = max(MIN_BATCH_SEQUENCES, devices, want)
    batch = _round_batch(max(devices, -(-batch // devices) * devices), devices)
    why = (f"raised to the minimum of {MIN_BATCH_SEQUENCES} sequences"
           if want < MIN_BATCH_SEQUENCES else None)
    if train_sequences is not None and batch > train_sequences >= devices:
        batch = max(devices, train_sequences // devices * devices)
        why = f"capped at the corpus' {train_sequences:,} training sequences"
    law_lr = peak_lr(flops, recipe_lr)
    lr = min(LR_MAX, law_lr)
    lr_why = None if lr == law_lr else f"capped at {LR_MAX:g}, the highest LR the recipe trained"
    return Hyper(batch, float(f"{lr:.3g}"), law_tokens, law_lr, why, lr_why, recipe_lr)
