"""What the speed benchmarks share: the peers, configured as a careful user of each would,
their library versions, FLOP counts of the peers and a matmul ceiling.

A ratio means nothing without its peer's configuration, so every script that prints one takes
the peer from here (``bench/model_step.py``, ``bench/cram_vs_hf.py``, ``bench/gpu.py``); the
machine it ran on is ``bench/common.py``'s header.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shoestring.config import ModelConfig


def peer_versions() -> dict[str, str]:
    """The peers' library versions, for the machine header (``common.Bench(**peer_versions())``)."""
    import transformers

    return {"transformers": transformers.__version__}


def special_ids() -> dict[str, int]:
    """Our WordPiece special tokens' ids (the packed data's order)."""
    from shoestring.families.spec import MLM_SPECIAL_TOKENS

    return {t: i for i, t in enumerate(MLM_SPECIAL_TOKENS)}


def hf_modernbert(cfg: ModelConfig, vocab: int, seq_len: int, sparse: bool = True,
                  ids: dict[str, int] | None = None, attention: str = "sdpa") -> nn.Module:
    """Our encoder's architecture as transformers' ``ModernBertForMaskedLM``, configured by our
    exporter (exact mapping), with ModernBERT's own sparse head on unless ``sparse=False``.

    The exporter writes ``sparse_prediction: False`` (it describes the function, not a training
    setting); a careful HF user training ModernBERT switches the sparse head on: with labels,
    the decoder then runs only where ``labels != sparse_pred_ignore_index`` (-100).
    """
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from shoestring.export.hf import hf_config

    fields = hf_config(cfg, vocab, seq_len, ids or special_ids())
    fields.update(sparse_prediction=sparse, sparse_pred_ignore_index=-100)
    return ModernBertForMaskedLM(ModernBertConfig.from_dict(fields, attn_implementation=attention))


def modernbert_setup(model: nn.Module) -> str:
    """How the ModernBERT peer was configured, in a phrase for the table."""
    c = model.config
    head = "sparse head on" if c.sparse_prediction else "dense head (sparse_prediction=False)"
    return f"transformers ModernBertForMaskedLM, {head}, attention {c._attn_implementation}"


def hf_llama(cfg: ModelConfig, vocab: int, seq_len: int, attention: str = "sdpa") -> nn.Module:
    """Our decoder's architecture as transformers' Llama, configured by our exporter."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from shoestring.export.hf_llama import hf_config as llama_config

    ids = {"<|endoftext|>": 0, "<|pad|>": 1}
    return LlamaForCausalLM(LlamaConfig.from_dict(llama_config(cfg, vocab, seq_len, ids),
                                                  attn_implementation=attention))


def mlm_labels(inputs: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """transformers' MLM labels (-100 where unscored) from our (positions, targets)."""
    return torch.full_like(inputs, -100).scatter_(1, positions, targets)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def counted_train_flops_per_token(forward: Any, tokens: int) -> float:
    """Training FLOPs per token as ``torch.utils.flop_counter.FlopCounterMode`` counts one
    forward call (``forward()``), × 3 for forward + backward: the peers' cost measured the same
    way whatever their code, rather than by our formula. On CPU (torch 2.13) the counter has
    no formula for SDPA's CPU flash kernel, so attention's QK^T/AV products (4·T·H·L per token,
    forward) are missing from every model's count alike."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        forward()
    return 3.0 * counter.get_total_flops() / tokens


# ---------------------------------------------------------------------------- matmul ceiling


def encoder_gemms(cfg: ModelConfig, vocab: int, tokens: int, head_tokens: int
                  ) -> list[tuple[int, int, int, int]]:
    """The (count, M, K, N) of every weight matmul of one forward pass of our encoder/decoder
    with ``tokens`` rows (``head_tokens`` rows reach the head): what its FLOPs are made of."""
    H, L = cfg.hidden_size, cfg.num_layers
    qkv = (cfg.num_heads + 2 * cfg.kv_heads) * cfg.head_dim
    ffn_in = cfg.ffn_input_width
    ffn_out = cfg.intermediate_size if cfg.ffn != "gelu" else ffn_in
    gemms = [(L, tokens, H, qkv), (L, tokens, H, H), (L, tokens, H, ffn_in),
             (L, tokens, ffn_out, H)]
    from shoestring import families

    if families.get(cfg.objective).head_transform:
        gemms.append((1, head_tokens, H, H))
    gemms.append((1, head_tokens, H, vocab))
    return gemms


def matmul_ceiling(gemms: list[tuple[int, int, int, int]], dtype: torch.dtype,
                   seconds: float = 5.0, device: str = "cpu") -> float:
    """FLOP/s of a loop that does nothing but the training matmuls of these shapes (forward
    ``x @ W^T``, then the two backward products ``dY @ W`` and ``dY^T @ x``) under the run's
    autocast: the ceiling an MFU on this machine should be judged against, measured rather
    than assumed; the best pass counts (a ceiling). Attention's batched products are left
    out (a few % of the FLOPs at T=128).

    On a GPU (``device="cuda"``) the operands are made in ``dtype`` directly (no autocast
    casts in the loop: the pure GEMM rate) and every pass is synchronized before its clock
    stops."""
    on_gpu = device != "cpu"
    if on_gpu:
        ctx = torch.autocast(device, enabled=False)
    else:
        ctx = (torch.autocast("cpu", dtype=dtype) if dtype != torch.float32
               else torch.autocast("cpu", enabled=False))
    made = dict(device=device, dtype=dtype) if on_gpu else dict(device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    tensors = []
    flops = 0.0
    for count, m, k, n in gemms:
        x, w, dy = (torch.randn(m, k, **made), torch.randn(n, k, **made),
                    torch.randn(m, n, **made))
        tensors.append((count, x, w, dy))
        flops += count * 3 * 2.0 * m * k * n

    def one_pass() -> None:
        with ctx:
            for count, x, w, dy in tensors:
                for _ in range(count):
                    F.linear(x, w)
                    torch.matmul(dy, w)
                    torch.matmul(dy.t(), x)

    one_pass()  # warm-up: allocator, autocast weight casts, oneDNN primitives / cuBLAS
    sync()
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        one_pass()
        sync()
        best = max(best, flops / (time.perf_counter() - t))
    return best
