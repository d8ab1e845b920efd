"""One entry each way between a run dir and the Hugging Face format, whatever the model.

Encoders go to and from ModernBERT (model/hf.py), decoders to and from Llama
(model/hf_llama.py); the run's ``final/config.json`` or the folder's ``model_type`` decides.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from shoestring.errors import ShoestringError
from shoestring.train.rundir import load_final


def check_run_dir(path: str | Path, command: str) -> None:
    """Say what ``path`` is when it is not a trained run dir (missing, an export, a data dir)."""
    path = Path(path)
    if not path.exists():
        raise ShoestringError("not found", where=str(path),
                              fix="check the path: a run dir written by shoestring train")
    if (path / "final").is_dir():
        return
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        raise ShoestringError(
            "this is a Hugging Face export (config.json + model.safetensors), not a run dir",
            where=str(path),
            fix=f"use the run dir it was exported from with shoestring {command}; an export "
            "loads with transformers' Auto classes or serves with shoestring serve",
        )
    if (path / "manifest.json").is_file() and (path / "tokenizer.json").is_file():
        raise ShoestringError("this is a data dir (written by shoestring prep), not a run dir",
                              where=str(path), fix="pass a run dir written by shoestring train")


def export_run(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Export a trained run to ``out_dir``; returns it (complete or absent, see fsutil)."""
    run_dir, out = Path(run_dir), Path(out_dir)
    check_run_dir(run_dir, "export")
    model, meta = load_final(run_dir)
    if meta["architecture"] == "shoestring-clm":
        from shoestring.model.hf_llama import export_decoder

        return export_decoder(run_dir, out, model, meta, overwrite=overwrite)
    from shoestring.model.hf import export_encoder

    return export_encoder(run_dir, out, overwrite=overwrite)


def import_hf(hf_dir: str | Path) -> tuple[nn.Module, dict]:
    """A Hugging Face folder (ModernBERT or Llama) as our model plus a ``load_final`` meta."""
    hf_dir = Path(hf_dir)
    try:
        cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ShoestringError(
            f"cannot import: no readable config.json ({type(e).__name__})", where=str(hf_dir),
            fix="point at a folder written by save_pretrained or shoestring export",
        ) from None
    kind = cfg.get("model_type")
    if kind == "llama":
        from shoestring.model.hf_llama import import_decoder

        return import_decoder(hf_dir, cfg)
    if kind == "modernbert":
        from shoestring.model.hf import import_encoder

        return import_encoder(hf_dir)
    raise ShoestringError(
        f"cannot import: model_type = {json.dumps(kind)} (shoestring reads modernbert and llama)",
        where=str(hf_dir / "config.json"),
    )
