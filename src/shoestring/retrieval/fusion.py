"""Hybrid retrieval: reciprocal-rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009).

Each ranking gives a passage ``1 / (c + rank)`` (rank from 1); the fused score is the sum.
Ranks, not scores, are fused, so BM25 scores (unbounded) and cosine similarities (in
[-1, 1]) need no calibration against each other; ``c = 60`` is the paper's constant.
"""

from __future__ import annotations

RRF_C = 60


def reciprocal_rank_fusion(rankings: list[list[int]], k: int, c: int = RRF_C) -> list[tuple[int, float]]:
    """The ``k`` best (item, fused score) of several best-first rankings; ties keep the order
    in which items were first seen (earlier rankings first)."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (c + rank)
    return sorted(fused.items(), key=lambda kv: -kv[1])[:k]
