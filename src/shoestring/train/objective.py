"""Backward-compatible names for the training objective, which the model family now owns.

``Objective`` and the losses live in ``shoestring.families`` (one masked-LM and one causal-LM
loss for the whole tree); this module keeps ``objective_for`` for callers that still import it.
"""

from __future__ import annotations

from shoestring import families
from shoestring.families import Objective

__all__ = ["Objective", "objective_for"]


def objective_for(kind: str, seq_len: int, vocab_size: int, special_ids: dict[str, int],
                  mask_rate: float, sparse: bool) -> Objective:
    """The objective of family ``kind`` (same as ``families.get(kind).objective(...)``)."""
    return families.get(kind).objective(seq_len, vocab_size, special_ids, mask_rate, sparse)
