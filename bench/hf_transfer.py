"""What a Hugging Face user gets from an export: fine-tuned with plain transformers, against its scratch twin.

A shoestring encoder is pretrained (the default recipe, a token budget, so machine load does
not change it), exported (`shoestring export`) and fine-tuned the way a transformers user
would: `AutoModelForSequenceClassification.from_pretrained(EXPORT, num_labels=...,
classifier_pooling=...)`, `AutoTokenizer`, torch AdamW (transformers' Trainer defaults: betas
0.9/0.999, eps 1e-8, no weight decay, linear decay to 0, no warmup), batch 16, 3 epochs. The
scratch twin is `AutoModelForSequenceClassification.from_config` on the same config: the same
architecture with transformers' own initialisation, so the paired difference (the same seed
gives both arms the same batch order) is what the pretrained
weights buy through this path. The grid is pooling (`cls`, ModernBERT's default, or `mean`)
× learning rate; each cell prints both arms, the paired difference with its 95% interval
and a verdict (eval/control.py), and the weight scale of each arm's encoder.

    python bench/hf_transfer.py --data DATA_DIR --tokens 12M --tasks sst2,cola --seeds 3
    python bench/hf_transfer.py --run runs/x --tasks sst2 --poolings mean --lrs 1e-4

Each fine-tune's score is kept in OUT/results.jsonl, so a rerun with the same arguments
resumes where it stopped. Needs transformers (a dev dependency) and the GLUE folder.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from common import ROOT, SHARED, Bench, parser
from jobs import log, pretrain
from shoestring.config import Config
from shoestring.eval.control import compare_arms
from shoestring.eval.glue import load_glue_task
from shoestring.eval.metrics import compute_metrics, main_score
from shoestring.eval.tasks import TaskData
from shoestring.export.hf import export_encoder

console = Console(stderr=True)
BATCH, EPOCHS = 16, 3.0
MAX_LENGTH = 128


def pretrained_run(data: Path, run: Path, tokens: str, threads: int | None) -> Path:
    """The default recipe pretrained on ``data`` for ``tokens`` (reused when finished)."""
    cfg = Config.model_validate({"train": {"budget": f"{tokens}tok", "threads": threads}})
    pretrain(cfg, data, run, console=console)
    return run


def exported(run: Path, out: Path) -> Path:
    """The run's Hugging Face export (made once)."""
    if not (out / "config.json").is_file():
        export_encoder(run, out, overwrite=True)
    return out


def encoder_scale(model: torch.nn.Module) -> float:
    """RMS over the encoder's matrices (not the new classifier): how large the weights a
    fine-tune starts from are, so the two arms' initial scales can be compared."""
    sq, n = 0.0, 0
    for name, p in model.named_parameters():
        if p.ndim == 2 and not name.startswith("classifier"):
            sq += float((p.detach().double() ** 2).sum())
            n += p.numel()
    return math.sqrt(sq / max(n, 1))


def redraw_head(model: torch.nn.Module) -> None:
    """Draw the head that ModernBertForSequenceClassification reuses from the MLM head
    (``head.dense`` + ``head.norm``) afresh, as transformers' own init draws it
    (``_init_weights`` skips weights that were loaded, so it is done here by hand)."""
    c = model.config
    std = c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers)
    cut = (c.initializer_cutoff_factor or 3.0) * std
    with torch.no_grad():
        torch.nn.init.trunc_normal_(model.head.dense.weight, std=std, a=-cut, b=cut)
        torch.nn.init.ones_(model.head.norm.weight)
        for p in (model.head.dense.bias, getattr(model.head.norm, "bias", None)):
            if p is not None:
                torch.nn.init.zeros_(p)


def build(export: Path, arm: str, pooling: str, num_labels: int, seed: int) -> torch.nn.Module:
    """The model a user gets: the export's weights, or its config from transformers' init."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    if arm in ("pretrained", "pretrained-newhead"):
        model = AutoModelForSequenceClassification.from_pretrained(
            export, num_labels=num_labels, classifier_pooling=pooling)
        if arm == "pretrained-newhead":
            redraw_head(model)
        return model
    cfg = AutoConfig.from_pretrained(export, num_labels=num_labels, classifier_pooling=pooling)
    return AutoModelForSequenceClassification.from_config(cfg)


def encode(tokenizer: Any, task: TaskData, rows: list) -> tuple[list[dict], np.ndarray]:
    labels = task.spec.labels or []
    enc = tokenizer([r.a for r in rows], *([[r.b for r in rows]] if task.spec.pair else []),
                    truncation=True, max_length=MAX_LENGTH)
    items = [{k: enc[k][i] for k in ("input_ids", "attention_mask")} for i in range(len(rows))]
    return items, np.array([labels.index(str(r.label)) for r in rows])


def batches(tokenizer: Any, items: list[dict], order: np.ndarray, size: int):
    for i in range(0, len(order), size):
        idx = order[i:i + size]
        yield idx, tokenizer.pad([items[j] for j in idx], return_tensors="pt")


def finetune(export: Path, task: TaskData, arm: str, pooling: str, lr: float,
             seed: int) -> dict[str, Any]:
    """One fine-tune, plain torch + transformers; returns the dev score and the start scale."""
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    tokenizer = AutoTokenizer.from_pretrained(export)
    model = build(export, arm, pooling, task.spec.num_labels, seed)
    scale = encoder_scale(model)
    train_items, train_y = encode(tokenizer, task, task.train)
    dev_items, dev_y = encode(tokenizer, task, task.evals["dev"])
    steps_per_epoch = math.ceil(len(train_items) / BATCH)
    total = int(steps_per_epoch * EPOCHS)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    sched = get_linear_schedule_with_warmup(opt, 0, total)
    rng = np.random.default_rng(seed)
    model.train()
    step = 0
    while step < total:
        for idx, batch in batches(tokenizer, train_items, rng.permutation(len(train_items)), BATCH):
            out = model(**batch, labels=torch.as_tensor(train_y[idx]))
            out.loss.backward()
            opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
            step += 1
            if step >= total:
                break
    model.eval()
    preds = []
    with torch.no_grad():
        for _, batch in batches(tokenizer, dev_items, np.arange(len(dev_items)), 128):
            preds.append(model(**batch).logits.argmax(-1).numpy())
    scores = compute_metrics(task.spec.metrics, dev_y, np.concatenate(preds))
    return {"score": main_score(scores, task.spec.metrics), "scores": scores,
            "encoder_rms": scale, "steps": total}


def ours(run: Path, glue: Path, name: str, pooling: str, lr: float, seeds: int,
         max_train: int, out: Path) -> dict[str, Any]:
    """The same fine-tune through shoestring's own path (`shoestring eval --control
    scratch`: our classifier head, our scratch twin), with the settings above; resumable."""
    from shoestring.eval.downstream import evaluate_downstream

    res = evaluate_downstream(
        run, glue, tasks=name, seeds=seeds, out=out, max_train=max_train, precision="fp32",
        overrides={"lr": lr, "epochs": EPOCHS, "batch_size": BATCH, "warmup": 0.0,
                   "beta2": 0.999, "eps": 1e-8, "pooling": pooling, "dropout": 0.0},
        control="scratch", console=console, resume=(out / "results.json").is_file())
    return res["tasks"][name]["comparison"]["dev"]


def key(r: dict[str, Any]) -> tuple:
    return (r["task"], r["arm"], r["pooling"], r["lr"], r["seed"])


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--data", type=Path, help="data dir to pretrain on (prepped by shoestring prep)")
    ap.add_argument("--run", type=Path, help="an existing finished run to export instead")
    ap.add_argument("--tokens", default="12M", help="pretraining budget in tokens (12M)")
    ap.add_argument("--threads", type=int, default=None, help="pretraining threads")
    ap.add_argument("--glue", type=Path, default=SHARED / "glue")
    ap.add_argument("--tasks", default="sst2,cola")
    ap.add_argument("--poolings", default="cls,mean")
    ap.add_argument("--lrs", default="1e-4,3e-4")
    ap.add_argument("--arms", default="pretrained,scratch",
                    help="pretrained, scratch (the from_config twin) and pretrained-newhead "
                    "(the export with the reused MLM head dense+norm redrawn); the first is "
                    "compared with scratch")
    ap.add_argument("--ours", action="store_true",
                    help="also fine-tune through shoestring's own path (our head and scratch "
                    "control) with the same settings, for a row 'shoestring' beside each cell")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-train", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "hf_transfer")
    args = ap.parse_args()
    if args.run is None and args.data is None:
        ap.error("give --data (to pretrain) or --run (a finished run)")
    import transformers

    bench = Bench("hf_transfer", args, precision="float32", transformers=transformers.__version__)
    args.out.mkdir(parents=True, exist_ok=True)
    run = args.run or pretrained_run(args.data, args.out / f"pretrain-{args.tokens}",
                                     args.tokens, args.threads)
    export = exported(run, args.out / f"export-{run.name}")
    summary = json.loads((run / "summary.json").read_text())
    results_path = args.out / f"results-{run.name}.jsonl"
    done = {}
    if results_path.is_file():
        for line in results_path.read_text().splitlines():
            r = json.loads(line)
            done[key(r)] = r
    poolings = args.poolings.split(",")
    lrs = [float(x) for x in args.lrs.split(",")]
    rows = []
    for name in args.tasks.split(","):
        task = load_glue_task(args.glue, name, max_train=args.max_train)
        for pooling in poolings:
            for lr in lrs:
                arms: dict[str, list] = {a: [] for a in args.arms.split(",")}
                for seed in range(args.seeds):
                    for arm in arms:
                        k = (name, arm, pooling, lr, seed)
                        if k not in done:
                            t0 = time.time()
                            r = finetune(export, task, arm, pooling, lr, seed)
                            r.update(task=name, arm=arm, pooling=pooling, lr=lr, seed=seed,
                                     seconds=round(time.time() - t0, 1))
                            with open(results_path, "a") as f:
                                f.write(json.dumps(r) + "\n")
                            done[k] = r
                            log(f"{name} {arm} {pooling} lr {lr:g} seed {seed}: "
                                f"{100 * r['score']:.1f}")
                        arms[arm].append({"seed": seed, "splits": {"dev": {"score": done[k]["score"]}}})
                if args.ours:
                    cmp = ours(run, args.glue, name, pooling, lr, args.seeds, args.max_train,
                               args.out / f"ours-{run.name}-{name}-{pooling}-{lr:g}")
                    ci = cmp["ci95"]
                    rows.append({"task": name, "pooling": pooling, "lr": lr, "arm": "shoestring",
                                 "arm_score": cmp["pretrained_median"],
                                 "scratch": cmp["scratch_median"],
                                 "difference": cmp["difference_mean"],
                                 "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None,
                                 "verdict": cmp["verdict"], "rms_arm": float("nan"),
                                 "rms_scratch": float("nan")})
                rms = {a: np.mean([done[(name, a, pooling, lr, s)]["encoder_rms"]
                                   for s in range(args.seeds)]) for a in arms}
                for arm in [a for a in arms if a != "scratch"]:
                    cmp = compare_arms(arms[arm], arms["scratch"], "dev")
                    ci = cmp["ci95"]
                    rows.append({"task": name, "pooling": pooling, "lr": lr, "arm": arm,
                                 "arm_score": cmp["pretrained_median"],
                                 "scratch": cmp["scratch_median"],
                                 "difference": cmp["difference_mean"],
                                 "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None,
                                 "verdict": cmp["verdict"], "rms_arm": rms[arm],
                                 "rms_scratch": rms["scratch"]})
    print(f"pretraining: default recipe, {summary.get('tokens', 0):,} tokens, val MLM "
          f"(subset) {summary.get('val_loss_subset', float('nan')):.3f}; run {run}")
    print(f"fine-tuning: transformers AutoModelForSequenceClassification, AdamW (0.9, 0.999, "
          f"1e-8, wd 0), linear decay, batch {BATCH}, {EPOCHS:g} epochs, first {args.max_train} "
          f"train rows, {args.seeds} seeds; scratch = from_config twin (transformers' init)")
    print(f"{'task':6} {'pool':5} {'lr':>7} {'arm':18} {'arm':>6} {'scratch':>7} "
          f"{'diff [95% CI]':>22} {'rms arm/scr':>13}  verdict")
    for r in rows:
        ci = (f"[{r['ci_low']:+.1f}, {r['ci_high']:+.1f}]" if r["ci_low"] is not None else "")
        print(f"{r['task']:6} {r['pooling']:5} {r['lr']:7.0e} {r['arm']:18} {r['arm_score']:6.1f} "
              f"{r['scratch']:7.1f} {r['difference']:+6.1f} {ci:>15} "
              f"{r['rms_arm']:6.3f}/{r['rms_scratch']:.3f}  {r['verdict']}")
    bench.table(rows, formats={"arm_score": ".1f", "scratch": ".1f", "difference": "+.1f",
                               "ci_low": "+.1f", "ci_high": "+.1f", "rms_arm": ".3f",
                               "rms_scratch": ".3f"})
    bench.end()


if __name__ == "__main__":
    main()
