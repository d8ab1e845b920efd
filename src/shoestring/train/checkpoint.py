"""Checkpoints: one format for every layout, complete or absent, resumable on another layout.

A checkpoint is a folder ``RUN_DIR/checkpoints/step_00001234/`` written with
torch.distributed.checkpoint (DCP) — by one process or by every rank of a job, each writing
only its shards — plus ``state.json`` (written last, by rank 0): step, tokens, budget used,
the data cursor, the RNG streams, the metrics file's length, the layout that wrote it.

DCP's metadata records each tensor's global shape and every chunk's offsets, so a checkpoint
written by one layout (one process, dp=2 with ZeRO-3, dp=2·tp=2·pp=2, ...) loads into any
other: each rank reads its chunks of the global tensors. Model and optimizer state use the
canonical model's parameter names and the optimizer state is flattened per parameter
(``state.<name>.exp_avg``), so pipeline stages and ZeRO-1 partitions merge by name. Fused
projections (q/k/v, the GLU's input and gate) are stored as their parts
(``...Wqkv.weight.part0`` = q): tensor parallelism packs them in a tp-dependent row order
(`shoestring.dist.parallelize`), their parts are plain row blocks in every layout.

The folder is built under a hidden temporary name and renamed into place, so a kill at any
moment leaves either the new checkpoint or none; older ones are pruned only after the new one
is in place. Run dirs written before this format (``model.safetensors`` + ``optimizer.pt``
checkpoints, or ``dist_checkpoints/``) are converted by `upgrade_run` (``shoestring train
--resume`` says so when it meets one).
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
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
from shoestring.fsutil import output_error, swap_in_dir, write_json_atomic
from shoestring.rundir import CHECKPOINT_PREFIX, RunDir

if TYPE_CHECKING:
    from shoestring.dist.parallelism import Parallelism

STATE = "state.json"
FORMAT = 2
PART = ".part"
_OPTS = StateDictOptions(flatten_optimizer_state_dict=True)


@dataclass
class Checkpoint:
    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])


# --------------------------------------------------------------------------- RNG streams


def capture_rng(gen: torch.Generator) -> dict[str, Any]:
    """Every random stream training draws from, as JSON-able lists."""
    state: dict[str, Any] = {"torch": torch.get_rng_state().tolist(),
                             "masking": gen.get_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any], gen: torch.Generator, where: str = "state.json") -> None:
    """Put back `capture_rng`'s streams; a stream cut short or holding other than bytes is a
    ShoestringError naming it (torch's own error is a traceback about a tensor size)."""
    torch.set_rng_state(_rng_bytes(state, "torch", torch.get_rng_state(), where))
    gen.set_state(_rng_bytes(state, "masking", gen.get_state(), where))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def _rng_bytes(state: dict[str, Any], name: str, like: Tensor, where: str) -> Tensor:
    value = state.get(name)
    ok = (isinstance(value, list) and len(value) == like.numel()
          and all(isinstance(v, int) and 0 <= v <= 255 for v in value))
    if not ok:
        size = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise ShoestringError(
            f"the checkpoint's random state rng.{name} is damaged ({size}; this torch keeps "
            f"{like.numel()} bytes)", where=where,
            fix="delete this checkpoint folder to resume from the one before, or start the run "
            "again")
    return torch.tensor(value, dtype=torch.uint8)


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


def _local_optim(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """ZeroRedundancyOptimizer keeps this rank's partition in ``.optim``: its parameters are
    whole parameters of the model, so it checkpoints like any optimizer, by name."""
    return getattr(opt, "optim", opt)


def _state_dicts(parallel: Parallelism) -> dict[str, dict[str, Any]]:
    sd: dict[str, dict[str, Any]] = {"model": {}, "optim": {}}
    for part, opt in zip(parallel.parts, parallel.optimizers):
        sd["model"].update(get_model_state_dict(part))
        sd["optim"].update(get_optimizer_state_dict(part, _local_optim(opt), options=_OPTS))
    return sd


def _dcp(fn, state: dict[str, Any], path: Path, no_dist: bool) -> None:  # noqa: ANN001
    """DCP save or load; a load reads nothing that can run code (`shoestring.train.dcp_safe`)."""
    kw: dict[str, Any] = {}
    if fn is dcp.load:
        from shoestring.train.dcp_safe import SafeLoadPlanner, SafeReader, check_metadata

        check_metadata(path)  # DCP would only report a refusal as a failed read
        kw = {"storage_reader": SafeReader(str(path)), "planner": SafeLoadPlanner()}
    try:
        with warnings.catch_warnings():  # one process: DCP says it assumes so; the intent
            warnings.filterwarnings("ignore", message=".*assuming the intent is to")
            fn(state, checkpoint_id=str(path), no_dist=no_dist, **kw)
    except CheckpointException as e:  # DCP wraps every rank's error: raise ours, or the OSError
        for exc, _ in e.failures.values():
            if isinstance(exc, (ShoestringError, OSError)):
                raise exc from None
        if fn is not dcp.load:
            raise
        # a shard that does not read back (truncated, corrupt): CheckpointException is a
        # BaseException, which the callers' "cannot restore" handling would not see
        first = next((exc for exc, _ in e.failures.values()), e)
        raise RuntimeError(f"a shard does not read back ({type(first).__name__}: "
                           f"{first})") from None


# --------------------------------------------------------------------------- save / load


def save_checkpoint(run_dir: Path, parallel: Parallelism, state: dict[str, Any], keep: int
                    ) -> Path:
    """Write ``checkpoints/step_N`` collectively (every rank calls this), atomically, then
    prune to the newest ``keep``; incomplete folders (`incomplete_checkpoints`) go too: no
    run can load them, and a resume already said it skipped them."""
    root = RunDir(run_dir).checkpoints_dir
    path = root / f"{CHECKPOINT_PREFIX}{state['step']:08d}"
    build = root / f".{path.name}.partial"
    if parallel.is_main:
        if build.exists():
            shutil.rmtree(build)
        build.mkdir(parents=True)
    parallel.barrier()
    sd = {k: split_fused(v, parallel.fused) for k, v in _state_dicts(parallel).items()}
    try:
        _dcp(dcp.save, sd, build, no_dist=not parallel.distributed)
        parallel.barrier()
        if parallel.is_main:
            write_json_atomic(build / STATE, {"format": FORMAT, **state})
            swap_in_dir(build, path)
            for old in RunDir(run_dir).checkpoints()[:-keep] + incomplete_checkpoints(run_dir):
                shutil.rmtree(old, ignore_errors=True)
    except (OSError, RuntimeError, CheckpointException) as e:  # a full disk (torch.save's
        refused = output_error(e, where=path)  # zip writer wraps it): name the checkpoint
        if refused is None:
            raise
        raise refused from None
    finally:
        if parallel.is_main and build.exists():
            shutil.rmtree(build, ignore_errors=True)
    parallel.barrier()
    return path


def load_checkpoint(ckpt: Checkpoint, parallel: Parallelism) -> None:
    """Load a checkpoint of any layout into this layout's parts and optimizers (resharding
    as needed)."""
    try:
        like = _state_dicts(parallel)
        sd = {k: split_fused(v, parallel.fused) for k, v in like.items()}
        _dcp(dcp.load, sd, ckpt.path, no_dist=not parallel.distributed)
        model_sd, optim_sd = (merge_fused(sd[k], like[k], parallel.fused) for k in like)
        for part, opt in zip(parallel.parts, parallel.optimizers):
            set_model_state_dict(part, model_sd, options=StateDictOptions(strict=False))
            set_optimizer_state_dict(part, _local_optim(opt), optim_sd, options=_OPTS)
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise ShoestringError(
            f"cannot restore the checkpoint ({type(e).__name__}: {str(e)[:300]})",
            where=str(ckpt.path),
            fix="the config must describe the run's model (same sizes); or delete this "
            "checkpoint folder to resume from the one before",
        ) from None


def consolidate(path: str | Path, model: nn.Module) -> nn.Module:
    """Load the model weights of a checkpoint of any layout into a plain single-process
    ``model`` (whose architecture matches), without any process group: what ``final/`` is
    written from."""
    from shoestring.dist.parallelize import fused_params

    fused = fused_params(model)
    like = {k: v.detach().clone() for k, v in model.state_dict().items()}
    split = split_fused(like, fused)
    _dcp(dcp.load, {"model": split}, Path(path), no_dist=True)
    model.load_state_dict(merge_fused(split, like, fused))
    return model


# --------------------------------------------------------------------------- listing


def incomplete_checkpoints(run_dir: Path) -> list[Path]:
    """``step_N`` folders without DCP's ``.metadata`` or ``state.json`` (cut off while they
    were saved or copied: this module's own saves appear complete or not at all), oldest
    first; folders of the earlier formats (`legacy_checkpoints`) are not among them."""
    root = RunDir(run_dir).checkpoints_dir
    if not root.is_dir():
        return []
    skip = set(RunDir(run_dir).checkpoints()) | set(legacy_checkpoints(Path(run_dir)))
    return sorted(p for p in root.iterdir() if p.is_dir()
                  and p.name.startswith(CHECKPOINT_PREFIX) and p not in skip)


def incomplete_note(path: Path) -> str:
    """What `train --resume` says of an incomplete checkpoint folder it skips."""
    lacks = ("DCP .metadata" if not (path / ".metadata").is_file() else STATE)
    return (f"skipping the checkpoint {path}: it has no {lacks}, so it was cut off while it "
            "was saved (or copied) and cannot be loaded; resuming from the newest complete "
            "one, and this folder is deleted when the run saves its next checkpoint")


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The newest complete checkpoint; a run dir holding only checkpoints of the format
    before this one is refused with the command that converts it."""
    ckpts = RunDir(run_dir).checkpoints()
    if not ckpts:
        if legacy_checkpoints(Path(run_dir)):
            raise ShoestringError(
                "this run dir's checkpoints are in the format of shoestring before the one "
                "trainer (model.safetensors + optimizer.pt, or dist_checkpoints/)",
                where=str(run_dir),
                fix=f"convert them once with: python -m shoestring.train.checkpoint "
                f"upgrade {run_dir}  (then --resume works on any layout)")
        return None
    try:
        return Checkpoint(ckpts[-1], json.loads((ckpts[-1] / STATE).read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        raise ShoestringError(f"checkpoint state is unreadable ({e})", where=str(ckpts[-1]),
                              fix="delete this checkpoint folder to resume from the one before"
                              ) from None


# --------------------------------------------------------------------------- older formats


def legacy_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders written before format 2: one-process ones (``model.safetensors``,
    ``optimizer.pt``, ``state.json``) and ``dist_checkpoints/step_N`` (DCP + ``trainer.json``)."""
    found = []
    root = RunDir(run_dir).checkpoints_dir
    if root.is_dir():
        found += [p for p in root.iterdir() if p.name.startswith(CHECKPOINT_PREFIX)
                  and (p / "model.safetensors").is_file() and (p / STATE).is_file()]
    old_dist = run_dir / "dist_checkpoints"
    if old_dist.is_dir():
        found += [p for p in old_dist.iterdir() if p.name.startswith(CHECKPOINT_PREFIX)
                  and (p / "trainer.json").is_file() and (p / ".metadata").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX):]))


def upgrade_run(run_dir: str | Path) -> list[Path]:
    """Convert a run dir's checkpoints of the earlier formats into format 2, in place (the
    originals are removed once their conversion is complete). Returns the new folders."""
    import base64

    import numpy as np
    from safetensors.torch import load_file

    from shoestring.dist.layout import Layout
    from shoestring.dist.parallelism import Parallelism
    from shoestring.dist.parallelize import fused_params
    from shoestring.model import build_model
    from shoestring.train.optim import build_optimizer

    run_dir = Path(run_dir)
    old = legacy_checkpoints(run_dir)
    if not old:
        raise ShoestringError("no checkpoints of an earlier format here", where=str(run_dir))
    cfg = RunDir(run_dir).read_config()
    done = []
    for src in old:
        if (src / "trainer.json").is_file():  # a DCP checkpoint already: new state file only
            t = json.loads((src / "trainer.json").read_text(encoding="utf-8"))
            mask = np.frombuffer(base64.b64decode(t["mask_rng"]), dtype=np.uint8).tolist()
            state = {"format": FORMAT, "step": t["step"], "tokens": t["tokens"], "skipped": 0,
                     "next_val": 1.0, "elapsed": t.get("elapsed_s", 0.0),
                     "cursor": t["cursor"], "rng": {"torch": torch.get_rng_state().tolist(),
                                                    "masking": mask},
                     "metrics_lines": len(RunDir(run_dir).read_metrics()),
                     "layout": t.get("layout"), "world_size": t.get("world_size")}
            dst = RunDir(run_dir).checkpoints_dir / f"{CHECKPOINT_PREFIX}{t['step']:08d}"
            build = dst.parent / f".{dst.name}.partial"
            shutil.copytree(src, build)  # and the checkpoints folder, if it is not there
            (build / "trainer.json").unlink()
            write_json_atomic(build / STATE, state)
            swap_in_dir(build, dst)
        else:  # one process: safetensors + a positional optimizer state
            weights = load_file(str(src / "model.safetensors"))
            vocab = next(v.shape[0] for k, v in weights.items() if k.endswith("tok_embeddings.weight"))
            model = build_model(cfg.model, vocab)
            model.load_state_dict(weights)
            opt = build_optimizer(model, cfg.train)
            opt.load_state_dict(torch.load(src / "optimizer.pt", weights_only=True))
            state = json.loads((src / STATE).read_text(encoding="utf-8"))
            parallel = Parallelism(layout=Layout(), device=torch.device("cpu"))
            parallel.parts, parallel.optimizers = [model], [opt]
            parallel.fused = fused_params(model)
            tmp = run_dir / ".upgrade"
            dst_state = {**state, "layout": Layout().to_dict(), "world_size": 1}
            written = save_checkpoint(tmp, parallel, dst_state, keep=1)
            shutil.rmtree(src)
            dst = RunDir(run_dir).checkpoints_dir / written.name
            written.rename(dst)
            shutil.rmtree(tmp, ignore_errors=True)
        done.append(dst)
    old_dist = run_dir / "dist_checkpoints"
    if old_dist.is_dir():
        shutil.rmtree(old_dist)
    return sorted(done)


def main(argv: list[str] | None = None) -> None:
    """``python -m shoestring.train.checkpoint upgrade RUN_DIR``: convert older checkpoints."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "upgrade":
        print("usage: python -m shoestring.train.checkpoint upgrade RUN_DIR", file=sys.stderr)
        sys.exit(2)
    try:
        for p in upgrade_run(args[1]):
            print(f"converted {p}")
    except ShoestringError as e:
        print(f"error: {e.message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
