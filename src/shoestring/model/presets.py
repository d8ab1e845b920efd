"""Named model sizes: encoders for a CPU up to BERT-large, decoders from a CPU toy up to ~1B.

Hidden sizes are multiples of 64 and head counts are powers of two or 12/20 so that tensor
parallelism of 2 or 4 divides them. Encoders use a GLU inner width of 2·hidden, Cramming's
proportion: its crammed BERT projects 768 → 3072 and the GLU halves that to 1536 before the
output projection (``intermediate_size`` here is the width after the gate, as in ModernBERT and
Llama). Decoders use Llama's 8/3·hidden rounded up to a multiple of 64.
"""

from __future__ import annotations

from typing import Any

import torch
from rich.table import Table

from shoestring import families
from shoestring.consoles import out
from shoestring.families import preset_fields
from shoestring.model import build_model
from shoestring.model.flops import train_flops_per_token

__all__ = ["PRESET_NAMES", "preset_description", "preset_fields", "presets", "print_presets"]

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


def print_presets(vocab: int, seq_len: int) -> None:
    """`shoestring presets`: every preset with its parameter counts and training FLOPs per
    token for a vocabulary of ``vocab`` and sequences of ``seq_len``, counted on the meta device
    (no weights allocated)."""
    # Under 120 columns (a pipe, a small terminal) the descriptions go in a second table,
    # so the numbers stay on one line each.
    wide = out.width >= 120
    cols = ("preset", "obj", "shape", "heads", "FFN", "params", "non-emb", "GFLOP/tok")
    t = Table(title=f"model presets (vocabulary {vocab:,}, sequence {seq_len})",
              box=None, pad_edge=False, header_style="bold")
    about = Table(box=None, pad_edge=False, header_style="bold")
    for col in cols + (("for",) if wide else ()):
        t.add_column(col, justify="right" if col in cols[5:] else "left", no_wrap=col != "for")
    about.add_column("preset", no_wrap=True)
    about.add_column("for")
    for name, cfg in presets().items():
        with torch.device("meta"):  # exact counts without allocating the weights
            model = build_model(cfg, vocab)
        fraction = cfg.family.model_head_fraction(cfg, seq_len, families.DEFAULT_MASK_RATE)
        flops = train_flops_per_token(cfg, vocab, seq_len, fraction)
        heads = f"{cfg.num_heads}" + (f"/{cfg.kv_heads}" if cfg.kv_heads != cfg.num_heads else "")
        t.add_row(name, cfg.objective, f"{cfg.num_layers}×{cfg.hidden_size}", heads,
                  f"{cfg.ffn} {cfg.intermediate_size}", f"{model.num_params() / 1e6:,.1f}M",
                  f"{model.num_params(non_embedding=True) / 1e6:,.1f}M", f"{flops / 1e9:,.2f}",
                  *((preset_description(name),) if wide else ()))
        about.add_row(name, preset_description(name))
    out.print(t)
    if not wide:
        out.print()
        out.print(about)
    out.print("shape: layers × hidden; heads: query/key-value heads; FLOPs: training, per token (MLM: the sparse head at "
              "25% of positions). Use one with --set model.preset=NAME (sizes given alongside "
              "it win)")
