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
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn

from shoestring import families
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.data.shards import PackedSplit
from shoestring.data.mixture import budget_report, manifest_sources
from shoestring.dist.layout import Layout, config_of, layout_from_config
from shoestring.dist.memory import check_fits
from shoestring.dist.parallelism import Parallelism, check_layout, world_from_env
from shoestring.errors import ShoestringError, TrainingInterrupted
from shoestring.fsutil import check_output_dir, check_writable_dir
from shoestring.progress import PLAIN_LINE_SECONDS
from shoestring.units import BudgetSpec
from shoestring.model import build_model
from shoestring.train.checkpoint import (Checkpoint, consolidate, incomplete_checkpoints,
                                         incomplete_note, latest_checkpoint)
from shoestring.device import busy_note
from shoestring.rundir import RunDir, model_meta
from shoestring.train import speed as speed_choices
from shoestring.train.run import Run, build_run, train_step
from shoestring.train.summary import run_summary
from shoestring.train.state import TrainState, check_cursor, check_state


class _Bar:
    """The training progress bar. In a log or CI (no terminal) rich draws nothing until the
    end, so there it prints a plain line instead, at most every ``PLAIN_LINE_SECONDS``."""

    def __init__(self, console: Console, show: bool, budget: str) -> None:
        self.console, self.budget = console, budget
        self.plain = show and not console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]training"), BarColumn(),
            TextColumn("{task.percentage:>5.1f}% of {task.fields[budget]}"),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]:,.0f} tok/s"),
            TextColumn("MFU {task.fields[mfu]:.1%}"), TextColumn("left {task.fields[left]}"),
            TextColumn("{task.fields[forecast]}"),
            console=console, disable=not show or self.plain)
        self.last = -math.inf
        self.forecast = ""  # the latest forecast, short, once there is one

    def __enter__(self) -> _Bar:
        self.progress.__enter__()
        self.task = self.progress.add_task("train", total=1.0, budget=self.budget, loss="–",
                                           tps=0.0, mfu=0.0, left="?", forecast="")
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def due(self) -> bool:
        """Whether a log's plain line is due: slow steps reach a log step rarely, and a log
        should not fall silent for minutes between them."""
        return self.plain and time.monotonic() - self.last >= PLAIN_LINE_SECONDS

    def update(self, fields: dict) -> None:
        self.progress.update(self.task, forecast=self.forecast, **fields)
        if self.due() or (self.plain and fields["completed"] >= 1):
            self.last = time.monotonic()
            self.console.print(
                f"training {fields['completed']:.1%} of {self.budget} · loss {fields['loss']} · "
                f"{fields['tps']:,.0f} tok/s · MFU {fields['mfu']:.1%} · left {fields['left']}"
                + (f" · {self.forecast}" if self.forecast else ""), highlight=False)


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
    if kind != cfg.model.family.base:
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


FRACTION_CAP_SECONDS = 1800.0  # a fractional checkpoint interval is at most 30 minutes


def _checkpoint_due(interval: BudgetSpec, s: TrainState, progress: float) -> bool:
    """``interval``: ``train.checkpoint_every``, parsed (units.parse_interval)."""
    kind, every = interval.kind, interval.amount
    if kind == "steps":
        return s.step % int(every) == 0
    if kind == "seconds":
        return s.elapsed - s.last_ckpt_time >= every
    return (progress - s.last_ckpt_progress >= every - 1e-9
            or s.elapsed - s.last_ckpt_time >= FRACTION_CAP_SECONDS)


def train(
    cfg: Config,
    data_dir: str | Path,
    run_dir: str | Path,
    overwrite: bool = False,
    console: Console | None = None,
    resume: bool = False,
    layout: Layout | None = None,
    deadline: float | None = None,
) -> dict:
    """Pretrain on ``data_dir`` into ``run_dir``; returns the summary (also summary.json).

    ``deadline``: a ``time.perf_counter()`` instant by which the loop must end (`cram
    --auto`'s wall-clock budget): a seconds budget is cut, when the loop starts, to what is
    left of it, so the model building and measuring before it are paid from the budget too.

    ``layout``: how to spread the model over the processes of a torchrun job (default: the
    config's ``parallel:`` section, whose unset degrees mean data parallelism over every
    process; one process without torchrun). The layout used is written to config.yaml.
    ``resume`` continues from the run dir's newest checkpoint, whatever layout wrote it (the
    config must describe the same model; the budget may be extended). Every check that can
    fail is made on every rank before any process group exists.
    """
    started = time.perf_counter()  # the setup before the clock: said in the summary
    console = console or Console(stderr=True)
    data = DataDir(data_dir)
    _check_data(cfg, data)
    run_dir = Path(run_dir)
    ckpt = None
    if resume:
        if not RunDir(run_dir).is_run:
            raise ShoestringError("nothing to resume: not a run dir", where=str(run_dir),
                                  fix="train without --resume to start a run here")
        if world_from_env()[0] == 0:
            for cut in incomplete_checkpoints(run_dir):
                console.print(f"[yellow]warning:[/] {escape(incomplete_note(cut))}",
                              highlight=False)
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise ShoestringError("nothing to resume: the run dir has no checkpoint",
                                  where=str(run_dir / "checkpoints"),
                                  fix="train again with --overwrite to start over")
        check_state(ckpt.state, str(ckpt.path / "state.json"))
    else:
        check_output_dir(run_dir, "run dir", owned=RunDir(run_dir).is_run, overwrite=overwrite)
    world = world_from_env()[1]
    if layout is None:
        layout = _layout_of(cfg, world, resume, console)
    cfg = cfg.model_copy(update={"parallel": config_of(layout)})  # config.yaml records it
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    check_layout(cfg, layout, data.vocab_size, world, device_type)
    train_split = data.split("train", verify="sha256")  # a flipped byte must not train silently
    if ckpt is not None:
        check_cursor(ckpt.state, len(train_split), str(ckpt.path / "state.json"), data.path)
    spare = check_fits(cfg.model, data.vocab_size, data.seq_len, cfg.train.micro_batch(layout.dp),
                       layout, cfg.train.precision, device_type,
                       local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", 1)))["spare"]
    if ckpt is None:
        # the one check that writes (a folder), so the last
        check_writable_dir(run_dir, "run dir", fix="choose a folder you can write for -o")
    with RunDir(run_dir).writing(enabled=world_from_env()[0] == 0):  # one writer per run dir
        parallel = Parallelism.start(cfg, layout, data.vocab_size)
        try:
            return _train(cfg, data, train_split, run_dir, parallel, console, ckpt, spare,
                          deadline, started)
        finally:
            parallel.close()


def _layout_of(cfg: Config, world: int, resume: bool, console: Console) -> Layout:
    """The layout of the config's ``parallel:`` section on this job's ``world`` ranks. A
    resumed run's saved layout whose size is not this job's gives way to data parallelism
    over the ranks there are (a checkpoint resumes on any layout), and says so."""
    layout = layout_from_config(cfg.parallel, world)
    if resume and layout.world_size != world:
        saved = layout.describe()
        layout = layout_from_config(cfg.parallel.model_copy(update={
            "dp": None, "dp_replicate": None, "dp_shard": None, "tp": 1, "pp": 1}), world)
        if world_from_env()[0] == 0:
            console.print(f"resuming on {world} rank(s): the layout {saved} needs another "
                          f"number of ranks, so this resume runs {layout.describe()}")
    return layout


def _mixture_report(r: Run, cfg: Config, data: DataDir, console: Console) -> list[str]:
    """Print the data mixture's epochs per source at this run's budget; returns the
    warnings for sources repeated past `REPEAT_WARN_EPOCHS` (none without a mixture)."""
    sources = manifest_sources(data.manifest)
    if not sources:
        return []
    tokens = speed_choices.expected_tokens(r.budget, cfg.train.batch_size * data.seq_len,
                                           r.flops_per_token, r.dev.peak_flops * r.parallel.world)
    about = "about " if r.budget.seconds is not None else ""
    lines, warnings = budget_report(tokens, sources)
    console.print(f"data mixture at this budget ({about}{tokens:,.0f} tokens): "
                  + "; ".join(lines), highlight=False, markup=False)
    return warnings


def _train(cfg: Config, data: DataDir, train_split: PackedSplit, run_dir: Path,
           parallel: Parallelism, console: Console, ckpt: Checkpoint | None,
           spare_bytes: int | None, deadline: float | None, started: float) -> dict:
    """The loop (see `train`); ``parallel`` holds everything that depends on the layout;
    ``started``: when `train` was called (the setup until the clock starts is timed)."""
    tc = cfg.train
    r, s = build_run(cfg, data, train_split, run_dir, parallel, ckpt, spare_bytes)
    if parallel.is_main:
        console.print(r.describe(s))
        warning = speed_choices.long_budget_warning(
            r.budget, tc.batch_size * data.seq_len, r.flops_per_token,
            r.dev.peak_flops * parallel.world)
        r.load_start = os.getloadavg()[0] if r.dev.device.type == "cpu" else None
        busy = busy_note(r.load_start, os.cpu_count() or 1) if r.load_start is not None else None
        for note in (warning, busy, *_mixture_report(r, cfg, data, console)):
            if note:
                console.print(f"[yellow]warning:[/] {note}", highlight=False)
        console.print(_off_the_clock(r, s), highlight=False)
    # a wall-clock budget's steps: once measured
    few_said = r.budget.seconds is not None or _say_few_steps(r, s, console)
    parallel.train_mode(True)
    if deadline is not None and r.budget.seconds is not None:
        r.budget.seconds = min(r.budget.seconds, max(deadline - time.perf_counter(), 1e-3))
    r.budget.restart(elapsed_before=s.elapsed)
    r.setup_seconds = time.perf_counter() - started
    # A run stopped while finishing (`_finish`) resumes to its finish, not one step past it.
    spent = ckpt is not None and r.budget.progress(s.step, s.tokens, elapsed=s.elapsed) >= 1.0
    step_time, ran = 0.0, 0
    try:
        with _signals_caught() as caught, _Bar(console, parallel.is_main,
                                               r.budget.describe()) as bar:
            while not spent:  # at least one step, however small the budget
                bsz, lr = r.batch_and_lr(s, step_time)
                before = r.loader.cursor, r.gen.get_state()
                try:
                    train_step(r, r.loader, s, bsz, lr)
                except Exception:
                    if not caught or parallel.world > 1:
                        raise
                    # A signal to the process group can kill a child the step needs (the
                    # first compiled step's `g++`, which inductor then reports as a compile
                    # error): the signal, not the step, is what the user did. The step did not
                    # happen — its batches and masks go back — and the run stops as at any
                    # other signal, with a checkpoint of the last finished step.
                    parallel.zero_grad()
                    r.gen.set_state(before[1])
                    r.checkpoint(s, cursor=before[0])
                    r.close_metrics()
                    raise TrainingInterrupted(int(caught[0]), r.last_ckpt, s.step)
                now, signum = parallel.agree([r.budget.elapsed,
                                              float(caught[0] if caught else 0)])
                step_time, s.elapsed = now - s.elapsed, now
                if not r.first_step_s:
                    r.first_step_s, r.first_step_tokens = step_time, s.tokens
                if s.bad_in_a_row and not signum:
                    continue
                p = r.budget.progress(s.step, s.tokens, elapsed=s.elapsed)
                s.curve.progressed(p)
                done = p >= 1.0
                ran += 1
                if not few_said and (ran >= 2 or done):  # the first step warms up
                    few_said = _say_few_steps(r, s, console, step_time)
                if logged := (s.step % tc.log_every == 0 or done) and r.window.steps > 0:
                    r.log(r.window.record(s, p, lr, bsz))
                if logged or bar.due():
                    bar.update(r.window.bar(s, p))
                if r.val_batch is not None and p >= s.next_val and not done:
                    r.validate(s, p)
                    while s.next_val <= p:
                        s.next_val += tc.val_every
                while (at := s.curve.next_point()) is not None and p >= at and not done:
                    bar.forecast = r.forecast(s, at, p, console)
                if (tc.checkpoint_every is not None and not done
                        and _checkpoint_due(tc.checkpoint_every, s, p)):
                    r.checkpoint(s)
                if signum:  # the bar shows where it stopped, before the first log step too
                    bar.update(r.window.bar(s, p))
                    r.checkpoint(s)
                    r.close_metrics()
                    raise TrainingInterrupted(int(signum), r.last_ckpt, s.step)
                if done:
                    break
    finally:
        r.loader.close()
    return _finish(r, s, console)


def _off_the_clock(r: Run, s: TrainState) -> str:
    """What the run does besides the steps the budget counts, said before it starts (a
    `--budget 2m` run that takes 3.5 minutes should not surprise anyone). The validations
    are counted over the steps there will be (at most one a step, none at the last): exact
    for a step budget, "up to" for any other."""
    tc, b = r.cfg.train, r.budget
    exact = b.steps is not None and b.seconds is None and b.tokens is None and b.flops is None
    checks = periodic_validations(tc.val_every, b.steps, s.step, s.next_val)
    val = (f"{'' if exact else 'up to '}{checks} validation{'s' if checks != 1 else ''} and a "
           f"final one, of {len(r.val_batch[0])} sequences each, "
           if r.val_batch is not None else "")
    return (f"the budget ({b.describe()}) counts training steps only: {val}the "
            "checkpoints and writing final/ come on top of it, as did the setup before")


def periodic_validations(every: float, steps: int | None, done: int = 0,
                         next_val: float | None = None) -> int:
    """How many periodic validations the loop runs (one when progress reaches ``next_val``,
    which then moves past it by ``every``; never at the last step) in a run of ``steps``
    steps resumed after ``done``; without ``steps``, how many the budget's fractions allow."""
    if every <= 0:
        return 0
    at = every if next_val is None else next_val
    if steps is None or steps - done > 100_000:  # no step count to cap it (or no need)
        return sum(1 for k in range(1, math.ceil(1 / every) + 1) if at <= k * every < 1)
    count = 0
    for step in range(done + 1, steps):
        if step / steps >= at:
            count += 1
            while at <= step / steps:
                at += every
    return count


def _say_few_steps(r: Run, s: TrainState, console: Console,
                   step_seconds: float | None = None) -> bool:
    """`speed.few_steps_note` for this run, printed by rank 0 (a wall-clock budget's once a
    step has been timed). True: nothing more to say."""
    steps = speed_choices.expected_steps(
        r.budget, r.cfg.train.batch_size * r.data.seq_len, r.flops_per_token, done=s.step,
        elapsed=s.elapsed, step_seconds=step_seconds)
    note = speed_choices.few_steps_note(steps, r.n_params[0])
    if note and r.parallel.is_main:
        console.print(f"note: {note}", highlight=False, markup=False)
    return True


def _finish(r: Run, s: TrainState, console: Console) -> dict:
    """After the clock stops: the final checkpoint and validation, ``final/`` (rank 0) and
    the summary (also summary.json)."""
    cfg, data, parallel = r.cfg, r.data, r.parallel
    train_seconds = s.elapsed  # the budget's seconds, before a resume included
    save_start = time.perf_counter()
    # Ctrl-C or SIGTERM here waits for the last checkpoint and the final validation, then
    # stops the run as during training (a checkpoint, the resume line): the signal is what
    # the user did, and a checkpoint half-written by it would be lost. Once final/ is being
    # written, the run finishes first (seconds) and says so.
    with _signals_caught() as caught:
        if parallel.is_main:
            console.print(f"budget spent at step {s.step}: saving the last checkpoint, "
                          f"{'validating, ' if r.val_batch is not None else ''}writing "
                          "final/ …", highlight=False)
        final_ckpt = r.checkpoint(s)
        val_loss = r.validate(s, 1.0) if r.val_batch is not None else None
        (signum,) = parallel.agree([float(caught[0] if caught else 0)])
        if signum:
            r.close_metrics()
            raise TrainingInterrupted(int(signum), r.last_ckpt, s.step)
        if parallel.is_main:  # final/ from the last checkpoint
            final = consolidate(final_ckpt, build_model(cfg.model, data.vocab_size))
            r.run.save_final(final, model_meta(cfg, data.vocab_size, data.seq_len,
                                               data.special_ids), data.tokenizer_path)
            r.run.clear_evaluations()  # they scored the final/ this one replaces
        save_seconds = time.perf_counter() - save_start
        r.close_metrics()
        summary = run_summary(r, s, train_seconds, save_seconds, val_loss)
        if parallel.is_main:
            r.run.write_summary(summary)
            if not r.resumed:
                r.record_compile_cost(s.tokens, train_seconds)
    if caught and parallel.is_main:
        console.print(f"{signal.Signals(caught[0]).name} arrived while final/ was being written: "
                      "the run was finished first", highlight=False)
    parallel.barrier()
    return summary
