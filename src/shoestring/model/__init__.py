"""Models: the masked-LM encoder, the causal-LM decoder and the replaced-token detector
(generator + encoder), built from one set of layers.

``BUILDERS`` is this floor's part of a model family: which module a family trains
(families/spec.py holds the family's constants; docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from shoestring.config import ModelConfig
from shoestring.model.decoder import CausalLM
from shoestring.model.encoder import MaskedLM
from shoestring.model.detector import ReplacedTokenDetector


def build_retriever(cfg: ModelConfig, vocab_size: int) -> MaskedLM:
    """The contrastive family's model: the masked-LM encoder with its MLM head kept (the run
    still fills masks) but frozen: no loss reaches it, and data-parallel gradient sync expects
    every trainable parameter to get a gradient."""
    model = MaskedLM(cfg, vocab_size)
    for part in (model.head_dense, model.head_norm, model.decoder, model.decoder_bias):
        if part is not None:
            part.requires_grad_(False)
    return model


BUILDERS: dict[str, Callable[[ModelConfig, int], nn.Module]] = {
    "mlm": MaskedLM, "clm": CausalLM, "contrastive": build_retriever,
    "rtd": ReplacedTokenDetector}


def build_model(cfg: ModelConfig, vocab_size: int) -> nn.Module:
    """The model of the family ``cfg.objective`` names, freshly initialized from the global
    torch seed."""
    return BUILDERS[cfg.family.name](cfg, vocab_size)
