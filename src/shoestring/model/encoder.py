"""A BERT-style encoder for masked language modelling, with the Cramming recipe.

The whole model is here, nanoGPT-style, so the math is visible. Recipe (Geiping & Goldstein,
"Cramming", 2022): pre-LayerNorm blocks, no biases in attention or dense layers, a GELU-gated
(GeGLU) feed-forward, a LayerNorm on the embeddings and after the last block, tied input/output
embeddings, no dropout, and a *sparse* prediction head that computes vocabulary logits only at
the masked positions (about a quarter of the tokens, so the largest matmul shrinks 4x).

Positions are rotary (RoPE) rather than learned: no position table caps the sequence length,
and the block layout then matches Hugging Face's ModernBERT exactly (fused Wqkv, GeGLU ``Wi``
producing input and gate, no pre-attention norm in the first block since the embedding norm
precedes it), which keeps a lossless export possible. The model knows nothing about data,
training or distribution.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoestring.config import ModelConfig


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding (half-split convention), cos/sin cached per length."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache: tuple[int, torch.device, Tensor, Tensor] | None = None

    def forward(self, seq_len: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if self._cache is None or self._cache[0] < seq_len or self._cache[1] != device:
            t = torch.arange(seq_len, device=device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq.to(device))
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cache = (seq_len, device, emb.cos(), emb.sin())
        _, _, cos, sin = self._cache
        return cos[:seq_len], sin[:seq_len]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, heads, T, head_dim); cos/sin: (T, head_dim)."""
    return (x * cos + _rotate_half(x) * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None) -> Tensor:
        B, T, H = x.shape
        qkv = self.Wqkv(x).view(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.Wo(y.transpose(1, 2).reshape(B, T, H))


class GatedMLP(nn.Module):
    """GeGLU: Wo(gelu(a) * g) where [a, g] = Wi(x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        a, g = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(F.gelu(a) * g)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, first: bool) -> None:
        super().__init__()
        ln = lambda: nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)  # noqa: E731
        self.attn_norm = nn.Identity() if first else ln()
        self.attn = Attention(cfg)
        self.mlp_norm = ln()
        self.mlp = GatedMLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor | None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, key_mask)
        return x + self.mlp(self.mlp_norm(x))


class MaskedLM(nn.Module):
    """Encoder + MLM head. ``forward`` returns logits at the given positions only."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        H = cfg.hidden_size
        self.tok_embeddings = nn.Embedding(vocab_size, H)
        self.emb_norm = nn.LayerNorm(H, eps=cfg.norm_eps, bias=False)
        self.rotary = Rotary(H // cfg.num_heads, cfg.rope_theta)
        self.layers = nn.ModuleList(Block(cfg, first=i == 0) for i in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(H, eps=cfg.norm_eps, bias=False)
        self.head_dense = nn.Linear(H, H, bias=False)
        self.head_norm = nn.LayerNorm(H, eps=cfg.norm_eps, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std); residual-output projections scaled by 1/sqrt(2·layers)."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.num_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("attn.Wo.weight", "mlp.Wo.weight")):
                nn.init.trunc_normal_(p, std=out_std, a=-3 * out_std, b=3 * out_std)
            else:
                nn.init.trunc_normal_(p, std=std, a=-3 * std, b=3 * std)

    def encode(self, input_ids: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """(B, T) token ids → (B, T, H) final hidden states.

        ``key_mask`` (B, T) bool marks real (non-padding) tokens; pretraining packs sequences
        without padding and passes None.
        """
        x = self.emb_norm(self.tok_embeddings(input_ids))
        cos, sin = self.rotary(input_ids.shape[1], input_ids.device)
        for layer in self.layers:
            x = layer(x, cos, sin, key_mask)
        return self.final_norm(x)

    def head(self, hidden: Tensor) -> Tensor:
        """Hidden states (..., H) → vocabulary logits (..., V), decoder tied to the embedding."""
        h = self.head_norm(F.gelu(self.head_dense(hidden)))
        return F.linear(h, self.tok_embeddings.weight)

    def forward(self, input_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        """Logits at ``positions`` (B, k) → (B, k, V): the sparse head; all positions if None."""
        hidden = self.encode(input_ids)
        if positions is not None:
            hidden = torch.gather(
                hidden, 1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
            )
        return self.head(hidden)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.tok_embeddings.weight.numel() if non_embedding else n
