"""A training run, built before its clock starts: the `Step` that `train_step` runs (which
`timing.time_steps` times bare, so a plan's seconds are `train`'s) and the `Run` the loop
(`loop.py`) drives and summary.json (`summary.py`) reports: a step with its data, run dir,
metrics, validation and checkpoints."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from rich.console import Console

from shoestring import families
from shoestring.config import Config
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader, Cursor
from shoestring.data.shards import PackedSplit
from shoestring.device import DeviceInfo, precision_name, select_device
from shoestring.dist.parallelism import Parallelism
from shoestring.errors import ShoestringError
from shoestring.fsutil import json_object_or_none
from shoestring.model import build_model
from shoestring.model.flops import train_flops_per_token
from shoestring.model.layers import set_attention_kernel
from shoestring.rundir import RunDir
from shoestring.train import compile_costs, forecast, speed as speed_choices
from shoestring.train.budget import Budget
from shoestring.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from shoestring.train.metrics_log import MetricsLog
from shoestring.train.objectives import Objective, objective_for
from shoestring.train.optim import build_optimizers
from shoestring.train.schedule import batch_at, lr_factor
from shoestring.train.state import TrainState, checkpoint_state, resume_state
from shoestring.train.window import Window


@dataclass(kw_only=True)
class Step:
    """What one optimizer step needs, whoever runs it (`build_step`): ``parallel`` holds the
    model and optimizers; ``gen`` draws the objective's masks; ``window`` sums what the step
    did for the next metrics line."""

    cfg: Config
    parallel: Parallelism
    dev: DeviceInfo
    peaks: list[float]  # FLOP/s of every device of the job
    objective: Objective
    flops_per_token: float  # training FLOPs per token
    budget: Budget
    micro: int
    speed: speed_choices.SpeedChoices
    n_params: tuple[int, int]  # all parameters, non-embedding
    scaler: torch.amp.GradScaler | None
    gen: torch.Generator
    window: Window
    memory: dict[str, int] | None = None  # measured at the first step that updates

    @property
    def quantum(self) -> int:
        """Sequences of one micro-step over all data-parallel ranks."""
        return self.parallel.dp * self.micro

    def stop_nonfinite(self, s: TrainState, loss: float) -> NoReturn:
        """Stop on a loss that stayed non-finite ``train.max_nonfinite`` steps in a row."""
        raise _nonfinite(s, loss, "", "the timed steps")


@dataclass(kw_only=True)
class Run(Step):
    """One `train` run: its step (`Step`) with the data it reads, the run dir it writes, the
    metrics, the validation subset and the checkpoints, and the figures summary.json reports
    besides the state's (`build_run`)."""

    data: DataDir
    run: RunDir
    loader: BatchLoader
    val_batch: tuple[torch.Tensor, ...] | None  # None: no periodic validation
    metrics: MetricsLog | None  # None on every rank but the first
    last_ckpt: Path | None
    resumed: bool
    first_step_s: float = 0.0  # the first step's wall clock: compilation happens there
    first_step_tokens: int = 0
    load_start: float | None = None  # the CPU's 1-minute load average as training began
    setup_seconds: float = 0.0  # from `train`'s call to the clock's start

    def stop_nonfinite(self, s: TrainState, loss: float) -> NoReturn:
        """Stop as `Step` does, the metrics closed and the last good checkpoint named."""
        self.close_metrics()
        kept = f"; the last good checkpoint is {self.last_ckpt}" if self.last_ckpt else ""
        raise _nonfinite(s, loss, kept, str(self.run.path))

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
                attention=self.speed.attention, precision=precision_name(self.dev.dtype),
                scaler=self.scaler)
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
        s.curve.validated(s.step, loss)
        return loss

    def forecast(self, s: TrainState, at: float, progress: float, console: Console) -> str:
        """The forecast of the final held-out loss at ``at`` of the budget (outside the
        budget clock, like a validation), kept in the state and printed by rank 0; returns
        its short form for the progress bar ("" when none could be made)."""
        with self.budget.pause():
            start = time.perf_counter()
            future = forecast.future_factors(self.cfg.train, s.curve, progress)
            # the passes over the train split by the end: the steps to come at the full batch
            tokens = s.tokens + len(future) * self.cfg.train.batch_size * self.data.seq_len
            passes = tokens / (len(self.loader.split) * self.data.seq_len)
            objective = self.cfg.model.objective
            made = forecast.forecast(
                s.curve, future, at, first=s.first_loss, far=forecast.FAR_MARGIN.get(objective),
                refs=forecast.references(objective, self.cfg.train, at, passes),
                validated=forecast.held_out_base(self.cfg.train, s.curve))
            seconds = time.perf_counter() - start
        record = made.to_dict() if isinstance(made, forecast.Forecast) else {
            "at": at, "step": s.step, "note": made}
        s.curve.forecasts.append(record | {"passes": round(passes, 3),
                                           "seconds": round(seconds, 3)})
        if self.parallel.is_main:
            text = made.describe() if isinstance(made, forecast.Forecast) else made
            if (isinstance(made, forecast.Forecast) and made.cooldown_ahead
                    and passes > forecast.MAX_PASSES):
                text += (f" (the reference runs' ends do not apply: this run reads its data "
                         f"{passes:.1f} times, theirs at most {forecast.MAX_PASSES:g})")
            console.print(f"at {at:.0%} of the budget (step {s.step}): {text}", highlight=False)
        return made.short() if isinstance(made, forecast.Forecast) else ""

    def record_compile_cost(self, tokens: int, train_seconds: float) -> None:
        """What compiling cost and bought in this run, for the next ``compile=auto``."""
        compile_costs.record(
            self.dev.name, _dtype_name(self.dev),
            _step_shape(self.cfg, self.parallel, self.micro, self.data.seq_len,
                        self.speed.attention),
            self.speed.compile, tokens, train_seconds, self.first_step_tokens, self.first_step_s)

    def describe(self, s: TrainState) -> str:
        dev, (n, n_ne) = self.dev, self.n_params
        return (
            f"model: {self.cfg.model.objective} {n / 1e6:.2f}M parameters "
            f"({n_ne / 1e6:.2f}M non-embedding), "
            f"{self.flops_per_token / 1e6:.1f} MFLOP/token; device: {dev.name}, "
            f"{_dtype_name(dev)}, measured peak "
            f"{dev.peak_flops / 1e9:.0f} GFLOP/s"
            + (f" (datasheet {dev.datasheet_name}: {dev.datasheet_flops / 1e12:.0f} TFLOP/s)"
               if dev.datasheet_flops else "")
            + (f"; layout {self.parallel.layout.describe()}" if self.parallel.distributed
               else "")
            + f"; budget: {self.budget.describe()}"
            + (f"; resuming at step {s.step}" if self.resumed else "")
            + f"; {self.speed.describe()}"
        )


def _nonfinite(s: TrainState, loss: float, kept: str, where: str) -> ShoestringError:
    return ShoestringError(
        f"the loss was non-finite ({loss}) {s.bad_in_a_row} steps in a row, "
        f"at step {s.step}{kept}", where=where,
        fix="lower train.lr, raise train.warmup, or --set train.precision=fp32")


def build_step(cfg: Config, vocab: int, seq_len: int, special_ids: dict[str, int],
               parallel: Parallelism, spare_bytes: int | None = None,
               resumed: dict[str, Any] | None = None,
               init: Callable[[torch.nn.Module], None] | None = None) -> Step:
    """The device at the agreed precision, the model spread over ``parallel`` with the
    trainer's optimizers (``init`` loads weights into the canonical model first), the
    objective, the budget and the speed choices: `build_run` and `timing.time_steps` share
    it, so the timing probe runs the very step `train` runs. ``resumed`` (the checkpoint's
    state) keeps an ``auto`` run's attention kernel and precision: on a CPU ``auto`` picks bf16
    by a timed probe, which the machine's load can tip, and a run must not change dtype
    halfway."""
    tc = cfg.train
    resumed = resumed or {}
    precision = tc.precision
    if precision == "auto" and resumed.get("precision") in ("bf16", "fp16", "fp32"):
        precision = resumed["precision"]
    # this rank's device at the precision every rank agrees on (rank 0's choice under
    # ``auto``), with its own measured peak
    dev = select_device(precision)
    (wanted,) = parallel.broadcast([float(dev.dtype == torch.bfloat16)])
    if precision == "auto" and (wanted == 1.0) != (dev.dtype == torch.bfloat16):
        dev = select_device("bf16" if wanted == 1.0 else "fp32")
    peaks = parallel.gather(dev.peak_flops)
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, vocab)
    n_params = (model.num_params(), model.num_params(non_embedding=True))
    if init is not None:
        init(model)
    objective = objective_for(cfg.model.family, seq_len, vocab, special_ids,
                              tc.mask_rate, cfg.model.sparse_prediction, model=cfg.model)
    flops_per_token = train_flops_per_token(cfg.model, vocab, seq_len, objective.head_fraction)
    budget = Budget.from_spec(tc.budget, tc.steps, flops_per_token)
    micro = cfg.train.micro_batch(parallel.layout.dp)
    speed = _speed_choices(cfg, parallel, dev, micro, seq_len, budget, flops_per_token,
                           spare_bytes, resumed.get("attention"))
    set_attention_kernel(model, speed.attention)
    parallel.apply(model, cfg, lambda parts, layout, meshes: build_optimizers(
        parts, tc, layout, meshes), compiled=speed.compile)
    del model
    scaler = torch.amp.GradScaler("cuda") if dev.dtype == torch.float16 else None
    datasheet = dev.datasheet_flops * parallel.world if dev.datasheet_flops else None
    window = Window(flops_per_token, sum(peaks), datasheet,
                    parallel.world if parallel.distributed else None)
    return Step(cfg=cfg, parallel=parallel, dev=dev, peaks=peaks, objective=objective,
                flops_per_token=flops_per_token, budget=budget, micro=micro, speed=speed,
                n_params=n_params, scaler=scaler, gen=torch.Generator().manual_seed(tc.seed),
                window=window)


def build_run(cfg: Config, data: DataDir, train_split: PackedSplit, run_dir: Path,
              parallel: Parallelism, ckpt: Checkpoint | None,
              spare_bytes: int | None) -> tuple[Run, TrainState]:
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
    b = build_step(cfg, data.vocab_size, data.seq_len, data.special_ids, parallel, spare_bytes,
                   ckpt.state if ckpt else None, init)
    s, cursor = TrainState(next_val=tc.val_every), Cursor()
    if ckpt is not None:
        load_checkpoint(ckpt, parallel)
        progress = b.budget.progress(ckpt.state["step"], ckpt.state["tokens"],
                                     elapsed=ckpt.state["elapsed"])
        s, cursor = resume_state(ckpt.state, progress, b.gen, b.scaler,
                                 str(ckpt.path / "state.json"))
        finished = (json_object_or_none(run.summary_path) or {}).get("steps") == s.step
        if progress >= 1.0 and finished:
            raise ShoestringError(
                f"nothing to resume: the checkpoint at step {s.step} has used the whole "
                f"budget ({b.budget.describe()})", where=str(ckpt.path),
                fix="extend the budget (--set train.steps=... / train.budget=...) to go on")
    metrics = (MetricsLog(run_dir, tc.tensorboard,
                          keep_lines=ckpt.state["metrics_lines"] if ckpt else 0)
               if parallel.is_main else None)
    b.window.reset(s.elapsed)
    return Run(**vars(b), data=data, run=run,
               loader=BatchLoader(train_split, parallel.dp * b.micro, tc.seed, cursor),
               val_batch=_val_batch(data, cfg, b.objective) if tc.val_every > 0 else None,
               metrics=metrics, last_ckpt=ckpt.path if ckpt else None,
               resumed=ckpt is not None), s


def train_step(r: Step, loader: Iterator[torch.Tensor], s: TrainState, bsz: int,
               lr: float) -> None:
    """One optimizer step over ``bsz`` rows of ``loader`` (accumulated over micro-steps), or,
    when the reduced loss or the global gradient norm is non-finite, a step every rank skips;
    too many skipped in a row stop the run (`Step.stop_nonfinite`)."""
    parallel, tc = r.parallel, r.cfg.train
    accum = bsz // r.quantum
    t0 = time.perf_counter()
    ids = torch.cat([next(loader) for _ in range(accum)])
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
        s.good_step(tokens, loss, lr / tc.lr)
        r.window.add(tokens, loss, gnorm)
        return
    parallel.zero_grad()  # every rank sees the same reduced loss and global norm: all skip
    if r.scaler is not None:
        r.scaler.update(r.scaler.get_scale() * r.scaler.get_backoff_factor())
    s.bad_step()
    if s.bad_in_a_row >= tc.max_nonfinite:
        r.stop_nonfinite(s, loss)


def _init_from(model: torch.nn.Module, source: str, cfg: Config, data: DataDir) -> None:
    """Copy weights from a Hugging Face folder or a run dir; the architectures and the
    tokenizers must agree (weights trained on other token ids start worse than random). An
    RTD run's (or HF folder's) encoder starts an RTD model's discriminator."""
    from shoestring.export.hf import TRAINING_ONLY
    from shoestring.export.hub import open_model

    loaded, meta, artifact = open_model(source, command="--init-from")
    theirs = {k: v for k, v in meta["model"].items()
              if k not in ("preset", "init_std", *TRAINING_ONLY)}
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
    # an RTD model starts its discriminator from the encoder (model/detector.py)
    getattr(model, "load_encoder", model.load_state_dict)(loaded.state_dict())


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
