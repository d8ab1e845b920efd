"""Masked-language-model corruption, on the fly and vectorized.

Every sequence of a batch gets the same number of masked positions, so the sparse prediction
head sees a static (batch, k) shape; positions are drawn uniformly among non-special tokens
(k is capped by the row with the fewest of them, which never binds for packed sequences).
The chosen tokens become [MASK] 80% of the time, a random non-special token 10%, and stay
unchanged 10% (BERT's recipe).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from shoestring.errors import ShoestringError
from shoestring.families.spec import num_masked


@dataclass
class MaskedBatch:
    inputs: Tensor  # (B, T) corrupted token ids
    positions: Tensor  # (B, k) masked positions, ascending
    targets: Tensor  # (B, k) original ids at those positions


def mask_tokens(
    ids: Tensor,
    rate: float,
    num_special: int,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> MaskedBatch:
    """Corrupt ``ids`` (B, T); ids below ``num_special`` are special and never chosen."""
    B, T = ids.shape
    special = ids < num_special
    eligible = T - int(special.sum(dim=1).max())
    if eligible == 0:
        raise ValueError("a sequence has no maskable (non-special) token")
    k = min(num_masked(T, rate), eligible)
    scores = torch.rand(B, T, generator=generator, device=ids.device)
    scores.masked_fill_(special, 2.0)
    positions = _smallest(scores, k)
    targets = ids.gather(1, positions)
    action = torch.rand(B, k, generator=generator, device=ids.device)
    random_tokens = torch.randint(
        num_special, vocab_size, (B, k), generator=generator, device=ids.device
    )
    replacement = torch.where(
        action < 0.8,
        torch.full_like(targets, mask_id),
        torch.where(action < 0.9, random_tokens, targets),
    )
    inputs = ids.clone()
    inputs.scatter_(1, positions, replacement)
    return MaskedBatch(inputs=inputs, positions=positions, targets=targets)


def _smallest(scores: Tensor, k: int) -> Tensor:
    """Column indices of the ``k`` smallest scores of each row, ascending (int64).

    On the CPU numpy's introselect (``argpartition``) then a sort of the k picks is about 4×
    faster than ``topk`` then ``sort`` on one thread (bench/loader.py), and picks the same
    set: the scores are distinct except for a tie exactly at the k-th place (odds about
    T / 2^24 per row), where either tied position is an equally uniform draw.
    """
    if scores.device.type != "cpu" or k >= scores.shape[1]:
        return scores.topk(k, dim=1, largest=False).indices.sort(dim=1).values
    picked = np.argpartition(scores.numpy(), k - 1, axis=1)[:, :k]
    picked.sort(axis=1)
    return torch.from_numpy(picked.astype(np.int64, copy=False))


def fixed_masks(ids: Tensor, first_index: int, rate: float, seed: int, num_special: int,
                mask_id: int, vocab_size: int) -> MaskedBatch:
    """Masks for rows ``first_index …``, each drawn on the CPU from its own (``seed``, row
    index) generator: every model evaluated on the same rows is scored on the same positions
    and targets, whatever the batch size or device (periodic validation and `eval` alike)."""
    rows = [
        mask_tokens(ids[i : i + 1], rate, num_special, mask_id, vocab_size,
                    torch.Generator().manual_seed(seed * 1_000_003 + first_index + i))
        for i in range(len(ids))
    ]
    return MaskedBatch(
        inputs=torch.cat([r.inputs for r in rows]),
        positions=torch.cat([r.positions for r in rows]),
        targets=torch.cat([r.targets for r in rows]),
    )


def fixed_uniforms(positions: Tensor, first_index: int, seed: int) -> Tensor:
    """One uniform per masked position (B, M) for rows ``first_index …``, each row's from its
    own (``seed``, row index) generator, apart from its masks' stream: the RTD generator's
    replacements in validation and `eval` do not depend on the batch size (model/detector.py)."""
    return torch.stack([
        torch.rand(positions.shape[1],
                   generator=torch.Generator().manual_seed((seed + 1) * 2_000_003 + first_index + i))
        for i in range(len(positions))])


# Inverse-cloze pairs for the contrastive family (families/contrastive.py): the query is a
# span of QUERY_FRACTION of a row's tokens (a sentence or two at 128); spans are token spans,
# since packed rows keep no sentence boundaries.
QUERY_FRACTION = 0.25


def inverse_cloze_pairs(ids: Tensor, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Rows [CLS] t1 … tn [SEP] → (queries [CLS] span [SEP], positives: the row without the
    span, so word overlap alone cannot match them). One span per row, at a uniformly random
    start; every row gives one pair, all of the same shapes (no padding)."""
    B, T = ids.shape
    span = max(1, round((T - 2) * QUERY_FRACTION))
    if T - 2 <= span:
        raise ShoestringError(f"rows of {T} tokens are too short for inverse-cloze pairs",
                              where="data.seq_len", fix="prep with data.seq_len of 16 or more")
    start = torch.randint(1, T - 1 - span + 1, (B,), generator=gen)
    cols = start[:, None] + torch.arange(span)[None, :]
    query = torch.cat([ids[:, :1], ids.gather(1, cols), ids[:, -1:]], dim=1)
    pos = torch.arange(T)[None, :]
    keep = (pos < start[:, None]) | (pos >= start[:, None] + span)
    positive = ids[keep].view(B, T - span)
    return (query, positive)
