"""`shoestring train --parallel ...` under torchrun: the distributed training loop.

The step is a handful of separate functions so the single-device loop can later share them:
`build_parallel_model` (split → TP → AC → FSDP/DDP), `global_batch` (same order and masking
as one process; each data-parallel rank keeps its rows), `forward_backward` (plain or through
a pipeline schedule), `parallelize.clip_grad_norm_` (across every mesh), `optimizer_step`,
and `checkpoint.save/load` (DCP). With the same seed and global batch, every layout computes
the single-process loss up to floating-point reduction order (tests/test_dist_parity.py).

Everything about the layout is validated before ``init_process_group``, on every rank.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from shoestring.config import Config
from shoestring.dist import checkpoint as ckpt
from shoestring.dist.layout import Layout, validate
from shoestring.dist.mesh import Meshes, build_mesh
from shoestring.dist.parallelize import (
    ParallelModel,
    build_optimizers,
    clip_grad_norm_,
    fused_params,
    parallelize,
    sync_tied_grads,
)
from shoestring.errors import ShoestringError


# --------------------------------------------------------------------------- setup


def world_from_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment (1 process without it)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def check_layout(cfg: Config, layout: Layout, vocab_size: int, world_size: int,
                 device_type: str) -> None:
    """All layout checks for this model and batch (no process group needed)."""
    m, t = cfg.model, cfg.train
    validate(layout, world_size, num_layers=m.num_layers, num_heads=m.num_heads,
             hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
             vocab_size=vocab_size, batch_size=t.batch_size,
             num_kv_heads=getattr(m, "num_kv_heads", None), device_type=device_type)
    if layout.tp > 1 and m.bias:
        raise ShoestringError(
            "model.bias=true with tp > 1 is not supported: fused q/k/v biases would be stored "
            "in the tp-dependent packed order", where="model.bias",
            fix="use biases with tp=1 (dp/pp/ZeRO work), or model.bias=false (the default)")
    if layout.tp > 1 and m.positions != "rotary":
        raise ShoestringError(
            f"model.positions={m.positions} with tp > 1 is not supported (sequence "
            "parallelism shards the residual stream before absolute positions are added)",
            where="model.positions", fix="use rotary positions (the default) with tp > 1")
    if layout.pp > 1 and m.objective == "mlm" and not m.sparse_prediction:
        raise ShoestringError("pipeline parallelism runs the sparse MLM head only",
                              where="model.sparse_prediction", fix="set it to true (default)")
    for name, off in (("batch_ramp", 0.0), ("micro_batch_size", None)):
        value = getattr(t, name, off)
        if value not in (off, t.batch_size):
            raise ShoestringError(
                f"train.{name}={value} is not supported with --parallel yet",
                where=f"train.{name}",
                fix="drop it; with pp > 1 use --microbatches to split the per-rank batch")


_INCARNATIONS = 0


def _fresh_store():  # noqa: ANN202
    """For the 2nd+ process group of one process (several runs in one launch, as the tests
    do): the launcher's store under a new prefix, so no key of the previous group is reused
    (gloo would otherwise dial a peer's stale address)."""
    global _INCARNATIONS
    _INCARNATIONS += 1
    if _INCARNATIONS == 1 or "MASTER_ADDR" not in os.environ:
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    return dist.PrefixStore(f"shoestring-run-{_INCARNATIONS}", store)


def init_process_group(device_type: str, local_rank: int) -> torch.device:
    """NCCL on CUDA (one GPU per local rank), gloo on CPU."""
    rank, world, _ = world_from_env()
    store = _fresh_store()
    kw = {} if store is None else {"store": store, "rank": rank, "world_size": world}
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device, **kw)
        return device
    dist.init_process_group("gloo", **kw)
    return torch.device("cpu")


def build_parallel_model(cfg: Config, vocab_size: int, meshes: Meshes, device: torch.device
                         ) -> ParallelModel:
    """The canonical model from the seed (identical on every rank), cut into this rank's
    pipeline stages, then tensor/data parallelized."""
    from shoestring.model import build_model

    layout = meshes.layout
    kind = cfg.model.objective
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, vocab_size)
    fused = fused_params(model)
    if meshes.pp is None:
        stage_modules = [(0, model)]
    else:
        from shoestring.dist.pipeline import split_model

        stage_modules = split_model(model, layout, meshes.coord("pp"), layout.tp, kind)
    tied = getattr(model, "decoder", None) is None and getattr(model, "lm_head", None) is None
    tied_owners, tied_copies = [], []
    parts, stage_ids = [], []
    for s, mod in stage_modules:
        mod.to(device)
        mod = parallelize(mod, meshes, layout, fused, kind=kind,
                          last=s == layout.num_stages - 1)
        parts.append(mod)
        stage_ids.append(s)
        if meshes.pp is not None and tied and hasattr(_unwrap(mod), "tok_embeddings"):
            emb = _unwrap(mod).tok_embeddings.weight
            (tied_owners if s == 0 else tied_copies).append(emb)
    pm = ParallelModel(parts=parts, stage_ids=stage_ids, fused=fused, meshes=meshes,
                       ddp=not layout.fsdp and meshes.dp is not None,
                       tied_owners=tied_owners, tied_copies=tied_copies)
    if meshes.pp is not None and tied:
        pm.embedding_group = _embedding_group(meshes)
    return pm


def _unwrap(mod: nn.Module) -> nn.Module:
    return getattr(mod, "module", mod)


def _embedding_group(meshes: Meshes):  # noqa: ANN202
    """Process group of the first and last stage rank that share this rank's (dp, tp) place;
    only those two ranks create (and join) it."""
    layout = meshes.layout
    ranks = sorted(int(r) for r in meshes.pp.mesh.flatten())
    first, last = ranks[0], ranks[(layout.num_stages - 1) % layout.pp]
    if dist.get_rank() not in (first, last):
        return None
    return dist.new_group([first, last], use_local_synchronization=True)


# --------------------------------------------------------------------------- data


def global_batch(ids: Tensor, objective, generator: torch.Generator, dp_rank: int,  # noqa: ANN001
                 dp: int) -> tuple[Tensor, ...]:
    """Prepare the *global* batch exactly as one process would (the same masking RNG draws),
    then keep this data-parallel rank's contiguous rows. Masking is a few elementwise ops;
    repeating it on every rank is what makes every layout see the single-process batch."""
    batch = objective.make_batch(ids, generator)
    b = ids.shape[0] // dp
    return tuple(t[dp_rank * b:(dp_rank + 1) * b] for t in batch)


def stage_loss_fn(kind: str):  # noqa: ANN201
    """The pipeline's loss on the last stage's output: MLM logits at the masked positions vs
    their targets; CLM logits vs the row shifted by one."""
    if kind == "clm":
        def clm(logits: Tensor, ids: Tensor) -> Tensor:
            return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
        return clm

    def mlm(logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    return mlm


def loss_context(pm: ParallelModel) -> contextlib.AbstractContextManager:
    if pm.meshes.tp is None:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _local(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def forward_backward(pm: ParallelModel, schedule, batch: tuple[Tensor, ...],  # noqa: ANN001
                     objective, autocast) -> Tensor:  # noqa: ANN001
    """One global batch's forward and backward on this rank; returns the mean loss over this
    rank's rows (0 on pipeline ranks without the last stage)."""
    with loss_context(pm), autocast():
        if schedule is None:
            loss = objective.loss(pm.parts[0], batch)
            loss.backward()
            return _local(loss).detach().float()
        first, last = 0 in pm.stage_ids, pm.meshes.layout.num_stages - 1 in pm.stage_ids
        if objective.kind == "clm":
            (ids,) = batch
            args, target = (ids,), ids
        else:
            inputs, positions, target = batch
            args = (inputs, positions.to(torch.float32))
        losses: list[Tensor] = []
        schedule.step(*(args if first else ()), target=target if last else None,
                      losses=losses if last else None)
        if not last:
            return torch.zeros((), dtype=torch.float32, device=batch[0].device)
        return torch.stack([_local(x).detach().float() for x in losses]).mean()


def reduce_loss(pm: ParallelModel, loss: Tensor) -> float:
    """The global batch's mean loss on every rank: from the last stage over pp, mean over dp."""
    m = pm.meshes
    if m.pp is not None:
        dist.all_reduce(loss, group=m.pp.get_group())
    if m.dp is not None:
        dist.all_reduce(loss, group=m.dp.get_group())
        loss = loss / m.dp.size()
    return float(loss)


def _local_bytes(tensors) -> int:  # noqa: ANN001
    return sum(_local(t).numel() * t.element_size() for t in tensors)


def measured_memory(pm: ParallelModel, optims: list[torch.optim.Optimizer], grad_bytes: int
                    ) -> dict[str, int]:
    """Bytes of this rank's parameter shards, gradients and optimizer state after a step, the
    maximum over ranks (what `shoestring.dist.memory` predicts for the busiest rank)."""
    params = _local_bytes(p for part in pm.parts for p in part.parameters())
    state = 0
    for opt in optims:
        inner = getattr(opt, "optim", opt)
        for st in inner.state.values():
            state += _local_bytes(v for v in st.values() if isinstance(v, Tensor) and v.dim() > 0)
    t = torch.tensor([params, grad_bytes, state], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"params": int(t[0]), "grads": int(t[1]), "optimizer": int(t[2])}


def optimizer_step(optims: list[torch.optim.Optimizer], lr: float) -> None:
    for opt in optims:
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------- the loop


def _lr_factor(cfg: Config, progress: float) -> float:
    try:
        from shoestring.train.schedule import lr_factor

        return lr_factor(cfg.train, progress)
    except ImportError:  # older schedule module
        from shoestring.train.schedule import one_cycle

        return one_cycle(progress, cfg.train.lr_peak_at)


class _Clock:
    """Budget progress decided by rank 0 and shared, so every rank stops at the same step."""

    def __init__(self, cfg: Config, tokens_per_step: int, flops_per_token: float) -> None:
        self.steps = cfg.train.steps
        self.seconds: float | None = None
        self.tokens_per_step = tokens_per_step
        self.budget = None
        if self.steps is None:
            try:
                from shoestring.train.budget import Budget, parse_budget

                self.budget = Budget.from_spec(parse_budget(cfg.train.budget), None,
                                               flops_per_token)
            except ImportError:
                from shoestring.train.budget import parse_duration

                self.seconds = parse_duration(cfg.train.budget)
        self.start = time.perf_counter()
        self.offset = 0.0

    def restart(self, elapsed_before: float = 0.0) -> None:
        self.start, self.offset = time.perf_counter(), elapsed_before
        if self.budget is not None:
            self.budget.restart(elapsed_before)

    @property
    def elapsed(self) -> float:
        return self.offset + time.perf_counter() - self.start

    def _progress(self, step: float) -> float:
        if self.steps is not None:
            return step / self.steps
        if self.budget is not None:
            return self.budget.progress(step, step * self.tokens_per_step)
        return self.elapsed / self.seconds  # type: ignore[operator]

    def progress(self, step: float) -> float:
        """Progress at ``step`` (shared from rank 0 under time budgets)."""
        p = self._progress(step)
        if self.steps is None and dist.is_initialized():
            t = torch.tensor([p if dist.get_rank() == 0 else 0.0], dtype=torch.float64)
            dist.broadcast(t, src=0)
            p = float(t)
        return p


CHECKPOINT_DIR = "dist_checkpoints"  # beside the single-device loop's checkpoints/, not in it


def _checkpoint_interval(cfg: Config, steps: int | None) -> tuple[int | None, float | None]:
    """(every N steps, every S seconds) from the argument or ``train.checkpoint_every``."""
    if steps is not None:
        return steps, None
    text = getattr(cfg.train, "checkpoint_every", None)
    if not text:
        return None, None
    from shoestring.train.budget import parse_budget

    spec = parse_budget(text)
    if spec.kind == "steps":
        return int(spec.amount), None
    if spec.kind in ("seconds", "time", "wall"):
        return None, float(spec.amount)
    return None, None


def _shared_flag(value: bool) -> bool:
    """Rank 0's decision, on every rank (wall-clock decisions must agree)."""
    t = torch.tensor([1.0 if value else 0.0])
    dist.broadcast(t, src=0)
    return bool(t.item())


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete distributed checkpoint of a run dir (None if there is none)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    done = sorted(p for p in folder.glob("step_*") if (p / ".metadata").is_file()
                  and (p / "trainer.json").is_file()) if folder.is_dir() else []
    return done[-1] if done else None


def train_distributed(
    cfg: Config,
    layout: Layout,
    data_dir: str | Path,
    run_dir: str | Path,
    *,
    overwrite: bool = False,
    resume: str | Path | None = None,
    checkpoint_every: int | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train under torchrun with ``layout``; rank 0 writes the run dir, every rank writes its
    checkpoint shards. ``stop_after`` ends the run early at that step (after checkpointing),
    as an interruption would; ``resume`` continues from a checkpoint folder of any layout."""
    from shoestring.data.datadir import DataDir
    from shoestring.data.loader import BatchLoader, Cursor
    from shoestring.model.flops import train_flops_per_token
    from shoestring.train.device import select_device
    from shoestring.train.objective import objective_for

    rank, world, local_rank = world_from_env()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    data = DataDir(data_dir)
    vocab, seq_len = data.vocab_size, data.seq_len
    check_layout(cfg, layout, vocab, world, device_type)  # before any process group
    run_dir = Path(run_dir)
    resume_state = ckpt.read_trainer_state(resume) if resume is not None else None
    if rank == 0:
        from shoestring.train.rundir import MARKER, prepare_run_dir

        # resuming continues a run dir in place (never wipes the checkpoint it resumes from)
        if resume is None or not (run_dir / MARKER).is_file():
            prepare_run_dir(run_dir, overwrite)
        from shoestring.fsutil import write_text_atomic

        write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())
    tc = cfg.train
    if tc.threads:
        torch.set_num_threads(tc.threads)
    dev = select_device(tc.precision, measure_peak=False)
    device = init_process_group(device_type, local_rank)
    try:
        dist.barrier()
        meshes = build_mesh(layout, device_type)
        pm = build_parallel_model(cfg, vocab, meshes, device)
        optims = build_optimizers(pm.parts, tc, layout, meshes)
        schedule = None
        if meshes.pp is not None:
            from shoestring.dist.pipeline import build_schedule

            schedule = build_schedule(list(zip(pm.stage_ids, pm.parts)), layout,
                                      meshes.pp.get_group(), device,
                                      stage_loss_fn(cfg.model.objective))
        split = data.split("train", verify=False)
        loader = BatchLoader(split, tc.batch_size, tc.seed, prefetch=0)
        gen = torch.Generator(device="cpu").manual_seed(tc.seed)
        step, tokens, elapsed_before = 0, 0, 0.0
        if resume is not None:
            state = ckpt.load(resume, pm.parts, optims, pm.fused)
            step, tokens = state["step"], state["tokens"]
            elapsed_before = state.get("elapsed_s", 0.0)
            loader = BatchLoader(split, tc.batch_size, tc.seed, Cursor.from_dict(state["cursor"]),
                                 prefetch=0)
            gen.set_state(ckpt.decode_rng(state["mask_rng"]))
        objective = objective_for(cfg.model.objective, seq_len, vocab, data.special_ids,
                                  tc.mask_rate, cfg.model.sparse_prediction)
        fpt = train_flops_per_token(cfg.model, vocab, seq_len, objective.head_fraction)
        tokens_per_step = tc.batch_size * seq_len
        clock = _Clock(cfg, tokens_per_step, fpt)
        if resume is not None and clock.steps is not None and step >= clock.steps:
            raise ShoestringError(
                f"the checkpoint is at step {step}, the end of the {clock.steps}-step budget",
                where=str(resume), fix="raise the budget (--steps / train.steps) to go on")
        dp_rank, dp = meshes.coord("dp"), layout.dp
        for part in pm.parts:
            part.train()
        metrics_path = run_dir / "metrics.jsonl"
        metrics = open(metrics_path, "a", encoding="utf-8") if rank == 0 else None
        ckdir = run_dir / CHECKPOINT_DIR
        every_steps, every_seconds = _checkpoint_interval(cfg, checkpoint_every)
        next_ckpt_time: float | None = None
        losses: list[float] = []
        memory: dict[str, int] | None = None
        clock.restart(elapsed_before)
        window_start, window_tokens = clock.elapsed, 0
        while True:
            lr = tc.lr * _lr_factor(cfg, clock.progress(step + 0.5))
            batch = global_batch(next(loader), objective, gen, dp_rank, dp)
            batch = tuple(t.to(device) for t in batch)
            local_loss = forward_backward(pm, schedule, batch, objective, dev.autocast)
            sync_tied_grads(pm)
            gnorm = clip_grad_norm_(pm, tc.grad_clip)
            if memory is None:
                grad_bytes = _local_bytes(p.grad for part in pm.parts for p in part.parameters()
                                          if p.grad is not None)
            optimizer_step(optims, lr)
            if memory is None:
                memory = measured_memory(pm, optims, grad_bytes)
            loss = reduce_loss(pm, local_loss)
            if not math.isfinite(loss):
                raise ShoestringError(f"the loss became {loss} at step {step}",
                                      where=str(run_dir), fix="lower train.lr")
            step += 1
            tokens += tokens_per_step
            window_tokens += tokens_per_step
            losses.append(loss)
            p = clock.progress(step)
            done = p >= 1.0 or (stop_after is not None and step >= stop_after)
            if metrics is not None and (step % tc.log_every == 0 or done):
                now = clock.elapsed
                record = {"step": step, "progress": round(p, 5), "loss": loss, "lr": lr,
                          "tokens": tokens, "grad_norm": gnorm,
                          "tokens_per_s": window_tokens / max(now - window_start, 1e-9),
                          "elapsed_s": now, "world_size": world}
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                window_start, window_tokens = now, 0
            if next_ckpt_time is None and every_seconds:
                next_ckpt_time = clock.elapsed + every_seconds
            due = bool(every_steps and step % every_steps == 0)
            if every_seconds and _shared_flag(clock.elapsed >= next_ckpt_time):
                due, next_ckpt_time = True, clock.elapsed + every_seconds
            if due or ((every_steps or every_seconds) and done):
                ckpt.save(ckdir / f"step_{step:07d}", pm.parts, optims, pm.fused, {
                    "step": step, "tokens": tokens, "elapsed_s": clock.elapsed,
                    "cursor": loader.cursor.to_dict(),
                    "mask_rng": ckpt.encode_rng(gen.get_state()),
                    "layout": layout.to_dict(), "world_size": world,
                })
            if done:
                break
        train_seconds = clock.elapsed
        if metrics is not None:
            metrics.close()
        finished = stop_after is None or step < stop_after or p >= 1.0
        final_ckpt = ckdir / f"step_{step:07d}"
        summary = {"data_dir": str(Path(data_dir).resolve()), "steps": step, "tokens": tokens, "train_seconds": round(train_seconds, 3),
                   "tokens_per_s": tokens / max(train_seconds - elapsed_before, 1e-9)
                   if resume is None else None,
                   "layout": layout.describe(), "world_size": world, "losses": losses,
                   "final_train_loss": losses[-1] if losses else None, "finished": finished,
                   "memory_measured": memory}
        if finished:
            if not (final_ckpt / ".metadata").is_file():
                ckpt.save(final_ckpt, pm.parts, optims, pm.fused, {
                    "step": step, "tokens": tokens, "elapsed_s": train_seconds,
                    "cursor": loader.cursor.to_dict(),
                    "mask_rng": ckpt.encode_rng(gen.get_state()),
                    "layout": layout.to_dict(), "world_size": world})
            if rank == 0:
                _write_final(cfg, data, run_dir, final_ckpt, vocab, seq_len)
        if rank == 0:
            from shoestring.fsutil import write_json_atomic

            write_json_atomic(run_dir / "summary.json", summary)
        dist.barrier()
        return summary
    finally:
        dist.destroy_process_group()


def _write_final(cfg: Config, data, run_dir: Path, checkpoint: Path, vocab: int,  # noqa: ANN001
                 seq_len: int) -> None:
    """Consolidate the last checkpoint into the run dir's ``final/`` (one safetensors file,
    the single-device format that eval/export/serve read)."""
    from shoestring.model import build_model
    from shoestring.train.rundir import model_meta, save_final

    model = ckpt.consolidate(checkpoint, build_model(cfg.model, vocab))
    save_final(run_dir, model, model_meta(cfg, vocab, seq_len, data.special_ids),
               data.tokenizer_path)
