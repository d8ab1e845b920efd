"""The headline comparison: shoestring's default recipe vs a standard Hugging Face MLM recipe.

Same tokenizer, same packed data (the same sequences in the same order), same wall-clock
budget, same model dimensions (hidden, layers, heads, and the feed-forward's input projection
width, which Cramming calls the intermediate size: our GeGLU halves its 2·intermediate_size
projection, so BERT gets ``intermediate_size`` = 2 × ours = 4·hidden, BERT's own proportion),
the same precision for both (``--precision auto``: whatever shoestring's device check picks on
this machine — bf16 autocast where it beats fp32, else fp32):

- **shoestring**: `shoestring.train.loop.train` with the default config (Cramming-style
  encoder, sparse prediction head, one-cycle LR keyed to the budget, 25% masking), budget
  ``--budget``. Its periodic validation pauses the budget clock and is not counted.
- **Hugging Face**: what a user writes from the transformers docs ("Training in native
  PyTorch" + the MLM guide): ``BertForMaskedLM(BertConfig(...))`` with the library's defaults
  (dropout 0.1, learned positions, biases, dense MLM head), ``DataCollatorForLanguageModeling``
  (mlm_probability 0.15, 80/10/10), ``torch.optim.AdamW`` (lr ``--hf-lr``, weight decay 0.01),
  ``get_linear_schedule_with_warmup`` (warmup ``--hf-warmup`` of the steps), gradient clipping
  at 1.0 (the Trainer's default), a plain loop under the same autocast as ours. The step
  count for the schedule is estimated from a short timing of a few steps on a throwaway copy
  of the model before the clock starts; training stops at the budget or at that step count,
  whichever comes first.

Held-out loss: both models are scored on EXACTLY the same masked validation batches, the
fixed masks of `shoestring.eval.mlm` (drawn from (eval.seed, sequence index) at rate 0.25):
the same input ids, masked positions and targets, cross-entropy at the masked positions.
`shoestring eval`'s own number for our run is recorded beside it as a cross-check.

    python bench/cram_vs_hf.py --budget 10m --out runs/bench/cram_vs_hf.json
    python bench/cram_vs_hf.py --budget 60s --eval-sequences 512 --out /tmp/cvh.json  # quick

The data dir (``--data``) is prepared from ``--corpus`` with `shoestring prep` defaults the
first time and reused after.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from shoestring.config import Config, load_config
from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader
from shoestring.data.tokenizer import MASK
from shoestring.eval.mlm import evaluate_run, fixed_masks
from shoestring.fsutil import write_json_atomic
from shoestring.train.budget import parse_duration
from shoestring.device import DeviceInfo, precision_name, select_device
from shoestring.train.loop import train
from shoestring.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "corpora" / "mixed-en.jsonl"
console = Console(stderr=True)


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def ensure_data(data_dir: Path, corpus: Path, cfg: Config) -> DataDir:
    """Reuse a prepared data dir, or prep the corpus into it with the default data settings."""
    if not (data_dir / "manifest.json").is_file():
        if not corpus.is_file():
            sys.exit(f"corpus not found: {corpus} (pass --corpus or --data with a prepared dir)")
        from shoestring.data.prep import prep

        console.print(f"preparing {corpus} → {data_dir}")
        prep([str(corpus)], data_dir, cfg.data, console=console)
    return DataDir(data_dir)


# ---------------------------------------------------------------------------- the HF recipe


def hf_tokenizer(data: DataDir):
    """Our tokenizer.json as a transformers fast tokenizer, with our special tokens."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(data.tokenizer_path), unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
    )


def hf_model(cfg: Config, data: DataDir):
    """BertForMaskedLM of the same dimensions, the library's defaults otherwise."""
    from transformers import BertConfig, BertForMaskedLM

    m = cfg.model
    config = BertConfig(
        vocab_size=data.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads, intermediate_size=m.ffn_input_width,
        max_position_embeddings=max(512, data.seq_len), pad_token_id=data.special_ids["[PAD]"],
    )
    return BertForMaskedLM(config)


def train_hf(cfg: Config, data: DataDir, seconds: float, lr: float, warmup: float,
             seed: int, device_info: DeviceInfo) -> tuple[torch.nn.Module, dict]:
    """A plain PyTorch loop over the same batches, under the same wall-clock budget."""
    from transformers import DataCollatorForLanguageModeling, get_linear_schedule_with_warmup

    torch.manual_seed(seed)
    device = device_info.device
    model = hf_model(cfg, data).to(device)
    tokenizer = hf_tokenizer(data)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15,
                                               return_tensors="pt")
    batch_size = cfg.train.batch_size

    def make_batch(ids: torch.Tensor) -> dict:
        batch = collator([{"input_ids": row} for row in ids])
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    def step(m, opt, sched, batch) -> float:
        with device_info.autocast():
            loss = m(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    # Estimate the step count: time a few steps of a throwaway copy (before the clock starts).
    probe = copy.deepcopy(model).train()
    probe_opt = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=0.01)
    probe_loader = BatchLoader(data.split("train"), batch_size, seed + 1, prefetch=0)
    for _ in range(2):
        step(probe, probe_opt, None, make_batch(next(probe_loader)))
    n_probe, t = 6, time.perf_counter()
    for _ in range(n_probe):
        step(probe, probe_opt, None, make_batch(next(probe_loader)))
    step_seconds = (time.perf_counter() - t) / n_probe
    del probe, probe_opt
    max_steps = max(10, int(seconds / step_seconds))
    console.print(f"HF: ~{step_seconds:.3f} s/step measured → schedule over {max_steps} steps")

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(warmup * max_steps), max_steps)
    loader = BatchLoader(data.split("train"), batch_size, cfg.train.seed)  # our loop's order
    model.train()
    steps = tokens = 0
    losses: list[float] = []
    start = time.perf_counter()
    while steps < max_steps and time.perf_counter() - start < seconds:
        ids = next(loader)
        losses.append(step(model, optimizer, scheduler, make_batch(ids)))
        steps += 1
        tokens += ids.numel()
        if steps % 20 == 0:
            elapsed = time.perf_counter() - start
            console.print(f"HF step {steps}/{max_steps}: loss {np.mean(losses[-20:]):.3f}, "
                          f"{tokens / elapsed:,.0f} tok/s, {elapsed:.0f}/{seconds:.0f} s")
    train_seconds = time.perf_counter() - start
    loader.close()
    tail = losses[-max(1, len(losses) // 20):]
    return model.eval(), {
        "recipe": "BertForMaskedLM + DataCollatorForLanguageModeling(0.15, 80/10/10), AdamW "
                  f"(lr {lr}, wd 0.01), linear warmup {warmup:.0%} / decay, clip 1.0, "
                  f"{device_info.dtype} compute, plain loop",
        "intermediate_size": model.config.intermediate_size,
        "params": sum(p.numel() for p in model.parameters()),
        "attention": model.config._attn_implementation,
        "estimated_step_seconds": step_seconds,
        "scheduled_steps": max_steps,
        "steps": steps,
        "tokens": tokens,
        "train_seconds": train_seconds,
        "tokens_per_s": tokens / train_seconds,
        "first_loss": losses[0],
        "final_train_loss": float(np.mean(tail)),
        "stopped_by": "steps" if steps >= max_steps else "budget",
    }


# ---------------------------------------------------------------------------- scoring


@torch.no_grad()
def score_both(ours: torch.nn.Module, theirs: torch.nn.Module, data: DataDir, cfg: Config,
               max_sequences: int, device_info: DeviceInfo) -> dict:
    """MLM loss of both models on the same fixed-mask validation batches (the run's autocast)."""
    device = device_info.device
    ours = ours.to(device)
    val = data.split("val", verify=True)
    n = min(len(val), max_sequences)
    ev = cfg.eval
    mask_id, vocab = data.special_ids[MASK], data.vocab_size
    nll = {"shoestring": 0.0, "hf": 0.0}
    correct = {"shoestring": 0, "hf": 0}
    count = 0
    for start in range(0, n, ev.batch_size):
        ids = torch.from_numpy(val.take(np.arange(start, min(start + ev.batch_size, n))))
        batch = fixed_masks(ids, start, ev, mask_id, vocab)
        targets = batch.targets.flatten()
        inputs, positions = batch.inputs.to(device), batch.positions.to(device)
        with device_info.autocast():
            ours_logits = ours(inputs, positions)
            hf_all = theirs(input_ids=inputs).logits  # (B, T, V)
        hf_logits = hf_all.gather(1, positions[..., None].expand(-1, -1, hf_all.shape[-1])).cpu()
        ours_logits = ours_logits.cpu()
        for name, logits in (("shoestring", ours_logits), ("hf", hf_logits)):
            logits = logits.float().flatten(0, 1)
            nll[name] += F.cross_entropy(logits, targets, reduction="sum").item()
            correct[name] += (logits.argmax(-1) == targets).sum().item()
        count += targets.numel()
    return {
        "sequences": n, "masked_tokens": count, "mask_rate": ev.mask_rate, "mask_seed": ev.seed,
        **{f"{k}_loss": v / count for k, v in nll.items()},
        **{f"{k}_accuracy": v / count for k, v in correct.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", default="10m", help="wall clock per recipe: 60s, 10m (default)")
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--data", type=Path, default=ROOT / "runs" / "bench" / "mixed-en-data",
                    help="data dir to reuse (prepared from --corpus when absent)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "cram_vs_hf",
                    help="folder for our run dir")
    ap.add_argument("--out", type=Path, required=True, help="JSON results file to write")
    ap.add_argument("--eval-sequences", type=int, default=4096, help="validation sequences (cap)")
    ap.add_argument("--hf-lr", type=float, default=5e-4)
    ap.add_argument("--hf-warmup", type=float, default=0.06, help="warmup fraction of the steps")
    ap.add_argument("--order", choices=["ours-first", "hf-first"], default="ours-first")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="compute precision for BOTH recipes (auto: shoestring's measured choice)")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="override shoestring's config (section.key=value), e.g. model dims")
    args = ap.parse_args()

    seconds = parse_duration(args.budget)
    # One precision for both: resolved once here (auto measures fp32 vs bf16 matmuls), then
    # pinned in our config so our loop cannot choose differently.
    device_info = select_device(args.precision, measure_peak=False)
    precision = precision_name(device_info.dtype)
    cfg = load_config(None, [f"train.budget={args.budget}", "train.steps=null",
                             f"train.precision={precision}", *args.sets])
    data = ensure_data(args.data, args.corpus, cfg)
    results: dict = {
        "budget": args.budget, "budget_seconds": seconds,
        "data_dir": str(args.data.resolve()), "seq_len": data.seq_len, "vocab": data.vocab_size,
        "model_dims": {**{k: getattr(cfg.model, k) for k in
                          ("hidden_size", "num_layers", "num_heads", "intermediate_size", "ffn")},
                       "ffn_input_width": cfg.model.ffn_input_width},
        "batch_size": cfg.train.batch_size,
        "precision": f"{precision} for both ({args.precision} requested)",
        "machine": {"device": device_info.name, "cpu": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": sys.version.split()[0], "load_average_start": load_average()},
    }
    import transformers

    results["machine"]["transformers"] = transformers.__version__

    def run_ours() -> None:
        load = load_average()
        run_dir = args.work / "shoestring"
        summary = train(cfg, args.data, run_dir, overwrite=True, console=console)
        results["shoestring"] = {
            "recipe": "shoestring defaults (train.loop.train)", "run_dir": str(run_dir),
            "load_average_before": load, "load_average_after": load_average(),
            **{k: summary[k] for k in ("params", "steps", "tokens", "train_seconds",
                                         "tokens_per_s", "mfu", "first_loss", "final_train_loss")},
        }

    trained: dict = {}

    def run_hf() -> None:
        load = load_average()
        model, info = train_hf(cfg, data, seconds, args.hf_lr, args.hf_warmup, cfg.train.seed,
                               device_info)
        results["hf"] = {"load_average_before": load, "load_average_after": load_average(), **info}
        trained["hf"] = model
        # Saved so the downstream benchmark (bench/glue_after_pretrain.py) can fine-tune it.
        hf_dir = args.work / "hf"
        model.save_pretrained(hf_dir)
        hf_tokenizer(data).save_pretrained(hf_dir)
        results["hf"]["saved_to"] = str(hf_dir)

    for fn in ((run_ours, run_hf) if args.order == "ours-first" else (run_hf, run_ours)):
        fn()

    ours, _ = RunDir(args.work / "shoestring").load_final()
    console.print(f"scoring both on up to {args.eval_sequences} validation sequences")
    scores = score_both(ours, trained["hf"], data, cfg, args.eval_sequences, device_info)
    official = evaluate_run(args.work / "shoestring", args.data, console=console,
                            overrides=[f"eval.max_sequences={args.eval_sequences}"])
    results["heldout"] = {**scores, "shoestring_eval_cli_loss": official["mlm_loss"],
                          "unigram_loss": official["unigram_loss"]}
    ours_tps, hf_tps = results["shoestring"]["tokens_per_s"], results["hf"]["tokens_per_s"]
    results["tokens_per_s_ratio"] = ours_tps / hf_tps
    results["loss_delta"] = scores["hf_loss"] - scores["shoestring_loss"]
    results["targets"] = {"lower_heldout_loss": scores["shoestring_loss"] < scores["hf_loss"],
                          "tokens_per_s_at_least_2x": ours_tps >= 2 * hf_tps}
    results["machine"]["load_average_end"] = load_average()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, results)

    s, h = results["shoestring"], results["hf"]
    machine = results["machine"]
    print(f"budget {args.budget} each on {machine['device']}, {precision}; load average start "
          f"{machine['load_average_start']}, end {machine['load_average_end']}")
    print(f"{'':12} {'params':>8} {'steps':>6} {'tokens':>10} {'tok/s':>8} {'held-out loss':>14}")
    rows = (("shoestring", s, scores["shoestring_loss"]), ("HF BERT", h, scores["hf_loss"]))
    for name, r, loss in rows:
        print(f"{name:12} {r['params'] / 1e6:7.2f}M {r['steps']:6d} {r['tokens']:10,d} "
              f"{r['tokens_per_s']:8,.0f} {loss:14.3f}")
    print(f"tokens/s ratio {results['tokens_per_s_ratio']:.2f}x; held-out loss shoestring "
          f"{scores['shoestring_loss']:.3f} vs HF {scores['hf_loss']:.3f} on "
          f"{scores['masked_tokens']:,} masked tokens ({scores['sequences']} sequences); "
          f"`shoestring eval` cross-check {official['mlm_loss']:.3f}; unigram "
          f"{official['unigram_loss']:.3f}")
    print(f"wrote {args.out}")
    if not math.isfinite(scores["hf_loss"]):
        sys.exit("HF loss is not finite")


if __name__ == "__main__":
    main()
