"""The run dir: what `train` writes and `eval`/`export`/`serve` read (docs/artifacts.md).

``config.yaml``, ``metrics.jsonl``, ``final/`` (``model.safetensors``, ``config.json``,
``tokenizer.json``) and ``summary.json``. Whole files are written to a temporary name and
renamed; ``final/`` is written as a temporary folder and renamed, so it is complete or absent.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from shoestring.config import Config, ModelConfig
from shoestring.errors import ShoestringError
from shoestring.fsutil import building_dir, check_output_dir, write_json_atomic, write_text_atomic
from shoestring.model import build_model

ARCHITECTURE = "shoestring-mlm"  # the encoder's; the decoder's is "shoestring-clm"
ARCHITECTURES = {"mlm": ARCHITECTURE, "clm": "shoestring-clm"}
MARKER = ".shoestring-run"

__all__ = ["load_final", "model_meta", "prepare_run_dir", "save_final",
           "write_json_atomic", "write_text_atomic"]


def prepare_run_dir(path: Path, overwrite: bool) -> None:
    """Create the run dir; refuse to mix a new run into an old one unless asked to.

    ``overwrite`` only ever deletes a folder that carries the marker file shoestring writes
    into every run dir, so a user's own folder is never removed by mistake.
    """
    check_output_dir(path, "run dir", owned=(path / MARKER).is_file(), overwrite=overwrite)
    if path.is_dir():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("shoestring run dir\n", encoding="utf-8")


def save_final(run_dir: Path, model: torch.nn.Module, meta: dict[str, Any], tokenizer_path: Path) -> Path:
    """Write ``final/`` atomically: weights (safetensors), model config, tokenizer."""
    final = run_dir / "final"
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()}
    with building_dir(final) as tmp:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_json_atomic(tmp / "config.json", meta)
        shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
    return final


def model_meta(cfg: Config, vocab_size: int, seq_len: int, special_ids: dict[str, int]) -> dict:
    return {
        "architecture": ARCHITECTURES[cfg.model.objective],
        "model": cfg.model.model_dump(mode="json"),
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "special_ids": special_ids,
    }


def load_final(run_dir: str | Path) -> tuple[torch.nn.Module, dict]:
    """The trained model of a run dir (on CPU, fp32, eval mode) and its metadata.

    A ``MaskedLM`` for architecture "shoestring-mlm", a ``CausalLM`` for "shoestring-clm".
    """
    final = Path(run_dir) / "final"
    if not (final / "model.safetensors").is_file() or not (final / "config.json").is_file():
        raise ShoestringError(
            "no trained model in this run dir (final/ is missing)",
            where=str(run_dir),
            fix="train first (shoestring train), or point at a finished run",
        )
    try:
        meta = json.loads((final / "config.json").read_text(encoding="utf-8"))
        if meta.get("architecture") not in ARCHITECTURES.values():
            raise ValueError(f"unknown architecture {meta.get('architecture')!r}")
        model = build_model(ModelConfig.model_validate(meta["model"]), meta["vocab_size"])
        model.load_state_dict(load_file(str(final / "model.safetensors")))
    except ShoestringError:
        raise
    except Exception as e:  # JSON, schema, safetensors and shape errors alike
        raise ShoestringError(
            f"cannot load the trained model ({type(e).__name__}: {e})",
            where=str(final),
            fix="the run dir is damaged or from another version; train it again",
        ) from None
    return model.eval(), meta
