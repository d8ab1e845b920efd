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
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from shoestring.data.canaries import Canary, random_secret

_BATCH_ROWS = 512


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


@torch.no_grad()
def causal_scores(model: nn.Module, prefix: list[int], secrets: list[list[int]]) -> np.ndarray:
    """Σ log p(secret token | everything before it), per candidate (equal-length secrets)."""
    rows = torch.tensor([prefix + s for s in secrets])
    n = len(secrets[0])
    out = []
    for batch in rows.split(_BATCH_ROWS):
        logp = F.log_softmax(model(batch)[:, -n - 1 : -1].float(), -1)
        out.append(logp.gather(-1, batch[:, -n:, None])[..., 0].sum(-1))
    return torch.cat(out).numpy()


@torch.no_grad()
def masked_scores(model: nn.Module, prefix: list[int], secrets: list[list[int]], cls: int,
                  sep: int, mask: int) -> np.ndarray:
    """Pseudo-log-likelihood of each candidate's secret tokens ([CLS] prefix secret [SEP])."""
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
    return torch.cat(out).view(len(secrets), n).sum(-1).numpy()


def canary_exposure(model: nn.Module, family: Any, tokenizer: Any, canary: Canary,
                    candidates: int, special_ids: dict[str, int], seed: int) -> dict[str, Any]:
    """Rank and exposure of ``canary``'s secret among ``candidates`` random ones."""
    from shoestring.data.tokenizer import CLS, MASK, SEP

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

    texts = [canary.secret, *others]
    toks = [secret_ids(s) for s in texts]
    scores = np.empty(len(texts))
    by_len: dict[int, list[int]] = {}
    for i, t in enumerate(toks):
        by_len.setdefault(len(t), []).append(i)
    model.eval()
    for idx in by_len.values():
        group = [toks[i] for i in idx]
        if family.causal:
            scores[idx] = causal_scores(model, prefix, group)
        else:
            scores[idx] = masked_scores(model, prefix, group, special_ids[CLS],
                                        special_ids[SEP], special_ids[MASK])
    rank = 1 + int((scores[1:] > scores[0]).sum())
    return {"id": canary.id, "rank": rank, "candidates": len(others),
            "exposure": math.log2((len(others) + 1) / rank),
            "log_likelihood": float(scores[0]),
            "median_candidate_log_likelihood": float(np.median(scores[1:]))}
