"""`shoestring train`: pretraining within a budget, resumable and preemption-safe.

The loop spends the budget and nothing else: model building and the peak measurement happen
before the clock starts; periodic validation and checkpoints pause it; the final validation
and save happen after it stops and are reported separately. Everything the next step depends
on (weights, optimizer, RNG streams, data cursor, budget used) is in each checkpoint, so a
resumed step-budget run reproduces the uninterrupted run's losses exactly.
"""

from __future__ import annotations

import contextlib
import math
import platform
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from shoestring import __version__
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader, Cursor
from shoestring.errors import ShoestringError
from shoestring.fsutil import write_json_atomic, write_text_atomic
from shoestring.model import build_model
from shoestring.model.flops import train_flops_per_token
from shoestring.train.budget import Budget, format_duration, parse_budget
from shoestring.train.checkpoint import (
    capture_rng,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from shoestring.train.device import DeviceInfo, select_device
from shoestring.train.metrics import MetricsLog
from shoestring.train.objective import Objective, objective_for
from shoestring.train.optim import build_optimizer
from shoestring.train.rundir import MARKER, model_meta, prepare_run_dir, save_final
from shoestring.train.schedule import batch_at, lr_factor


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived; a checkpoint was saved. The CLI exits with 128 + signal."""

    def __init__(self, signum: int, checkpoint: Path, step: int) -> None:
        self.signum, self.checkpoint, self.step = signum, checkpoint, step
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}")


@dataclass
class _State:
    step: int = 0
    tokens: int = 0
    skipped: int = 0  # non-finite steps skipped, in total
    bad_in_a_row: int = 0
    next_val: float = 0.0  # progress at which the next periodic validation runs
    last_ckpt_time: float = 0.0  # budget-elapsed seconds at the last checkpoint
    first_loss: float | None = None
    losses: list[float] = field(default_factory=list)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]training"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}% of {task.fields[budget]}"),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TextColumn("MFU {task.fields[mfu]:.1%}"),
        TextColumn("left {task.fields[left]}"),
        console=console,
    )


@contextlib.contextmanager
def _signals_caught() -> Iterator[list[int]]:
    """SIGTERM/SIGINT set a flag instead of killing the process (main thread only)."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _check_data(cfg: Config, data: DataDir) -> None:
    kind = data.manifest.get("objective", "mlm")
    if kind != cfg.model.objective:
        preset = "clm-tiny" if kind == "clm" else "tiny"
        raise ShoestringError(
            f"the data dir is prepared for objective '{kind}' but model.objective is "
            f"'{cfg.model.objective}'",
            where=str(data.path),
            fix=f"--set model.objective={kind} (or a {kind} preset such as model.preset={preset}), "
            "or prep the data with the other objective",
        )
    if cfg.model.positions != "rotary" and data.seq_len > cfg.model.max_positions:
        raise ShoestringError(
            f"sequences of {data.seq_len} tokens exceed model.max_positions "
            f"({cfg.model.max_positions}) for {cfg.model.positions} positions",
            where="model.max_positions",
            fix=f"--set model.max_positions={data.seq_len}",
        )


def _init_from(model: torch.nn.Module, source: str, cfg: Config, data: DataDir) -> None:
    """Copy weights from a Hugging Face folder or a run dir; the architectures must agree."""
    from shoestring.model.hub import import_hf
    from shoestring.train.rundir import load_final

    path = Path(source)
    loaded, meta = load_final(path) if (path / MARKER).is_file() else import_hf(path)
    theirs = {k: v for k, v in meta["model"].items() if k not in ("preset", "init_std")}
    ours = {k: v for k, v in cfg.model.model_dump(mode="json").items() if k in theirs}
    diff = sorted(k for k in theirs if theirs[k] != ours.get(k))
    if diff or meta["vocab_size"] != data.vocab_size:
        what = ", ".join(f"model.{k}: ours {ours.get(k)!r}, theirs {theirs[k]!r}" for k in diff[:4])
        if meta["vocab_size"] != data.vocab_size:
            what = (what + "; " if what else "") + (
                f"vocabulary: data {data.vocab_size}, theirs {meta['vocab_size']}")
        raise ShoestringError(
            f"cannot start from these weights: {what}",
            where=f"train.init_from={source}",
            fix="use the same model settings as the checkpoint (e.g. --config its config) and "
            "data prepared with its tokenizer (--set data.tokenizer=DIR/tokenizer.json)",
        )
    model.load_state_dict(loaded.state_dict())


def _val_batch(data: DataDir, cfg: Config, objective: Objective) -> tuple[torch.Tensor, ...] | None:
    """The fixed periodic-validation subset: the first val_sequences rows, masks fixed."""
    try:
        val = data.split("val")
    except ShoestringError:
        return None
    n = min(len(val), cfg.train.val_sequences)
    ids = torch.from_numpy(val.take(np.arange(n)))
    if objective.kind == "clm":
        return (ids,)
    from shoestring.eval.mlm import fixed_masks

    b = fixed_masks(ids, 0, cfg.eval, objective.mask_id, objective.vocab_size)
    return (b.inputs, b.positions, b.targets)


@torch.no_grad()
def _val_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, ...], objective: Objective,
              dev: DeviceInfo, size: int = 64) -> float:
    import torch.nn.functional as F

    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(batch[0]), size):
        part = [t[start:start + size].to(dev.device) for t in batch]
        with dev.autocast():
            if objective.kind == "clm":
                logits = model(part[0])[:, :-1]
                targets = part[0][:, 1:]
            else:
                logits = model(part[0], part[1])
                targets = part[2]
        total += F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                 reduction="sum").item()
        count += targets.numel()
    model.train()
    return total / max(count, 1)


def _ckpt_interval(text: str | None) -> tuple[str, float] | None:
    if text is None:
        return None
    spec = parse_budget(text)
    return spec.kind, spec.amount


def train(
    cfg: Config,
    data_dir: str | Path,
    run_dir: str | Path,
    overwrite: bool = False,
    console: Console | None = None,
    resume: bool = False,
) -> dict:
    """Pretrain on ``data_dir`` into ``run_dir``; returns the summary (also summary.json).

    ``resume`` continues from the run dir's newest checkpoint (the config must describe the
    same model; the budget may be extended).
    """
    console = console or Console(stderr=True)
    data = DataDir(data_dir)
    _check_data(cfg, data)
    train_split = data.split("train", verify=False)
    run_dir = Path(run_dir)
    tc = cfg.train
    ckpt = None
    if resume:
        if not (run_dir / MARKER).is_file():
            raise ShoestringError("nothing to resume: not a run dir", where=str(run_dir),
                                  fix="train without --resume to start a run here")
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ShoestringError("nothing to resume: the run dir has no checkpoint",
                                  where=str(run_dir / "checkpoints"),
                                  fix="train again with --overwrite to start over")
    else:
        prepare_run_dir(run_dir, overwrite)
    write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())

    if tc.threads:
        torch.set_num_threads(tc.threads)
    dev: DeviceInfo = select_device(tc.precision)
    torch.manual_seed(tc.seed)
    vocab, seq_len = data.vocab_size, data.seq_len
    model = build_model(cfg.model, vocab)
    if tc.init_from and ckpt is None:
        _init_from(model, tc.init_from, cfg, data)
    model = model.to(dev.device)
    optimizer = build_optimizer(model, tc)
    objective = objective_for(cfg.model.objective, seq_len, vocab, data.special_ids,
                              tc.mask_rate, cfg.model.sparse_prediction)
    step_model = torch.compile(model) if tc.compile else model
    scaler = torch.amp.GradScaler("cuda") if dev.dtype == torch.float16 else None

    flops_per_token = train_flops_per_token(cfg.model, vocab, seq_len, objective.head_fraction)
    spec = parse_budget(tc.budget) if tc.budget is not None else None
    budget = Budget.from_spec(spec, tc.steps, flops_per_token)
    gen = torch.Generator(device=dev.device).manual_seed(tc.seed)
    s = _State(next_val=tc.val_every)
    cursor = Cursor()
    if ckpt is not None:
        load_checkpoint(ckpt, model, optimizer)
        st = ckpt.state
        restore_rng(st["rng"], gen)
        cursor = Cursor(**st["cursor"])
        s = _State(step=st["step"], tokens=st["tokens"], skipped=st["skipped"],
                   next_val=st["next_val"], last_ckpt_time=st["elapsed"],
                   first_loss=st.get("first_loss"), losses=list(st.get("recent_losses", [])))
    loader = BatchLoader(train_split, tc.micro_batch, tc.seed, cursor)
    val_batch = _val_batch(data, cfg, objective) if tc.val_every > 0 else None
    interval = _ckpt_interval(tc.checkpoint_every)
    metrics = MetricsLog(run_dir, tc.tensorboard, keep_lines=ckpt.state["metrics_lines"] if ckpt else 0)

    console.print(
        f"model: {cfg.model.objective} {model.num_params() / 1e6:.2f}M parameters "
        f"({model.num_params(non_embedding=True) / 1e6:.2f}M non-embedding), "
        f"{flops_per_token / 1e6:.1f} MFLOP/token; device: {dev.name}, "
        f"{str(dev.dtype).removeprefix('torch.')}, measured peak {dev.peak_flops / 1e9:.0f} GFLOP/s"
        + (f" (datasheet {dev.datasheet_name}: {dev.datasheet_flops / 1e12:.0f} TFLOP/s)"
           if dev.datasheet_flops else "") + "; "
        f"budget: {budget.describe()}"
        + (f"; resuming at step {s.step}" if ckpt else "")
    )

    def checkpoint() -> Path:
        with budget.pause():
            state = {
                "step": s.step, "tokens": s.tokens, "skipped": s.skipped, "next_val": s.next_val,
                "elapsed": budget.elapsed, "cursor": {"epoch": loader.cursor.epoch,
                                                      "offset": loader.cursor.offset},
                "rng": capture_rng(gen), "metrics_lines": metrics.lines,
                "first_loss": s.first_loss, "recent_losses": s.losses[-200:],
            }
            path = save_checkpoint(run_dir, model, optimizer, state, tc.keep_checkpoints)
            s.last_ckpt_time = budget.elapsed
            return path

    model.train()
    budget.restart(elapsed_before=ckpt.state["elapsed"] if ckpt else 0.0)
    window = {"start": budget.elapsed, "tokens": 0, "loss": 0.0, "steps": 0, "wait": 0.0,
              "gnorm": 0.0}
    last_ckpt: Path | None = ckpt.path if ckpt else None
    try:
        with _signals_caught() as caught, _progress(console) as bar:
            task = bar.add_task("train", total=1.0, budget=budget.describe(), loss=float("nan"),
                                tps=0.0, mfu=0.0, left="?")
            ema: float | None = None
            while True:  # at least one step, however small the budget
                p_now = budget.progress(s.step, s.tokens)
                bsz = batch_at(tc, p_now)
                accum = bsz // tc.micro_batch
                lr = tc.lr * lr_factor(tc, budget.progress(s.step + 0.5, s.tokens + bsz * seq_len / 2))
                for group in optimizer.param_groups:
                    group["lr"] = lr
                t0 = time.perf_counter()
                ids = torch.cat([next(loader) for _ in range(accum)]).to(dev.device, non_blocking=True)
                window["wait"] += time.perf_counter() - t0
                batch = objective.make_batch(ids, gen)
                total = 0.0
                for i in range(accum):
                    micro = tuple(t[i * tc.micro_batch:(i + 1) * tc.micro_batch] for t in batch)
                    with dev.autocast():
                        loss = objective.loss(step_model, micro) / accum
                    (scaler.scale(loss) if scaler else loss).backward()
                    total += loss.item()
                if scaler:
                    scaler.unscale_(optimizer)
                gnorm = torch.nn.utils.clip_grad_norm_(
                    model.parameters(), tc.grad_clip if tc.grad_clip > 0 else float("inf")).item()
                if not (math.isfinite(total) and math.isfinite(gnorm)):
                    optimizer.zero_grad(set_to_none=True)
                    if scaler:
                        scaler.update()
                    s.skipped += 1
                    s.bad_in_a_row += 1
                    if s.bad_in_a_row >= tc.max_nonfinite:
                        metrics.close()
                        kept = f"; the last good checkpoint is {last_ckpt}" if last_ckpt else ""
                        raise ShoestringError(
                            f"the loss was non-finite ({total}) {s.bad_in_a_row} steps in a row, "
                            f"at step {s.step}{kept}",
                            where=str(run_dir),
                            fix="lower train.lr, raise train.warmup, or --set train.precision=fp32",
                        )
                    continue
                s.bad_in_a_row = 0
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                s.step += 1
                s.tokens += bsz * seq_len
                s.losses.append(total)
                s.first_loss = total if s.first_loss is None else s.first_loss
                ema = total if ema is None else 0.95 * ema + 0.05 * total
                for k, v in (("tokens", bsz * seq_len), ("loss", total), ("steps", 1), ("gnorm", gnorm)):
                    window[k] += v
                done = budget.exhausted(s.step, s.tokens)
                p = budget.progress(s.step, s.tokens)
                if s.step % tc.log_every == 0 or done:
                    now = budget.elapsed
                    span = max(now - window["start"], 1e-9)
                    tps = window["tokens"] / span
                    record = {
                        "step": s.step, "progress": round(p, 5),
                        "loss": window["loss"] / window["steps"], "lr": lr, "batch_size": bsz,
                        "tokens": s.tokens, "flops": s.tokens * flops_per_token,
                        "tokens_per_s": tps, "mfu": tps * flops_per_token / dev.peak_flops,
                        "grad_norm": window["gnorm"] / window["steps"],
                        "data_wait": min(1.0, window["wait"] / span), "skipped": s.skipped,
                        "elapsed_s": now,
                    }
                    if dev.datasheet_flops:
                        record["mfu_datasheet"] = tps * flops_per_token / dev.datasheet_flops
                    metrics.write(record)
                    window = {"start": now, "tokens": 0, "loss": 0.0, "steps": 0, "wait": 0.0,
                              "gnorm": 0.0}
                    left = (now / p - now) if p > 0 else float("inf")
                    bar.update(task, completed=p, loss=ema, tps=tps, mfu=record["mfu"],
                               left=format_duration(left))
                if val_batch is not None and (p >= s.next_val) and not done:
                    with budget.pause():
                        metrics.write({"step": s.step, "progress": round(p, 5), "tokens": s.tokens,
                                       "flops": s.tokens * flops_per_token, "elapsed_s": budget.elapsed,
                                       "val_loss": _val_loss(model, val_batch, objective, dev)})
                    while s.next_val <= p:
                        s.next_val += tc.val_every
                if interval is not None and not done:
                    kind, every = interval
                    due = (s.step % int(every) == 0) if kind == "steps" else (
                        budget.elapsed - s.last_ckpt_time >= every)
                    if due:
                        last_ckpt = checkpoint()
                if caught:
                    last_ckpt = checkpoint()
                    metrics.close()
                    raise TrainingInterrupted(caught[0], last_ckpt, s.step)
                if done:
                    break
    finally:
        loader.close()
    train_seconds = budget.elapsed

    save_start = time.perf_counter()
    checkpoint()
    meta = model_meta(cfg, vocab, seq_len, data.special_ids)
    save_final(run_dir, model, meta, data.tokenizer_path)
    save_seconds = time.perf_counter() - save_start
    val_loss = None
    if val_batch is not None:
        val_loss = _val_loss(model, val_batch, objective, dev)
        metrics.write({"step": s.step, "progress": 1.0, "tokens": s.tokens,
                       "flops": s.tokens * flops_per_token, "elapsed_s": train_seconds,
                       "val_loss": val_loss})
    metrics.close()
    tail = s.losses[-max(1, len(s.losses) // 20):] or [float("nan")]
    tps = s.tokens / max(train_seconds, 1e-9)
    summary = {
        "data_dir": str(Path(data_dir).resolve()),
        "objective": cfg.model.objective,
        "steps": s.step,
        "tokens": s.tokens,
        "skipped_steps": s.skipped,
        "train_seconds": round(train_seconds, 3),
        "save_seconds": round(save_seconds, 3),
        "tokens_per_s": tps,
        "flops_per_token": flops_per_token,
        "total_flops": flops_per_token * s.tokens,
        "mfu": tps * flops_per_token / dev.peak_flops,
        "peak_flops": dev.peak_flops,
        # Against the vendor's datasheet peak on a known GPU (plan.hardware); else null.
        "mfu_datasheet": tps * flops_per_token / dev.datasheet_flops if dev.datasheet_flops else None,
        "datasheet_peak_flops": dev.datasheet_flops,
        "datasheet_device": dev.datasheet_name,
        "device": dev.name,
        "dtype": str(dev.dtype).removeprefix("torch."),
        "params": model.num_params(),
        "params_non_embedding": model.num_params(non_embedding=True),
        "first_loss": s.first_loss,
        "final_train_loss": sum(tail) / len(tail),
        "val_loss_subset": val_loss,
        "budget": budget.describe(),
        "resumed": ckpt is not None,
        "versions": {
            "shoestring": __version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }
    write_json_atomic(run_dir / "summary.json", summary)
    return summary
