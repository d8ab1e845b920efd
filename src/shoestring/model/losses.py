"""The pretraining losses, written once: every trainer, evaluator and planner calls these.

Logits are upcast to fp32 before the softmax (stable under bf16/fp16 autocast). ``reduction``
is ``"mean"`` for training and ``"sum"`` for evaluators that average over many batches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# InfoNCE temperature of the contrastive family (as in DPR-style in-batch negatives)
TEMPERATURE = 0.05


def causal_lm_loss(logits: Tensor, ids: Tensor, reduction: str = "mean") -> Tensor:
    """Next-token cross-entropy: ``logits[:, t]`` predicts ``ids[:, t + 1]``.

    ``logits`` may cover the whole row (B, T, V: the last position is unused, which keeps the
    compute at the FLOP formula's seq_len) or the row without its last token (B, T-1, V).
    """
    steps = ids.shape[1] - 1
    return F.cross_entropy(logits[:, :steps].float().flatten(0, 1), ids[:, 1:].flatten(),
                           reduction=reduction)


def masked_lm_loss(logits: Tensor, targets: Tensor, positions: Tensor | None = None,
                   reduction: str = "mean") -> Tensor:
    """Cross-entropy at the masked positions only.

    ``positions=None``: ``logits`` are already the sparse head's (B, M, V), one per target.
    Otherwise ``logits`` cover every position (B, T, V, the dense head) and the targets are
    scattered to ``positions``; the other positions are ignored.
    """
    if positions is None:
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                               reduction=reduction)
    dense = targets.new_full(logits.shape[:2], -100).scatter_(1, positions, targets)
    return F.cross_entropy(logits.float().flatten(0, 1), dense.flatten(), ignore_index=-100,
                           reduction=reduction)


def replaced_token_loss(gen_logits: Tensor, targets: Tensor, disc_logits: Tensor,
                        replaced: Tensor, disc_weight: float, reduction: str = "mean"
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """RTD (ELECTRA): (total, generator MLM loss, discriminator loss). The generator's
    cross-entropy at the masked positions plus ``disc_weight`` × the discriminator's binary
    cross-entropy over every token (packed rows have no padding). ``"mean"`` averages each
    part over its own positions; ``"sum"`` sums them (an evaluator divides by the counts)."""
    gen = masked_lm_loss(gen_logits, targets, reduction=reduction)
    disc = F.binary_cross_entropy_with_logits(disc_logits.float(), replaced.float(),
                                              reduction=reduction)
    return gen + disc_weight * disc, gen, disc


def pooled(model: nn.Module, ids: Tensor) -> Tensor:
    """Mean-pooled, L2-normalized last hidden states (the serving engine's ``embed`` pooling
    and the dense index's, so what the contrastive family trains is what is searched)."""
    return F.normalize(model.encode(ids).float().mean(1), dim=-1)


def in_batch_loss(model: nn.Module, batch: tuple[Tensor, Tensor],
                  reduction: str = "mean") -> Tensor:
    """InfoNCE: query i should be nearest positive i among all positives of the batch (the
    cosine similarities divided by ``TEMPERATURE``; every other row is a negative)."""
    query, positive = batch
    scores = pooled(model, query) @ pooled(model, positive).T / TEMPERATURE
    return F.cross_entropy(scores, torch.arange(len(query), device=scores.device),
                           reduction=reduction)
