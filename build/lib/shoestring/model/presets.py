"""Named model sizes: encoders for a CPU up to BERT-large, decoders from a CPU toy up to ~1B.

Hidden sizes are multiples of 64 and head counts are powers of two or 12/20 so that tensor
parallelism of 2 or 4 divides them. Encoders use a GLU inner width of 2·hidden, Cramming's
proportion: its crammed BERT projects 768 → 3072 and the GLU halves that to 1536 before the
output projection (``intermediate_size`` here is the width after the gate, as in ModernBERT and
Llama). Decoders use Llama's 8/3·hidden rounded up to a multiple of 64.
"""

from __future__ import annotations

from typing import Any

# name → (objective, hidden, layers, heads, kv_heads or None, intermediate, what it is)
_TABLE: dict[str, tuple[str, int, int, int, int | None, int, str]] = {
    "tiny": ("mlm", 256, 4, 4, None, 512, "CPU minutes (the demo)"),
    "mini": ("mlm", 512, 4, 8, None, 1024, "CPU hour / small GPU"),
    "small": ("mlm", 512, 8, 8, None, 1024, "BERT-medium size"),
    "base": ("mlm", 768, 12, 12, None, 1536, "BERT-base size (Cramming's 24h-GPU model)"),
    "large": ("mlm", 1024, 24, 16, None, 2048, "BERT-large size"),
    "clm-tiny": ("clm", 256, 4, 4, None, 704, "CPU minutes"),
    "clm-mini": ("clm", 512, 8, 8, None, 1408, "CPU hour / small GPU"),
    "gpt2-small": ("clm", 768, 12, 12, None, 2048, "GPT-2 small size (124M with its vocab)"),
    "gpt2-medium": ("clm", 1024, 24, 16, None, 2752, "GPT-2 medium size"),
    "gpt2-large": ("clm", 1280, 36, 20, None, 3456, "GPT-2 large size"),
    "llama-1b": ("clm", 2048, 16, 32, 8, 8192, "Llama-3.2-1B shape (grouped-query attention)"),
}

PRESET_NAMES: tuple[str, ...] = tuple(_TABLE)


def preset_fields(name: str) -> dict[str, Any]:
    """The ModelConfig fields a preset sets; ValueError (shown by config validation) if unknown."""
    if name not in _TABLE:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(_TABLE)}")
    objective, hidden, layers, heads, kv, inter, _ = _TABLE[name]
    fields: dict[str, Any] = {
        "objective": objective,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "intermediate_size": inter,
    }
    if kv is not None:
        fields["num_kv_heads"] = kv
    return fields


def preset_description(name: str) -> str:
    return _TABLE[name][-1]


def presets() -> dict[str, Any]:
    """name → resolved ModelConfig, in size order within each objective."""
    from shoestring.config import ModelConfig

    return {name: ModelConfig(preset=name) for name in _TABLE}
