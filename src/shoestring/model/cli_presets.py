"""The body of `shoestring presets`: every model preset with its parameter counts and training
FLOPs per token, counted on the meta device (no weights allocated)."""

from __future__ import annotations

import torch
from rich.table import Table

from shoestring import families
from shoestring.consoles import out
from shoestring.model import build_model
from shoestring.model.flops import train_flops_per_token
from shoestring.model.presets import preset_description, presets


def run(vocab: int, seq_len: int) -> None:
    """Print the presets' table for a vocabulary of ``vocab`` and sequences of ``seq_len``."""
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
