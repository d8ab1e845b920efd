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
from shoestring.eval.classifier import SequenceClassifier, collate, save_classifier
from shoestring.eval.metrics import compute_metrics, main_score
from shoestring.privacy.dp_sgd import PrivateTraining
from shoestring.eval.tasks import Example, TaskData
from shoestring.progress import progress_bar
from shoestring.device import DeviceInfo, select_device

__all__ = [
    "PROTOCOLS",
    "SWEEP_GRID",
    "Protocol",
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
    tokenizer.enable_truncation(max_length, strategy="longest_first")
    tokenizer.no_padding()
    if not examples:
        return []
    if examples[0].b is None:
        encs = tokenizer.encode_batch([e.a for e in examples])
    else:
        encs = tokenizer.encode_batch([(e.a, e.b or "") for e in examples])
    return [np.asarray(e.ids, dtype=np.int64) for e in encs]


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
def predict_encoded(
    model: SequenceClassifier, seqs: list[np.ndarray], problem: str, device: DeviceInfo,
    pad_id: int, batch_size: int = 128,
) -> np.ndarray:
    """Predicted class indices (or regression values) for pre-tokenized sequences."""
    model.to(device.device).eval()
    order = np.argsort([len(s) for s in seqs], kind="stable")
    out = np.zeros(len(seqs), dtype=np.float64 if problem == "regression" else np.int64)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids, mask = collate(seqs, idx, pad_id)
        with device.autocast():
            logits = model(ids.to(device.device), mask.to(device.device)).float().cpu()
        out[idx] = logits[:, 0].numpy() if problem == "regression" else logits.argmax(-1).numpy()
    return out


def evaluate_classifier(
    model: SequenceClassifier, seqs: list[np.ndarray], labels: list, data: TaskData,
    device: DeviceInfo, pad_id: int, batch_size: int = 128,
) -> dict[str, float]:
    """The task's metrics on one evaluation split, plus ``score`` (their mean)."""
    preds = predict_encoded(model, seqs, data.spec.problem, device, pad_id, batch_size)
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


def run_task(
    base_model: torch.nn.Module,
    base_meta: dict[str, Any],
    tokenizer: Any,
    tokenizer_path: str | Path,
    data: TaskData,
    protocol: Protocol,
    seeds: list[int],
    out_dir: str | Path | None = None,
    precision: str = "auto",
    grid: list[dict[str, Any]] | None = None,
    console: Console | None = None,
    notes: dict[str, Any] | None = None,
    from_scratch: bool = False,
    privacy: PrivateTraining | None = None,
) -> dict[str, Any]:
    """Fine-tune ``base_model`` on ``data`` once per seed (per grid point for a sweep), score
    every evaluation split, save the median seed's classifier in ``out_dir``; returns the
    task's result record (per-seed scores, median/spread per split and metric, timings).

    ``from_scratch`` is the control arm (eval/control.py): everything identical except that
    the encoder's weights are drawn afresh (``initial_encoder``)."""
    console = console or Console(stderr=True)
    device = select_device(precision, measure_peak=False)
    pad_id = int(base_meta.get("special_ids", {}).get("[PAD]", 0))
    t_start = time.perf_counter()
    train_seqs = encode_examples(tokenizer, data.train, protocol.max_length)
    train_labels = data.label_ids(data.train)
    eval_seqs = {s: encode_examples(tokenizer, ex, protocol.max_length) for s, ex in data.evals.items()}
    eval_labels = {s: data.label_ids(ex) for s, ex in data.evals.items()}
    first_split = next(iter(data.evals))
    settings = [protocol] if not grid else [replace(protocol, **g) for g in grid]

    candidates: list[tuple[float, Protocol]] = []
    best: tuple[float, Protocol, list[dict[str, Any]], list[dict[str, torch.Tensor]]] | None = None
    with progress_bar(console) as bar:
        for setting in settings:
            per_seed, states = [], []
            for seed in seeds:
                model = SequenceClassifier(
                    initial_encoder(base_model, seed, from_scratch), data.spec.num_labels,
                    setting.pooling, setting.dropout,
                )
                label = f"{data.spec.name}{' (scratch)' if from_scratch else ''} seed {seed}"
                if grid:
                    label += f" lr {setting.lr:g} bs {setting.batch_size}"
                steps = math.ceil(len(train_seqs) / setting.batch_size) * setting.epochs
                task_id = bar.add_task(label, total=math.ceil(steps), unit="steps")

                def on_step(step: int, total: int, loss: float, _tid=task_id, _label=label) -> None:
                    bar.update(_tid, completed=step, total=total,
                               description=f"{_label} loss {loss:.3f}")
                    # A bar does not redraw in a log file: leave a line every 10% there.
                    if not console.is_terminal and step % max(1, total // 10) == 0:
                        console.log(f"{_label}: step {step:,}/{total:,}, loss {loss:.3f}")

                stats = finetune(model, train_seqs, train_labels, data.spec.problem, setting,
                                 seed, device, pad_id, on_step, privacy)
                t_eval = time.perf_counter()
                splits = {s: evaluate_classifier(model, eval_seqs[s], eval_labels[s], data, device,
                                                 pad_id, setting.eval_batch_size)
                          for s in data.evals}
                stats["eval_seconds"] = time.perf_counter() - t_eval
                bar.update(task_id, description=f"{label} {first_split} "
                           f"{100 * splits[first_split]['score']:.1f}")
                per_seed.append({"seed": seed, "splits": splits, **stats})
                states.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
                del model
            median_dev = float(np.median([r["splits"][first_split]["score"] for r in per_seed]))
            candidates.append((median_dev, setting))
            # Keep weights only for the best setting so far (a sweep would otherwise hold
            # grid × seeds copies of the model).
            if best is None or median_dev > best[0]:
                best = (median_dev, setting, per_seed, states)

    assert best is not None
    _, setting, per_seed, states = best
    summary = {
        split: {name: _summary([r["splits"][split][name] for r in per_seed])
                for name in [*data.spec.metrics, "score"]}
        for split in data.evals
    }
    # The saved classifier is the seed whose first-split score is the (lower) median.
    ranked = sorted(range(len(per_seed)), key=lambda i: per_seed[i]["splits"][first_split]["score"])
    median_i = ranked[(len(ranked) - 1) // 2]
    result: dict[str, Any] = {
        "task": data.spec.name,
        "problem": data.spec.problem,
        "pair": data.spec.pair,
        "labels": data.spec.labels,
        "metrics": data.spec.metrics,
        **data.facts(),
        "protocol": asdict(setting),
        "seeds": per_seed,
        "summary": summary,
        "median_seed": per_seed[median_i]["seed"],
        "init": "scratch" if from_scratch else "pretrained",
        "device": device.name,
        "dtype": str(device.dtype).removeprefix("torch."),
        "wall_seconds": time.perf_counter() - t_start,
        **(notes or {}),
    }
    if grid:
        result["sweep"] = [{"lr": c.lr, "batch_size": c.batch_size, "median_dev_score": m}
                           for m, c in candidates]
    if out_dir is not None:
        model = SequenceClassifier(copy.deepcopy(base_model), data.spec.num_labels,
                                   setting.pooling, setting.dropout)
        model.load_state_dict(states[median_i])
        path = Path(out_dir) / data.spec.name
        save_classifier(
            path, model.eval(), base_meta, tokenizer_path,
            labels=data.spec.labels, problem=data.spec.problem, max_length=setting.max_length,
            pair=data.spec.pair, task=data.spec.name,
            extra={"seed": per_seed[median_i]["seed"], "protocol": asdict(setting),
                   "dev": per_seed[median_i]["splits"]},
        )
        result["classifier"] = str(path)
    return result
