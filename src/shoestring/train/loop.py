"""`shoestring train`: masked-LM pretraining within a budget.

The loop spends the budget and nothing else: model building and the peak measurement happen
before the clock starts, and the final save happens after it stops, reported separately.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from shoestring import __version__
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader
from shoestring.data.masking import MaskedBatch, mask_tokens, num_masked
from shoestring.data.tokenizer import MASK, NUM_SPECIAL
from shoestring.errors import ShoestringError
from shoestring.model.encoder import MaskedLM
from shoestring.model.flops import train_flops_per_token
from shoestring.train.budget import Budget, format_duration, parse_duration
from shoestring.train.device import DeviceInfo, select_device
from shoestring.train.optim import build_optimizer
from shoestring.train.rundir import (
    model_meta,
    prepare_run_dir,
    save_final,
    write_json_atomic,
    write_text_atomic,
)
from shoestring.train.schedule import one_cycle


def mlm_loss(model: MaskedLM, batch: MaskedBatch) -> torch.Tensor:
    """Mean cross-entropy over the masked positions (logits in fp32 for a stable softmax)."""
    logits = model(batch.inputs, batch.positions)
    return F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten())


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


def train(
    cfg: Config,
    data_dir: str | Path,
    run_dir: str | Path,
    overwrite: bool = False,
    console: Console | None = None,
) -> dict:
    """Pretrain on ``data_dir`` into ``run_dir``; returns the summary (also summary.json)."""
    console = console or Console(stderr=True)
    data = DataDir(data_dir)
    train_split = data.split("train", verify=False)
    run_dir = Path(run_dir)
    prepare_run_dir(run_dir, overwrite)
    write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())

    tc = cfg.train
    if tc.threads:
        torch.set_num_threads(tc.threads)
    dev: DeviceInfo = select_device(tc.precision)
    torch.manual_seed(tc.seed)
    vocab, seq_len = data.vocab_size, data.seq_len
    model = MaskedLM(cfg.model, vocab).to(dev.device)
    optimizer = build_optimizer(model, tc)
    loader = BatchLoader(train_split, tc.batch_size, tc.seed)
    gen = torch.Generator(device=dev.device).manual_seed(tc.seed)
    mask_id = data.special_ids[MASK]

    k = num_masked(seq_len, tc.mask_rate)
    flops_per_token = train_flops_per_token(cfg.model, vocab, seq_len, k / seq_len)
    tokens_per_step = tc.batch_size * seq_len
    budget = Budget(
        seconds=None if tc.steps is not None or tc.budget is None else parse_duration(tc.budget),
        steps=tc.steps,
    )
    console.print(
        f"model: {model.num_params() / 1e6:.2f}M parameters "
        f"({model.num_params(non_embedding=True) / 1e6:.2f}M non-embedding), "
        f"{flops_per_token / 1e6:.1f} MFLOP/token; device: {dev.name}, "
        f"{str(dev.dtype).removeprefix('torch.')}, measured peak {dev.peak_flops / 1e9:.0f} GFLOP/s; "
        f"budget: {budget.describe()}"
    )

    metrics_path = run_dir / "metrics.jsonl"
    step, tokens, window_loss, window_steps = 0, 0, 0.0, 0
    first_loss: float | None = None
    ema: float | None = None
    losses: list[float] = []
    model.train()
    budget.restart()
    window_start, window_tokens = budget.elapsed, 0
    with open(metrics_path, "w", encoding="utf-8") as metrics, _progress(console) as bar:
        task = bar.add_task("train", total=1.0, budget=budget.describe(), loss=float("nan"),
                            tps=0.0, mfu=0.0, left="?")
        while True:  # at least one step, however small the budget
            lr = tc.lr * one_cycle(budget.progress(step + 0.5), tc.lr_peak_at)
            for group in optimizer.param_groups:
                group["lr"] = lr
            ids = next(loader).to(dev.device, non_blocking=True)
            batch = mask_tokens(ids, tc.mask_rate, NUM_SPECIAL, mask_id, vocab, gen)
            with dev.autocast():
                loss = mlm_loss(model, batch)
            loss.backward()
            if tc.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            value = loss.item()
            if not math.isfinite(value):
                raise ShoestringError(
                    f"the loss became {value} at step {step}",
                    where=str(run_dir),
                    fix="lower train.lr or use --set train.precision=fp32",
                )
            step += 1
            tokens += tokens_per_step
            window_tokens += tokens_per_step
            window_loss += value
            window_steps += 1
            losses.append(value)
            first_loss = value if first_loss is None else first_loss
            ema = value if ema is None else 0.95 * ema + 0.05 * value
            done = budget.exhausted(step)
            if step % tc.log_every == 0 or done:
                now, p = budget.elapsed, budget.progress(step)
                tps = window_tokens / max(now - window_start, 1e-9)
                record = {
                    "step": step,
                    "progress": round(p, 5),
                    "loss": window_loss / window_steps,
                    "lr": lr,
                    "tokens": tokens,
                    "tokens_per_s": tps,
                    "mfu": tps * flops_per_token / dev.peak_flops,
                    "elapsed_s": now,
                }
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
                window_start, window_tokens, window_loss, window_steps = now, 0, 0.0, 0
                left = (now / p - now) if p > 0 else float("inf")
                bar.update(task, completed=p, loss=ema, tps=tps, mfu=record["mfu"],
                           left=format_duration(left))
            if done:
                break
    train_seconds = budget.elapsed

    save_start = time.perf_counter()
    meta = model_meta(cfg, vocab, seq_len, data.special_ids)
    save_final(run_dir, model, meta, data.tokenizer_path)
    tail = losses[-max(1, len(losses) // 20):]
    tps = tokens / train_seconds
    summary = {
        "data_dir": str(Path(data_dir).resolve()),
        "steps": step,
        "tokens": tokens,
        "train_seconds": round(train_seconds, 3),
        "save_seconds": round(time.perf_counter() - save_start, 3),
        "tokens_per_s": tps,
        "flops_per_token": flops_per_token,
        "total_flops": flops_per_token * tokens,
        "mfu": tps * flops_per_token / dev.peak_flops,
        "peak_flops": dev.peak_flops,
        "device": dev.name,
        "dtype": str(dev.dtype).removeprefix("torch."),
        "params": model.num_params(),
        "params_non_embedding": model.num_params(non_embedding=True),
        "first_loss": first_loss,
        "final_train_loss": sum(tail) / len(tail),
        "budget": budget.describe(),
        "versions": {
            "shoestring": __version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    }
    write_json_atomic(run_dir / "summary.json", summary)
    return summary
