"""Packing a token stream into fixed-length rows, and ordering them.

MLM rows are ``[CLS] chunk [SEP]`` (documents joined by ``[SEP]`` in the stream); CLM rows
are plain windows of the stream (documents joined by ``<|endoftext|>``). Neither pads: only
the final partial row of a split is dropped.
"""

from __future__ import annotations

import numpy as np


def pack_mlm(stream: np.ndarray, seq_len: int, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut a token stream into ``[CLS] chunk [SEP]`` rows of ``seq_len``; return (rows, rest).

    Documents arrive joined by ``[SEP]``, so no padding is needed and no token is wasted except
    the final partial chunk of the corpus.
    """
    body = seq_len - 2
    n = len(stream) // body
    rows = np.empty((n, seq_len), dtype=np.int64)
    rows[:, 0] = cls_id
    rows[:, 1:-1] = stream[: n * body].reshape(n, body)
    rows[:, -1] = sep_id
    return rows, stream[n * body :]


def pack_clm(stream: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut a token stream (documents joined by ``<|endoftext|>``) into rows of ``seq_len``.

    No padding and no special tokens per row: a row may start mid-document, as in GPT
    pretraining; only the final partial row of the corpus is dropped (returned as rest).
    """
    n = len(stream) // seq_len
    return np.asarray(stream[: n * seq_len]).reshape(n, seq_len), stream[n * seq_len :]


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
