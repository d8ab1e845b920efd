"""The decoder: causal, and KV-cached generation equal to recomputing from scratch."""

from __future__ import annotations

import pytest
import torch

from shoestring.config import ModelConfig
from shoestring.model.decoder import CausalLM

VOCAB = 200
CFG = ModelConfig(objective="clm", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  intermediate_size=96, init_std=0.2)


@pytest.fixture(scope="module")
def model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(CFG, VOCAB).eval()


def _naive_greedy(model: CausalLM, ids: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def test_future_tokens_do_not_change_past_logits(model: CausalLM) -> None:
    ids = torch.randint(0, VOCAB, (1, 20))
    changed = ids.clone()
    changed[0, 12:] = (changed[0, 12:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3


def test_cached_greedy_generation_equals_recomputation(model: CausalLM) -> None:
    ids = torch.randint(0, VOCAB, (2, 7))
    with torch.no_grad():
        expected = _naive_greedy(model, ids, 12)
    got = model.generate(ids, 12, temperature=0)
    assert torch.equal(got, expected)


def test_left_padded_batch_equals_each_prompt_alone(model: CausalLM) -> None:
    short, long = torch.randint(0, VOCAB, (1, 4)), torch.randint(0, VOCAB, (1, 9))
    batch = torch.zeros(2, 9, dtype=torch.long)
    batch[0, 5:], batch[1] = short[0], long[0]
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :5] = False
    out = model.generate(batch, 6, temperature=0, attention_mask=mask)
    assert torch.equal(out[0, 5:], model.generate(short, 6, temperature=0)[0])
    assert torch.equal(out[1], model.generate(long, 6, temperature=0)[0])
    # the scoring forward agrees with the unpadded one at real positions
    with torch.no_grad():
        padded_logits = model(batch, attention_mask=mask)[0, 5:]
        alone = model(short)[0]
    torch.testing.assert_close(padded_logits, alone, rtol=1e-4, atol=1e-4)


def test_sampling_controls(model: CausalLM) -> None:
    ids = torch.randint(0, VOCAB, (3, 5))
    greedy = model.generate(ids, 8, temperature=0)
    assert torch.equal(model.generate(ids, 8, temperature=1.0, top_k=1), greedy)
    assert torch.equal(model.generate(ids, 8, temperature=1.0, top_p=1e-6), greedy)
    gen = lambda s: torch.Generator().manual_seed(s)  # noqa: E731
    a = model.generate(ids, 8, temperature=1.5, generator=gen(1))
    assert torch.equal(a, model.generate(ids, 8, temperature=1.5, generator=gen(1)))
    assert not torch.equal(a, model.generate(ids, 8, temperature=1.5, generator=gen(2)))
    # top-k=5 never picks a token outside the 5 most likely at the first step
    first = model(ids)[:, -1].topk(5).indices
    for seed in range(5):
        tok = model.generate(ids, 1, temperature=2.0, top_k=5, generator=gen(seed))[:, -1]
        assert all(tok[i] in first[i] for i in range(3))


def test_eos_stops_a_row_and_pads_the_rest(model: CausalLM) -> None:
    ids = torch.randint(0, VOCAB, (2, 5))
    free = model.generate(ids, 10, temperature=0)
    eos = int(free[0, 7])  # the third generated token of row 0
    out = model.generate(ids, 10, temperature=0, eos_id=eos, pad_id=0)
    row = out[0, 5:].tolist()
    stop = row.index(eos)
    assert all(t == 0 for t in row[stop + 1:])
    assert stop <= 2
