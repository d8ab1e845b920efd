"""Batches of packed sequences in a deterministic, resumable, rank-sharded order.

The global order is a fresh permutation of the split per epoch, drawn from (seed, epoch) —
or, for a split prepared with ``data.order=sort``, the stored order in epoch 0 (Cramming's
curriculum) and permutations after. Global batch ``s`` is the next ``batch_size`` entries
of that order (running into the next epoch when one ends); with data parallelism, rank
``r`` of ``world`` takes the contiguous slice ``[r·b, (r+1)·b)`` of it, ``b = batch_size /
world``. So the union over ranks of a step is exactly the batch one process would see, and
the position in the stream is two integers (epoch, offset) that every rank shares.

A split prepared with a data mixture (``data.mixture``) is drawn by its sources' weights
instead: each epoch is ``len(split)`` sequences, each source's share of them from its own
stream of permutations (repeated or subsampled as its weight asks), shuffled together by
(seed, epoch) — see `shoestring.data.mixture`. Resuming and rank slicing are unchanged.

Batches are assembled in a background thread (``prefetch`` batches ahead) so reading
overlaps the training step; ``last_wait``/``total_wait`` say how long the consumer was
blocked on data (``data_wait`` in the trainer's metrics). The `Cursor` after the last batch
*handed out* (not the last one prefetched) is what a checkpoint saves.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shoestring.data.mixture import MixtureSampler
from shoestring.data.shards import PackedSplit
from shoestring.errors import ShoestringError


@dataclass
class Cursor:
    """Where the next global batch starts: in ``epoch``, at ``offset`` of its order."""

    epoch: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Cursor:
        try:
            epoch, offset = int(state["epoch"]), int(state["offset"])
        except (KeyError, TypeError, ValueError):
            raise ShoestringError(
                f"bad data cursor {state!r}: expected {{'epoch': int, 'offset': int}}",
                where="checkpoint", fix="resume from an intact checkpoint",
            ) from None
        if epoch < 0 or offset < 0:
            raise ShoestringError(f"bad data cursor {state!r}: negative position",
                                  where="checkpoint")
        return cls(epoch, offset)


_END = object()


class BatchLoader:
    """Infinite iterator of (batch_size / world, seq_len) int64 tensors over a split.

    ``BatchLoader(split, batch_size, seed, cursor=None, *, rank=0, world=1, prefetch=2,
    shuffle=None, pin_memory=False)``: ``batch_size`` is the global batch (all ranks);
    ``shuffle=None`` shuffles unless the split is stored sorted (then epoch 0 is in stored
    order); ``prefetch=0`` assembles batches in the caller's thread.
    """

    def __init__(
        self,
        split: PackedSplit,
        batch_size: int,
        seed: int,
        cursor: Cursor | None = None,
        *,
        rank: int = 0,
        world: int = 1,
        prefetch: int = 2,
        shuffle: bool | None = None,
        pin_memory: bool = False,
    ) -> None:
        if world < 1 or not 0 <= rank < world:
            raise ShoestringError(f"rank {rank} is not in a world of {world} processes")
        if batch_size < world or batch_size % world:
            raise ShoestringError(
                f"the global batch size {batch_size} does not split over {world} ranks",
                where="train.batch_size", fix=f"use a multiple of {world}",
            )
        if len(split) == 0:
            raise ShoestringError("the split has no sequences", fix="prep a larger corpus")
        self.split = split
        self.batch_size = batch_size
        self.seed = seed
        self.rank, self.world = rank, world
        self.local_batch = batch_size // world
        self.prefetch = max(0, prefetch)
        self.shuffle = (not getattr(split, "ordered", False)) if shuffle is None else shuffle
        self.pin_memory = pin_memory
        self._cursor = Cursor(**(cursor or Cursor()).to_dict())  # handed-out position
        self._next = Cursor(**self._cursor.to_dict())  # producer position
        self._orders: dict[int, np.ndarray] = {}
        self.mixture = MixtureSampler.of(split)  # a data mixture: sources sampled by weight
        self.last_wait = 0.0
        self.total_wait = 0.0
        self.batches = 0
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # --- the order ----------------------------------------------------------------------

    @property
    def cursor(self) -> Cursor:
        """Position after the last batch handed out; save ``cursor.to_dict()`` in checkpoints."""
        return Cursor(self._cursor.epoch, self._cursor.offset)

    def state_dict(self) -> dict[str, int]:
        return self._cursor.to_dict()

    def order(self, epoch: int) -> np.ndarray:
        """The global order of sequence indices in ``epoch``."""
        if self.mixture is not None:
            return self.mixture.order(self.seed, epoch)
        if epoch == 0 and not self.shuffle:
            return np.arange(len(self.split))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.split))

    def global_indices(self, cursor: Cursor) -> tuple[np.ndarray, Cursor]:
        """Indices of the global batch starting at ``cursor``, and the cursor after it."""
        parts, need = [], self.batch_size
        epoch, offset = cursor.epoch, cursor.offset
        while need:
            order = self._cached_order(epoch)
            take = order[offset : offset + need]  # empty for a cursor from a larger split
            parts.append(take)
            need -= len(take)
            offset += len(take)
            if offset >= len(order):
                epoch, offset = epoch + 1, 0
        return np.concatenate(parts), Cursor(epoch, offset)

    def _cached_order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            order = self.order(epoch)
            self._orders = {epoch: order, **{e: o for e, o in self._orders.items() if e > epoch - 2}}
        return order

    def _produce(self) -> tuple[torch.Tensor, Cursor]:
        indices, after = self.global_indices(self._next)
        self._next = after
        mine = indices[self.rank * self.local_batch : (self.rank + 1) * self.local_batch]
        if self.pin_memory and torch.cuda.is_available():
            # Gathered straight into page-locked memory (torch's caching host allocator
            # reuses the blocks), not gathered and then copied by .pin_memory().
            batch = torch.empty((len(mine), self.split.seq_len), dtype=torch.int64,
                                pin_memory=True)
            self.split.take(mine, out=batch.numpy())
            return batch, after
        return torch.from_numpy(self.split.take(mine)), after

    # --- iteration ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        t = time.perf_counter()
        if self.prefetch == 0:
            batch, after = self._produce()
        else:
            batch, after = self._get()
        self.last_wait = time.perf_counter() - t
        self.total_wait += self.last_wait
        self.batches += 1
        self._cursor = after
        return batch

    def _get(self) -> tuple[torch.Tensor, Cursor]:
        if self._thread is None:
            self._queue = queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(
                target=_prefetch, args=(weakref.ref(self), self._queue, self._stop),
                name="shoestring-prefetch", daemon=True,
            )
            self._thread.start()
        assert self._queue is not None
        item = self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def close(self) -> None:
        """Stop the prefetch thread (iteration may restart, from the handed-out cursor)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread, self._queue = None, None
        self._stop = threading.Event()
        self._next = Cursor(self._cursor.epoch, self._cursor.offset)

    def __enter__(self) -> BatchLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stop.set()
        except Exception:
            pass


def _prefetch(ref: weakref.ref, out: queue.Queue, stop: threading.Event) -> None:
    """The prefetch thread; holds the loader only weakly, so a dropped loader is collected."""
    while not stop.is_set():
        loader = ref()
        if loader is None:
            return
        try:
            item: Any = loader._produce()
        except BaseException as e:  # handed to the consumer, which raises it
            item = e
        del loader
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                break
            except queue.Full:
                if ref() is None:
                    return
        if isinstance(item, BaseException):
            return
