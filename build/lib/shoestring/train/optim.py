"""The optimizer: AdamW with decoupled weight decay on matrices only."""

from __future__ import annotations

import torch
from torch import nn

from shoestring.config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay weight matrices (and the embedding); never norms' gains or biases (1-D)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        foreach=True,
    )
