"""The transformer pieces both model families are built from, one recipe option each.

Every option of `ModelConfig` that changes the function lives here as a small choice:
LayerNorm or RMSNorm (with or without bias), pre- or post-norm blocks, GeGLU / SwiGLU /
plain-GELU feed-forward, rotary or learned / sinusoidal positions, fused QKV with optional
grouped-query attention, and attention through ``F.scaled_dot_product_attention`` or, where it
is measurably faster (short sequences on a CPU), two batched matmuls around an fp32 softmax
(`eager_attention`; the choice is a runtime kernel setting, not a recipe option). Parameter
names follow ModernBERT (``Wqkv``, ``Wo``, ``Wi``) so the encoder exports as a renaming; the
decoder's export splits the fused matrices into Llama's ``q/k/v`` and ``gate/up``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoestring.config import ModelConfig


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.bias)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding (half-split convention, as ModernBERT and Llama in HF)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache: tuple[int, torch.device, Tensor, Tensor] | None = None

    def forward(self, seq_len: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin tables of shape (seq_len, 1, head_dim) for positions 0..seq_len-1: they
        broadcast over the heads of a (B, T, heads, head_dim) projection (`apply_rotary`)."""
        if self._cache is None or self._cache[0] < seq_len or self._cache[1] != device:
            t = torch.arange(seq_len, device=device, dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq.to(device))
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cache = (seq_len, device, emb.cos(), emb.sin())
        _, _, cos, sin = self._cache
        return cos[:seq_len, None], sin[:seq_len, None]

    def at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin for explicit positions (B, T) → (B, T, 1, head_dim), for KV-cached decoding."""
        cos, sin = self.forward(int(positions.max()) + 1, positions.device)
        return cos[positions, 0].unsqueeze(2), sin[positions, 0].unsqueeze(2)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: (B, T, heads, head_dim), the projection's own layout; cos/sin broadcastable to it."""
    return (x * cos + _rotate_half(x) * sin).to(x.dtype)


def sinusoidal_table(n: int, dim: int) -> Tensor:
    """The fixed sin/cos position table of "Attention is all you need" (n, dim)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n, dim)
    table[:, 0::2] = torch.sin(pos * div)
    table[:, 1::2] = torch.cos(pos * div[: dim // 2])
    return table


class AddedPositions(nn.Module):
    """Learned or sinusoidal absolute positions added to the token embeddings."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.max_positions = cfg.max_positions
        if cfg.positions == "learned":
            self.pos_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden_size)
        else:
            self.register_buffer(
                "table", sinusoidal_table(cfg.max_positions, cfg.hidden_size), persistent=False
            )

    def forward(self, positions: Tensor) -> Tensor:
        if int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"position {int(positions.max())} is past model.max_positions ({self.max_positions})"
            )
        if hasattr(self, "pos_embeddings"):
            return self.pos_embeddings(positions)
        return self.table[positions]


class KVCache:
    """Preallocated keys and values for every layer; ``length`` tokens are filled."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        shape = (cfg.num_layers, batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.max_len = max_len

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this step's (B, kv_heads, T, head_dim) keys/values; return all so far."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache full ({self.max_len} positions)")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


ATTENTION_KERNELS = ("sdpa", "eager")


def eager_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                    causal: bool = False) -> Tensor:
    """Attention as two batched matmuls around a softmax computed in fp32 — the function of
    ``F.scaled_dot_product_attention`` (same arguments' meaning, keys aligned top-left), for
    the shapes where PyTorch's fused CPU kernel is slower: at 128 tokens under bf16 its
    forward + backward takes 1.7-2.6x as long as this (bench/attention_kernels.py). Stores the (B, heads, T, keys) scores
    for backward, so it is chosen only where those fit (`train/speed.py`)."""
    if k.shape[1] != q.shape[1]:  # grouped-query: each key/value head serves a group
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    allowed = mask
    if causal and mask is None:
        allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    return scores.float().softmax(-1).to(v.dtype) @ v


def set_attention_kernel(model: nn.Module, kernel: str) -> None:
    """Run every attention layer of ``model`` through ``kernel`` ("sdpa" or "eager")."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel {kernel!r} is not one of {ATTENTION_KERNELS}")
    for mod in model.modules():
        if isinstance(mod, Attention):
            mod.kernel = kernel


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.kernel = "sdpa"  # or "eager": set_attention_kernel
        self.num_heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.kv_heads, cfg.head_dim
        qkv = (cfg.num_heads + 2 * cfg.kv_heads) * cfg.head_dim
        self.Wqkv = nn.Linear(cfg.hidden_size, qkv, bias=cfg.bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.bias)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor:
        """``mask``: bool, True = may attend, broadcastable to (B, heads, T, keys)."""
        B, T, _ = x.shape
        H, KV = self.num_heads, self.kv_heads
        qkv = self.Wqkv(x).view(B, T, H + 2 * KV, self.head_dim)
        # Rotate q and k together, in the projection's (B, T, heads, head_dim) layout, before
        # the transpose: one contiguous pass instead of two strided ones (on an H100 the two
        # strided passes' backward was the step's largest elementwise kernel, bench/gpu_profile.py)
        qk = qkv[:, :, : H + KV] if rope is None else apply_rotary(qkv[:, :, : H + KV], *rope)
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)
        v = qkv[:, :, H + KV :].transpose(1, 2)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        if self.kernel == "eager":
            y = eager_attention(q, k, v, mask, causal)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                enable_gqa=self.kv_heads != self.num_heads,
            )
        # -1, not hidden_size: under tensor parallelism a rank holds num_heads/tp heads.
        return self.Wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    """GeGLU / SwiGLU: ``Wo(act(a) * g)`` with ``[a, g] = Wi(x)``; plain GELU: ``Wo(gelu(Wi x))``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gated = cfg.ffn != "gelu"
        self.act = F.silu if cfg.ffn == "swiglu" else F.gelu
        self.Wi = nn.Linear(cfg.hidden_size, cfg.ffn_input_width, bias=cfg.bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            a, g = self.Wi(x).chunk(2, dim=-1)
            return self.Wo(self.act(a) * g)
        return self.Wo(self.act(self.Wi(x)))


class Block(nn.Module):
    """Pre-norm: ``x + f(norm(x))``; post-norm (original BERT): ``norm(x + f(x))``.

    In a pre-norm model whose embeddings are normalized, the first block's attention norm would
    normalize an already-normalized input; ModernBERT drops it, and so do we.
    """

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.pre = cfg.norm_position == "pre"
        skip_first = self.pre and cfg.embedding_norm and layer == 0
        self.attn_norm = nn.Identity() if skip_first else make_norm(cfg)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = make_norm(cfg)
        self.mlp = FeedForward(cfg)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None, mask: Tensor | None = None,
                causal: bool = False, cache: KVCache | None = None) -> Tensor:
        if self.pre:
            x = x + self.attn(self.attn_norm(x), rope, mask, causal, cache)
            return x + self.mlp(self.mlp_norm(x))
        x = self.attn_norm(x + self.attn(x, rope, mask, causal, cache))
        return self.mlp_norm(x + self.mlp(x))


class Trunk(nn.Module):
    """Embeddings, positions and blocks: everything but the output head."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden_size
        self.tok_embeddings = nn.Embedding(vocab_size, H)
        self.emb_norm = make_norm(cfg) if cfg.embedding_norm else None
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta) if cfg.positions == "rotary" else None
        self.added_positions = AddedPositions(cfg) if cfg.positions != "rotary" else None
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.final_norm = make_norm(cfg) if cfg.norm_position == "pre" else None

    def reset_parameters(self) -> None:
        """Fresh weights (`init_weights`); each model calls it once its head is built."""
        init_weights(self, self.cfg)

    def run(self, input_ids: Tensor, positions: Tensor | None = None, mask: Tensor | None = None,
            causal: bool = False, cache: KVCache | None = None,
            embedded: Tensor | None = None) -> Tensor:
        """(B, T) ids → (B, T, H) final hidden states.

        ``positions`` (B, T) are needed only when they are not 0..T-1 (cached decoding, left
        padding); ``mask`` is a bool attention mask (True = may attend); ``embedded`` (B, T, H)
        replaces the token-embedding lookup where the caller's table is another module's (the
        RTD generator and discriminator share one, model/detector.py).
        """
        T = input_ids.shape[1]
        x = self.tok_embeddings(input_ids) if embedded is None else embedded
        if self.added_positions is not None:
            pos = positions if positions is not None else torch.arange(T, device=x.device)
            x = x + self.added_positions(pos)
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        rope = None
        if self.rotary is not None:
            rope = self.rotary.at(positions) if positions is not None else self.rotary(T, x.device)
        for layer in self.layers:
            x = layer(x, rope, mask, causal, cache)
        return self.final_norm(x) if self.final_norm is not None else x

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters; ``non_embedding`` leaves out the token (and learned position) tables but
        keeps an untied output projection, which costs compute like any matmul."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_embeddings.weight.numel()
            if self.added_positions is not None and self.cfg.positions == "learned":
                n -= self.added_positions.pos_embeddings.weight.numel()
        return n


def init_weights(module: nn.Module, cfg: ModelConfig) -> None:
    """Normal(0, init_std) cut at ±3σ; residual-output projections scaled by 1/sqrt(2·layers)
    (GPT-2 / ModernBERT depth scaling); norm weights one, biases zero; deterministic from the
    global seed."""
    std = cfg.init_std
    out_std = std / math.sqrt(2 * cfg.num_layers)
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() == 1:
            nn.init.ones_(p)
        elif name.endswith(("attn.Wo.weight", "mlp.Wo.weight")):
            nn.init.trunc_normal_(p, std=out_std, a=-3 * out_std, b=3 * out_std)
        else:
            nn.init.trunc_normal_(p, std=std, a=-3 * std, b=3 * std)
