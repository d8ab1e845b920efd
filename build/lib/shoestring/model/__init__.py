"""Models: the masked-LM encoder and the causal-LM decoder, built from one set of layers."""

from __future__ import annotations

from torch import nn

from shoestring.config import ModelConfig


def build_model(cfg: ModelConfig, vocab_size: int) -> nn.Module:
    """The model ``cfg.objective`` names, freshly initialized from the global torch seed."""
    if cfg.objective == "clm":
        from shoestring.model.decoder import CausalLM

        return CausalLM(cfg, vocab_size)
    from shoestring.model.encoder import MaskedLM

    return MaskedLM(cfg, vocab_size)
