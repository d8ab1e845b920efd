"""Named model sizes: encoders for a CPU up to BERT-large, decoders from a CPU toy up to ~1B.

Hidden sizes are multiples of 64 and head counts are powers of two or 12/20 so that tensor
parallelism of 2 or 4 divides them. Encoders use a GLU inner width of 2·hidden, Cramming's
proportion: its crammed BERT projects 768 → 3072 and the GLU halves that to 1536 before the
output projection (``intermediate_size`` here is the width after the gate, as in ModernBERT and
Llama). Decoders use Llama's 8/3·hidden rounded up to a multiple of 64.
"""

from __future__ import annotations

from typing import Any

from shoestring import families
from shoestring.families import preset_fields

__all__ = ["PRESET_NAMES", "preset_description", "preset_fields", "presets"]

# name → (objective, hidden, layers, heads, kv_heads or None, intermediate, what it is); the
# rows live with their family (families/), in registry order.
_TABLE: dict[str, tuple[str, int, int, int, int | None, int, str]] = {
    name: (family.name, *row) for family in families.all_families()
    for name, row in family.presets.items()
}

PRESET_NAMES: tuple[str, ...] = tuple(_TABLE)


def preset_description(name: str) -> str:
    return _TABLE[name][-1]


def presets() -> dict[str, Any]:
    """name → resolved ModelConfig, in size order within each objective."""
    from shoestring.config import ModelConfig

    return {name: ModelConfig(preset=name) for name in _TABLE}
