"""Distributed checkpoints (torch.distributed.checkpoint): sharded save, resharding load,
consolidation to one safetensors file.

Every rank writes only its shards; the checkpoint's metadata records each tensor's global
shape and every chunk's offsets, so a checkpoint written by one layout (say dp=2,tp=2,pp=2 with
ZeRO-2) loads into any other (dp=2 with DDP, one process, ...): DCP reads each rank's chunks of
the global tensors. Model and optimizer state use parameter names of the canonical model, and
the optimizer state is flattened per parameter (``state.<name>.exp_avg``), so pipeline stages
and ZeRO-1 partitions merge by name. Fused projections are stored as their parts (see
`shoestring.dist.parallelize`), which keeps the stored form independent of ``tp``.

A checkpoint folder: DCP's ``.metadata`` and ``__<rank>_*.distcp`` files, plus ``trainer.json``
(step, tokens, data cursor, masking RNG, layout, config) written by rank 0. Folders are built
under a temporary name and renamed when complete.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from shoestring.errors import ShoestringError
from shoestring.fsutil import swap_in_dir, write_json_atomic

PART = ".part"
_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


# --------------------------------------------------------------------------- fused parts


def _split(t: Tensor, sizes: list[int]) -> list[Tensor]:
    """Rows of a (possibly TP-packed, possibly sharded) fused tensor → its parts, as views."""
    if not isinstance(t, DTensor):
        return list(t.split(sizes, dim=0))
    n = 1
    for dim, p in enumerate(t.placements):
        if p.is_shard(0):
            n *= t.device_mesh.size(dim)
    local = t.to_local()
    cols = t.shape[1:]
    out = []
    for size, piece in zip(sizes, local.split([s // n for s in sizes], dim=0)):
        shape = torch.Size((size, *cols))
        stride = torch.empty(shape, device="meta").stride()
        out.append(DTensor.from_local(piece, t.device_mesh, t.placements, run_check=False,
                                      shape=shape, stride=stride))
    return out


def _merge(like: Tensor, parts: list[Tensor]) -> Tensor:
    if not isinstance(like, DTensor):
        return torch.cat(parts, dim=0)
    local = torch.cat([p.to_local() for p in parts], dim=0)
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False,
                              shape=like.shape, stride=like.stride())


def _fused_of(key: str, fused: dict[str, list[int]]) -> list[int] | None:
    """The part sizes when ``key`` (model name or flat optimizer key) is a fused tensor."""
    if key in fused:
        return fused[key]
    if key.startswith("state."):
        name = key[len("state."):].rsplit(".", 1)[0]
        return fused.get(name) if not key.endswith(".step") else None
    return None


def split_fused(sd: dict[str, Any], fused: dict[str, list[int]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sd.items():
        sizes = _fused_of(k, fused)
        if sizes is not None and isinstance(v, Tensor) and v.dim() >= 2:
            for i, part in enumerate(_split(v, sizes)):
                out[f"{k}{PART}{i}"] = part
        else:
            out[k] = v
    return out


def merge_fused(split: dict[str, Any], like: dict[str, Any], fused: dict[str, list[int]]
                ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in like.items():
        sizes = _fused_of(k, fused)
        if sizes is not None and isinstance(v, Tensor) and v.dim() >= 2:
            out[k] = _merge(v, [split[f"{k}{PART}{i}"] for i in range(len(sizes))])
        else:
            out[k] = split[k]
    return out


# --------------------------------------------------------------------------- state dicts


def _model_sd(parts: list[nn.Module]) -> dict[str, Any]:
    sd: dict[str, Any] = {}
    for part in parts:
        sd.update(get_model_state_dict(part))
    return sd


def _optim_sd(parts: list[nn.Module], optims: list[torch.optim.Optimizer]) -> dict[str, Any]:
    sd: dict[str, Any] = {}
    for part, opt in zip(parts, optims):
        sd.update(get_optimizer_state_dict(part, _local_optim(opt), options=_OPTS))
    return sd


def _local_optim(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """ZeroRedundancyOptimizer keeps this rank's partition in ``.optim``: its parameters are
    whole parameters of the model, so it checkpoints like any optimizer, by name."""
    return getattr(opt, "optim", opt)


def save(path: str | Path, parts: list[nn.Module], optims: list[torch.optim.Optimizer],
         fused: dict[str, list[int]], trainer_state: dict[str, Any]) -> Path:
    """Write a checkpoint folder collectively (every rank calls this)."""
    path = Path(path)
    build = path.parent / f".{path.name}.partial"
    rank = dist.get_rank()
    if rank == 0:
        import shutil

        if build.exists():
            shutil.rmtree(build)
        build.mkdir(parents=True)
    dist.barrier()
    state = {"model": split_fused(_model_sd(parts), fused),
             "optim": split_fused(_optim_sd(parts, optims), fused)}
    dcp.save(state, checkpoint_id=str(build))
    dist.barrier()
    if rank == 0:
        write_json_atomic(build / "trainer.json", trainer_state)
        swap_in_dir(build, path)
    dist.barrier()
    return path


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    p = Path(path) / "trainer.json"
    if not p.is_file() or not (Path(path) / ".metadata").is_file():
        raise ShoestringError(
            "not a distributed checkpoint (trainer.json or .metadata missing)", where=str(path),
            fix="point --resume at a folder under <run>/checkpoints/ written by a --parallel run")
    return json.loads(p.read_text(encoding="utf-8"))


def load(path: str | Path, parts: list[nn.Module], optims: list[torch.optim.Optimizer],
         fused: dict[str, list[int]]) -> dict[str, Any]:
    """Load a checkpoint into this layout's model parts and optimizers (resharding as
    needed); returns the trainer state."""
    trainer_state = read_trainer_state(path)
    model_like, optim_like = _model_sd(parts), _optim_sd(parts, optims)
    state = {"model": split_fused(model_like, fused), "optim": split_fused(optim_like, fused)}
    dcp.load(state, checkpoint_id=str(path))
    model_sd = merge_fused(state["model"], model_like, fused)
    optim_sd = merge_fused(state["optim"], optim_like, fused)
    for part, opt in zip(parts, optims):
        set_model_state_dict(part, model_sd, options=StateDictOptions(strict=False))
        set_optimizer_state_dict(part, _local_optim(opt), optim_sd, options=_OPTS)
    return trainer_state


# --------------------------------------------------------------------------- consolidation


def consolidate(path: str | Path, model: nn.Module) -> nn.Module:
    """Load the model weights of a checkpoint into a plain single-process ``model`` (whose
    architecture matches), without any process group: what `export` and the trainer's
    ``final/`` use."""
    from shoestring.dist.parallelize import fused_params

    read_trainer_state(path)
    fused = fused_params(model)
    like = {k: v.detach().clone() for k, v in model.state_dict().items()}
    split = split_fused(like, fused)
    dcp.load({"model": split}, checkpoint_id=str(path), no_dist=True)
    model.load_state_dict(merge_fused(split, like, fused))
    return model


def encode_rng(state: Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def decode_rng(text: str) -> Tensor:
    import numpy as np

    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())
