from __future__ import annotations

import torch

from shoestring.data.masking import mask_tokens, num_masked

NUM_SPECIAL, MASK_ID, VOCAB = 5, 4, 1000


def _packed(B: int, T: int) -> torch.Tensor:
    ids = torch.randint(NUM_SPECIAL, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    ids[:, T // 2] = 3  # a document boundary inside the sequence
    return ids


def test_fixed_count_never_special_and_targets_are_originals() -> None:
    ids = _packed(64, 128)
    b = mask_tokens(ids, 0.25, NUM_SPECIAL, MASK_ID, VOCAB, torch.Generator().manual_seed(0))
    k = num_masked(128, 0.25)
    assert k == 32 and b.positions.shape == (64, k) and b.targets.shape == (64, k)
    assert (ids.gather(1, b.positions) >= NUM_SPECIAL).all()
    assert torch.equal(b.targets, ids.gather(1, b.positions))
    assert (b.positions.diff(dim=1) > 0).all()  # distinct, ascending
    unmasked = torch.ones_like(ids, dtype=torch.bool).scatter_(1, b.positions, False)
    assert torch.equal(b.inputs[unmasked], ids[unmasked])


def test_80_10_10_proportions() -> None:
    ids = _packed(512, 128)
    b = mask_tokens(ids, 0.25, NUM_SPECIAL, MASK_ID, VOCAB, torch.Generator().manual_seed(0))
    at = b.inputs.gather(1, b.positions)
    n = at.numel()
    is_mask = (at == MASK_ID).sum().item() / n
    kept = (at == b.targets).sum().item() / n
    random = 1 - is_mask - kept
    assert abs(is_mask - 0.8) < 0.01
    assert abs(kept - 0.1) < 0.01  # includes ~0.1% random draws equal to the original
    assert abs(random - 0.1) < 0.01
    assert (at[at != MASK_ID] >= NUM_SPECIAL).all()


def test_positions_are_uniform_over_the_sequence() -> None:
    ids = _packed(2000, 64)
    b = mask_tokens(ids, 0.25, NUM_SPECIAL, MASK_ID, VOCAB, torch.Generator().manual_seed(0))
    hist = torch.bincount(b.positions.flatten(), minlength=64).float()
    assert hist[0] == 0 and hist[63] == 0 and hist[32] == 0
    inner = torch.cat([hist[1:32], hist[33:63]])
    expected = b.positions.numel() / 61
    assert ((inner - expected).abs() / expected < 0.1).all()


def test_same_generator_seed_same_masks() -> None:
    ids = _packed(8, 32)
    a = mask_tokens(ids, 0.3, NUM_SPECIAL, MASK_ID, VOCAB, torch.Generator().manual_seed(7))
    b = mask_tokens(ids, 0.3, NUM_SPECIAL, MASK_ID, VOCAB, torch.Generator().manual_seed(7))
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.positions, b.positions)


def test_positions_are_the_k_lowest_scores_of_the_generator() -> None:
    """The selection (numpy's argpartition on the CPU) picks exactly what ``topk`` on the
    same draws picks: the masks for a seed are the same as before it was sped up."""
    ids = _packed(256, 128)
    b = mask_tokens(ids, 0.4, NUM_SPECIAL, MASK_ID, VOCAB, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    scores = torch.rand(256, 128, generator=gen).masked_fill_(ids < NUM_SPECIAL, 2.0)
    k = num_masked(128, 0.4)
    expected = scores.topk(k, dim=1, largest=False).indices.sort(dim=1).values
    assert b.positions.dtype == torch.int64 and torch.equal(b.positions, expected)
    action = torch.rand(256, k, generator=gen)
    assert torch.equal(b.inputs.gather(1, b.positions) == MASK_ID, action < 0.8)
