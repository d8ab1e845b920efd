"""Models: the masked-LM encoder and the causal-LM decoder, built from one set of layers."""

from __future__ import annotations

from torch import nn

from shoestring import families
from shoestring.config import ModelConfig


def build_model(cfg: ModelConfig, vocab_size: int) -> nn.Module:
    """The model of the family ``cfg.objective`` names, freshly initialized from the global
    torch seed (``families.get(cfg.objective).build``)."""
    return families.get(cfg.objective).build(cfg, vocab_size)
