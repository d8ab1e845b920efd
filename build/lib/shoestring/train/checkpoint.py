"""Training checkpoints: complete or absent, the last K kept, enough state to resume exactly.

A checkpoint is a folder ``RUN_DIR/checkpoints/step_00001234/`` holding the model
(safetensors), the optimizer state (torch.save), and ``state.json``: step, tokens, budget
used, the data cursor, the RNG states (torch CPU, CUDA, masking generator) and the metrics
file's length at that step. It is written into a hidden temporary folder and renamed into
place (fsutil.building_dir), so a kill at any moment leaves either the new checkpoint or none,
never a half-written one, and the previous checkpoints stay usable. Old ones are deleted only
after the new one is in place.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from shoestring.errors import ShoestringError
from shoestring.fsutil import building_dir, write_json_atomic

DIR = "checkpoints"
PREFIX = "step_"


@dataclass
class Checkpoint:
    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])


def _rng_bytes(t: torch.Tensor) -> list[int]:
    return t.tolist()


def capture_rng(gen: torch.Generator) -> dict[str, Any]:
    """Every random stream training draws from, as JSON-able lists."""
    state: dict[str, Any] = {"torch": _rng_bytes(torch.get_rng_state()),
                             "masking": _rng_bytes(gen.get_state())}
    if torch.cuda.is_available():
        state["cuda"] = [_rng_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any], gen: torch.Generator) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    gen.set_state(torch.tensor(state["masking"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def save_checkpoint(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int) -> Path:
    """Write ``checkpoints/step_N`` atomically, then prune to the newest ``keep``."""
    root = run_dir / DIR
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{PREFIX}{state['step']:08d}"
    weights = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    with building_dir(path) as tmp:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        write_json_atomic(tmp / "state.json", state)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary build folders are hidden and skipped)."""
    root = run_dir / DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return None
    path = ckpts[-1]
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ShoestringError(f"checkpoint state is unreadable ({e})", where=str(path),
                              fix="delete this checkpoint folder to resume from the one before") from None
    return Checkpoint(path, state)


def load_checkpoint(ckpt: Checkpoint, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> None:
    """Restore weights and optimizer state in place (tensors land on the model's device)."""
    try:
        device = next(model.parameters()).device
        model.load_state_dict(load_file(str(ckpt.path / "model.safetensors"), device=str(device)))
        optimizer.load_state_dict(
            torch.load(ckpt.path / "optimizer.pt", map_location=device, weights_only=True))
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise ShoestringError(
            f"cannot restore the checkpoint ({type(e).__name__}: {e})", where=str(ckpt.path),
            fix="the config must match the run's (same model); or delete this checkpoint",
        ) from None
