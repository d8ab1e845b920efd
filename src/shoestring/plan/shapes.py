"""The family of model shapes the planner chooses from, with exact parameter and FLOP counts.

Shapes follow the presets (`shoestring.model.presets`): head dimension 64, the objective's
feed-forward proportion (GLU 3·H for encoders, 8/3·H for decoders, rounded to 64) and depth
≈ hidden / (the presets' median width-per-layer, 64). Hidden sizes are multiples of 64, and
from 1024 up multiples of 512 so that the head count (hidden/64) is a multiple of 8: tensor
parallelism of 2, 4 or 8 divides it. Depth varies around the presets' proportion (½× to 2×) so
the family covers parameter counts finely, not in 4× jumps.

Counts are exact: parameters come from building the real model on PyTorch's ``meta`` device
(no memory, no init cost), FLOPs from `shoestring.model.flops`, the same accounting `train`
uses for MFU and FLOP budgets.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from typing import Any

from shoestring import families
from shoestring.config import ModelConfig

HEAD_DIM = 64
DEPTH_FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class Shape:
    """One candidate model: its config and what it costs."""

    model: ModelConfig
    params: int
    params_non_embedding: int
    flops_per_token: float  # training (forward + backward) FLOPs per token

    @property
    def label(self) -> str:
        m = self.model
        return f"{m.num_layers}×{m.hidden_size}"

    def model_section(self, objective: str) -> dict[str, Any]:
        """The config's ``model:`` keys that build this shape (a plan's, a sweep point's)."""
        m = self.model
        return {"objective": objective, "hidden_size": m.hidden_size, "num_layers": m.num_layers,
                "num_heads": m.num_heads, "intermediate_size": m.intermediate_size}


def _preset_proportions(family: families.FamilySpec) -> tuple[float, float]:
    """(hidden per layer, ffn/hidden) from the presets this family builds from (RTD's and the
    contrastive family's are the masked LM's); without presets, the proportions its spec
    states."""
    from shoestring.model.presets import presets

    rows = [c for c in presets().values() if c.objective == family.base]
    if not rows:
        return family.shape
    per_layer = statistics.median(c.hidden_size / c.num_layers for c in rows)
    ffn = statistics.median(c.intermediate_size / c.hidden_size for c in rows)
    return float(per_layer), float(ffn)


def hidden_sizes(max_hidden: int = 16384) -> list[int]:
    """64, 128, …, 1024, then 1536, 2048, … (multiples of 512: heads divisible by 8)."""
    small = list(range(64, 1024, 64))
    return small + list(range(1024, max_hidden + 1, 512))


def make_config(
    family: families.FamilySpec, hidden: int, layers: int, ffn_ratio: float | None = None
) -> ModelConfig:
    """A model config of this shape with the family's recipe (heads of 64)."""
    if ffn_ratio is None:
        ffn_ratio = _preset_proportions(family)[1]
    inter = max(64, int(round(ffn_ratio * hidden / 64.0)) * 64)
    return ModelConfig(objective=family.name, hidden_size=hidden, num_layers=layers,
                       num_heads=max(1, hidden // HEAD_DIM), intermediate_size=inter)


@functools.lru_cache(maxsize=4096)
def _count(model_json: str, vocab_size: int) -> tuple[int, int]:
    import torch

    from shoestring.model import build_model

    cfg = ModelConfig.model_validate_json(model_json)
    with torch.device("meta"):
        model = build_model(cfg, vocab_size)
    return int(model.num_params()), int(model.num_params(non_embedding=True))


def count_params(model: ModelConfig, vocab_size: int) -> tuple[int, int]:
    """(all parameters, non-embedding parameters) of the real model, built on ``meta``.

    Blocks are identical, so counts are linear in depth: one- and two-layer models are built
    and the rest extrapolated exactly (building 100-layer models, even on meta, takes seconds).
    """
    one = _count(model.model_copy(update={"num_layers": 1}).model_dump_json(), vocab_size)
    if model.num_layers == 1:
        return one
    two = _count(model.model_copy(update={"num_layers": 2}).model_dump_json(), vocab_size)
    extra = model.num_layers - 1
    return (one[0] + extra * (two[0] - one[0]), one[1] + extra * (two[1] - one[1]))


def flops_per_token(
    model: ModelConfig, vocab_size: int, seq_len: int,
    mask_rate: float = families.DEFAULT_MASK_RATE,
) -> float:
    """Training FLOPs per token, as `train` counts them (sparse MLM head at the masked rate)."""
    from shoestring.model import flops

    head_fraction = model.family.model_head_fraction(model, seq_len, mask_rate)
    return float(flops.train_flops_per_token(model, vocab_size, seq_len, head_fraction))


def candidates(
    family: families.FamilySpec,
    vocab_size: int,
    seq_len: int,
    mask_rate: float = families.DEFAULT_MASK_RATE,
    max_params: float = 2e12,
) -> list[Shape]:
    """Every shape in the family up to ``max_params`` non-embedding parameters, smallest first."""
    per_layer, ffn = _preset_proportions(family)
    seen: set[tuple[int, int]] = set()
    out: list[Shape] = []
    for hidden in hidden_sizes():
        base = max(1.0, hidden / per_layer)
        for f in DEPTH_FACTORS:
            layers = max(1, int(round(base * f)))
            if (hidden, layers) in seen or (hidden >= 128 and layers < 2):
                continue
            seen.add((hidden, layers))
            # quick analytic size check before building anything (12·H² per layer is close)
            if 12 * hidden * hidden * layers > 3 * max_params:
                continue
            model = make_config(family, hidden, layers, ffn)
            shape = Shape(model, *count_params(model, vocab_size),
                          flops_per_token(model, vocab_size, seq_len, mask_rate))
            if shape.params_non_embedding <= max_params:
                out.append(shape)
    out.sort(key=lambda s: (s.params_non_embedding, s.model.hidden_size))
    return out
