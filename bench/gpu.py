"""The GPU benchmark (issue 34, docs/gpu.md): what a user picking a tool on one GPU wants to know.

For each shape, shoestring's trainer (`shoestring.train.loop.train`, the default recipe at a
steady full batch: no ramp, no validation pauses, compiled, bf16 autocast, the attention
kernel ``auto`` picks) and the careful Hugging Face user on the same card, same data order:

- ``mlm-cram``: the `cram` default shape (the ``tiny`` encoder, 256 × 4, seq 128, vocab 8192);
- ``mlm-base``: the Cramming shape (BERT-base size, 768 × 12, seq 128, vocab 32768);
  peer: transformers' ``ModernBertForMaskedLM`` of exactly our architecture (configured by our
  exporter), its sparse head on, its fastest attention (``flash_attention_2`` where the
  flash-attn package is installed, else ``sdpa``), ``torch.compile``d by hand, our recipe
  (`build_optimizer`, the same masking, clipping and batch);
- ``clm-gpt2``: the decoder at GPT-2-small shape (768 × 12, seq 1024, vocab up to 50304);
  peer: ``LlamaForCausalLM`` configured by our exporter the same way.

Figures per side: tokens/s in the steady state (after the compile and warm-up steps), MFU
against the card's dense bf16 datasheet peak (`shoestring.datasheets`) and against a
measured ceiling (a loop of only our model's training GEMMs at the same shapes, bf16), peak
memory (``torch.cuda.max_memory_allocated``) beside the memory model's estimate, the first
step's time with a cold compile cache, and the loader's data-wait fraction of step time.
Serving follows the ``mlm-cram`` shape, on its run: ``/v1/embed`` at 32 and 256 concurrent
clients against the engine's offline best-batch ceiling (`bench/serve_load.py`'s machinery).

Two rows measure what a user gets with no configuration (issue 48, `bench/gpu_default.py`):
``default``, BERT-base shape trained through the CLI exactly as a user types it
(``shoestring train --data D -o R --budget {seconds}s --set model.preset=base``), what it
chose read back from the run; ``quality``, that run against the careful HF user given the same
wall clock (both compiles inside it), both scored on the same held-out masked positions. They
train on ``--data`` (default ``.gpu-data/wiki-books-32k``, from ``make gpu-data``) and are
not in the default ``--only``: ``make gpu-check GPU_PART=default`` runs them.

Our steady-state tokens/s: the trainer runs a step budget sized from a short warm-up run
(which also fills the compile cache), and the rate is read from its metrics records after the
first one (so the compile in the first window is not counted), the same rule as the peers'
loop (timed after three warm-up steps).

    python bench/gpu.py --out runs/gpu/gpu-bench.json --table runs/gpu/gpu-bench.md
    python bench/gpu.py --seconds 60 --only mlm-base --out runs/gpu/base.json  # one shape, longer
    python bench/gpu.py --device cpu --smoke --out /tmp/g.json          # the code path, on CPU
    python bench/gpu.py --only default,quality,mlm-base --mlm-base-data .gpu-data/wiki-books-32k \
        --no-serve --out runs/gpu/default.json                          # GPU_PART=default

Without a CUDA device it refuses (exit 2) unless ``--device cpu --smoke`` (tiny shapes,
seconds-long sides: a check of the code, not a figure).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from common import ROOT, Bench, cpu_name, parser

if TYPE_CHECKING:
    from shoestring.config import Config


@dataclass(frozen=True)
class Shape:
    """One benchmarked model shape and the data it is measured on."""

    name: str
    objective: str  # mlm or clm
    sets: tuple[str, ...]  # --set overrides of the default config (model size)
    vocab: int
    seq_len: int
    batch: int  # sequences per step, both sides (one micro-batch: no accumulation)
    what: str
    peer: str = field(default="")


# In the order they run: the issue's MFU target (BERT-base) first, so that a command cut off at
# its time limit has measured it (the JSON and table are written after every shape).
SHAPES = {
    "mlm-base": Shape("mlm-base", "mlm", ("model.preset=base",), 32768, 128, 128,
                      "Cramming shape (BERT-base 768x12), seq 128, vocab 32768",
                      "ModernBertForMaskedLM"),
    "mlm-cram": Shape("mlm-cram", "mlm", (), 8192, 128, 256,
                      "`cram` default (tiny encoder 256x4), seq 128, vocab 8192",
                      "ModernBertForMaskedLM"),
    "clm-gpt2": Shape("clm-gpt2", "clm", ("model.preset=gpt2-small",), 50304, 1024, 16,
                      "GPT-2-small shape (768x12), seq 1024, vocab up to 50304",
                      "LlamaForCausalLM"),
}
SMOKE_MODEL = ("model.preset=null", "model.hidden_size=64", "model.num_layers=2",
               "model.num_heads=2", "model.intermediate_size=128")


# The rows of issue 48 (bench/gpu_default.py), beside the shapes in --only; not run by default.
ROWS = ("default", "quality")
SLICE = ROOT / ".gpu-data" / "wiki-books-32k"  # `make gpu-data` (bench/gpu_data.py)
# The smoke run's default path: the toy model, and a metrics record every step, so that a
# seconds-long run on a busy CPU has the three `steady` needs (a logging setting, not a
# training one: the GPU run passes only the model size).
SMOKE_DEFAULT_SETS = (*SMOKE_MODEL, "train.log_every=1")


def smoke_shape(s: Shape) -> Shape:
    """The same side at a toy size (seconds on a CPU)."""
    return Shape(s.name, s.objective, SMOKE_MODEL, 1000, 64, 8, s.what + " [smoke: 64x2]",
                 s.peer)


# ---------------------------------------------------------------------------- the device


class Device:
    """Where the benchmark runs: the torch device, its sync, its peaks and its memory."""

    def __init__(self, kind: str) -> None:
        import torch

        from shoestring.device import measure_matmul_flops
        from shoestring.datasheets import from_device_name

        self.kind = kind
        self.torch = torch.device(kind)
        self.dtype = torch.bfloat16 if kind == "cuda" else torch.float32
        self.precision = "bf16" if kind == "cuda" else "fp32"
        if kind == "cuda":
            self.name = torch.cuda.get_device_name(0)
            hw = from_device_name(self.name)
            self.datasheet = (hw.bf16, hw.name) if hw and hw.bf16 else (None, None)
        else:
            self.name, self.datasheet = f"cpu ({cpu_name()})", (None, None)
        self.square_matmul = measure_matmul_flops(kind, self.dtype)

    def sync(self) -> None:
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.kind == "cuda":
            import torch

            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_bytes(self) -> int | None:
        if self.kind != "cuda":
            return None
        import torch

        return torch.cuda.max_memory_allocated()

    def bench(self, args: argparse.Namespace) -> Bench:
        """The machine header (printed now) and the record of this run."""
        import torch

        from peers import peer_versions

        return Bench("gpu", args, precision=self.precision, device=self.name, **peer_versions(),
                     cuda=torch.version.cuda, driver=_driver())

    def facts(self) -> dict:
        """The device's peaks, beside the machine header in the JSON."""
        return {"square_matmul_flops": self.square_matmul,
                "datasheet_bf16_flops": self.datasheet[0], "datasheet_name": self.datasheet[1]}


def _driver() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------- data


def prepared(work: Path, shape: Shape) -> Path:
    """builtin:pydocs prepared for this shape's objective, vocabulary and length (once)."""
    from shoestring.config import DataConfig
    from shoestring.prep.prep import prep

    out = work / f"data-{shape.objective}-{shape.vocab}-{shape.seq_len}"
    if not (out / "manifest.json").is_file():
        cfg = DataConfig(objective=shape.objective, vocab_size=shape.vocab,
                         seq_len=shape.seq_len, workers=max(1, min(8, os.cpu_count() or 1)))
        prep(["builtin:pydocs"], out, cfg)
    return out


def shape_data(args: argparse.Namespace, shape: Shape) -> Path:
    """The data a shape row trains on: ``--mlm-base-data`` for mlm-base when given (the
    default path's data dir: the same tokens and the whole 32768 vocabulary, where pydocs
    reaches ~11k), else builtin:pydocs prepared for the shape."""
    if shape.name == "mlm-base" and args.mlm_base_data is not None:
        return args.mlm_base_data
    return prepared(args.work, shape)


def data_problem(path: Path, flag: str, seq_len: int | None) -> str | None:
    """Why ``path`` cannot feed an MLM row at ``seq_len`` (None: it can)."""
    from shoestring.data.datadir import DataDir
    from shoestring.errors import ShoestringError

    if not (path / "manifest.json").is_file():
        return (f"{flag} {path}: no prepared data dir there; build the wiki-books slice with "
                "`make gpu-data PYTHON=.venv/bin/python` where the shared corpus is (or "
                "`python bench/gpu_data.py`), and carry .gpu-data to the GPU machine "
                "(docs/gpu.md)")
    try:
        data = DataDir(path)
        if data.objective != "mlm":
            return (f"{flag} {path}: prepared for {data.objective}, not mlm (prep "
                    "--objective mlm)")
        if seq_len is not None and data.seq_len != seq_len:
            return (f"{flag} {path}: sequences of {data.seq_len} tokens, this row needs "
                    f"{seq_len} (prep --set data.seq_len={seq_len})")
    except ShoestringError as e:
        return f"{flag} {path}: {e}"
    return None


# ---------------------------------------------------------------------------- ours


def our_config(shape: Shape, dev: Device, compile_: bool, steps: int,
               log_every: int) -> Config:
    """The default recipe at this shape, at a steady full batch for ``steps`` steps."""
    from shoestring.config import load_config

    return load_config(None, [
        *shape.sets, f"model.objective={shape.objective}", "train.budget=null",
        f"train.steps={steps}", f"train.precision={dev.precision}",
        f"train.compile={'true' if compile_ else 'false'}", "train.attention=auto",
        f"train.batch_size={shape.batch}", "train.micro_batch_size=null", "train.batch_ramp=0",
        "train.val_every=0", "train.checkpoint_every=null", "train.tensorboard=false",
        f"train.log_every={log_every}"])


def steady(records: list[dict]) -> dict:
    """Tokens/s and data-wait over the metrics windows after the first (which holds the
    compile and the warm-up)."""
    train = [r for r in records if "loss" in r]
    if len(train) < 3:
        raise RuntimeError(f"only {len(train)} metrics records: raise --seconds")
    a, b = train[0], train[-1]
    rest = train[1:]
    return {"tokens_per_s": (b["tokens"] - a["tokens"]) / (b["elapsed_s"] - a["elapsed_s"]),
            "data_wait": sum(r["data_wait"] for r in rest) / len(rest),
            "windows": len(rest)}


def run_ours(shape: Shape, data: Path, work: Path, dev: Device, args: argparse.Namespace) -> dict:
    """Warm-up run (cold compile: the first step's time; a speed estimate), then a step
    budget of about ``--seconds`` at that speed, measured in the steady state."""
    from rich.console import Console

    from shoestring.data.datadir import DataDir
    from shoestring.dist.memory import memory_per_rank
    from shoestring.train.loop import train

    console = Console(stderr=True, quiet=not args.verbose)
    tokens_per_step = shape.batch * shape.seq_len
    warm_steps = 3 * args.log_every
    warm = train(our_config(shape, dev, args.compile, warm_steps, args.log_every), data,
                 work / f"{shape.name}-warmup", overwrite=True, console=console)
    estimate = steady(_records(work / f"{shape.name}-warmup"))["tokens_per_s"]
    steps = max(4 * args.log_every, math.ceil(args.seconds * estimate / tokens_per_step))
    steps = args.log_every * math.ceil(steps / args.log_every)
    cfg = our_config(shape, dev, args.compile, steps, args.log_every)
    dev.reset_peak()
    s = train(cfg, data, work / shape.name, overwrite=True, console=console)
    peak = dev.peak_bytes()
    st = steady(_records(work / shape.name))
    estimate_bytes = memory_per_rank(cfg.model, DataDir(data).vocab_size, shape.seq_len,
                                     shape.batch, param_dtype=dev.precision)
    return {
        "side": "shoestring", "recipe": f"shoestring train: attention {s['attention']}, "
        f"compile {'on' if s['compiled'] else 'off'}, {s['dtype']}, batch {shape.batch}",
        "params": s["params"], "steps": s["steps"], "tokens": s["tokens"],
        "flops_per_token": s["flops_per_token"], **st,
        "first_step_s_cold": warm["first_step_s"], "first_step_s_warm": s["first_step_s"],
        "peak_allocated_bytes": peak, "memory_estimate": estimate_bytes,
        "memory_measured_state": s["memory_measured"], "run_dir": str(work / shape.name),
        "attention": s["attention"], "compiled": s["compiled"], "device": s["device"]}


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------- the peer


def hf_attention(dev: Device) -> str:
    """The careful user's fastest attention: flash-attn's kernel where it is installed."""
    import importlib.util

    if dev.kind == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def run_peer(shape: Shape, data_dir: Path, dev: Device, args: argparse.Namespace) -> dict:
    """The HF model of our architecture in the loop a careful user writes: pinned batches
    copied non_blocking, bf16 autocast, compiled by hand, our optimizer and clipping; timed
    after three warm-up steps (the first, with the compile, timed on its own)."""
    import torch

    from peers import count_params, hf_llama, hf_modernbert, mlm_labels
    from shoestring.families import MLM
    from shoestring.train.objectives import objective_for
    from shoestring.data.datadir import DataDir
    from shoestring.data.loader import BatchLoader
    from shoestring.train.optim import build_optimizer

    cfg = our_config(shape, dev, args.compile, 1, 1)
    data = DataDir(data_dir)
    attention = hf_attention(dev)
    torch.manual_seed(cfg.train.seed)
    if shape.objective == "mlm":
        model = hf_modernbert(cfg.model, data.vocab_size, data.seq_len, sparse=True,
                              ids=data.special_ids, attention=attention)
        obj = objective_for(MLM, data.seq_len, data.vocab_size, data.special_ids,
                            cfg.train.mask_rate, True)
        gen = torch.Generator().manual_seed(cfg.train.seed)

        def batch_of(ids: torch.Tensor) -> dict:
            inputs, positions, targets = obj.make_batch(ids, gen)
            return {"input_ids": inputs, "labels": mlm_labels(inputs, positions, targets)}
    else:
        model = hf_llama(cfg.model, data.vocab_size, data.seq_len, attention=attention)

        def batch_of(ids: torch.Tensor) -> dict:
            return {"input_ids": ids, "labels": ids}
    model = model.to(dev.torch).train()
    own_compile = getattr(model.config, "reference_compile", None)  # ModernBERT's own option
    opt = build_optimizer(model, cfg.train)
    step_model = torch.compile(model) if args.compile else model
    loader = BatchLoader(data.split("train"), shape.batch, cfg.train.seed,
                         pin_memory=dev.kind == "cuda")
    dev.reset_peak()

    def step() -> float:
        t = time.perf_counter()
        batch = {k: v.to(dev.torch, non_blocking=True) for k, v in batch_of(next(loader)).items()}
        waited = time.perf_counter() - t
        with torch.autocast(dev.kind, dtype=dev.dtype, enabled=dev.kind == "cuda"):
            loss = step_model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return waited

    t0 = time.perf_counter()
    step()
    dev.sync()
    first = time.perf_counter() - t0
    for _ in range(2):
        step()
    dev.sync()
    steps, wait, t0 = 0, 0.0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds or steps < 3:
        wait += step()
        steps += 1
        if steps % 10 == 0:
            dev.sync()  # keep the host from queueing far ahead of the clock
    dev.sync()
    elapsed = time.perf_counter() - t0
    loader.close()
    return {"side": shape.peer, "recipe": f"transformers {shape.peer}, attention {attention}"
            + (f", sparse head on, reference_compile={own_compile}"
               if shape.objective == "mlm" else "")
            + f", torch.compile by hand {'on' if args.compile else 'off'}, our AdamW/clip, "
            f"batch {shape.batch}", "params": count_params(model), "steps": steps,
            "tokens": steps * shape.batch * shape.seq_len,
            "tokens_per_s": steps * shape.batch * shape.seq_len / elapsed,
            "data_wait": wait / elapsed, "first_step_s_cold": first,
            "peak_allocated_bytes": dev.peak_bytes(), "attention": attention}


# ---------------------------------------------------------------------------- one shape


def ceiling(shape: Shape, data_dir: Path, dev: Device, seconds: float) -> float:
    """FLOP/s of only our model's training GEMMs at this shape's sizes (bf16 on a GPU)."""
    from peers import encoder_gemms, matmul_ceiling
    from shoestring.data.datadir import DataDir
    from shoestring.data.masking import num_masked

    cfg = our_config(shape, dev, False, 1, 1)
    data = DataDir(data_dir)
    tokens = shape.batch * data.seq_len
    head = (shape.batch * num_masked(data.seq_len, cfg.train.mask_rate)
            if shape.objective == "mlm" else tokens)
    return matmul_ceiling(encoder_gemms(cfg.model, data.vocab_size, tokens, head), dev.dtype,
                          seconds, device=dev.kind)


def bench_shape(shape: Shape, dev: Device, args: argparse.Namespace) -> dict:
    from shoestring.data.datadir import DataDir
    from shoestring.model.flops import mfu

    print(f"== {shape.name}: {shape.what}", file=sys.stderr, flush=True)
    clock = Phases()
    data = clock.time("prep", shape_data, args, shape)
    dd = DataDir(data)
    ours = clock.time("ours", run_ours, shape, data, args.work, dev, args)
    top = clock.time("ceiling", ceiling, shape, data, dev, args.ceiling_seconds)
    peer = clock.time("peer", run_peer, shape, data, dev, args)
    print(f"  {shape.name} wall: {clock}", file=sys.stderr, flush=True)
    achieved = ours["tokens_per_s"] * ours["flops_per_token"]
    peak = dev.datasheet[0]
    for side in (ours, peer):  # same architecture: the peer's FLOPs per token are ours
        side["mfu_datasheet"] = mfu(side["tokens_per_s"], ours["flops_per_token"], peak) \
            if peak else None
        side["mfu_ceiling"] = mfu(side["tokens_per_s"], ours["flops_per_token"], top)
    return {"shape": shape.what, "data": str(data), "vocab": dd.vocab_size,
            "vocab_asked": shape.vocab,
            "seq_len": dd.seq_len, "batch": shape.batch, "matmul_ceiling_flops": top,
            "ours_achieved_flops": achieved, "ours": ours, "peer": peer,
            "ratio_tokens_per_s": ours["tokens_per_s"] / peer["tokens_per_s"],
            "phase_s": clock.seconds}


class Phases:
    """Wall seconds per phase of one shape (or of serving): what a 10-minute device command
    spends where, so the next session can size its command (docs/gpu.md)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def time(self, name: str, fn, *args):  # noqa: ANN001, ANN201 - any callable
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds[name] = round(time.perf_counter() - t, 1)

    def __str__(self) -> str:
        return ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items()) + \
            f"; total {sum(self.seconds.values()):.0f} s"


# ---------------------------------------------------------------------------- issue 48's rows


def default_data(args: argparse.Namespace) -> Path:
    """The default and quality rows' data: ``--data``, else the wiki-books slice (smoke:
    builtin:pydocs at the toy shape, so a CPU check needs no slice)."""
    if args.data is not None:
        return args.data
    return prepared(args.work, smoke_shape(SHAPES["mlm-base"])) if args.smoke else SLICE


def run_row(name: str, dev: Device, args: argparse.Namespace, results: dict,
            state: dict) -> None:
    """One of `ROWS` into ``results``; the quality row runs the default one first when it
    has not run (it scores that run's model)."""
    if "run" not in state:
        if "default" in results.get("errors", {}):
            raise RuntimeError("the quality row scores the default run, which failed")
        results["default_path"] = bench_default(dev, args, state)
        if name == "default":
            return
        save(results, args)
    if name == "quality":
        results["quality"] = bench_quality(dev, args, state)


def bench_default(dev: Device, args: argparse.Namespace, state: dict) -> dict:
    """The default-path row: `shoestring train` as a user types it, on the data, for
    ``--quality-seconds``; ``state["run"]`` keeps the run for the quality row."""
    from gpu_default import default_row, run_default

    print("== default: shoestring train with no configuration beyond the model size and a "
          "budget", file=sys.stderr, flush=True)
    clock = Phases()
    data = clock.time("prep", default_data, args)
    sets = SMOKE_DEFAULT_SETS if args.smoke else SHAPES["mlm-base"].sets
    run = clock.time("train", run_default, data, args.work / "default", args.quality_seconds,
                     sets, args.work)
    row = default_row(run, steady(run["records"]), dev.datasheet[0])
    state.update(run=run, data=data, steady=row["tokens_per_s"])
    row.update(data=str(data), phase_s=clock.seconds)
    c = row["chosen"]
    print(f"  default: {run['command']}\n  chose compile {c['compiled']}, attention "
          f"{c['attention']}, batch {c['batch_size']} (micro {c['micro_batch']}), lr "
          f"{c['lr']}, {c['schedule']}, {c['dtype']}: {row['tokens_per_s']:,.0f} tok/s steady"
          + ("" if row["mfu_datasheet"] is None else
             f", MFU {row['mfu_datasheet']:.1%} of the datasheet (target "
             f"{row['target_mfu']:.0%})") + f"\n  default wall: {clock}",
          file=sys.stderr, flush=True)
    return row


def bench_quality(dev: Device, args: argparse.Namespace, state: dict) -> dict:
    """The quality row on the default run (bench/gpu_default.py's `quality_row`)."""
    from gpu_default import quality_row
    from shoestring.data.datadir import DataDir

    print(f"== quality: the careful HF user for the same {args.quality_seconds:g} s, both "
          "scored on the same held-out masked positions", file=sys.stderr, flush=True)
    clock = Phases()
    q = clock.time("peer + scoring", quality_row, state["run"], state["steady"],
                   DataDir(state["data"]), dev, args.quality_seconds, args.peer_lrs,
                   args.compile, hf_attention(dev), args.heldout_sequences, args.work)
    q["phase_s"] = clock.seconds
    print(f"  quality: ours {q['ours']['tokens']:,} tokens, loss {q['ours']['loss']:.4f}; "
          f"peer {q['peer']['tokens']:,} tokens, loss {q['peer']['loss']:.4f}; tokens/s "
          f"{q['ratio_tokens_per_s']:.2f}x, loss ours - peer {q['loss_difference']:+.4f} on "
          f"{q['heldout']['masked_positions']:,} positions\n  quality wall: {clock}",
          file=sys.stderr, flush=True)
    return q


def cross_ratios(results: dict) -> None:
    """The default path's steady tokens/s over the other rows' that ran (steady against
    steady): the quality peer (same data and batch), and mlm-base's hand-configured sides."""
    d = results.get("default_path")
    if d is None:
        return
    q, base = results.get("quality"), results["shapes"].get("mlm-base")
    peer = q["peer"].get("steady_tokens_per_s") if q else None
    d["ratios"] = {
        "ours / quality peer": d["tokens_per_s"] / peer if peer else None,
        "ours / hand-configured ours": (d["tokens_per_s"] / base["ours"]["tokens_per_s"]
                                        if base else None),
        "ours / hand-configured peer": (d["tokens_per_s"] / base["peer"]["tokens_per_s"]
                                        if base else None)}


def default_record_rows(results: dict) -> list[dict]:
    d = results["default_path"]
    c = d["chosen"]
    return [{"row": "default path", "compiled": c["compiled"], "attention": c["attention"],
             "batch": c["batch_size"], "micro": c["micro_batch"], "lr": c["lr"],
             "tokens/s (steady)": d["tokens_per_s"], "MFU (datasheet)": d["mfu_datasheet"],
             "first step s": d["first_step_s"], **d.get("ratios", {})}]


def quality_record_rows(results: dict) -> list[dict]:
    q = results["quality"]
    return [{"side": side["side"], "lr": side["lr"], "batch": side["batch_size"],
             "train s": side["train_seconds"], "tokens seen": side["tokens"],
             "tokens/s": side["tokens_per_s"], "held-out MLM loss": side["loss"],
             "masked positions": side["masked_positions"]}
            for side in (q["ours"], *q["peers"])]


def _met(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**not met**")


def issue48_table(results: dict) -> list[str]:
    """The default-path and quality rows, as markdown lines (none when they did not run)."""
    lines: list[str] = []
    d = results.get("default_path")
    if d is not None:
        c, r = d["chosen"], d.get("ratios", {})

        def x(v: float | None) -> str:
            return "–" if v is None else f"{v:.2f}x"

        mfu = "–" if d["mfu_datasheet"] is None else f"{d['mfu_datasheet']:.1%}"
        lines += ["", f"Default path (`{d['command']}`, {d['steps']:,} steps in "
                  f"{d['train_seconds']:.0f} s; the run's own account: {d['describe']}):", "",
                  "| row | compiled | attention | batch (micro) | lr | tokens/s (steady) | "
                  "MFU (datasheet) | target ≥ 40% | first step | / quality peer | "
                  "/ hand-configured ours | / hand-configured peer |",
                  "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
                  f"| default path | {c['compiled']} | {c['attention']} | {c['batch_size']} "
                  f"({c['micro_batch']}) | {c['lr']:g} | {d['tokens_per_s']:,.0f} | {mfu} | "
                  f"{_met(d['mfu_met'])} | {d['first_step_s']:.1f} s | "
                  f"{x(r.get('ours / quality peer'))} | "
                  f"{x(r.get('ours / hand-configured ours'))} | "
                  f"{x(r.get('ours / hand-configured peer'))} |"]
        why = {k: v for k, v in c.items() if "." in k}
        if why:
            lines.append("- what train said about its choices: " + "; ".join(
                f"{k} = {v}" for k, v in why.items()))
    q = results.get("quality")
    if q is not None:
        h = q["heldout"]
        lines += ["", f"Equal wall clock ({q['seconds_each']:g} s each, compile included), "
                  f"scored on the same {h['sequences']:,} val sequences "
                  f"({h['masked_positions']:,} masked positions, masked once at rate "
                  f"{h['mask_rate']:g}, seed {h['seed']}):", "",
                  "| side | lr | batch | train s | tokens seen | tokens/s | tokens/s (steady) "
                  "| first step | held-out MLM loss |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for side in (q["ours"], *q["peers"]):
            st = side.get("steady_tokens_per_s")
            lines.append(f"| {side['side']} | {side['lr']:g} | {side['batch_size']} | "
                         f"{side['train_seconds']:.1f} | {side['tokens']:,} | "
                         f"{side['tokens_per_s']:,.0f} | {'–' if st is None else f'{st:,.0f}'} "
                         f"| {side['first_step_s']:.1f} s | {side['loss']:.4f} |")
        lines += ["", f"- tokens/s ours / peer: {q['ratio_tokens_per_s']:.2f}x (target ≥ "
                  f"{q['target_ratio']:g}x: {_met(q['ratio_met'])}); held-out loss ours − "
                  f"peer: {q['loss_difference']:+.4f} (target: ours lower: "
                  f"{_met(q['loss_met'])})",
                  f"- ours: {q['ours']['recipe']}", f"- peer: {q['peer']['recipe']}"]
    for name, err in results.get("errors", {}).items():
        lines.append(f"- {name}: FAILED: {err.splitlines()[0] if err else ''}")
    return lines


# ---------------------------------------------------------------------------- serving


def bench_serving(run: Path, args: argparse.Namespace) -> dict:
    """/v1/embed at each --concurrency through `shoestring serve` against the engine alone
    at its best batch (bench/serve_load.py's offline ceiling and load generator)."""
    import asyncio

    from serve_load import Server, encode_post, load, make_texts, offline, ours_cmd, summarize
    from serve_load import scrape_metrics, stage_summary

    threads = max(1, min(8, os.cpu_count() or 1))
    texts = make_texts(args.serve_texts)
    off = offline(run, texts, args.serve_batches, threads, args.serve_seconds)
    best = max(off["sps"].values())
    by_workers = {}
    for workers in getattr(args, "serve_workers", [1]):  # issue 49: replicas on one device
        server = Server("shoestring", ours_cmd(run, max(1, threads // workers), workers, [
            "--max-concurrent-requests", str(4 * max(args.concurrency))]))
        try:
            host, port = server.url.removeprefix("http://").rsplit(":", 1)
            reqs = [encode_post(host, int(port), "/v1/embed", {"inputs": t}) for t in texts]
            out = {}
            for c in args.concurrency:
                before = scrape_metrics(server.url)
                res = summarize([asyncio.run(load(server.url, reqs, c, args.serve_requests))])
                if workers == 1:  # a scrape reaches one replica: its stages are its own
                    res["stages"] = stage_summary(before, scrape_metrics(server.url),
                                                  args.serve_requests + max(2 * c, 32))
                res["fraction_of_offline_best"] = res["throughput"] / best
                out[str(c)] = res
                print(f"  serve workers={workers} C={c}: {res['throughput']:.0f} req/s = "
                      f"{res['fraction_of_offline_best']:.0%} of the offline best {best:.0f}/s",
                      file=sys.stderr, flush=True)
        finally:
            server.stop()
        by_workers[str(workers)] = out
    first = by_workers[str(getattr(args, "serve_workers", [1])[0])]
    return {"run": str(run), "offline_sequences_per_s": off["sps"], "offline_best": best,
            "offline_one_ms": off["one_ms"], "threads": threads, "concurrency": first,
            "workers": by_workers}


# ---------------------------------------------------------------------------- output


def _flops(x: float) -> str:
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.1f} GFLOP/s"


def planned_rate(machine: dict, ours: dict) -> tuple[float, float] | None:
    """What `shoestring plan` assumes for this run when told nothing about the card (its
    default MFU, `device.ASSUMED_MFU`, of the datasheet peak): (that MFU, tokens/s)."""
    from shoestring.device import ASSUMED_MFU

    peak = machine.get("datasheet_bf16_flops")
    if not peak or not ours.get("flops_per_token"):
        return None
    return ASSUMED_MFU, ASSUMED_MFU * peak / ours["flops_per_token"]


def table(results: dict) -> str:
    """The markdown table docs/benchmarks/gpu.md takes, with the machine above it."""
    m = results["machine"]
    lines = [f"{m['device']}, driver {m['driver']}, torch {m['torch']} (CUDA {m['cuda']}), "
             f"transformers {m['transformers']}; {m['precision']}; dense peak "
             + (f"{m['datasheet_bf16_flops'] / 1e12:.0f} TFLOP/s ({m['datasheet_name']})"
                if m["datasheet_bf16_flops"] else "unknown")
             + f", square {m['precision']} matmul measured {_flops(m['square_matmul_flops'])}"
             + (" — SMOKE (toy shapes, not a figure)" if results["smoke"] else "")]
    if results["shapes"]:
        lines += ["", "| shape | side | params | tokens/s | MFU (datasheet) | "
                  "MFU (GEMM ceiling) | peak mem | first step (cold) | data wait | ours / peer |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{x:.1%}"

    for row in record_rows(results):
        mem, ratio = row["peak mem GiB"], row["ours / peer"]
        lines.append("| " + " | ".join([
            row["shape"], row["side"], f"{row['params (M)']:.1f}M", f"{row['tokens/s']:,.0f}",
            pct(row["MFU (datasheet)"]), pct(row["MFU (GEMM ceiling)"]),
            "–" if mem is None else f"{mem:.2f} GiB", f"{row['first step (cold) s']:.1f} s",
            pct(row["data wait"]), "" if ratio is None else f"{ratio:.2f}x"]) + " |")
    if results["shapes"]:
        lines.append("")
    for name, r in results["shapes"].items():
        o = r["ours"]
        plan = planned_rate(m, o)
        lines.append(f"- {name}: {r['shape']} (vocab {r['vocab']}); GEMM ceiling "
                     f"{_flops(r['matmul_ceiling_flops'])}; memory model "
                     f"{o['memory_estimate'].get('total', 0) / 2**30:.2f} GiB estimated; ours: "
                     f"{o['recipe']}; peer: {r['peer']['recipe']}" + (
                         "" if plan is None else f"; `plan` (no --mfu/--measure) assumes "
                         f"{plan[0]:.0%} of the datasheet peak: {plan[1]:,.0f} tokens/s, "
                         f"{plan[1] / o['tokens_per_s']:.2f}x the measured"))
    if "serving" in results:
        s = results["serving"]
        lines.append(f"- serving /v1/embed (mlm-cram run): offline best "
                     f"{s['offline_best']:,.0f} seq/s; " + ", ".join(
                         f"C={c}: {v['throughput']:,.0f} req/s "
                         f"({v['fraction_of_offline_best']:.0%}), p99 {v['p99_ms']:.0f} ms"
                         for c, v in s["concurrency"].items()))
        for w, by_c in list(s.get("workers", {}).items())[1:]:
            lines.append(f"  - --workers {w}: " + ", ".join(
                f"C={c}: {v['throughput']:,.0f} req/s, p99 {v['p99_ms']:.0f} ms"
                for c, v in by_c.items()))
    lines += issue48_table(results)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- main


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser(__doc__)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--smoke", action="store_true",
                    help="toy shapes and short sides: checks the code path, measures nothing")
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="steady-state seconds per side (default 10; with the compiles, the "
                    "three shapes and serving may not fit one 10-minute device command: "
                    "each shape's row is saved when it is done, serving last; docs/gpu.md)")
    ap.add_argument("--ceiling-seconds", type=float, default=3.0)
    ap.add_argument("--only", default=",".join(SHAPES),
                    help=f"comma-separated rows, run in this order: shapes from "
                    f"{', '.join(SHAPES)} (the default), and the no-configuration rows "
                    f"{', '.join(ROWS)} (issue 48: GPU_PART=default runs "
                    "default,quality,mlm-base)")
    ap.add_argument("--data", type=Path, default=None,
                    help="data dir of the default and quality rows (default: "
                    ".gpu-data/wiki-books-32k from `make gpu-data`; with --smoke, builtin:pydocs "
                    "prepared at the toy size)")
    ap.add_argument("--mlm-base-data", type=Path, default=None,
                    help="train the mlm-base row on this data dir instead of builtin:pydocs "
                    "(GPU_PART=default passes the slice, so the hand-configured row sees the "
                    "default path's tokens and vocabulary)")
    ap.add_argument("--quality-seconds", type=float, default=120.0,
                    help="wall-clock budget of each side of the quality row, compile included "
                    "(default 120); the default-path row is that same run of ours")
    ap.add_argument("--heldout-sequences", type=int, default=2048,
                    help="val sequences both quality sides are scored on (default 2048)")
    ap.add_argument("--peer-lrs", default="",
                    help="comma-separated peak LRs to train the quality peer at, one run each "
                    "(default: only the LR our default run chose); the best peer is compared")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="eager on both sides (default: both compiled)")
    ap.add_argument("--log-every", type=int, default=None,
                    help="steps per metrics window of our run (default 20; smoke 2)")
    ap.add_argument("--no-serve", dest="serve", action="store_false")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--serve-requests", type=int, default=4000)
    ap.add_argument("--serve-texts", type=int, default=512)
    ap.add_argument("--serve-batches", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--serve-seconds", type=float, default=3.0)
    ap.add_argument("--serve-workers", type=int, nargs="+", default=[1],
                    help="serve with each of these --workers counts in turn (e.g. 1 2 4)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "gpu")
    ap.add_argument("--out", type=Path, help="JSON results file (required unless --render)")
    ap.add_argument("--render", type=Path, metavar="JSON",
                    help="print the table of a results file this script wrote; measure nothing")
    ap.add_argument("--table", type=Path, help="also write the markdown table here")
    ap.add_argument("--verbose", action="store_true", help="show the trainer's progress")
    args = ap.parse_args(argv)
    if args.out is None and args.render is None:
        ap.error("--out is required (or --render JSON to print a saved run's table)")
    unknown = set(args.only.split(",")) - set(SHAPES) - set(ROWS)
    if unknown:
        ap.error(f"--only: unknown row(s) {', '.join(sorted(unknown))}; "
                 f"choose from {', '.join([*SHAPES, *ROWS])}")
    try:
        args.peer_lrs = [float(x) for x in args.peer_lrs.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--peer-lrs {args.peer_lrs!r}: not a comma-separated list of numbers")
    if any(lr <= 0 for lr in args.peer_lrs):
        ap.error("--peer-lrs: every LR must be positive")
    if args.quality_seconds <= 0 or args.heldout_sequences < 1:
        ap.error("--quality-seconds must be positive and --heldout-sequences at least 1")
    if args.smoke:
        args.compile = False  # ~40 s of compiling per side on a CPU: not what a smoke run checks
        args.seconds = min(args.seconds, 2.0)
        args.ceiling_seconds = min(args.ceiling_seconds, 0.3)
        args.serve_requests, args.serve_texts = min(args.serve_requests, 48), 32
        args.concurrency = [2, 8]
        args.serve_batches, args.serve_seconds = [8, 32], 0.3
        args.quality_seconds = min(args.quality_seconds, 6.0)
        args.heldout_sequences = min(args.heldout_sequences, 256)
    if args.log_every is None:
        args.log_every = 2 if args.smoke else 20
    return args


def refuse(args: argparse.Namespace) -> str | None:
    """Why this run cannot give the figures it is for (None: it can)."""
    if args.device == "cpu" and not args.smoke:
        return ("--device cpu is only for --smoke: the figures of this benchmark are GPU "
                "figures (CPU speed: bench/cram_vs_hf.py, bench/model_step.py)")
    wanted = args.only.split(",")
    if any(r in wanted for r in ROWS) and not (args.smoke and args.data is None):
        why = data_problem(args.data or SLICE, "--data", None if args.smoke else 128)
        if why:
            return why
    if "mlm-base" in wanted and args.mlm_base_data is not None:
        base = SHAPES["mlm-base"]
        why = data_problem(args.mlm_base_data, "--mlm-base-data",
                           (smoke_shape(base) if args.smoke else base).seq_len)
        if why:
            return why
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ("bench/gpu.py measures a CUDA GPU and torch sees none here "
                    "(torch.cuda.is_available() is False); run it where one is lent "
                    "(docs/gpu.md: make gpu-check), or check the code path on CPU with "
                    "--device cpu --smoke")
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.render is not None:
        print(table(json.loads(args.render.read_text())), end="")
        return 0
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the trainer and the engine follow torch
    why = refuse(args)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    dev = Device(args.device)
    bench = dev.bench(args)
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict = {"smoke": args.smoke, "seconds_per_side": args.seconds,
                     "machine": {**bench.header, **dev.facts()}, "shapes": {}}
    state: dict = {}  # the default run, shared by the default and quality rows
    failed: list[str] = []
    for name in args.only.split(","):
        try:
            if name in ROWS:
                run_row(name, dev, args, results, state)
            else:
                shape = smoke_shape(SHAPES[name]) if args.smoke else SHAPES[name]
                results["shapes"][name] = bench_shape(shape, dev, args)
                r = results["shapes"][name]
                print(f"  {name}: ours {r['ours']['tokens_per_s']:,.0f} tok/s, "
                      f"{r['peer']['side']} {r['peer']['tokens_per_s']:,.0f} tok/s, "
                      f"ratio {r['ratio_tokens_per_s']:.2f}x", file=sys.stderr, flush=True)
        except Exception as e:  # noqa: BLE001 - one row's failure must not cost the next rows
            traceback.print_exc()
            failed.append(name)
            results.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:2000]
        save(results, args)  # each row as it is done: a run cut off keeps what it measured
    if "mlm-cram" in results["shapes"] and args.serve:
        # Serving the cram run, after every shape: a command cut off at its limit loses
        # serving's figures rather than a shape's row.
        clock = Phases()
        run = Path(results["shapes"]["mlm-cram"]["ours"]["run_dir"])
        results["serving"] = clock.time("serving", bench_serving, run, args)
        results["serving"]["phase_s"] = clock.seconds
        print(f"  serving wall: {clock}", file=sys.stderr, flush=True)
        save(results, args)
    notes = [table(results).split("\n")[0]]
    if results["shapes"]:
        bench.table(record_rows(results), notes=notes, formats={
            "params (M)": ".1f", "tokens/s": ",.0f", "MFU (datasheet)": ".1%",
            "MFU (GEMM ceiling)": ".1%", "peak mem GiB": ".2f", "first step (cold) s": ".1f",
            "data wait": ".1%", "ours / peer": ".2f"})
    if "default_path" in results:
        bench.table(default_record_rows(results), name="default", notes=notes, formats={
            "tokens/s (steady)": ",.0f", "MFU (datasheet)": ".1%", "lr": "g",
            "first step s": ".1f", "ours / quality peer": ".2f",
            "ours / hand-configured ours": ".2f", "ours / hand-configured peer": ".2f"})
    if "quality" in results:
        bench.table(quality_record_rows(results), name="quality", notes=notes, formats={
            "train s": ".1f", "tokens seen": ",.0f", "tokens/s": ",.0f",
            "held-out MLM loss": ".4f", "lr": "g"})
    bench.end()
    results["machine"]["load_after"] = bench.header["load_after"]
    print(save(results, args))
    print(f"wrote {args.out}" + (f" and {args.table}" if args.table else ""))
    if failed:
        print(f"error: row(s) {', '.join(failed)} failed (the tracebacks above; the JSON's "
              "\"errors\"); the other rows are saved", file=sys.stderr)
        return 1
    return 0


def record_rows(results: dict) -> list[dict]:
    """The table's figures, unformatted: the rows of this run's record."""
    rows = []
    for name, r in results["shapes"].items():
        for side in (r["ours"], r["peer"]):
            mem = side["peak_allocated_bytes"]
            rows.append({"shape": name, "side": side["side"], "params (M)": side["params"] / 1e6,
                         "tokens/s": side["tokens_per_s"],
                         "MFU (datasheet)": side["mfu_datasheet"],
                         "MFU (GEMM ceiling)": side["mfu_ceiling"],
                         "peak mem GiB": None if mem is None else mem / 2**30,
                         "first step (cold) s": side["first_step_s_cold"],
                         "data wait": side["data_wait"],
                         "ours / peer": r["ratio_tokens_per_s"] if side is r["ours"] else None})
    return rows


def save(results: dict, args: argparse.Namespace) -> str:
    """Write the JSON and the table (each whole or not at all); returns the table."""
    from shoestring.fsutil import write_json_atomic

    cross_ratios(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, results)
    text = table(results)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.table.with_name(args.table.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.table)
    return text


if __name__ == "__main__":
    sys.exit(main())
