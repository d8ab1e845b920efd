"""What packing reads and computes: a token stream as rows, their order, document offsets.

MLM rows are ``[CLS] chunk [SEP]`` (documents joined by ``[SEP]`` in the stream); CLM rows
are plain windows of the stream (documents joined by ``<|endoftext|>``). Neither pads: only
the final partial row of a split is dropped. A shard is written by ``stages.pack_shard``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class StreamRows:
    """A token stream file read as ``(n, body)`` rows (the final partial row left out),
    without keeping it in memory: a slice is one positioned read, a gather (`take`) one
    positioned read per row.

    Packing passes over the whole stream (and twice more to sort it); through a plain
    ``np.memmap`` every page it touched stays in the process's resident set until the map
    is closed, so prep's RSS grew by the stream's size (~0.5 GB per GB of text). Dropping a
    map's pages now and then (``madvise``) does not bound a gather: each fault maps the
    whole cached folio around the row (up to megabytes), so a few hundred random rows
    touched hundreds of MB. Here a pass holds one slice, or the gathered rows, at a time.
    """

    def __init__(self, path: Path | str, dtype: np.dtype | str, body: int) -> None:
        self.path, self.dtype, self.body = Path(path), np.dtype(dtype), body
        self.n = os.path.getsize(self.path) // self.dtype.itemsize // body
        self.shape = (self.n, body)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> np.ndarray:
        """Rows ``key`` (a slice with step 1), read from the file."""
        if not isinstance(key, slice):
            raise TypeError("StreamRows: index with a slice, or gather with take()")
        lo, hi, step = key.indices(self.n)
        if step != 1:
            raise ValueError("StreamRows: slices have step 1")
        hi = max(lo, hi)
        count = (hi - lo) * self.body
        if not count:
            return np.zeros((0, self.body), dtype=self.dtype)
        rows = np.fromfile(self.path, dtype=self.dtype, count=count,
                           offset=lo * self.body * self.dtype.itemsize)
        return rows.reshape(hi - lo, self.body)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (indices from anywhere in the stream), in that order."""
        out = np.empty((len(rows), self.body), dtype=self.dtype)
        size = self.body * self.dtype.itemsize
        with open(self.path, "rb", buffering=0) as f:
            fd = f.fileno()
            for i, r in enumerate(np.asarray(rows, dtype=np.int64).tolist()):
                if not 0 <= r < self.n:
                    raise IndexError(f"row {r} is outside [0, {self.n})")
                if os.preadv(fd, [out[i]], r * size) != size:
                    raise OSError(f"{self.path}: short read at row {r}")
        return out


def unigram_sort_order(rows: np.ndarray, vocab_size: int, counts: np.ndarray | None = None,
                       chunk: int = 4096) -> np.ndarray:
    """Cramming's data ordering: sequences by ascending mean log2 unigram probability.

    Probabilities are add-one smoothed token frequencies of ``rows`` themselves (or the given
    ``counts``); the sort is stable, so ties keep stream order. As in Cramming's
    ``_sort_tokenized_dataset_by_unigram``: the least likely (rarest-token) sequences first.
    """
    if counts is None:
        counts = unigram_counts(rows, vocab_size, chunk)
    return np.argsort(unigram_scores(rows, unigram_logp(counts), chunk), kind="stable")


def unigram_counts(rows: np.ndarray, vocab_size: int, chunk: int = 4096) -> np.ndarray:
    """Token frequencies of ``rows`` (a sum over row ranges is the count of their union)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(rows), chunk):
        counts += np.bincount(np.asarray(rows[i : i + chunk]).ravel(), minlength=vocab_size)
    return counts


def unigram_logp(counts: np.ndarray) -> np.ndarray:
    """Add-one smoothed log2 unigram probabilities."""
    return np.log2((counts + 1.0) / (counts.sum() + len(counts)))


def unigram_scores(rows: np.ndarray, logp: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Each row's mean log2 unigram probability (row by row: any split of the rows gives
    the same values)."""
    scores = np.empty(len(rows), dtype=np.float64)
    for i in range(0, len(rows), chunk):
        scores[i : i + chunk] = logp[np.asarray(rows[i : i + chunk])].mean(axis=1)
    return scores


def doc_offsets(doc_starts: np.ndarray, src: np.ndarray, body: int, seq_len: int,
                 shift: int) -> np.ndarray:
    """Offsets, in a shard's ``.bin``, of the document starts inside its rows.

    Row j of the shard holds stream positions [src[j]·body, (src[j]+1)·body), written at
    j·seq_len + shift (shift 1 for the [CLS] of MLM rows).
    """
    lo = np.searchsorted(doc_starts, src * body, side="left")
    hi = np.searchsorted(doc_starts, (src + 1) * body, side="left")
    counts = hi - lo
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    row = np.repeat(np.arange(len(src)), counts)
    first = np.repeat(lo, counts) + np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = doc_starts[first]
    return row * seq_len + shift + (positions - src[row] * body)
