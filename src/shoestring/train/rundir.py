"""Backward-compatible function names for the run dir; ``shoestring.rundir.RunDir`` is the
one reader/writer now. Kept for the trainers that still import these names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from shoestring import families
from shoestring.fsutil import write_json_atomic, write_text_atomic
from shoestring.rundir import MARKER, RunDir, model_meta

ARCHITECTURES = {f.name: f.architecture for f in families.all_families()}

__all__ = ["ARCHITECTURES", "MARKER", "load_final", "model_meta", "prepare_run_dir",
           "save_final", "write_json_atomic", "write_text_atomic"]


def prepare_run_dir(path: Path, overwrite: bool) -> None:
    """``RunDir.create(path, overwrite)``."""
    RunDir.create(path, overwrite)


def save_final(run_dir: Path, model: torch.nn.Module, meta: dict[str, Any],
               tokenizer_path: Path) -> Path:
    """``RunDir(run_dir).save_final(model, meta, tokenizer_path)``."""
    return RunDir(run_dir).save_final(model, meta, tokenizer_path)


def load_final(run_dir: str | Path) -> tuple[torch.nn.Module, dict]:
    """``RunDir(run_dir).load_final()``."""
    return RunDir(run_dir).load_final()
