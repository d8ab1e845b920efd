"""The two pretraining losses, written once: every trainer, evaluator and planner calls these.

Logits are upcast to fp32 before the softmax (stable under bf16/fp16 autocast). ``reduction``
is ``"mean"`` for training and ``"sum"`` for evaluators that average over many batches.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


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
