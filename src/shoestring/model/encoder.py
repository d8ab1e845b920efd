"""A BERT-style encoder for masked language modelling, with the Cramming recipe by default.

Recipe (Geiping & Goldstein, "Cramming", 2022, as ModernBERT lays it out): pre-LayerNorm blocks
without biases, a GELU-gated (GeGLU) feed-forward, a norm on the embeddings and after the last
block, tied input/output embeddings, no dropout, rotary positions, and a *sparse* prediction
head that computes vocabulary logits only at the masked positions (about a quarter of the
tokens, so the largest matmul shrinks 4x). Each choice is a `ModelConfig` option
(model/layers.py), so post-norm, RMSNorm, biases, SwiGLU or plain GELU, learned or sinusoidal
positions and an untied decoder are one ``--set`` away. The model knows nothing about data,
training or distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoestring.config import ModelConfig
from shoestring.model.layers import Trunk, make_norm


class MaskedLM(Trunk):
    """Encoder + MLM head. ``forward`` returns logits at the given positions only."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__(cfg, vocab_size)
        H = cfg.hidden_size
        self.head_dense = nn.Linear(H, H, bias=cfg.bias)
        self.head_norm = make_norm(cfg)
        self.decoder = None if cfg.tie_embeddings else nn.Linear(H, vocab_size, bias=False)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size)) if cfg.bias else None
        self.reset_parameters()

    def encode(self, input_ids: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """(B, T) token ids → (B, T, H) final hidden states.

        ``key_mask`` (B, T) bool marks real (non-padding) tokens; pretraining packs sequences
        without padding and passes None.
        """
        mask = None if key_mask is None else key_mask[:, None, None, :]
        return self.run(input_ids, mask=mask)

    def head(self, hidden: Tensor) -> Tensor:
        """Hidden states (..., H) → vocabulary logits (..., V)."""
        h = self.head_norm(F.gelu(self.head_dense(hidden)))
        weight = self.tok_embeddings.weight if self.decoder is None else self.decoder.weight
        return F.linear(h, weight, self.decoder_bias)

    def forward(self, input_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        """Logits at ``positions`` (B, k) → (B, k, V): the sparse head; all positions if None."""
        hidden = self.encode(input_ids)
        return self.head(hidden if positions is None else at_positions(hidden, positions))


def at_positions(hidden: Tensor, positions: Tensor) -> Tensor:
    """(B, T, H) hidden states at ``positions`` (B, k) → (B, k, H): what a sparse head scores."""
    return torch.gather(hidden, 1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
