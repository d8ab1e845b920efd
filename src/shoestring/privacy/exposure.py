"""Canary exposure (Carlini et al. 2019, "The Secret Sharer"): how many bits more likely the
model finds a planted secret than random secrets of the same form.

``exposure = log2(C + 1) − log2(rank)``, where ``rank`` is the true secret's place (1 =
most likely) among itself and ``C`` random candidates: the sampled estimate of the paper's
``log2 |R| − log2 rank``, capped at ``log2(C + 1)``. A never-inserted canary averages about
1.4 bits (the mean of log2((C+1)/rank) for a uniform rank); memorization shows as more.

Scores are log-likelihoods of the secret's tokens after the canary's prefix: for decoders the
chain-rule log-likelihood, for encoders the pseudo-log-likelihood (Salazar et al. 2020) —
each secret token masked in turn with everything else visible. Which one a model gets is the
family's ``causal`` flag.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from shoestring.prep.canaries import Canary, random_secret

_BATCH_ROWS = 512


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@torch.no_grad()
def causal_scores(model: nn.Module, prefix: list[int], secrets: list[list[int]],
                  advance: Callable[[int], None] = lambda n: None) -> np.ndarray:
    """Σ log p(secret token | everything before it), per candidate (equal-length secrets);
    ``advance`` is told the rows (forward passes) of each batch done."""
    rows = torch.tensor([prefix + s for s in secrets])
    n = len(secrets[0])
    out = []
    for batch in rows.split(_BATCH_ROWS):
        logp = F.log_softmax(model(batch)[:, -n - 1 : -1].float(), -1)
        out.append(logp.gather(-1, batch[:, -n:, None])[..., 0].sum(-1))
        advance(len(batch))
    return torch.cat(out).numpy()


@torch.no_grad()
def masked_scores(model: nn.Module, prefix: list[int], secrets: list[list[int]], cls: int,
                  sep: int, mask: int, advance: Callable[[int], None] = lambda n: None
                  ) -> np.ndarray:
    """Pseudo-log-likelihood of each candidate's secret tokens ([CLS] prefix secret [SEP]):
    one forward pass per secret token, batched across candidates and positions."""
    n = len(secrets[0])
    rows = torch.tensor([[cls, *prefix, *s, sep] for s in secrets])
    at = torch.arange(len(prefix) + 1, len(prefix) + 1 + n)
    # One row per (candidate, secret position), that position masked.
    inputs = rows.repeat_interleave(n, 0)
    pos = at.repeat(len(secrets))
    targets = inputs[torch.arange(len(inputs)), pos].clone()
    inputs[torch.arange(len(inputs)), pos] = mask
    out = []
    for x, p, t in zip(inputs.split(_BATCH_ROWS), pos.split(_BATCH_ROWS),
                       targets.split(_BATCH_ROWS)):
        logp = F.log_softmax(model(x, p[:, None])[:, 0].float(), -1)
        out.append(logp.gather(-1, t[:, None])[:, 0])
        advance(len(x))
    return torch.cat(out).view(len(secrets), n).sum(-1).numpy()


def _candidates(tokenizer: Any, canary: Canary, candidates: int,
                seed: int) -> tuple[list[int], list[list[int]]]:
    """The prefix's tokens and the secret's tokens for the true secret (first) and
    ``candidates`` random ones, drawn per canary so that every run ranks the same set."""
    rng = np.random.default_rng([seed, zlib.crc32(canary.id.encode())])  # per canary, stable
    pool = {canary.secret}
    while len(pool) < candidates + 1:
        pool.add(random_secret(rng))
    others = sorted(pool - {canary.secret})
    prefix = _ids(tokenizer, canary.prefix)

    # Score by the full text's tokens so the prefix/secret boundary tokenizes as in training.
    def secret_ids(secret: str) -> list[int]:
        full = _ids(tokenizer, f"{canary.prefix} {secret}")
        return full[len(prefix):] if full[: len(prefix)] == prefix else full

    return prefix, [secret_ids(s) for s in [canary.secret, *others]]


def forward_passes(causal: bool, tokenizer: Any, canary: Canary, candidates: int,
                   seed: int) -> int:
    """The rows ``canary_exposure`` runs through the model: one per candidate for a decoder,
    one per candidate and secret token for an encoder (the pseudo-log-likelihood), which is
    why an encoder's audit costs several times a decoder's of the same size."""
    toks = _candidates(tokenizer, canary, candidates, seed)[1]
    return len(toks) if causal else sum(map(len, toks))


def canary_exposure(model: nn.Module, family: Any, tokenizer: Any, canary: Canary,
                    candidates: int, special_ids: dict[str, int], seed: int,
                    advance: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    """Rank and exposure of ``canary``'s secret among ``candidates`` random ones;
    ``advance(n)`` is called as each batch of n forward passes finishes (the progress bar)."""
    from shoestring.families.spec import CLS, MASK, SEP

    prefix, toks = _candidates(tokenizer, canary, candidates, seed)
    scores = np.empty(len(toks))
    by_len: dict[int, list[int]] = {}
    for i, t in enumerate(toks):
        by_len.setdefault(len(t), []).append(i)
    model.eval()
    for idx in by_len.values():
        group = [toks[i] for i in idx]
        if family.causal:
            scores[idx] = causal_scores(model, prefix, group, advance)
        else:
            scores[idx] = masked_scores(model, prefix, group, special_ids[CLS],
                                        special_ids[SEP], special_ids[MASK], advance)
    rank = 1 + int((scores[1:] > scores[0]).sum())
    others = len(toks) - 1
    return {"id": canary.id, "rank": rank, "candidates": others,
            "exposure": math.log2((others + 1) / rank),
            "log_likelihood": float(scores[0]),
            "median_candidate_log_likelihood": float(np.median(scores[1:]))}
