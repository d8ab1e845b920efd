from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from shoestring.config import ModelConfig
from shoestring.data.masking import mask_tokens, num_masked
from shoestring.model.encoder import MaskedLM
from shoestring.model.flops import forward_flops_per_token

CFG = ModelConfig(hidden_size=64, num_layers=3, num_heads=4, intermediate_size=96)
VOCAB = 500


def _model(seed: int = 0) -> MaskedLM:
    torch.manual_seed(seed)
    return MaskedLM(CFG, VOCAB).eval()


def test_sparse_head_equals_dense_head_at_masked_positions() -> None:
    model = _model()
    ids = torch.randint(5, VOCAB, (3, 32))
    batch = mask_tokens(ids, 0.25, 5, 4, VOCAB, torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense = model(batch.inputs)  # (B, T, V)
        sparse = model(batch.inputs, batch.positions)  # (B, k, V)
    assert sparse.shape == (3, num_masked(32, 0.25), VOCAB)
    expected = torch.gather(dense, 1, batch.positions.unsqueeze(-1).expand(-1, -1, VOCAB))
    torch.testing.assert_close(sparse, expected, rtol=1e-5, atol=1e-5)


def test_init_is_deterministic_from_seed() -> None:
    a, b, c = _model(1), _model(1), _model(2)
    for (na, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), na
    assert not torch.equal(a.tok_embeddings.weight, c.tok_embeddings.weight)


def test_recipe_no_biases_tied_embeddings() -> None:
    model = _model()
    assert all(not name.endswith("bias") for name, _ in model.named_parameters())
    expected = VOCAB * 64 + model.num_params(non_embedding=True)
    assert model.num_params() == expected  # the decoder adds no parameters: it is tied
    assert isinstance(model.layers[0].attn_norm, torch.nn.Identity)
    assert isinstance(model.layers[1].attn_norm, torch.nn.LayerNorm)


def test_rotary_makes_attention_position_aware() -> None:
    """Without positions, attention is permutation-equivariant: swapping two tokens would leave
    every other position's output unchanged. Rotary breaks that symmetry."""
    torch.manual_seed(0)
    model = MaskedLM(CFG.model_copy(update={"init_std": 0.3}), VOCAB).eval()  # peaky attention
    ids = torch.randint(5, VOCAB, (1, 16))
    swapped = ids.clone()
    swapped[0, [3, 9]] = swapped[0, [9, 3]]
    with torch.no_grad():
        h1, h2 = model.encode(ids), model.encode(swapped)
        model.rotary.inv_freq.zero_()  # all rotations become the identity
        model.rotary._cache = None
        n1, n2 = model.encode(ids), model.encode(swapped)
    assert (h1[0, 0] - h2[0, 0]).abs().max() > 0.1
    torch.testing.assert_close(n1[0, 0], n2[0, 0], rtol=1e-4, atol=1e-4)


def test_padding_mask_hides_padded_keys() -> None:
    model = _model()
    ids = torch.randint(5, VOCAB, (1, 12))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    key_mask = torch.cat([torch.ones(1, 12), torch.zeros(1, 4)], dim=1).bool()
    with torch.no_grad():
        plain = model.encode(ids)
        masked = model.encode(padded, key_mask)[:, :12]
    torch.testing.assert_close(plain, masked, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sparse", [True, False])
def test_flop_formula_matches_torch_flop_counter(sparse: bool) -> None:
    model = _model()
    B, T = 2, 64
    ids = torch.randint(5, VOCAB, (B, T))
    positions = torch.arange(0, T, 4).expand(B, -1) if sparse else None
    counter = FlopCounterMode(display=False)
    # The math backend spells attention as matmuls, which the counter sees on every device.
    with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        model(ids, positions)
    fraction = (positions.shape[1] / T) if sparse else 1.0
    ours = forward_flops_per_token(CFG, VOCAB, T, fraction) * B * T
    assert counter.get_total_flops() == pytest.approx(ours, rel=1e-6)


def test_rotary_scores_depend_only_on_relative_position() -> None:
    """q·k after rotation is a function of the offset m − n, not of m and n."""
    from shoestring.model.layers import Rotary, apply_rotary

    rot = Rotary(head_dim=16, theta=10000.0)
    cos, sin = rot(64, torch.device("cpu"))
    q, k = torch.randn(16), torch.randn(16)

    def score(m: int, n: int) -> float:
        qm = apply_rotary(q.view(1, 1, 1, 16), cos[m : m + 1], sin[m : m + 1]).flatten()
        kn = apply_rotary(k.view(1, 1, 1, 16), cos[n : n + 1], sin[n : n + 1]).flatten()
        return float(qm @ kn)

    assert score(10, 3) == pytest.approx(score(40, 33), abs=1e-4)
    assert score(5, 5) == pytest.approx(float(q @ k), abs=1e-4)
    assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-3)
    # the lowest frequency pair rotates by exactly theta^(-2i/d) radians per position
    assert torch.allclose(cos[1, 0, :8], torch.cos(10000.0 ** (-torch.arange(0, 16, 2) / 16)))
