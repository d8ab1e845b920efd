"""The headline: shoestring's defaults vs two Hugging Face users, same wall clock, same data.

Same tokenizer, the same packed data (the same sequences in the same order, from
`BatchLoader` with the run's seed), the same wall-clock budget each, the same batch size and
one precision for all (``--precision auto``: whatever shoestring's device check picks here —
bf16 autocast where it beats fp32, else fp32). Three contenders:

1. **shoestring**: `shoestring.train.loop.train` with the default config (Cramming-style
   encoder, sparse head, one-cycle LR keyed to the budget, 25% masking, ``train.attention``
   and ``train.compile`` on ``auto``: the attention kernel timed before the clock, compile on
   from 10-minute budgets, its time charged to the budget). Its periodic validation pauses
   the budget clock and is not counted.
2. **the careful HF user** (``modernbert``): transformers' `ModernBertForMaskedLM` of exactly
   our architecture (configured by our exporter) with ModernBERT's own sparse head ON and the
   faster of its attention implementations (sdpa / eager, timed over a few steps before the
   clock; ``--hf-attention``), trained with OUR recipe in a plain loop: `build_optimizer`,
   `lr_factor` keyed to the elapsed fraction of the wall clock, `batch_at`, the mlm family's
   masking (same seed: the same masks), our gradient clipping. Only the implementation
   differs. With ``--hf-compile`` a fourth contender, ``modernbert-compiled``, is the same
   user who also wraps the model in ``torch.compile`` by hand (what transformers' Trainer
   does with ``torch_compile=True``; ModernBERT's own ``reference_compile`` refuses CPUs),
   compile time charged to its budget as ours is.
3. **the HF-docs user** (``bert``): `BertForMaskedLM` with the library's defaults (dropout
   0.1, learned positions, biases, dense head) and the FFN width that gives it our parameter
   count (printed), ``DataCollatorForLanguageModeling`` (15%, 80/10/10), `torch.optim.AdamW`
   (weight decay 0.01), linear warmup (``--bert-warmup``) then linear decay to 0 keyed to the
   elapsed fraction of the budget (so the schedule ends exactly at the budget), clipping at
   1.0 (the Trainer's default). Its learning rate is picked by a sweep before the clock
   starts: each of ``--bert-sweep`` for ``--sweep-budget``, the lowest held-out loss (at its
   15%) on ``--sweep-eval-sequences`` wins; the sweep and its cost are in the JSON.

Held-out loss: every model is scored at the mask rate it trained with AND at one common rate
(``--common-rate``, 0.25), on exactly the same masked validation batches (fixed masks drawn
from (eval.seed, sequence index), `shoestring.data.masking.fixed_masks`): the same input ids,
masked positions and targets, cross-entropy at the masked positions. `shoestring eval`'s own
number for our run is recorded as a cross-check. FLOPs per token of every model are counted by
``FlopCounterMode`` (forward × 3); our MFU is set against a measured matmul ceiling: a loop of
only our model's training matmuls (same shapes, same precision).

    python bench/cram_vs_hf.py --budget 10m --out runs/bench/cram_vs_hf.json
    python bench/cram_vs_hf.py --budget 10m --hf-compile --bert-lr 3e-4 --out runs/bench/cvh.json
    python bench/cram_vs_hf.py --budget 10m --repeats 2 --out runs/bench/cvh2.json  # interleaved
    python bench/cram_vs_hf.py --budget 20s --sweep-budget 10s --eval-sequences 64 \
        --out /tmp/cvh.json                                                        # smoke test

The data dir (``--data``) is prepared from ``--corpus`` with `shoestring prep` defaults the
first time and reused after.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from common import ROOT, SHARED, Bench, add_repeats, header_line, load_average, parser
from peers import count_params, counted_train_flops_per_token, encoder_gemms, hf_modernbert, \
    matmul_ceiling, mlm_labels, modernbert_setup, peer_versions
from shoestring.config import Config, load_config
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader
from shoestring.data.masking import fixed_masks, num_masked
from shoestring.families.spec import MASK, NUM_SPECIAL
from shoestring.device import DeviceInfo, precision_name, select_device
from shoestring.eval.mlm_loss import evaluate_run
from shoestring.families import MLM
from shoestring.fsutil import write_json_atomic
from shoestring.model import build_model
from shoestring.model.flops import train_flops_per_token
from shoestring.rundir import RunDir
from shoestring.units import parse_budget
from shoestring.train.loop import train
from shoestring.train.objectives import objective_for
from shoestring.train.optim import build_optimizer
from shoestring.train.schedule import batch_at, linear, lr_factor

CORPUS = SHARED / "corpora" / "mixed-en.jsonl"
CONTENDERS = ("shoestring", "modernbert", "bert")
# A fourth, optional (--hf-compile): the careful HF user who also compiles by hand, as
# transformers' Trainer does with TrainingArguments(torch_compile=True).
ALL_CONTENDERS = (*CONTENDERS, "modernbert-compiled")
console = Console(stderr=True)

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # inputs, positions, targets


def ensure_data(data_dir: Path, corpus: Path, cfg: Config) -> DataDir:
    """Reuse a prepared data dir, or prep the corpus into it with the default data settings."""
    if not (data_dir / "manifest.json").is_file():
        if not corpus.is_file():
            sys.exit(f"corpus not found: {corpus} (pass --corpus or --data with a prepared dir)")
        from shoestring.prep.prep import prep

        console.print(f"preparing {corpus} → {data_dir}")
        prep([str(corpus)], data_dir, cfg.data, console=console)
    return DataDir(data_dir)


# ---------------------------------------------------------------------------- held-out scoring


class HeldOut:
    """The validation batches every model is scored on, masked once per rate and kept, so each
    model sees exactly the same inputs, positions and targets at a given rate."""

    def __init__(self, data: DataDir, cfg: Config, max_sequences: int) -> None:
        self.data, self.cfg = data, cfg
        self.val = data.split("val", verify=True)
        self.n = min(len(self.val), max_sequences)
        self._cache: dict[tuple[float, int], list[Batch]] = {}

    def batches(self, rate: float, n: int | None = None) -> list[Batch]:
        n = min(self.n, n or self.n)
        key = (rate, n)
        if key not in self._cache:
            ev, mask_id, out = self.cfg.eval, self.data.special_ids[MASK], []
            for start in range(0, n, ev.batch_size):
                ids = torch.from_numpy(self.val.take(np.arange(start, min(start + ev.batch_size, n))))
                b = fixed_masks(ids, start, rate, ev.seed, NUM_SPECIAL, mask_id, self.data.vocab_size)
                out.append((b.inputs, b.positions, b.targets))
            self._cache[key] = out
        return self._cache[key]

    @torch.no_grad()
    def score(self, logits_at: Callable[[Batch], torch.Tensor], rate: float,
              device_info: DeviceInfo, n: int | None = None) -> dict:
        """Mean cross-entropy and accuracy at the masked positions (the run's autocast)."""
        nll, correct, count = 0.0, 0, 0
        for batch in self.batches(rate, n):
            with device_info.autocast():
                logits = logits_at(batch)
            logits, targets = logits.float().flatten(0, 1), batch[2].flatten()
            nll += F.cross_entropy(logits, targets, reduction="sum").item()
            correct += (logits.argmax(-1) == targets).sum().item()
            count += targets.numel()
        return {"rate": rate, "loss": nll / count, "accuracy": correct / count,
                "masked_tokens": count, "sequences": min(self.n, n or self.n)}


def ours_logits(model: torch.nn.Module) -> Callable[[Batch], torch.Tensor]:
    return lambda b: model(b[0], b[1])


def hf_logits(model: torch.nn.Module) -> Callable[[Batch], torch.Tensor]:
    """(B, k, V) logits at the masked positions: through ModernBERT's sparse head when it is
    on (its rows come out in row-major order, which is our ascending positions' order), else
    gathered from the dense (B, T, V) logits."""
    def at(b: Batch) -> torch.Tensor:
        inputs, positions, targets = b
        if getattr(model.config, "sparse_prediction", False):
            out = model(input_ids=inputs, labels=mlm_labels(inputs, positions, targets)).logits
            return out.view(*positions.shape, -1)
        out = model(input_ids=inputs).logits
        return out.gather(1, positions[..., None].expand(-1, -1, out.shape[-1]))
    return at


# ---------------------------------------------------------------------------- the HF loops


@dataclass
class Recipe:
    """One plain training loop's choices: what differs between the two HF users."""

    optimizer: torch.optim.Optimizer
    lr_at: Callable[[float], float]  # progress (elapsed / budget) -> learning rate
    rows_at: Callable[[float], int]  # progress -> sequences in the step
    make_batch: Callable[[torch.Tensor], dict]  # token rows -> the model's keyword arguments
    clip: float
    describe: str


def plain_loop(model: torch.nn.Module, recipe: Recipe, data: DataDir, cfg: Config,
               seconds: float, device_info: DeviceInfo, label: str) -> dict:
    """The loop an HF user writes: same data order as ours (`BatchLoader`, the run's seed),
    the LR set from the elapsed fraction of the wall clock, stop at the budget."""
    micro = cfg.train.micro_batch()
    loader = BatchLoader(data.split("train"), micro, cfg.train.seed)
    model.train()
    steps = tokens = 0
    losses: list[float] = []
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        progress = elapsed / seconds
        for group in recipe.optimizer.param_groups:
            group["lr"] = recipe.lr_at(progress)
        ids = torch.cat([next(loader) for _ in range(max(1, recipe.rows_at(progress) // micro))])
        with device_info.autocast():
            loss = model(**recipe.make_batch(ids)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
        recipe.optimizer.step()
        recipe.optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        steps += 1
        tokens += ids.numel()
        if steps % 50 == 0:
            console.print(f"{label} step {steps}: loss {np.mean(losses[-50:]):.3f}, "
                          f"{tokens / elapsed:,.0f} tok/s, {elapsed:.0f}/{seconds:.0f} s")
    train_seconds = time.perf_counter() - start
    loader.close()
    tail = losses[-max(1, len(losses) // 20):]
    model.eval()
    return {"recipe": recipe.describe, "params": count_params(model),
            "attention": model.config._attn_implementation, "steps": steps, "tokens": tokens,
            "train_seconds": train_seconds, "tokens_per_s": tokens / train_seconds,
            "first_loss": losses[0], "final_train_loss": float(np.mean(tail))}


def modernbert_recipe(model: torch.nn.Module, data: DataDir, cfg: Config) -> Recipe:
    """Our recipe, verbatim, around transformers' model (labels → its sparse head)."""
    tc = cfg.train
    objective = objective_for(MLM, data.seq_len, data.vocab_size, data.special_ids,
                              tc.mask_rate, True)
    gen = torch.Generator().manual_seed(tc.seed)  # our loop's masking stream

    def make_batch(ids: torch.Tensor) -> dict:
        inputs, positions, targets = objective.make_batch(ids, gen)
        return {"input_ids": inputs, "labels": mlm_labels(inputs, positions, targets)}

    return Recipe(build_optimizer(model, tc), lambda p: tc.lr * lr_factor(tc, p),
                  lambda p: batch_at(tc, p, tc.micro_batch()), make_batch, tc.grad_clip,
                  f"{modernbert_setup(model)}; shoestring's recipe: AdamW lr {tc.lr} "
                  f"({tc.schedule} keyed to wall clock), {tc.mask_rate:.0%} masking, batch "
                  f"{tc.batch_size}, clip {tc.grad_clip}")


def pick_hf_attention(cfg: Config, data: DataDir, device_info: DeviceInfo,
                      steps: int = 6) -> dict:
    """The careful user's attention choice for ModernBERT: time a few training steps with
    each of its implementations (sdpa, eager) at the run's batch and take the faster, before
    the clock starts (as shoestring's ``train.attention=auto`` does for ours)."""
    loader = BatchLoader(data.split("train"), cfg.train.micro_batch(), cfg.train.seed)
    ids = next(loader)
    loader.close()
    times: dict[str, float] = {}
    for attn in ("sdpa", "eager"):
        torch.manual_seed(cfg.train.seed)
        model = hf_modernbert(cfg.model, data.vocab_size, data.seq_len, sparse=True,
                              ids=data.special_ids, attention=attn)
        recipe = modernbert_recipe(model, data, cfg)
        batch = recipe.make_batch(ids)
        for i in range(steps + 2):  # two warm-up steps
            if i == 2:
                t0 = time.perf_counter()
            with device_info.autocast():
                loss = model(**batch).loss
            loss.backward()
            recipe.optimizer.step()
            recipe.optimizer.zero_grad(set_to_none=True)
        times[attn] = (time.perf_counter() - t0) / steps
    best = min(times, key=times.get)
    console.print("ModernBERT attention: " + ", ".join(f"{k} {v * 1e3:.0f} ms/step"
                                                      for k, v in times.items()) + f" → {best}")
    return {"seconds_per_step": times, "picked": best}


def bert_model(cfg: Config, data: DataDir, intermediate: int) -> torch.nn.Module:
    """BertForMaskedLM of our hidden/layers/heads, the library's defaults otherwise."""
    from transformers import BertConfig, BertForMaskedLM

    m = cfg.model
    return BertForMaskedLM(BertConfig(
        vocab_size=data.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, intermediate_size=intermediate,
        max_position_embeddings=max(512, data.seq_len), pad_token_id=data.special_ids["[PAD]"]))


def bert_width(cfg: Config, data: DataDir, target_params: int) -> int:
    """The BERT FFN width whose parameter count is closest to ours (a multiple of 8): the
    count is linear in the width, L·(2H+1) per unit (two matrices and a bias)."""
    base_width = cfg.model.ffn_input_width
    base = count_params(bert_model(cfg, data, base_width))
    per_unit = cfg.model.num_layers * (2 * cfg.model.hidden_size + 1)
    return max(8, 8 * round((base_width + (target_params - base) / per_unit) / 8))


def bert_recipe(model: torch.nn.Module, data: DataDir, lr: float, warmup: float,
                mask_rate: float, batch_size: int) -> Recipe:
    """The transformers docs' MLM recipe, its linear schedule keyed to the wall clock."""
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(data.tokenizer_path), unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=mask_rate,
                                               return_tensors="pt")
    return Recipe(torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01),
                  lambda p: lr * linear(p, warmup), lambda p: batch_size,
                  lambda ids: collator([{"input_ids": row} for row in ids]), 1.0,
                  f"transformers BertForMaskedLM (defaults: dropout 0.1, dense head, attention "
                  f"{model.config._attn_implementation}), FFN {model.config.intermediate_size}, "
                  f"DataCollatorForLanguageModeling {mask_rate:.0%}, AdamW lr {lr:g} (swept) "
                  f"wd 0.01, linear warmup {warmup:.0%}/decay ending at the budget, clip 1.0, "
                  f"batch {batch_size}")


def train_bert(cfg: Config, data: DataDir, width: int, lr: float, args: argparse.Namespace,
               seconds: float, device_info: DeviceInfo, label: str) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(cfg.train.seed)  # init and the collator's masks
    model = bert_model(cfg, data, width)
    recipe = bert_recipe(model, data, lr, args.bert_warmup, args.bert_mask_rate,
                         cfg.train.batch_size)
    return model, plain_loop(model, recipe, data, cfg, seconds, device_info, label)


def sweep_bert_lr(cfg: Config, data: DataDir, width: int, held: HeldOut, args: argparse.Namespace,
                  device_info: DeviceInfo) -> dict:
    """The docs user's LR sweep: short runs, lowest held-out loss at its own mask rate."""
    seconds, t0, runs = parse_budget(args.sweep_budget).amount, time.perf_counter(), []
    for lr in (float(x) for x in args.bert_sweep.split(",")):
        model, info = train_bert(cfg, data, width, lr, args, seconds, device_info, f"sweep {lr:g}")
        score = held.score(hf_logits(model), args.bert_mask_rate, device_info,
                           args.sweep_eval_sequences)
        runs.append({"lr": lr, "steps": info["steps"], "tokens_per_s": info["tokens_per_s"],
                     "heldout_loss": score["loss"]})
        console.print(f"sweep lr {lr:g}: held-out loss {score['loss']:.3f} ({info['steps']} steps)")
    best = min(runs, key=lambda r: r["heldout_loss"] if math.isfinite(r["heldout_loss"]) else 1e9)
    return {"budget_each": args.sweep_budget, "eval_sequences": args.sweep_eval_sequences,
            "mask_rate": args.bert_mask_rate, "runs": runs, "best_lr": best["lr"],
            "cost_seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------- main


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--budget", default="10m", help="wall clock per contender: 60s, 10m (default)")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--data", type=Path, default=ROOT / "runs" / "bench" / "mixed-en-data",
                    help="data dir to reuse (prepared from --corpus when absent)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "cram_vs_hf",
                    help="folder for our run dirs and the saved BERT")
    ap.add_argument("--out", type=Path, required=True, help="JSON results file to write")
    ap.add_argument("--eval-sequences", type=int, default=4096, help="validation sequences (cap)")
    ap.add_argument("--common-rate", type=float, default=0.25,
                    help="the one mask rate every model is also scored at")
    ap.add_argument("--bert-sweep", default="1e-4,3e-4,1e-3,3e-3",
                    help="BERT learning rates to sweep (comma-separated, ≥ 4 for the issue)")
    ap.add_argument("--bert-lr", type=float, help="skip the sweep and use this BERT LR")
    ap.add_argument("--sweep-budget", default="2m", help="wall clock per sweep run")
    ap.add_argument("--sweep-eval-sequences", type=int, default=512)
    ap.add_argument("--bert-warmup", type=float, default=0.06, help="warmup fraction of the budget")
    ap.add_argument("--bert-mask-rate", type=float, default=0.15)
    add_repeats(ap, 1, "rounds of all contenders")
    ap.add_argument("--order", default=",".join(CONTENDERS),
                    help="contender order of the first round; later rounds rotate it")
    ap.add_argument("--ceiling-seconds", type=float, default=10.0,
                    help="how long to measure the matmul ceiling")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="compute precision for every contender (auto: shoestring's measured choice)")
    ap.add_argument("--hf-attention", choices=["auto", "sdpa", "eager"], default="auto",
                    help="ModernBERT's attn_implementation (auto: the faster of the two, timed "
                    "over a few steps before the clock)")
    ap.add_argument("--hf-compile", action="store_true",
                    help="torch.compile the ModernBERT peer by hand (not HF's own option)")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="override shoestring's config (section.key=value), e.g. model dims")
    args = ap.parse_args()
    order = args.order.split(",")
    if sorted(order) != sorted(CONTENDERS):
        sys.exit(f"--order must list each of {', '.join(CONTENDERS)} once")
    if args.hf_compile:
        order.insert(order.index("modernbert") + 1, "modernbert-compiled")

    seconds = parse_budget(args.budget).amount
    # One precision for all: resolved once here, then pinned in our config.
    device_info = select_device(args.precision, measure_peak=False)
    precision = precision_name(device_info.dtype)
    bench = Bench("cram_vs_hf", args, precision=f"{precision} for all ({args.precision} requested)",
                  device=device_info.name, **peer_versions())
    cfg = load_config(None, [f"train.budget={args.budget}", "train.steps=null",
                             f"train.precision={precision}", *args.sets])
    data = ensure_data(args.data, args.corpus, cfg)
    held = HeldOut(data, cfg, args.eval_sequences)
    ours_params = count_params(build_model(cfg.model, data.vocab_size))
    width = bert_width(cfg, data, ours_params)
    results: dict = {
        "budget": args.budget, "budget_seconds": seconds,
        "data_dir": str(args.data.resolve()), "seq_len": data.seq_len, "vocab": data.vocab_size,
        "model_dims": {**{k: getattr(cfg.model, k) for k in
                          ("hidden_size", "num_layers", "num_heads", "intermediate_size", "ffn")},
                       "ffn_input_width": cfg.model.ffn_input_width},
        "bert_intermediate_size": width, "batch_size": cfg.train.batch_size,
        "precision": f"{precision} for all ({args.precision} requested)",
        "machine": bench.header, "rounds": [],
    }
    console.print(f"BERT FFN width {width} matches our {ours_params / 1e6:.3f}M parameters")
    if args.bert_lr is None:
        results["bert_sweep"] = sweep_bert_lr(cfg, data, width, held, args, device_info)
        bert_lr = results["bert_sweep"]["best_lr"]
    else:
        bert_lr = args.bert_lr
        results["bert_sweep"] = {"skipped": f"--bert-lr {bert_lr:g} given"}
    flops_batch = held.batches(cfg.train.mask_rate)[0]  # a batch to count FLOPs on
    tokens_counted = flops_batch[0].numel()

    def run_shoestring(r: int) -> dict:
        # Round 1 at the path bench/glue_after_pretrain.py reads, beside the saved BERT.
        run_dir = args.work / ("shoestring" if r == 0 else f"shoestring-r{r + 1}")
        s = train(cfg, args.data, run_dir, overwrite=True, console=console)
        model, _ = RunDir(run_dir).load_final()
        official = evaluate_run(run_dir, args.data, console=console,
                                overrides=[f"eval.max_sequences={args.eval_sequences}"])
        return {"recipe": f"shoestring defaults (train.loop.train): attention {s['attention']}, "
                          f"compile {'on' if s['compiled'] else 'off'} (first step "
                          f"{s['first_step_s']:.1f} s, in the budget)", "run_dir": str(run_dir),
                **{k: s[k] for k in ("params", "steps", "tokens", "train_seconds", "tokens_per_s",
                                     "mfu", "first_loss", "final_train_loss", "attention",
                                     "compiled", "first_step_s")},
                "mask_rate": cfg.train.mask_rate, "eval_cli_loss": official["mlm_loss"],
                "unigram_loss": official["unigram_loss"], "_model": model,
                "_logits": ours_logits(model),
                "_count": lambda: model(flops_batch[0], flops_batch[1])}

    if args.hf_attention == "auto":
        results["modernbert_attention"] = pick_hf_attention(cfg, data, device_info)
        hf_attention = results["modernbert_attention"]["picked"]
    else:
        hf_attention = args.hf_attention
        results["modernbert_attention"] = {"picked": hf_attention, "given": True}

    def run_modernbert(r: int, compiled: bool = False) -> dict:
        torch.manual_seed(cfg.train.seed)
        model = hf_modernbert(cfg.model, data.vocab_size, data.seq_len, sparse=True,
                              ids=data.special_ids, attention=hf_attention)
        recipe = modernbert_recipe(model, data, cfg)
        if compiled:  # by hand: ModernBERT's own reference_compile refuses CPUs
            recipe.describe += "; torch.compile(model) by hand (compile time in the budget)"
        info = plain_loop(torch.compile(model) if compiled else model, recipe, data, cfg,
                          seconds, device_info, "ModernBERT" + (" compiled" if compiled else ""))
        labels = mlm_labels(*flops_batch)
        return {**info, "mask_rate": cfg.train.mask_rate, "_model": model,
                "_logits": hf_logits(model),
                "_count": lambda: model(input_ids=flops_batch[0], labels=labels)}

    def run_bert(r: int) -> dict:
        model, info = train_bert(cfg, data, width, bert_lr, args, seconds, device_info, "BERT")
        if r == 0:  # for bench/glue_after_pretrain.py
            model.save_pretrained(args.work / "hf")
            info["saved_to"] = str(args.work / "hf")
        return {**info, "mask_rate": args.bert_mask_rate, "intermediate_size": width,
                "_model": model, "_logits": hf_logits(model),
                "_count": lambda: model(input_ids=flops_batch[0])}

    runners = {"shoestring": run_shoestring, "modernbert": run_modernbert, "bert": run_bert,
               "modernbert-compiled": lambda r: run_modernbert(r, compiled=True)}
    for r in range(args.repeats):
        k = r % len(order)
        rnd: dict = {"order": order[k:] + order[:k]}
        for name in rnd["order"]:
            load = load_average()
            res = runners[name](r)
            res["load_average_before"], res["load_average_after"] = load, load_average()
            res["train_flops_per_token_counted"] = counted_train_flops_per_token(
                res.pop("_count"), tokens_counted)
            logits_at = res.pop("_logits")
            res["heldout_own_rate"] = held.score(logits_at, res["mask_rate"], device_info)
            res["heldout_common_rate"] = held.score(logits_at, args.common_rate, device_info)
            res.pop("_model")
            rnd[name] = res
        rnd["ratios"] = ratios(rnd)
        results["rounds"].append(rnd)

    # The MFU ceiling: only our model's training matmuls, same shapes and precision.
    m = cfg.model
    tokens = cfg.train.micro_batch() * data.seq_len
    head = cfg.train.micro_batch() * num_masked(data.seq_len, cfg.train.mask_rate)
    ceiling = matmul_ceiling(encoder_gemms(m, data.vocab_size, tokens, head), device_info.dtype,
                             args.ceiling_seconds)
    fpt = train_flops_per_token(m, data.vocab_size, data.seq_len, head / tokens)
    achieved = [rnd["shoestring"]["tokens_per_s"] * fpt for rnd in results["rounds"]]
    results["mfu_ceiling"] = {
        "matmul_loop_flops_per_s": ceiling, "ours_flops_per_token": fpt,
        "ours_achieved_flops_per_s": achieved, "fraction_of_ceiling": [a / ceiling for a in achieved],
        "how": f"F.linear + the two backward matmuls for each of our GEMM shapes "
               f"({tokens} tokens, {head} at the head), {precision}, best pass of "
               f"{args.ceiling_seconds:g} s"}
    save(results, args, bench)


def save(results: dict, args: argparse.Namespace, bench: Bench) -> None:
    """The record (the load average at the end goes into results["machine"] too), the JSON,
    then the table."""
    before, after = notes(results, args)
    bench.table(table_rows(results, args.common_rate), notes=before + after, formats={
        "params (M)": ".2f", "MFLOP/tok": ".1f", "tok/s": ",.0f", "loss@own": ".3f",
        "own rate": ".0%", f"loss@{args.common_rate:.0%}": ".3f", "ours / this tok/s": ".2f",
        "this − ours loss": "+.3f"})
    bench.end()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, results)
    print_table(results, args)
    print(f"wrote {args.out}")


def ratios(rnd: dict) -> dict:
    """Ours vs each peer: tokens/s ratio and held-out loss deltas (peer − ours)."""
    s = rnd["shoestring"]
    return {peer: {
        "tokens_per_s": s["tokens_per_s"] / rnd[peer]["tokens_per_s"],
        "loss_delta_common_rate": rnd[peer]["heldout_common_rate"]["loss"]
        - s["heldout_common_rate"]["loss"],
        "loss_delta_own_rates": rnd[peer]["heldout_own_rate"]["loss"] - s["heldout_own_rate"]["loss"],
    } for peer in rnd["order"] if peer != "shoestring"}


def table_rows(results: dict, common_rate: float) -> list[dict]:
    """One row per round and contender, with the ratio of ours to it: the printed table."""
    rate = f"loss@{common_rate:.0%}"
    rows = []
    for i, rnd in enumerate(results["rounds"]):
        for name in (c for c in ALL_CONTENDERS if c in rnd):
            r, ratio = rnd[name], rnd["ratios"].get(name, {})
            rows.append({"round": i + 1, "contender": name, "params (M)": r["params"] / 1e6,
                         "MFLOP/tok": r["train_flops_per_token_counted"] / 1e6,
                         "steps": r["steps"], "tokens": r["tokens"], "tok/s": r["tokens_per_s"],
                         "loss@own": r["heldout_own_rate"]["loss"],
                         "own rate": r["heldout_own_rate"]["rate"],
                         rate: r["heldout_common_rate"]["loss"],
                         "ours / this tok/s": ratio.get("tokens_per_s"),
                         "this − ours loss": ratio.get("loss_delta_common_rate")})
    return rows


def notes(results: dict, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """What each contender was and how the table was made: the lines printed above the
    table (the choices made before the clock) and below it (recipes, ratios, ceiling)."""
    before, after = [], []
    att = results["modernbert_attention"]
    if "seconds_per_step" in att:
        before.append("ModernBERT attention timed before the clock: " + ", ".join(
            f"{k} {v * 1e3:.0f} ms/step" for k, v in att["seconds_per_step"].items())
            + f"; picked {att['picked']}")
    sweep = results["bert_sweep"]
    if "runs" in sweep:
        before.append(f"BERT LR sweep ({sweep['budget_each']} each, held-out at "
                      f"{sweep['mask_rate']:.0%} on {sweep['eval_sequences']} sequences, "
                      f"{sweep['cost_seconds']:.0f} s in all): "
                      + ", ".join(f"{r['lr']:g} → {r['heldout_loss']:.3f}" for r in sweep["runs"])
                      + f"; picked {sweep['best_lr']:g}")
    rate = args.common_rate
    first = results["rounds"][0]
    for name in (c for c in ALL_CONTENDERS if c in first):
        after.append(f"  {name}: {first[name]['recipe']}")
    for peer in (c for c in ALL_CONTENDERS[1:] if c in first):
        tps = [rnd["ratios"][peer]["tokens_per_s"] for rnd in results["rounds"]]
        dl = [rnd["ratios"][peer]["loss_delta_common_rate"] for rnd in results["rounds"]]
        after.append(f"ours / {peer}: tokens/s {statistics.median(tps):.2f}x "
                     f"(rounds: {', '.join(f'{x:.2f}' for x in tps)}); held-out loss at "
                     f"{rate:.0%} {peer} − ours = {statistics.median(dl):+.3f}  "
                     f"[peer: {results['rounds'][0][peer]['recipe']}]")
    c = results["mfu_ceiling"]
    after.append(f"matmul ceiling {c['matmul_loop_flops_per_s'] / 1e9:.1f} GFLOP/s ({c['how']}); "
                 f"ours achieved "
                 f"{', '.join(f'{a / 1e9:.1f}' for a in c['ours_achieved_flops_per_s'])} "
                 f"GFLOP/s = {', '.join(f'{f:.0%}' for f in c['fraction_of_ceiling'])} of it")
    s = first["shoestring"]
    after.append(f"`shoestring eval` cross-check (round 1) {s['eval_cli_loss']:.3f}; unigram "
                 f"{s['unigram_loss']:.3f}; {s['heldout_common_rate']['masked_tokens']:,} masked "
                 f"tokens ({s['heldout_common_rate']['sequences']} sequences) at {rate:.0%}")
    return before, after


def print_table(results: dict, args: argparse.Namespace) -> None:
    """The table and the ratios, each with the peer's configuration beside it."""
    print(f"budget {args.budget} each; {header_line(results['machine'])}")
    before, after = notes(results, args)
    for line in before:
        print(line)
    rate = args.common_rate
    print(f"{'round':>5} {'contender':19} {'params':>8} {'MFLOP/tok':>9} {'steps':>6} "
          f"{'tokens':>10} {'tok/s':>8} {'loss@own':>13} {f'loss@{rate:.0%}':>9}")
    for r in table_rows(results, rate):
        print(f"{r['round']:5d} {r['contender']:19} {r['params (M)']:7.2f}M "
              f"{r['MFLOP/tok']:9.1f} {r['steps']:6d} {r['tokens']:10,d} {r['tok/s']:8,.0f} "
              f"{r['loss@own']:7.3f} @{r['own rate']:.0%} {r[f'loss@{rate:.0%}']:9.3f}")
    print("\n".join(after))


if __name__ == "__main__":
    main()
