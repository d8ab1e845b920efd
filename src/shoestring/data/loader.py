"""Batches of packed sequences in a deterministic order.

The order is a fresh permutation per epoch, drawn from (seed, epoch), so a run is
reproducible and the position in the stream is two integers (epoch, offset).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from shoestring.data.shards import PackedSplit


@dataclass
class Cursor:
    epoch: int = 0
    offset: int = 0


class BatchLoader:
    """Infinite iterator of (batch_size, seq_len) int64 tensors over a split."""

    def __init__(self, split: PackedSplit, batch_size: int, seed: int, cursor: Cursor | None = None) -> None:
        self.split = split
        self.batch_size = batch_size
        self.seed = seed
        self.cursor = cursor or Cursor()
        self._order = self._permutation(self.cursor.epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.split))

    def _next_indices(self) -> np.ndarray:
        parts, need = [], self.batch_size
        while need:
            start = self.cursor.offset
            take = self._order[start : start + need]
            parts.append(take)
            need -= len(take)
            self.cursor.offset += len(take)
            if self.cursor.offset >= len(self._order):
                self.cursor = Cursor(self.cursor.epoch + 1, 0)
                self._order = self._permutation(self.cursor.epoch)
        return np.concatenate(parts)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        return torch.from_numpy(self.split.take(self._next_indices()))
