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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn

from shoestring import families
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.data.shards import PackedSplit
from shoestring.data.loader import BatchLoader, Cursor
from shoestring.data.mixture import budget_report, manifest_sources
from shoestring.dist.layout import Layout, config_of, layout_from_config
from shoestring.dist.memory import check_fits
from shoestring.dist.parallelism import (
    Parallelism,
    check_layout,
    world_from_env,
)
from shoestring.errors import ShoestringError, TrainingInterrupted  # noqa: F401 (re-export)
from shoestring.fsutil import check_output_dir, check_writable_dir, json_object_or_none
from shoestring.progress import PLAIN_LINE_SECONDS
from shoestring.units import BudgetSpec
from shoestring.model import build_model
from shoestring.model.flops import train_flops_per_token
from shoestring.model.layers import set_attention_kernel
from shoestring.train.budget import Budget
from shoestring.train.checkpoint import (
    Checkpoint,
    consolidate,
    incomplete_checkpoints,
    incomplete_note,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from shoestring.device import DeviceInfo, busy_note, select_device
from shoestring.train.objectives import Objective, objective_for
from shoestring.train.optim import build_optimizers
from shoestring.rundir import RunDir, model_meta
from shoestring.train.metrics import MetricsLog
from shoestring.train.schedule import batch_at, lr_factor
from shoestring.train import compile_costs, speed as speed_choices
from shoestring.train.summary import run_summary
from shoestring.train.state import (TrainState, check_cursor, check_state, checkpoint_state,
                                    resume_state)
from shoestring.train.window import Window


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
            console=console, disable=not show or self.plain)
        self.last = -math.inf

    def __enter__(self) -> _Bar:
        self.progress.__enter__()
        self.task = self.progress.add_task("train", total=1.0, budget=self.budget, loss="–",
                                           tps=0.0, mfu=0.0, left="?")
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def due(self) -> bool:
        """Whether a log's plain line is due: slow steps reach a log step rarely, and a log
        should not fall silent for minutes between them."""
        return self.plain and time.monotonic() - self.last >= PLAIN_LINE_SECONDS

    def update(self, fields: dict) -> None:
        self.progress.update(self.task, **fields)
        now = time.monotonic()
        if self.plain and (now - self.last >= PLAIN_LINE_SECONDS or fields["completed"] >= 1):
            self.last = now
            self.console.print(
                f"training {fields['completed']:.1%} of {self.budget} · loss {fields['loss']} · "
                f"{fields['tps']:,.0f} tok/s · MFU {fields['mfu']:.1%} · left {fields['left']}",
                highlight=False)


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


def _init_from(model: torch.nn.Module, source: str, cfg: Config, data: DataDir) -> None:
    """Copy weights from a Hugging Face folder or a run dir; the architectures and the
    tokenizers must agree (weights trained on other token ids start worse than random)."""
    from shoestring.export.hub import open_model

    loaded, meta, artifact = open_model(source, command="--init-from")
    theirs = {k: v for k, v in meta["model"].items() if k not in ("preset", "init_std")}
    ours = {k: v for k, v in cfg.model.model_dump(mode="json").items() if k in theirs}
    for side in (theirs, ours):  # a contrastive run starts from its base (mlm) family's weights
        side["objective"] = families.get(side.get("objective", "mlm"), where=source).base
    diff = sorted(k for k in theirs if theirs[k] != ours.get(k))
    problems = [f"model.{k}: ours {ours.get(k)!r}, theirs {theirs[k]!r}" for k in diff[:4]]
    if meta["vocab_size"] != data.vocab_size:
        problems.append(f"vocabulary: data {data.vocab_size}, theirs {meta['vocab_size']}")
    their_tok = artifact.tokenizer_path
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
    return objective.validation_batch(ids, 0, cfg.eval)


FRACTION_CAP_SECONDS = 1800.0  # a fractional checkpoint interval is at most 30 minutes


def _checkpoint_due(interval: BudgetSpec, step: int, progress: float, elapsed: float,
                    last_progress: float, last_elapsed: float) -> bool:
    """``interval``: ``train.checkpoint_every``, parsed (units.parse_interval)."""
    kind, every = interval.kind, interval.amount
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

    def cost(kernel: str) -> compile_costs.CompileCost:
        return compile_costs.lookup(dev.device.type, dev.name, _dtype_name(dev),
                                    _step_shape(cfg, parallel, micro, seq_len, kernel))

    choices = speed_choices.choose(
        attention, cfg.train.compile, device_type=dev.device.type, dtype=dev.dtype,
        rows=micro, heads=m.num_heads // layout.tp, kv_heads=max(1, m.kv_heads // layout.tp),
        seq_len=seq_len, head_dim=m.head_dim, layers=m.num_layers, causal=m.family.causal,
        spare_bytes=spare_bytes, pipeline=layout.pp > 1, compile_cost=cost,
        seconds=speed_choices.expected_seconds(budget, tokens_per_step, flops_per_token,
                                               dev.peak_flops * parallel.world))
    return speed_choices.agreed(choices, parallel.broadcast)


def _dtype_name(dev: DeviceInfo) -> str:
    return str(dev.dtype).removeprefix("torch.")


def _step_shape(cfg: Config, parallel: Parallelism, micro: int, seq_len: int,
                attention: str) -> str:
    """The shape a compile's cost and speed-up are recorded under (`compile_costs`): what the
    compiled graphs depend on, and the layout and thread count that set the step's speed."""
    m = cfg.model
    layout = parallel.layout.describe() if parallel.distributed else "1 process"
    threads = f", {torch.get_num_threads()} threads" if not torch.cuda.is_available() else ""
    return (f"{m.objective} {m.num_layers}x{m.hidden_size} h{m.num_heads}/{m.kv_heads} "
            f"ffn{m.intermediate_size} seq{seq_len} micro{micro} {attention} attention, "
            f"{layout}{threads}")


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


@dataclass
class _Built:
    """What a step needs that does not depend on a data dir or a run dir (`_build`)."""

    dev: DeviceInfo
    peaks: list[float]  # FLOP/s of every device of the job
    objective: Objective
    flops_per_token: float  # training FLOPs per token
    budget: Budget
    micro: int
    speed: speed_choices.SpeedChoices
    n_params: tuple[int, int]  # all parameters, non-embedding
    scaler: torch.amp.GradScaler | None


@dataclass
class _Run(_Built):
    """Everything fixed for one run, built before the clock starts: what `_build` made (the
    device, objective, budget, speed choices), the data, the metrics and the objects a step
    mutates (``parallel`` holds the model and optimizers)."""

    cfg: Config
    data: DataDir | None  # None in `time_steps`, which times steps on random rows
    run: RunDir | None  # None in `time_steps` (it writes nothing)
    parallel: Parallelism
    gen: torch.Generator
    loader: BatchLoader | Iterator[torch.Tensor]  # `time_steps`: random rows in memory
    val_batch: tuple[torch.Tensor, ...] | None
    interval: BudgetSpec | None
    metrics: MetricsLog | None
    window: Window
    last_ckpt: Path | None
    resumed: bool
    memory: dict[str, int] | None = None
    first_step_s: float = 0.0  # the first step's wall clock: compilation happens there
    first_step_tokens: int = 0
    load_start: float | None = None  # the CPU's 1-minute load average as training began
    setup_seconds: float = 0.0  # from `train`'s call to the clock's start

    @property
    def quantum(self) -> int:
        """Sequences of one micro-step over all data-parallel ranks."""
        return self.parallel.dp * self.micro

    def log(self, record: dict) -> None:
        if self.metrics is not None:
            self.metrics.write(record)

    def close_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.close()

    def batch_and_lr(self, s: TrainState, step_time: float) -> tuple[int, float]:
        """This step's batch size (the ramp) and learning rate (the schedule at the step's
        middle, in the budget's own unit)."""
        tc, seq_len = self.cfg.train, self.data.seq_len
        bsz = batch_at(tc, self.budget.progress(s.step, s.tokens, elapsed=s.elapsed),
                       self.quantum)
        middle = self.budget.progress(s.step + 0.5, s.tokens + bsz * seq_len / 2,
                                      elapsed=s.elapsed + step_time / 2)
        return bsz, tc.lr * lr_factor(tc, middle)

    def checkpoint(self, s: TrainState, cursor: Cursor | None = None) -> Path:
        """Save a checkpoint (the budget clock paused) and note when it was taken; ``cursor``
        replaces the loader's when a step took batches and did not finish."""
        with self.budget.pause():
            state = checkpoint_state(
                s, cursor=cursor or self.loader.cursor, gen=self.gen,
                metrics_lines=self.metrics.lines if self.metrics else 0,
                layout=self.parallel.layout.to_dict(), world_size=self.parallel.world,
                attention=self.speed.attention, scaler=self.scaler)
            self.last_ckpt = save_checkpoint(self.run.path, self.parallel, state,
                                             self.cfg.train.keep_checkpoints)
            s.last_ckpt_time = s.elapsed
            s.last_ckpt_progress = self.budget.progress(s.step, s.tokens, elapsed=s.elapsed)
            return self.last_ckpt

    def validate(self, s: TrainState, progress: float) -> float:
        """Loss on the fixed validation subset, logged (outside the budget clock)."""
        with self.budget.pause():
            loss = self.parallel.eval_loss(self.objective, self.val_batch, self.dev.autocast)
            self.log({"step": s.step, "progress": round(progress, 5), "tokens": s.tokens,
                      "flops": s.tokens * self.flops_per_token, "elapsed_s": s.elapsed,
                      "val_loss": loss})
        return loss

    def describe(self, s: TrainState, resumed: bool) -> str:
        dev, (n, n_ne) = self.dev, self.n_params
        return (
            f"model: {self.cfg.model.objective} {n / 1e6:.2f}M parameters "
            f"({n_ne / 1e6:.2f}M non-embedding), "
            f"{self.flops_per_token / 1e6:.1f} MFLOP/token; device: {dev.name}, "
            f"{str(dev.dtype).removeprefix('torch.')}, measured peak "
            f"{dev.peak_flops / 1e9:.0f} GFLOP/s"
            + (f" (datasheet {dev.datasheet_name}: {dev.datasheet_flops / 1e12:.0f} TFLOP/s)"
               if dev.datasheet_flops else "")
            + (f"; layout {self.parallel.layout.describe()}" if self.parallel.distributed
               else "")
            + f"; budget: {self.budget.describe()}"
            + (f"; resuming at step {s.step}" if resumed else "")
            + f"; {self.speed.describe()}"
        )


def _build(cfg: Config, vocab: int, seq_len: int, special_ids: dict[str, int],
           parallel: Parallelism, spare_bytes: int | None, resumed_kernel: str | None,
           init: Callable[[torch.nn.Module], None] | None = None) -> _Built:
    """The device at the agreed precision, the model spread over ``parallel`` with the
    trainer's optimizers (``init`` loads weights into the canonical model first), the
    objective, the budget and the speed choices: `_setup` and `time_steps` share it, so the
    timing probe runs the very step `train` runs."""
    tc = cfg.train
    dev = _select_device(tc, parallel)
    peaks = parallel.gather(dev.peak_flops)
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, vocab)
    n_params = (model.num_params(), model.num_params(non_embedding=True))
    if init is not None:
        init(model)
    objective = objective_for(cfg.model.family, seq_len, vocab, special_ids,
                              tc.mask_rate, cfg.model.sparse_prediction)
    flops_per_token = train_flops_per_token(cfg.model, vocab, seq_len, objective.head_fraction)
    budget = Budget.from_spec(tc.budget, tc.steps, flops_per_token)
    micro = cfg.train.micro_batch(parallel.layout.dp)
    speed = _speed_choices(cfg, parallel, dev, micro, seq_len, budget, flops_per_token,
                           spare_bytes, resumed_kernel)
    set_attention_kernel(model, speed.attention)
    parallel.apply(model, cfg, lambda parts, layout, meshes: build_optimizers(
        parts, tc, layout, meshes), compiled=speed.compile)
    del model
    scaler = torch.amp.GradScaler("cuda") if dev.dtype == torch.float16 else None
    return _Built(dev, peaks, objective, flops_per_token, budget, micro, speed, n_params, scaler)


def _setup(cfg: Config, data: DataDir, train_split: PackedSplit, run_dir: Path,
           parallel: Parallelism, ckpt: Checkpoint | None,
           spare_bytes: int | None) -> tuple[_Run, TrainState]:
    """Build the run (model placed by ``parallel``, checkpoint loaded) and its first state."""
    tc = cfg.train
    run = RunDir(run_dir)
    if parallel.is_main:
        if ckpt is None:
            run = RunDir.create(run_dir, overwrite=True)  # refused up front unless allowed
        run.write_config(cfg)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    init = ((lambda model: _init_from(model, tc.init_from, cfg, data))
            if tc.init_from and ckpt is None else None)
    b = _build(cfg, data.vocab_size, data.seq_len, data.special_ids, parallel, spare_bytes,
               ckpt.state.get("attention") if ckpt else None, init)
    gen = torch.Generator().manual_seed(tc.seed)
    s, cursor = TrainState(next_val=tc.val_every), Cursor()
    if ckpt is not None:
        load_checkpoint(ckpt, parallel)
        elapsed = ckpt.state["elapsed"]
        s, cursor = resume_state(ckpt.state, b.budget.progress(
            ckpt.state["step"], ckpt.state["tokens"], elapsed=elapsed), gen, b.scaler,
            str(ckpt.path / "state.json"))
        finished = (json_object_or_none(run.summary_path) or {}).get("steps") == s.step
        if b.budget.progress(s.step, s.tokens, elapsed=elapsed) >= 1.0 and finished:
            raise ShoestringError(
                f"nothing to resume: the checkpoint at step {s.step} has used the whole "
                f"budget ({b.budget.describe()})", where=str(ckpt.path),
                fix="extend the budget (--set train.steps=... / train.budget=...) to go on")
    metrics = (MetricsLog(run_dir, tc.tensorboard,
                          keep_lines=ckpt.state["metrics_lines"] if ckpt else 0)
               if parallel.is_main else None)
    datasheet = b.dev.datasheet_flops * parallel.world if b.dev.datasheet_flops else None
    window = Window(b.flops_per_token, sum(b.peaks), datasheet,
                    parallel.world if parallel.distributed else None, start=s.elapsed)
    return _Run(**vars(b), cfg=cfg, data=data, run=run, parallel=parallel, gen=gen,
                loader=BatchLoader(train_split, parallel.dp * b.micro, tc.seed, cursor),
                val_batch=_val_batch(data, cfg, b.objective) if tc.val_every > 0 else None,
                interval=tc.checkpoint_every, metrics=metrics, window=window,
                last_ckpt=ckpt.path if ckpt else None, resumed=ckpt is not None), s


def train_step(r: _Run, s: TrainState, bsz: int, lr: float) -> None:
    """One optimizer step over ``bsz`` rows (accumulated over micro-steps), or, when the
    reduced loss or the global gradient norm is non-finite, a step every rank skips; too many
    skipped in a row stop the run with a ShoestringError naming the last good checkpoint."""
    parallel, tc = r.parallel, r.cfg.train
    accum = bsz // r.quantum
    t0 = time.perf_counter()
    ids = torch.cat([next(r.loader) for _ in range(accum)])
    r.window.waited(time.perf_counter() - t0)
    batch = r.objective.make_batch(ids, r.gen)
    local = parallel.forward_backward(r.objective, parallel.local_rows(batch, accum),
                                      r.dev.autocast, r.scaler)
    tokens = bsz * ids.shape[1]
    parallel.unscale(r.scaler)
    gnorm = parallel.clip(tc.grad_clip)
    loss = parallel.reduce_loss(local)
    if math.isfinite(loss) and math.isfinite(gnorm):
        grad_bytes = parallel.grad_bytes() if r.memory is None else 0
        parallel.step(lr, r.scaler)
        if r.memory is None:
            r.memory = parallel.measured_memory(grad_bytes)
        s.good_step(tokens, loss)
        r.window.add(tokens, loss, gnorm)
        return
    parallel.zero_grad()  # every rank sees the same reduced loss and global norm: all skip
    if r.scaler is not None:
        r.scaler.update(r.scaler.get_scale() * r.scaler.get_backoff_factor())
    s.bad_step()
    if s.bad_in_a_row >= tc.max_nonfinite:
        r.close_metrics()
        kept = f"; the last good checkpoint is {r.last_ckpt}" if r.last_ckpt else ""
        raise ShoestringError(
            f"the loss was non-finite ({loss}) {s.bad_in_a_row} steps in a row, "
            f"at step {s.step}{kept}", where=str(r.run.path) if r.run else "the timed steps",
            fix="lower train.lr, raise train.warmup, or --set train.precision=fp32")


def _mixture_report(r: _Run, cfg: Config, data: DataDir, console: Console) -> list[str]:
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
           spare_bytes: int | None, deadline: float | None = None,
           started: float | None = None) -> dict:
    """The loop (see `train`); ``parallel`` holds everything that depends on the layout;
    ``started``: when `train` was called (the setup until the clock starts is timed)."""
    r, s = _setup(cfg, data, train_split, run_dir, parallel, ckpt, spare_bytes)
    if parallel.is_main:
        console.print(r.describe(s, resumed=ckpt is not None))
        warning = speed_choices.long_budget_warning(
            r.budget, cfg.train.batch_size * data.seq_len, r.flops_per_token,
            r.dev.peak_flops * parallel.world)
        r.load_start = os.getloadavg()[0] if r.dev.device.type == "cpu" else None
        busy = busy_note(r.load_start, os.cpu_count() or 1) if r.load_start is not None else None
        for note in (warning, busy, *_mixture_report(r, cfg, data, console)):
            if note:
                console.print(f"[yellow]warning:[/] {note}", highlight=False)
        console.print(_off_the_clock(r, s), highlight=False)
    few_said = r.budget.seconds is not None  # a wall-clock budget's steps: once measured
    if not few_said:
        few_said = _say_few_steps(r, s, console)
    parallel.train_mode(True)
    if deadline is not None and r.budget.seconds is not None:
        r.budget.seconds = min(r.budget.seconds, max(deadline - time.perf_counter(), 1e-3))
    r.budget.restart(elapsed_before=s.elapsed)
    r.setup_seconds = time.perf_counter() - started if started is not None else 0.0
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
                    train_step(r, s, bsz, lr)
                except Exception:
                    if not caught or parallel.world > 1:
                        raise
                    _lost_step(r, s, caught[0], *before)
                now, signum = parallel.agree([r.budget.elapsed,
                                              float(caught[0] if caught else 0)])
                step_time, s.elapsed = now - s.elapsed, now
                if not r.first_step_s:
                    r.first_step_s, r.first_step_tokens = step_time, s.tokens
                if s.bad_in_a_row and not signum:
                    continue
                p = r.budget.progress(s.step, s.tokens, elapsed=s.elapsed)
                done = p >= 1.0
                ran += 1
                if not few_said and (ran >= 2 or done):  # the first step warms up
                    few_said = _say_few_steps(r, s, console, step_time)
                if (s.step % cfg.train.log_every == 0 or done) and r.window.steps:
                    r.log(r.window.record(s, p, lr, bsz))
                    bar.update(r.window.bar(s, p))
                elif bar.due():
                    bar.update(r.window.bar(s, p))
                if r.val_batch is not None and p >= s.next_val and not done:
                    r.validate(s, p)
                    while s.next_val <= p:
                        s.next_val += cfg.train.val_every
                if r.interval is not None and not done and _checkpoint_due(
                        r.interval, s.step, p, s.elapsed, s.last_ckpt_progress,
                        s.last_ckpt_time):
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


def _write_final(r: _Run, final_ckpt: Path) -> None:
    """``final/`` from the last checkpoint (rank 0)."""
    cfg, data = r.cfg, r.data
    if r.parallel.is_main:
        final = consolidate(final_ckpt, build_model(cfg.model, data.vocab_size))
        r.run.save_final(final, model_meta(cfg, data.vocab_size, data.seq_len,
                                           data.special_ids), data.tokenizer_path)
        r.run.clear_evaluations()  # they scored the final/ this one replaces


def _off_the_clock(r: _Run, s: TrainState) -> str:
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


def _say_few_steps(r: _Run, s: TrainState, console: Console,
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


def _lost_step(r: _Run, s: TrainState, signum: int, cursor: Cursor,
               rng: torch.Tensor) -> None:
    """A signal to the process group can kill a child the step needs (the first compiled
    step's `g++`, which inductor then reports as a compile error): the signal, not the step,
    is what the user did. The step did not happen — its batches and masks go back — and the
    run stops as at any other signal, with a checkpoint of the last finished step."""
    r.parallel.zero_grad()
    r.gen.set_state(rng)
    r.checkpoint(s, cursor=cursor)
    r.close_metrics()
    raise TrainingInterrupted(int(signum), r.last_ckpt, s.step)


def _finish(r: _Run, s: TrainState, console: Console) -> dict:
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
        _write_final(r, final_ckpt)
        save_seconds = time.perf_counter() - save_start
        r.close_metrics()
        summary = run_summary(r, s, train_seconds, save_seconds, val_loss)
        if parallel.is_main:
            r.run.write_summary(summary)
            if not r.resumed:  # what compiling cost and bought here, for the next `auto`
                compile_costs.record(
                    r.dev.name, _dtype_name(r.dev), _step_shape(cfg, parallel, r.micro,
                                                                data.seq_len, r.speed.attention),
                    r.speed.compile, s.tokens, train_seconds, r.first_step_tokens, r.first_step_s)
    if caught and parallel.is_main:
        console.print(f"{signal.Signals(caught[0]).name} arrived while final/ was being written: "
                      "the run was finished first", highlight=False)
    parallel.barrier()
    return summary
