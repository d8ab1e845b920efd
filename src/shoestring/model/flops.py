"""Exact FLOP accounting for every model family, used for MFU, budgets and the planner.

Counts the multiply-adds of every matmul (2 FLOPs each) and nothing else: norms, GELU,
softmax and the embedding lookup are a rounding error next to them. Training costs three
forward passes (forward + backward for activations and for weights), which is where the
familiar 6·N comes from.
"""

from __future__ import annotations

from shoestring.config import ModelConfig


def forward_flops_per_token(
    cfg: ModelConfig, vocab_size: int, seq_len: int, head_fraction: float
) -> float:
    """Forward FLOPs per input token.

    ``head_fraction`` is the fraction of positions at which the vocabulary head runs (the mask
    rate for the sparse MLM head, 1.0 for a dense head). A family with a generator (RTD)
    adds it: per token, its blocks and the projection from the shared table into its width,
    and at the masked positions its head back out to the table and the vocabulary; the
    discriminator's replaced-token head (dense + a single output) runs at every token. The
    sampling between them is a softmax and a search, no matmul.
    """
    H, V = cfg.hidden_size, vocab_size
    if not cfg.family.generator:
        return _blocks(cfg, seq_len) + head_fraction * 2 * cfg.family.head_matmul_params(H, V)
    gen = cfg.generator_config()
    G = gen.hidden_size
    discriminator = _blocks(cfg, seq_len) + 2 * (H * H + H)
    generator = (_blocks(gen, seq_len) + 2 * H * G
                 + head_fraction * 2 * (G * H + H * V))
    return discriminator + generator


def _blocks(cfg: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of the transformer blocks."""
    H, I, L, T = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, seq_len
    qkv = H * (cfg.num_heads + 2 * cfg.kv_heads) * cfg.head_dim
    ffn = (3 if cfg.ffn != "gelu" else 2) * H * I  # gated: Wi is 2I wide
    block_matmul_params = qkv + H * H + ffn
    # QK^T and AV over all T keys (causal masking is not subtracted, the PaLM/Megatron
    # convention, and what SDPA's FLOP counter reports).
    attention = 4 * T * H
    return L * (2 * block_matmul_params + attention)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """The one MFU formula: achieved FLOP/s (tokens/s × FLOPs per token) over ``peak_flops``."""
    return tokens_per_s * flops_per_token / peak_flops


def train_flops_per_token(
    cfg: ModelConfig, vocab_size: int, seq_len: int, head_fraction: float
) -> float:
    """Forward + backward FLOPs per token: 3x the forward."""
    return 3.0 * forward_flops_per_token(cfg, vocab_size, seq_len, head_fraction)
