"""Fine-tuning a pretrained encoder on a labelled task, fast on a CPU, the way papers do it.

The ``sane`` protocol is Cramming's ("GLUE-sane", Geiping & Goldstein 2023, and their
``eval/GLUE_sane.yaml``): one hyperparameter set for every task — AdamW (β 0.9/0.98, ε 1e-6,
no weight decay), lr 4e-5, batch 16, 5 epochs, 10% linear warmup then cosine decay to 0,
sequences truncated to 128 tokens, the final model evaluated (no early stopping, no
checkpoint picking on dev), and no MNLI initialisation for the small tasks. ``sweep``
repeats the same recipe over a small per-task grid (learning rate × batch size) and keeps
the setting with the best median dev score — which selects on dev, so sweep scores are
optimistic and reports say so.

Speed on a CPU comes from not computing padding: examples are tokenized once, batches are
drawn from length buckets (a shuffled pool of 50 batches is sorted by length and cut, so
each batch pads only to its own longest row), attention gets a key mask, and matmuls run
under bf16 autocast where the CPU has bf16 units. Several seeds give a median and a spread;
the classifier of the median seed is saved for `serve`.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from shoestring.errors import ShoestringError
from shoestring.classifier import SequenceClassifier, collate, save_classifier, token_ids
from shoestring.eval.metrics import compute_metrics, main_score
from shoestring.privacy.dp_sgd import PrivateTraining
from shoestring.eval.tasks import Example, TaskData
from shoestring.progress import progress_bar
from shoestring.device import DeviceInfo, select_device

__all__ = [
    "PROTOCOLS",
    "SWEEP_GRID",
    "Pretrained",
    "Protocol",
    "TaskSettings",
    "encode_examples",
    "evaluate_classifier",
    "finetune",
    "initial_encoder",
    "length_bucketed_batches",
    "run_task",
]


@dataclass(frozen=True)
class Protocol:
    """Fine-tuning hyperparameters (one set for every task under ``sane``)."""

    name: str = "sane"
    lr: float = 4e-5
    batch_size: int = 16
    epochs: float = 5.0
    warmup: float = 0.1  # fraction of the steps
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    max_length: int = 128
    dropout: float = 0.1
    pooling: str = "cls"
    grad_clip: float = 0.0  # 0 = off (Cramming's sane protocol clips nothing)
    eval_batch_size: int = 128


PROTOCOLS: dict[str, Protocol] = {"sane": Protocol(), "sweep": Protocol(name="sweep")}
# The sweep grid: every (lr, batch_size) pair, each run with all the seeds.
SWEEP_GRID: list[dict[str, Any]] = [
    {"lr": lr, "batch_size": bs} for lr in (2e-5, 4e-5, 1e-4) for bs in (16, 32)
]


# ---------------------------------------------------------------------------------------------
# Data


def encode_examples(tokenizer: Any, examples: list[Example], max_length: int) -> list[np.ndarray]:
    """Token ids of each example ([CLS] a [SEP] (b [SEP])), truncated longest-first."""
    pairs = None if not examples or examples[0].b is None else [e.b or "" for e in examples]
    return token_ids(tokenizer, [e.a for e in examples], pairs, max_length)


def length_bucketed_batches(
    lengths: np.ndarray, batch_size: int, rng: np.random.Generator, pool: int = 50
) -> list[np.ndarray]:
    """One epoch of index batches: shuffle, sort each pool of ``pool`` batches by length, cut,
    then shuffle the batch order — random batches that each pad only to their own longest row."""
    order = rng.permutation(len(lengths))
    batches = []
    span = batch_size * pool
    for start in range(0, len(order), span):
        chunk = order[start : start + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def _lr_at(step: int, total: int, warmup_steps: int) -> float:
    """Linear warmup to 1, then cosine decay to 0 (a multiplier of the peak lr)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------------------------
# Train and evaluate


def finetune(
    model: SequenceClassifier,
    seqs: list[np.ndarray],
    labels: list[int] | list[float],
    problem: str,
    protocol: Protocol,
    seed: int,
    device: DeviceInfo,
    pad_id: int,
    on_step: Callable[[int, int, float], None] | None = None,
    privacy: PrivateTraining | None = None,
) -> dict[str, Any]:
    """Train ``model`` in place; returns steps, seconds, examples/s and the final loss.

    ``privacy``: DP-SGD (privacy/dp_sgd.py) — it wraps the model and optimizer and draws the
    batches; the result gains a ``privacy`` record (ε spent)."""
    if len(seqs) == 0:
        raise ShoestringError("the task has no training examples")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model.to(device.device).train()
    lengths = np.array([len(s) for s in seqs])
    steps_per_epoch = math.ceil(len(seqs) / protocol.batch_size)
    total = max(1, math.ceil(steps_per_epoch * protocol.epochs))
    warmup = int(protocol.warmup * total)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.dim() < 2 or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": protocol.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=protocol.lr, betas=(protocol.beta1, protocol.beta2), eps=protocol.eps,
    )

    def epoch() -> list[np.ndarray]:
        return length_bucketed_batches(lengths, protocol.batch_size, rng)

    if privacy is not None:
        def probe(m: torch.nn.Module) -> torch.Tensor:
            ids, mask = collate(seqs, np.arange(1), pad_id)
            return m(ids.to(device.device), mask.to(device.device)).sum()

        model, opt, epoch = privacy.wrap(model, opt, len(seqs), protocol.batch_size, total, seed,
                                         probe=probe)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_at(s, total, warmup))
    y_all = torch.tensor(labels, dtype=torch.float32 if problem == "regression" else torch.long)
    step, losses, tokens = 0, [], 0
    t0 = time.perf_counter()
    while step < total:
        for idx in epoch():
            if step >= total:
                break
            if len(idx) == 0:  # Poisson sampling (DP) can draw an empty batch
                continue
            ids, mask = collate(seqs, idx, pad_id)
            y = y_all[torch.from_numpy(idx)].to(device.device)
            with device.autocast():
                logits = model(ids.to(device.device), mask.to(device.device))
            logits = logits.float()
            if problem == "regression":
                loss = F.mse_loss(logits[:, 0], y)
            else:
                loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            if privacy is not None:
                privacy.backward(loss)
            else:
                loss.backward()
            if protocol.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), protocol.grad_clip)
            opt.step()
            sched.step()
            step += 1
            tokens += int(mask.sum())
            losses.append(loss.item())
            if on_step is not None:
                on_step(step, total, float(np.mean(losses[-20:])))
    seconds = time.perf_counter() - t0
    model.eval()
    return {
        "steps": step,
        "epochs": protocol.epochs,
        "train_seconds": seconds,
        "examples_per_s": step * protocol.batch_size / seconds if seconds > 0 else 0.0,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "first_loss": float(np.mean(losses[:20])),
        "final_loss": float(np.mean(losses[-max(1, len(losses) // 20):])),
        **({"privacy": privacy.finish()} if privacy is not None else {}),
    }


@torch.no_grad()
def evaluate_classifier(
    model: SequenceClassifier, seqs: list[np.ndarray], labels: list, data: TaskData,
    device: DeviceInfo, pad_id: int, batch_size: int = 128,
) -> dict[str, float]:
    """The task's metrics on one evaluation split (pre-tokenized sequences), plus ``score``
    (their mean)."""
    regression = data.spec.problem == "regression"
    model.to(device.device).eval()
    order = np.argsort([len(s) for s in seqs], kind="stable")
    preds = np.zeros(len(seqs), dtype=np.float64 if regression else np.int64)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids, mask = collate(seqs, idx, pad_id)
        with device.autocast():
            logits = model(ids.to(device.device), mask.to(device.device)).float().cpu()
        preds[idx] = logits[:, 0].numpy() if regression else logits.argmax(-1).numpy()
    scores = compute_metrics(data.spec.metrics, labels, preds)
    scores["score"] = main_score(scores, data.spec.metrics)
    return scores


# ---------------------------------------------------------------------------------------------
# A task, with seeds (and a sweep)


def initial_encoder(base_model: torch.nn.Module, seed: int, from_scratch: bool) -> torch.nn.Module:
    """The encoder a seed's fine-tuning starts from: a copy of the pretrained one, or (the
    control) the same architecture re-initialized as pretraining initializes it. Either way
    the global RNG is left seeded with ``seed``, so the classifier head built next is the
    same draw in both arms and the arms are paired by seed."""
    encoder = copy.deepcopy(base_model)
    if from_scratch:
        torch.manual_seed(seed)
        encoder.reset_parameters()
    torch.manual_seed(seed)
    return encoder


def _summary(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(a)),
        "mean": float(a.mean()),
        "std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "min": float(a.min()),
        "max": float(a.max()),
    }


@dataclass(frozen=True)
class Pretrained:
    """The encoder a task is fine-tuned from: its model and run meta (never modified: each
    seed starts from a copy), its tokenizer, and the tokenizer's file (saved with a
    classifier)."""

    model: torch.nn.Module
    meta: dict[str, Any]
    tokenizer: Any
    tokenizer_path: str | Path


@dataclass(frozen=True)
class TaskSettings:
    """How `run_task` fine-tunes one task: the protocol, once per seed (and per ``grid`` point
    for a sweep); where the median seed's classifier goes (None: not saved); ``from_scratch``
    for the control arm (eval/control.py: everything identical except that the encoder's
    weights are drawn afresh, ``initial_encoder``); ``privacy`` to fine-tune with DP-SGD."""

    protocol: Protocol
    seeds: list[int]
    out_dir: str | Path | None = None
    precision: str = "auto"
    grid: list[dict[str, Any]] | None = None
    from_scratch: bool = False
    privacy: PrivateTraining | None = None


Encoded = tuple[list[np.ndarray], list]  # a split's token ids and label ids


@dataclass(frozen=True)
class _Job:
    """One task ready to fine-tune: what every seed and setting shares."""

    base: Pretrained
    data: TaskData
    how: TaskSettings
    device: DeviceInfo
    train: Encoded
    evals: dict[str, Encoded]

    @property
    def first_split(self) -> str:
        return next(iter(self.data.evals))


def run_task(base: Pretrained, data: TaskData, how: TaskSettings,
             console: Console | None = None) -> dict[str, Any]:
    """Fine-tune ``base.model`` on ``data`` once per seed (per grid point for a sweep), score
    every evaluation split, save the median seed's classifier in ``how.out_dir``; returns the
    task's result record (per-seed scores, median/spread per split and metric, timings)."""
    console = console or Console(stderr=True)
    device = select_device(how.precision, measure_peak=False)
    t_start = time.perf_counter()

    def encoded(examples: list[Example]) -> Encoded:
        return (encode_examples(base.tokenizer, examples, how.protocol.max_length),
                data.label_ids(examples))

    job = _Job(base, data, how, device, encoded(data.train),
               {s: encoded(ex) for s, ex in data.evals.items()})
    settings = [how.protocol] if not how.grid else [replace(how.protocol, **g) for g in how.grid]
    candidates: list[tuple[float, Protocol]] = []
    best: tuple[float, Protocol, list[dict[str, Any]], tuple[dict, ...]] | None = None
    with progress_bar(console) as bar:
        for setting in settings:
            per_seed, states = zip(*[_fit_seed(job, setting, seed, bar, console)
                                     for seed in how.seeds])
            median_dev = float(np.median([r["splits"][job.first_split]["score"]
                                          for r in per_seed]))
            candidates.append((median_dev, setting))
            # Keep weights only for the best setting so far (a sweep would otherwise hold
            # grid × seeds copies of the model).
            if best is None or median_dev > best[0]:
                best = (median_dev, setting, list(per_seed), states)
    assert best is not None
    _, setting, per_seed, states = best
    # The saved classifier is the seed whose first-split score is the (lower) median.
    ranked = sorted(range(len(per_seed)),
                    key=lambda i: per_seed[i]["splits"][job.first_split]["score"])
    median_i = ranked[(len(ranked) - 1) // 2]
    result = _result(job, setting, per_seed, median_i, t_start)
    if how.grid:
        result["sweep"] = [{"lr": c.lr, "batch_size": c.batch_size, "median_dev_score": m}
                           for m, c in candidates]
    if how.out_dir is not None:
        result["classifier"] = str(_save_median(job, setting, per_seed[median_i],
                                                states[median_i]))
    return result


def _fit_seed(job: _Job, setting: Protocol, seed: int, bar: Any, console: Console
              ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Fine-tune and score one seed under one setting, on its own progress bar; its record
    and its weights (on CPU)."""
    data, how = job.data, job.how
    pad_id = int(job.base.meta.get("special_ids", {}).get("[PAD]", 0))
    model = SequenceClassifier(initial_encoder(job.base.model, seed, how.from_scratch),
                               data.spec.num_labels, setting.pooling, setting.dropout)
    label = f"{data.spec.name}{' (scratch)' if how.from_scratch else ''} seed {seed}"
    if how.grid:
        label += f" lr {setting.lr:g} bs {setting.batch_size}"
    steps = math.ceil(len(job.train[0]) / setting.batch_size) * setting.epochs
    task_id = bar.add_task(label, total=math.ceil(steps), unit="steps")

    def on_step(step: int, total: int, loss: float) -> None:
        bar.update(task_id, completed=step, total=total, description=f"{label} loss {loss:.3f}")
        # A bar does not redraw in a log file: leave a line every 10% there.
        if not console.is_terminal and step % max(1, total // 10) == 0:
            console.log(f"{label}: step {step:,}/{total:,}, loss {loss:.3f}")

    stats = finetune(model, *job.train, data.spec.problem, setting, seed, job.device, pad_id,
                     on_step, how.privacy)
    t_eval = time.perf_counter()
    splits = {s: evaluate_classifier(model, *job.evals[s], data, job.device, pad_id,
                                     setting.eval_batch_size) for s in data.evals}
    stats["eval_seconds"] = time.perf_counter() - t_eval
    bar.update(task_id, description=f"{label} {job.first_split} "
               f"{100 * splits[job.first_split]['score']:.1f}")
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {"seed": seed, "splits": splits, **stats}, state


def _result(job: _Job, setting: Protocol, per_seed: list[dict[str, Any]], median_i: int,
            t_start: float) -> dict[str, Any]:
    """The task's result record: the chosen setting's seeds and their median/spread."""
    spec = job.data.spec
    return {
        "task": spec.name,
        "problem": spec.problem,
        "pair": spec.pair,
        "labels": spec.labels,
        "metrics": spec.metrics,
        **job.data.facts(),
        "protocol": asdict(setting),
        "seeds": per_seed,
        "summary": {split: {name: _summary([r["splits"][split][name] for r in per_seed])
                            for name in [*spec.metrics, "score"]} for split in job.data.evals},
        "median_seed": per_seed[median_i]["seed"],
        "init": "scratch" if job.how.from_scratch else "pretrained",
        "device": job.device.name,
        "dtype": str(job.device.dtype).removeprefix("torch."),
        "wall_seconds": time.perf_counter() - t_start,
    }


def _save_median(job: _Job, setting: Protocol, record: dict[str, Any],
                 state: dict[str, torch.Tensor]) -> Path:
    """Save the median seed's classifier (``record``, ``state``) in ``how.out_dir``."""
    spec, out_dir = job.data.spec, job.how.out_dir
    assert out_dir is not None
    model = SequenceClassifier(copy.deepcopy(job.base.model), spec.num_labels, setting.pooling,
                               setting.dropout)
    model.load_state_dict(state)
    path = Path(out_dir) / spec.name
    save_classifier(path, model.eval(), job.base.meta, job.base.tokenizer_path,
                    labels=spec.labels, problem=spec.problem, max_length=setting.max_length,
                    pair=spec.pair, task=spec.name,
                    extra={"seed": record["seed"], "protocol": asdict(setting),
                           "dev": record["splits"]})
    return path
