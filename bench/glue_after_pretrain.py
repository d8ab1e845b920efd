"""Downstream scores after the headline pretraining: shoestring's model vs the HF baseline.

Takes the two models `bench/cram_vs_hf.py` leaves behind (our run dir and the saved
`BertForMaskedLM`) and fine-tunes each on GLUE dev tasks under the same `sane` protocol
(lr 4e-5, batch 16, 5 epochs, 10% warmup + cosine, max length 128; Cramming's GLUE-sane)
with the same fine-tuning code, the same tokenizer (both were pretrained on the same
tokenized data) and the same classification head on the [CLS] vector. Only the pretrained
body differs: ours is the run's encoder; theirs is the `BertModel` inside the saved
`BertForMaskedLM` (token type ids left at 0 for both, as our tokenizer does not emit them).

    python bench/glue_after_pretrain.py --out runs/bench/glue_after_pretrain.json
    python bench/glue_after_pretrain.py --tasks cola,mrpc --max-train 500 --out /tmp/g.json

Prints one row per model with the dev score of each task (×100: CoLA Matthews correlation,
SST-2 accuracy, MRPC mean of F1 and accuracy) and the wall time of each model's evaluation.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import torch
from rich.console import Console

from common import ROOT, SHARED, Bench, load_average, parser
from shoestring.data.tokenizer import load_tokenizer
from shoestring.eval.downstream import _load_tasks
from shoestring.eval.finetune import PROTOCOLS, Pretrained, TaskSettings, run_task
from shoestring.eval.glue import parse_task_list
from shoestring.eval.downstream_report import glue_averages, score_columns
from shoestring.fsutil import write_json_atomic
from shoestring.rundir import RunDir

WORK = ROOT / "runs" / "bench" / "cram_vs_hf"
GLUE = SHARED / "glue"
console = Console(stderr=True)


class HFBody(torch.nn.Module):
    """A transformers encoder behind the interface our classifier uses (``encode``, ``cfg``)."""

    def __init__(self, body: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.cfg = SimpleNamespace(hidden_size=hidden_size)

    def encode(self, ids: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = None if key_mask is None else key_mask.long()
        return self.body(input_ids=ids, attention_mask=mask).last_hidden_state


def load_hf_body(path: Path) -> HFBody:
    from transformers import BertForMaskedLM

    mlm = BertForMaskedLM.from_pretrained(path)
    return HFBody(mlm.bert, mlm.config.hidden_size)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--ours", type=Path, default=WORK / "shoestring", help="our run dir")
    ap.add_argument("--hf", type=Path, default=WORK / "hf", help="the saved BertForMaskedLM")
    ap.add_argument("--glue", type=Path, default=GLUE)
    ap.add_argument("--tasks", default="cola,sst2,mrpc")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--max-train", type=int, default=None, help="cap training examples (quick)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    ours, meta = RunDir(args.ours).load_final()
    tok_path = args.ours / "final" / "tokenizer.json"
    tokenizer = load_tokenizer(tok_path)
    data = _load_tasks(args.glue, parse_task_list(args.tasks), [], args.max_train)
    proto = PROTOCOLS["sane"]
    seeds = list(range(args.seeds))
    bodies = {"shoestring": lambda: ours, "hf": lambda: load_hf_body(args.hf)}
    bench = Bench("glue_after_pretrain", args, precision="auto (fine-tuning's choice)")
    results: dict = {"protocol": "sane", "seeds": seeds, "max_train": args.max_train,
                     "threads": torch.get_num_threads(), "machine": bench.header, "models": {}}
    for name, load in bodies.items():
        base = load()
        t0, load_start = time.perf_counter(), load_average()
        tasks = {}
        for d in data:
            console.print(f"[bold]{name}[/]: {d.spec.name}, {len(d.train):,} train examples")
            tasks[d.spec.name] = run_task(Pretrained(base, meta, tokenizer, tok_path), d,
                                          TaskSettings(proto, seeds), console=console)
        columns = score_columns(tasks)
        results["models"][name] = {
            "params": sum(p.numel() for p in base.parameters()),
            "columns": columns,
            "partial_mean": glue_averages(columns).get("partial_mean"),
            "tasks": {k: {"train_seconds": sum(s["train_seconds"] for s in v["seeds"]),
                          "eval_seconds": sum(s["eval_seconds"] for s in v["seeds"]),
                          "wall_seconds": v["wall_seconds"],
                          "examples_per_s": v["seeds"][0]["examples_per_s"],
                          "summary": v["summary"]} for k, v in tasks.items()},
            "wall_seconds": time.perf_counter() - t0,
            "load_average": [load_start, load_average()],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.out, results)

    names = [c["column"] for c in results["models"]["shoestring"]["columns"]]
    setting = (f"sane protocol, {len(seeds)} seed(s)"
               f"{', max-train ' + str(args.max_train) if args.max_train else ''}; dev scores x100")
    print(setting)
    print(f"{'model':12} " + " ".join(f"{n:>7}" for n in names) + f" {'mean':>7} {'wall s':>8}")
    rows = []
    for name, r in results["models"].items():
        vals = [c["median"] for c in r["columns"]]
        print(f"{name:12} " + " ".join(f"{v:7.1f}" for v in vals)
              + f" {sum(vals) / len(vals):7.1f} {r['wall_seconds']:8.0f}")
        rows.append({"model": name, **dict(zip(names, vals)), "mean": sum(vals) / len(vals),
                     "wall s": r["wall_seconds"]})
    print(f"wrote {args.out}")
    bench.table(rows, notes=[setting], formats={**{n: ".1f" for n in names}, "mean": ".1f",
                                                "wall s": ".0f"})
    bench.end()


if __name__ == "__main__":
    main()
