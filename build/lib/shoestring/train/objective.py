"""Training objectives: how a batch of packed token rows becomes a loss.

Masked LM (encoders): mask a fixed count per row (80/10/10), score only the masked positions
through the sparse head. Causal LM (decoders): predict every next token inside the row. Both
report how many positions they score, for the FLOP count of the vocabulary head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from shoestring.data.masking import mask_tokens, num_masked
from shoestring.data.tokenizer import MASK, NUM_SPECIAL


@dataclass(frozen=True)
class Objective:
    kind: str  # "mlm" | "clm"
    seq_len: int
    vocab_size: int
    mask_rate: float = 0.25
    mask_id: int = 4
    sparse: bool = True

    @property
    def head_fraction(self) -> float:
        """Fraction of positions the vocabulary head computes (for FLOPs)."""
        if self.kind == "mlm" and self.sparse:
            return num_masked(self.seq_len, self.mask_rate) / self.seq_len
        return 1.0

    def make_batch(self, ids: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """Token rows → what ``loss`` consumes: ``(ids,)`` for CLM, ``(inputs, positions,
        targets)`` for MLM. Masking the whole step's batch at once (then splitting it into
        micro-batches) makes gradient accumulation draw the same masks as one big batch."""
        if self.kind == "clm":
            return (ids,)
        b = mask_tokens(ids, self.mask_rate, NUM_SPECIAL, self.mask_id, self.vocab_size, gen)
        return (b.inputs, b.positions, b.targets)

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Mean cross-entropy over the scored positions (logits in fp32 for a stable softmax)."""
        if self.kind == "clm":
            (ids,) = batch
            # The whole row goes in (the last position's logits are unused) so the compute is
            # exactly the FLOP formula's at seq_len.
            logits = model(ids)[:, :-1]
            return F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
        inputs, positions, targets = batch
        if self.sparse:
            logits = model(inputs, positions)
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        logits = model(inputs)
        dense = torch.full_like(inputs, -100).scatter_(1, positions, targets)
        return F.cross_entropy(logits.float().flatten(0, 1), dense.flatten(), ignore_index=-100)


def objective_for(kind: str, seq_len: int, vocab_size: int, special_ids: dict[str, int],
                  mask_rate: float, sparse: bool) -> Objective:
    return Objective(kind, seq_len, vocab_size, mask_rate, special_ids.get(MASK, 4), sparse)
