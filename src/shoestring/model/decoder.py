"""A Llama-style decoder for causal language modelling, with KV-cached generation.

Default recipe (Touvron et al. 2023): pre-RMSNorm blocks, no biases, SwiGLU feed-forward,
rotary positions, optional grouped-query attention; embeddings tied to the output by default
(small models gain from it; `model.tie_embeddings=false` unties). Built from the same pieces as
the encoder (model/layers.py), so every recipe option applies to both.

`generate` serves eval and `serve`: prompts of different lengths go in one batch left-padded
with an attention mask, keys and values are cached so each new token costs one position, and
sampling is greedy (temperature 0), temperature, top-k and/or top-p.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoestring.config import ModelConfig
from shoestring.model.layers import KVCache, Trunk


def _attention_mask(key_valid: Tensor, q_len: int, offset: int) -> Tensor:
    """(B, 1, q_len, offset+q_len) bool: causal and not padding; each query sees itself, so a
    padded row never has every key masked (which would make NaNs)."""
    k_len = key_valid.shape[1]
    q_pos = torch.arange(offset, offset + q_len, device=key_valid.device)[:, None]
    k_pos = torch.arange(k_len, device=key_valid.device)[None, :]
    allowed = (k_pos <= q_pos)[None] & key_valid[:, None, :]
    allowed |= (k_pos == q_pos)[None]
    return allowed[:, None]


def sample_next(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generator: torch.Generator | None) -> Tensor:
    """(B, V) logits → (B,) token ids. Temperature 0 is greedy."""
    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0 < top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest set reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class CausalLM(Trunk):
    """Decoder + LM head. ``forward(ids)`` → (B, T, V) next-token logits."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__(cfg, vocab_size)
        self.lm_head = (
            None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, vocab_size, bias=False)
        )
        self.reset_parameters()

    def logits(self, hidden: Tensor) -> Tensor:
        weight = self.tok_embeddings.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Training/scoring forward. ``attention_mask`` (B, T) bool marks real tokens (padding
        on the left or right); None means every token is real (packed pretraining)."""
        if attention_mask is None:
            return self.logits(self.run(input_ids, causal=True))
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        mask = _attention_mask(attention_mask.bool(), input_ids.shape[1], 0)
        return self.logits(self.run(input_ids, positions=positions, mask=mask))

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
        attention_mask: Tensor | None = None,
        pad_id: int | None = None,
        on_token: Callable[[Tensor], bool] | None = None,
    ) -> Tensor:
        """Continue each prompt by up to ``max_new_tokens``; returns (B, T + new) ids.

        ``on_token`` sees each step's (B,) new tokens as they are made (streaming); returning
        False stops generation there (a streaming client went away).
        Prompts of unequal length are left-padded with ``attention_mask`` marking real tokens.
        A row that emits ``eos_id`` stops; its remaining positions hold ``pad_id`` (default
        ``eos_id``). Stops early when every row has finished.
        """
        B, T = input_ids.shape
        device = input_ids.device
        valid = (torch.ones(B, T, dtype=torch.bool, device=device) if attention_mask is None
                 else attention_mask.to(device=device, dtype=torch.bool))
        dtype = next(self.parameters()).dtype
        if torch.is_autocast_enabled(device.type):
            dtype = torch.get_autocast_dtype(device.type)
        cache = KVCache(self.cfg, B, T + max_new_tokens, device, dtype)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        padded = not bool(valid.all())
        mask = _attention_mask(valid, T, 0) if padded else None
        hidden = self.run(input_ids, positions=positions if padded else None, mask=mask,
                          causal=not padded, cache=cache)
        cache.length = T
        next_pos = positions[:, -1:] + 1
        done = torch.zeros(B, dtype=torch.bool, device=device)
        fill = pad_id if pad_id is not None else eos_id
        out = [input_ids]
        for _ in range(max_new_tokens):
            token = sample_next(self.logits(hidden[:, -1]), temperature, top_k, top_p, generator)
            if eos_id is not None:
                token = torch.where(done, torch.full_like(token, fill), token)
                done |= token == eos_id
            out.append(token[:, None])
            if on_token is not None and not on_token(token):
                break
            if eos_id is not None and bool(done.all()):
                break
            valid = torch.cat([valid, torch.ones(B, 1, dtype=torch.bool, device=device)], dim=1)
            mask = _attention_mask(valid, 1, cache.length) if padded else None
            hidden = self.run(token[:, None], positions=next_pos, mask=mask, cache=cache)
            cache.length += 1
            next_pos = next_pos + 1
        return torch.cat(out, dim=1)
