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
import os
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

from shoestring import __version__, families
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.data.shards import PackedSplit
from shoestring.data.loader import BatchLoader, Cursor
from shoestring.dist.layout import Layout, make_layout
from shoestring.dist.memory import check_fits
from shoestring.dist.parallelism import (
    Parallelism,
    check_layout,
    micro_batch_of,
    world_from_env,
)
from shoestring.errors import ShoestringError
from shoestring.fsutil import check_output_dir, check_writable_dir
from shoestring.model import build_model
from shoestring.model.flops import train_flops_per_token
from shoestring.model.layers import set_attention_kernel
from shoestring.train.budget import Budget, format_duration, parse_budget
from shoestring.train.checkpoint import (
    Checkpoint,
    capture_rng,
    consolidate,
    latest_checkpoint,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from shoestring.device import DeviceInfo, peak_note, select_device
from shoestring.families import Objective
from shoestring.rundir import RunDir, model_meta
from shoestring.train.metrics import MetricsLog
from shoestring.train.schedule import batch_at, lr_factor
from shoestring.train import speed as speed_choices


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
    last_ckpt_progress: float = 0.0  # budget progress at the last checkpoint
    first_loss: float | None = None
    losses: list[float] = field(default_factory=list)


def _progress(console: Console, show: bool = True) -> Progress:
    return Progress(
        TextColumn("[bold]training"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}% of {task.fields[budget]}"),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TextColumn("MFU {task.fields[mfu]:.1%}"),
        TextColumn("left {task.fields[left]}"),
        console=console,
        disable=not show,
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
    if kind != families.get(cfg.model.objective).base:
        preset = families.get(kind, where=str(data.path / "manifest.json")).default_preset
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
    """Copy weights from a Hugging Face folder or a run dir; the architectures and the
    tokenizers must agree (weights trained on other token ids start worse than random)."""
    from shoestring.model.hub import import_hf

    path = Path(source)
    run = RunDir(path)
    loaded, meta = run.load_final() if run.is_run else import_hf(path)
    theirs = {k: v for k, v in meta["model"].items() if k not in ("preset", "init_std")}
    ours = {k: v for k, v in cfg.model.model_dump(mode="json").items() if k in theirs}
    for side in (theirs, ours):  # a contrastive run starts from its base (mlm) family's weights
        side["objective"] = families.get(side.get("objective", "mlm"), where=source).base
    diff = sorted(k for k in theirs if theirs[k] != ours.get(k))
    problems = [f"model.{k}: ours {ours.get(k)!r}, theirs {theirs[k]!r}" for k in diff[:4]]
    if meta["vocab_size"] != data.vocab_size:
        problems.append(f"vocabulary: data {data.vocab_size}, theirs {meta['vocab_size']}")
    their_tok = run.tokenizer_path if run.is_run else path / "tokenizer.json"
    if not problems and their_tok.is_file() and _vocab(their_tok) != _vocab(data.tokenizer_path):
        problems.append(f"tokenizer: {their_tok} and the data dir's {data.tokenizer_path} "
                        "map tokens to different ids")
    if problems:
        raise ShoestringError(
            f"cannot start from these weights: {'; '.join(problems)}",
            where=f"train.init_from={source}",
            fix="use the same model settings as the checkpoint (e.g. --config its config) and "
            f"data prepared with its tokenizer (prep with --set data.tokenizer={their_tok})",
        )
    model.load_state_dict(loaded.state_dict())


def _vocab(tokenizer_json: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).get_vocab()


def _val_batch(data: DataDir, cfg: Config, objective: Objective) -> tuple[torch.Tensor, ...] | None:
    """The fixed periodic-validation subset: val_sequences rows spread evenly over the whole
    validation split (the first rows would be the first few documents only), masks fixed."""
    try:
        val = data.split("val")
    except ShoestringError:
        return None
    n = min(len(val), cfg.train.val_sequences)
    ids = torch.from_numpy(val.take(np.linspace(0, len(val) - 1, n).round().astype(np.int64)))
    return objective.family.validation_batch(ids, 0, cfg.eval, objective.mask_id,
                                             objective.vocab_size)


FRACTION_CAP_SECONDS = 1800.0  # a fractional checkpoint interval is at most 30 minutes


def _ckpt_interval(text: str | None) -> tuple[str, float] | None:
    """("fraction", 0.1) for "10%", ("seconds", 1800) for "30m", ("steps", 500)."""
    if text is None:
        return None
    if str(text).endswith("%"):
        return "fraction", float(str(text)[:-1]) / 100
    spec = parse_budget(text)
    return spec.kind, spec.amount


def _checkpoint_due(interval: tuple[str, float], step: int, progress: float, elapsed: float,
                    last_progress: float, last_elapsed: float) -> bool:
    kind, every = interval
    if kind == "steps":
        return step % int(every) == 0
    if kind == "seconds":
        return elapsed - last_elapsed >= every
    return (progress - last_progress >= every - 1e-9
            or elapsed - last_elapsed >= FRACTION_CAP_SECONDS)


def _select_device(tc, parallel: Parallelism) -> DeviceInfo:  # noqa: ANN001
    """This rank's device at the precision every rank agrees on (rank 0's choice under
    ``auto``), with its own measured peak."""
    dev = select_device(tc.precision)
    (wanted,) = parallel.broadcast([float(dev.dtype == torch.bfloat16)])
    if tc.precision == "auto" and (wanted == 1.0) != (dev.dtype == torch.bfloat16):
        dev = select_device("bf16" if wanted == 1.0 else "fp32")
    return dev


def _speed_choices(cfg: Config, parallel: Parallelism, dev: DeviceInfo, micro: int,
                   seq_len: int, budget: Budget, flops_per_token: float,
                   spare_bytes: int | None, resumed_kernel: str | None
                   ) -> speed_choices.SpeedChoices:
    """train.attention and train.compile for this run, measured on rank 0 and agreed. A
    resumed ``auto`` run keeps the kernel its checkpoint was trained with (the two round
    differently, and a resumed step budget reproduces the uninterrupted losses exactly)."""
    m, layout = cfg.model, parallel.layout
    tokens_per_step = cfg.train.batch_size * seq_len
    attention = cfg.train.attention
    if attention == "auto" and resumed_kernel in ("sdpa", "eager"):
        attention = resumed_kernel
    choices = speed_choices.choose(
        attention, cfg.train.compile, device_type=dev.device.type, dtype=dev.dtype,
        rows=micro, heads=m.num_heads // layout.tp, kv_heads=max(1, m.kv_heads // layout.tp),
        seq_len=seq_len, head_dim=m.head_dim, layers=m.num_layers, causal=families.get(
            m.objective).causal, spare_bytes=spare_bytes, pipeline=layout.pp > 1,
        distributed=parallel.distributed,
        seconds=speed_choices.expected_seconds(budget, tokens_per_step, flops_per_token,
                                               dev.peak_flops * parallel.world))
    return speed_choices.agreed(choices, parallel.broadcast)


def train(
    cfg: Config,
    data_dir: str | Path,
    run_dir: str | Path,
    overwrite: bool = False,
    console: Console | None = None,
    resume: bool = False,
    layout: Layout | None = None,
) -> dict:
    """Pretrain on ``data_dir`` into ``run_dir``; returns the summary (also summary.json).

    ``layout``: how to spread the model over the processes of a torchrun job (default: data
    parallel over all of them; one process without torchrun). ``resume`` continues from the
    run dir's newest checkpoint, whatever layout wrote it (the config must describe the same
    model; the budget may be extended). Every check that can fail is made on every rank before
    any process group exists.
    """
    console = console or Console(stderr=True)
    data = DataDir(data_dir)
    _check_data(cfg, data)
    run_dir = Path(run_dir)
    ckpt = None
    if resume:
        if not RunDir(run_dir).is_run:
            raise ShoestringError("nothing to resume: not a run dir", where=str(run_dir),
                                  fix="train without --resume to start a run here")
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ShoestringError("nothing to resume: the run dir has no checkpoint",
                                  where=str(run_dir / "checkpoints"),
                                  fix="train again with --overwrite to start over")
    else:
        check_output_dir(run_dir, "run dir", owned=RunDir(run_dir).is_run, overwrite=overwrite)
    world = world_from_env()[1]
    if layout is None:
        layout = make_layout({"dp": world})
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    check_layout(cfg, layout, data.vocab_size, world, device_type)
    train_split = data.split("train", verify="sha256")  # a flipped byte must not train silently
    spare = check_fits(cfg.model, data.vocab_size, data.seq_len, micro_batch_of(cfg, layout),
                       layout, cfg.train.precision, device_type,
                       local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))["spare"]
    if ckpt is None:
        # the one check that writes (a folder), so the last
        check_writable_dir(run_dir, "run dir", fix="choose a folder you can write for -o")
    with RunDir(run_dir).writing(enabled=world_from_env()[0] == 0):  # one writer per run dir
        parallel = Parallelism.start(cfg, layout, data.vocab_size)
        try:
            return _train(cfg, data, train_split, run_dir, parallel, console, ckpt, spare)
        finally:
            parallel.close()


def _tail_mean(losses: list[float]) -> float:
    """The "train loss" of the bar and the summary: the mean over the last 5% of steps."""
    tail = losses[-max(1, len(losses) // 20):]
    return sum(tail) / len(tail) if tail else float("nan")


def _bar_fields(s: _State, p: float, elapsed: float, flops_per_token: float, job_peak: float
                ) -> dict:
    """The progress bar's figures: progress, mean tail loss ("–" before any step), the run's
    tokens/s and MFU so far, and the time left at this pace."""
    loss = _tail_mean(s.losses)
    avg = s.tokens / max(elapsed, 1e-9)  # the summary's tokens/s and MFU
    left = (elapsed / p - elapsed) if p > 0 else None
    return {"completed": p, "loss": f"{loss:.3f}" if math.isfinite(loss) else "–", "tps": avg,
            "mfu": avg * flops_per_token / job_peak,
            "left": format_duration(left) if left is not None else "?"}


def _train(cfg: Config, data: DataDir, train_split: PackedSplit, run_dir: Path,
           parallel: Parallelism, console: Console, ckpt: Checkpoint | None,
           spare_bytes: int | None) -> dict:
    """The loop (see `train`); ``parallel`` holds everything that depends on the layout."""
    tc = cfg.train
    main = parallel.is_main
    run = RunDir(run_dir)
    if main:
        if ckpt is None:
            run = RunDir.create(run_dir, overwrite=True)  # refused up front unless allowed
        run.write_config(cfg)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    dev = _select_device(tc, parallel)
    peaks = parallel.gather(dev.peak_flops)  # FLOP/s of every device of the job
    vocab, seq_len = data.vocab_size, data.seq_len
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, vocab)
    n_params, n_params_ne = model.num_params(), model.num_params(non_embedding=True)
    if tc.init_from and ckpt is None:
        _init_from(model, tc.init_from, cfg, data)
    objective = families.get(cfg.model.objective).objective(
        seq_len, vocab, data.special_ids, tc.mask_rate, cfg.model.sparse_prediction)
    flops_per_token = train_flops_per_token(cfg.model, vocab, seq_len, objective.head_fraction)
    spec = parse_budget(tc.budget) if tc.budget is not None else None
    budget = Budget.from_spec(spec, tc.steps, flops_per_token)
    micro = micro_batch_of(cfg, parallel.layout)
    speed = _speed_choices(cfg, parallel, dev, micro, seq_len, budget, flops_per_token,
                           spare_bytes, ckpt.state.get("attention") if ckpt else None)
    set_attention_kernel(model, speed.attention)
    parallel.apply(model, cfg, compiled=speed.compile)
    del model
    scaler = torch.amp.GradScaler("cuda") if dev.dtype == torch.float16 else None
    gen = torch.Generator().manual_seed(tc.seed)
    s = _State(next_val=tc.val_every)
    cursor = Cursor()
    if ckpt is not None:
        load_checkpoint(ckpt, parallel)
        st = ckpt.state
        restore_rng(st["rng"], gen)
        cursor = Cursor(**st["cursor"])
        s = _State(step=st["step"], tokens=st["tokens"], skipped=st["skipped"],
                   next_val=st["next_val"], last_ckpt_time=st["elapsed"],
                   last_ckpt_progress=budget.progress(st["step"], st["tokens"], elapsed=st["elapsed"]),
                   first_loss=st.get("first_loss"), losses=list(st.get("recent_losses", [])))
        if budget.progress(s.step, s.tokens, elapsed=st["elapsed"]) >= 1.0:
            raise ShoestringError(
                f"nothing to resume: the checkpoint at step {s.step} has used the whole "
                f"budget ({budget.describe()})", where=str(ckpt.path),
                fix="extend the budget (--set train.steps=... / train.budget=...) to go on")
        if scaler is not None and "scaler" in st:
            scaler.load_state_dict(st["scaler"])
    quantum = parallel.dp * micro  # sequences of one micro-step over all data-parallel ranks
    loader = BatchLoader(train_split, quantum, tc.seed, cursor)
    val_batch = _val_batch(data, cfg, objective) if tc.val_every > 0 else None
    interval = _ckpt_interval(tc.checkpoint_every)
    metrics = MetricsLog(run_dir, tc.tensorboard, keep_lines=ckpt.state["metrics_lines"] if ckpt else 0) \
        if main else None
    job_peak = sum(peaks)

    def log(record: dict) -> None:
        if metrics is not None:
            metrics.write(record)

    if main:
        console.print(
            f"model: {cfg.model.objective} {n_params / 1e6:.2f}M parameters "
            f"({n_params_ne / 1e6:.2f}M non-embedding), "
            f"{flops_per_token / 1e6:.1f} MFLOP/token; device: {dev.name}, "
            f"{str(dev.dtype).removeprefix('torch.')}, measured peak {dev.peak_flops / 1e9:.0f} GFLOP/s"
            + (f" (datasheet {dev.datasheet_name}: {dev.datasheet_flops / 1e12:.0f} TFLOP/s)"
               if dev.datasheet_flops else "")
            + (f"; layout {parallel.layout.describe()}" if parallel.distributed else "")
            + f"; budget: {budget.describe()}"
            + (f"; resuming at step {s.step}" if ckpt else "")
            + f"; {speed.describe()}"
        )

    def checkpoint() -> Path:
        with budget.pause():
            state = {
                "step": s.step, "tokens": s.tokens, "skipped": s.skipped, "next_val": s.next_val,
                "elapsed": t_agreed, "cursor": loader.cursor.to_dict(),
                "rng": capture_rng(gen), "metrics_lines": metrics.lines if metrics else 0,
                "first_loss": s.first_loss, "recent_losses": s.losses[-200:],
                "layout": parallel.layout.to_dict(), "world_size": parallel.world,
                "attention": speed.attention,
            }
            if scaler is not None:
                state["scaler"] = scaler.state_dict()
            path = save_checkpoint(run_dir, parallel, state, tc.keep_checkpoints)
            s.last_ckpt_time = t_agreed
            s.last_ckpt_progress = budget.progress(s.step, s.tokens, elapsed=t_agreed)
            return path

    parallel.train_mode(True)
    elapsed_before = ckpt.state["elapsed"] if ckpt else 0.0
    budget.restart(elapsed_before=elapsed_before)
    # Wall-clock decisions (LR, validation, checkpoint, stop) use the elapsed time every rank
    # agreed on at the end of the previous step, so that all ranks take them together.
    t_agreed, step_time = elapsed_before, 0.0
    first_step_s = 0.0  # the first step's wall clock: compilation, when compiled, happens there
    window = {"start": t_agreed, "tokens": 0, "loss": 0.0, "steps": 0, "wait": 0.0, "gnorm": 0.0}
    last_ckpt: Path | None = ckpt.path if ckpt else None
    memory: dict[str, int] | None = None
    try:
        with _signals_caught() as caught, _progress(console, main) as bar:
            task = bar.add_task("train", total=1.0, budget=budget.describe(), loss="–",
                                tps=0.0, mfu=0.0, left="?")
            while True:  # at least one step, however small the budget
                p_now = budget.progress(s.step, s.tokens, elapsed=t_agreed)
                bsz = batch_at(tc, p_now, quantum)
                accum = bsz // quantum
                lr = tc.lr * lr_factor(tc, budget.progress(
                    s.step + 0.5, s.tokens + bsz * seq_len / 2, elapsed=t_agreed + step_time / 2))
                t0 = time.perf_counter()
                ids = torch.cat([next(loader) for _ in range(accum)])
                window["wait"] += time.perf_counter() - t0
                batch = objective.make_batch(ids, gen)
                local = parallel.forward_backward(objective, parallel.local_rows(batch, accum),
                                                  dev.autocast, scaler)
                parallel.unscale(scaler)
                gnorm = parallel.clip(tc.grad_clip)
                total = parallel.reduce_loss(local)
                if math.isfinite(total) and math.isfinite(gnorm):
                    grad_bytes = parallel.grad_bytes() if memory is None else 0
                    parallel.step(lr, scaler)
                    if memory is None:
                        memory = parallel.measured_memory(grad_bytes)
                    s.bad_in_a_row = 0
                    s.step += 1
                    s.tokens += bsz * seq_len
                    s.losses.append(total)
                    s.first_loss = total if s.first_loss is None else s.first_loss
                    for k, v in (("tokens", bsz * seq_len), ("loss", total), ("steps", 1),
                                 ("gnorm", gnorm)):
                        window[k] += v
                else:  # every rank sees the same reduced loss and global norm: all skip
                    parallel.zero_grad()
                    if scaler is not None:
                        scaler.update(scaler.get_scale() * scaler.get_backoff_factor())
                    s.skipped += 1
                    s.bad_in_a_row += 1
                    if s.bad_in_a_row >= tc.max_nonfinite:
                        if metrics is not None:
                            metrics.close()
                        kept = f"; the last good checkpoint is {last_ckpt}" if last_ckpt else ""
                        raise ShoestringError(
                            f"the loss was non-finite ({total}) {s.bad_in_a_row} steps in a row, "
                            f"at step {s.step}{kept}",
                            where=str(run_dir),
                            fix="lower train.lr, raise train.warmup, or --set train.precision=fp32",
                        )
                now, signum = parallel.agree([budget.elapsed, float(caught[0] if caught else 0)])
                step_time, t_agreed = now - t_agreed, now
                first_step_s = first_step_s or step_time
                if s.bad_in_a_row and not signum:
                    continue
                p = budget.progress(s.step, s.tokens, elapsed=t_agreed)
                done = p >= 1.0
                if (s.step % tc.log_every == 0 or done) and window["steps"]:
                    span = max(t_agreed - window["start"], 1e-9)
                    tps = window["tokens"] / span
                    record = {
                        "step": s.step, "progress": round(p, 5),
                        "loss": window["loss"] / window["steps"], "lr": lr, "batch_size": bsz,
                        "tokens": s.tokens, "flops": s.tokens * flops_per_token,
                        "tokens_per_s": tps, "mfu": tps * flops_per_token / job_peak,
                        "grad_norm": window["gnorm"] / window["steps"],
                        "data_wait": min(1.0, window["wait"] / span), "skipped": s.skipped,
                        "elapsed_s": t_agreed,
                    }
                    if parallel.distributed:
                        record["world_size"] = parallel.world
                    if dev.datasheet_flops:
                        record["mfu_datasheet"] = tps * flops_per_token / (
                            dev.datasheet_flops * parallel.world)
                    log(record)
                    window = {"start": t_agreed, "tokens": 0, "loss": 0.0, "steps": 0,
                              "wait": 0.0, "gnorm": 0.0}
                    bar.update(task, **_bar_fields(s, p, t_agreed, flops_per_token, job_peak))
                if val_batch is not None and (p >= s.next_val) and not done:
                    with budget.pause():
                        log({"step": s.step, "progress": round(p, 5), "tokens": s.tokens,
                             "flops": s.tokens * flops_per_token, "elapsed_s": t_agreed,
                             "val_loss": parallel.eval_loss(objective, val_batch, dev.autocast)})
                    while s.next_val <= p:
                        s.next_val += tc.val_every
                if interval is not None and not done and _checkpoint_due(
                        interval, s.step, p, t_agreed, s.last_ckpt_progress, s.last_ckpt_time):
                    last_ckpt = checkpoint()
                if signum:  # the bar shows where it stopped, before the first log step too
                    bar.update(task, **_bar_fields(s, p, t_agreed, flops_per_token, job_peak))
                    last_ckpt = checkpoint()
                    if metrics is not None:
                        metrics.close()
                    raise TrainingInterrupted(int(signum), last_ckpt, s.step)
                if done:
                    break
    finally:
        loader.close()
    train_seconds = t_agreed  # the budget's seconds, before a resume included

    save_start = time.perf_counter()
    final_ckpt = checkpoint()
    val_loss = None
    if val_batch is not None:
        val_loss = parallel.eval_loss(objective, val_batch, dev.autocast)
        log({"step": s.step, "progress": 1.0, "tokens": s.tokens,
             "flops": s.tokens * flops_per_token, "elapsed_s": t_agreed, "val_loss": val_loss})
    if main:
        final = consolidate(final_ckpt, build_model(cfg.model, vocab))
        run.save_final(final, model_meta(cfg, vocab, seq_len, data.special_ids),
                       data.tokenizer_path)
        run.clear_evaluations()  # they scored the final/ this one replaces
    save_seconds = time.perf_counter() - save_start
    if metrics is not None:
        metrics.close()
    tps = s.tokens / max(train_seconds, 1e-9)
    achieved = tps * flops_per_token  # FLOP/s of the job
    summary = {
        "data_dir": str(data.path.resolve()),
        "objective": cfg.model.objective,
        "steps": s.step,
        "tokens": s.tokens,
        "skipped_steps": s.skipped,
        "train_seconds": round(train_seconds, 3),
        "save_seconds": round(save_seconds, 3),
        "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / parallel.world,
        "flops_per_token": flops_per_token,
        "total_flops": flops_per_token * s.tokens,
        # achieved FLOP/s over the sum of the devices' measured peaks (= per-device MFU when
        # the devices are alike); per device: its share of the work over its own peak
        "mfu": achieved / job_peak,
        "mfu_per_device": [achieved / parallel.world / pk for pk in peaks],
        "mfu_note": peak_note(achieved / job_peak, job_peak),  # why, when above 1
        "peak_flops": dev.peak_flops,
        # Against the vendor's datasheet peak on a known GPU (plan.hardware); else null.
        "mfu_datasheet": achieved / (dev.datasheet_flops * parallel.world)
        if dev.datasheet_flops else None,
        "datasheet_peak_flops": dev.datasheet_flops,
        "datasheet_device": dev.datasheet_name,
        "device": dev.name,
        "dtype": str(dev.dtype).removeprefix("torch."),
        "layout": parallel.layout.describe(),
        "attention": speed.attention,
        "compiled": speed.compile,
        "first_step_s": round(first_step_s, 3),
        "world_size": parallel.world,
        "micro_batch": micro,
        "params": n_params,
        "params_non_embedding": n_params_ne,
        "memory_measured": memory,
        "first_loss": s.first_loss,
        "final_train_loss": _tail_mean(s.losses),
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
    if main:
        run.write_summary(summary)
    parallel.barrier()
    return summary
