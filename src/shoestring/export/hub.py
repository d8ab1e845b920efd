"""One entry each way between a run dir and the Hugging Face format, whatever the model.

This floor's part of a model family: encoders go to and from ModernBERT (export/hf.py),
decoders to and from Llama (export/hf_llama.py), registered by family name in ``EXPORTERS``
and ``IMPORTERS``; the run's ``final/config.json`` "architecture" or the folder's
``model_type`` names the family (families/spec.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from shoestring import families
from shoestring.artifacts import Artifact, Kind, identify
from shoestring.errors import ShoestringError
from shoestring.export.hf import export_encoder, import_encoder
from shoestring.export.hf_llama import export_decoder, import_decoder
from shoestring.model.detector import as_encoder
from shoestring.rundir import RunDir
from shoestring.units import with_article


def _export_mlm(run_dir: Path, out: Path, model: nn.Module, meta: dict[str, Any], *,
                overwrite: bool) -> Path:
    return export_encoder(run_dir, out, overwrite=overwrite, loaded=(model, meta))


# family name → writer of a run's HF folder (complete or absent); → reader of one
EXPORTERS: dict[str, Callable[..., Path]] = {"mlm": _export_mlm, "clm": export_decoder}
IMPORTERS: dict[str, Callable[[Path, dict], tuple[nn.Module, dict]]] = {
    "mlm": import_encoder, "clm": import_decoder}


def export_run(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Export a trained run to ``out_dir``; returns it (complete or absent, see fsutil)."""
    run = RunDir(identify(run_dir, want=(Kind.RUN,), command="shoestring export",
                          trained=True).path)
    model, meta = as_encoder(*run.load_final())  # an RTD run exports its discriminator
    family = families.by_architecture(meta["architecture"], where=str(run.final_dir))
    if family.name not in EXPORTERS:
        raise ShoestringError(
            f"exporting {with_article(family.name)} run ({family.description}) to Hugging Face "
            "is not supported yet", where=str(run_dir),
            fix="serve or index with the run dir itself")
    return EXPORTERS[family.name](run.path, Path(out_dir), model, meta, overwrite=overwrite)


def import_hf(hf_dir: str | Path) -> tuple[nn.Module, dict]:
    """A Hugging Face folder (ModernBERT or Llama) as our model plus a ``load_final`` meta."""
    hf_dir = Path(hf_dir)
    try:
        cfg = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ShoestringError(
            f"cannot import: no readable config.json ({type(e).__name__})", where=str(hf_dir),
            fix="point at a folder written by save_pretrained or shoestring export") from None
    kind = cfg.get("model_type")
    try:
        family = families.by_hf_model_type(kind)
    except ShoestringError:
        known = " and ".join(dict.fromkeys(f.hf_model_type for f in families.all_families()
                                           if f.hf_model_type))
        raise ShoestringError(
            f"cannot import: model_type = {json.dumps(kind)} (shoestring reads {known})",
            where=str(hf_dir / "config.json")) from None
    return IMPORTERS[family.name](hf_dir, cfg)


def open_model(path: str | Path, *, command: str = "this command"
               ) -> tuple[nn.Module, dict[str, Any], Artifact]:
    """The model behind a run dir (or its ``final/``) or a Hugging Face export: the one
    loader that `serve`, ``--init-from`` and the model repository share (an RTD run's is its
    discriminator, a plain encoder)."""
    artifact = identify(path, want=(Kind.RUN, Kind.EXPORT), command=command, trained=True)
    if artifact.kind is Kind.RUN:
        model, meta = as_encoder(*RunDir(artifact.path).load_final())
    else:
        model, meta = import_hf(artifact.path)
    return model, meta, artifact
