"""AdamW vs a Muon candidate at equal wall clock: would `train.optimizer=muon` earn its place?

The trainer issue asks for one modern optimizer alternative, kept only if it reaches a lower
held-out loss than AdamW at equal budget here. The candidate lives in this script, not in
the product, because it did not (see docs/benchmarks/train.md): `torch.optim.Muon` (Newton–Schulz
orthogonalized Nesterov momentum 0.95) on the transformer blocks' 2-D weight matrices, AdamW
(the trainer's own settings) on embeddings, the prediction head and every 1-D gain. It is
injected into the real training loop in place of `build_optimizer`; everything else — data
dir, model, one-cycle schedule (it scales every group's lr), batch, seed, wall-clock budget,
checkpoints — is the trainer's.

Muon's learning rate: ``--muon-adjust match_rms_adamw`` scales each matrix's update to
AdamW's RMS (Moonshot, "Muon is Scalable for LLM Training") so ``train.lr`` is reused;
``--muon-adjust original --muon-lr-mult 10`` is Keller Jordan's setting (lr 0.02 when AdamW
runs 2e-3). Runs are interleaved (adamw, muon, adamw, muon, ...) with seeds 0, 1, ..., and
each is scored by `shoestring eval`'s fixed-mask held-out MLM loss on the same sequences.

    python bench/optimizer.py --budget 3m --repeats 2 --out runs/bench/optimizer.json
    python bench/optimizer.py --budget 3m --repeats 1 --muon-adjust original --muon-lr-mult 10 \\
        --out runs/bench/optimizer-original.json
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from common import ROOT, Bench, add_repeats, load_average, parser
from shoestring.config import TrainConfig, load_config
from shoestring.eval.mlm_loss import evaluate_run
from shoestring.fsutil import write_json_atomic
from shoestring.train import loop, optim
from shoestring.train.optim import build_optimizer, param_groups

console = Console(stderr=True)


class OptimizerSet:
    """Two torch optimizers stepped as one: what the loop and its checkpoints use."""

    def __init__(self, **optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers.values() for g in o.param_groups]

    def step(self) -> None:
        for o in self.optimizers.values():
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers.values():
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: o.state_dict() for name, o in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, o in self.optimizers.items():
            o.load_state_dict(state[name])


def muon_builder(adjust: str, lr_mult: float):
    """A `build_optimizer` replacement: Muon on block matrices, AdamW on the rest."""

    class ScaledMuon(torch.optim.Muon):
        """Muon whose lr is ``lr_mult`` × the lr the schedule sets on its groups."""

        def step(self, closure=None):
            scheduled = [g["lr"] for g in self.param_groups]
            for g in self.param_groups:
                g["lr"] *= lr_mult
            try:
                return super().step(closure)
            finally:
                for g, lr in zip(self.param_groups, scheduled):
                    g["lr"] = lr

    def build(model: nn.Module, cfg: TrainConfig) -> OptimizerSet:
        hidden = [p for n, p in model.named_parameters()
                  if p.requires_grad and p.dim() == 2 and n.startswith("layers.")]
        ids = {id(p) for p in hidden}
        rest = nn.ParameterList([p for p in model.parameters() if id(p) not in ids])
        muon = ScaledMuon(hidden, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=0.95,
                          nesterov=True, adjust_lr_fn=adjust)
        adamw = torch.optim.AdamW(param_groups(rest, cfg.weight_decay), lr=cfg.lr,
                                  betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True)
        return OptimizerSet(muon=muon, adamw=adamw)

    return build


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--budget", default="3m")
    add_repeats(ap, 2, "interleaved rounds (seeds 0, 1, ...); the median is reported")
    ap.add_argument("--muon-adjust", default="match_rms_adamw",
                    choices=["match_rms_adamw", "original"])
    ap.add_argument("--muon-lr-mult", type=float, default=1.0,
                    help="Muon's lr = this × the scheduled lr")
    ap.add_argument("--data", type=Path, default=ROOT / "runs" / "bench" / "mixed-en-data",
                    help="a prepared data dir (bench/cram_vs_hf.py prepares this one)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "optimizer")
    ap.add_argument("--eval-sequences", type=int, default=2048)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not (args.data / "manifest.json").is_file():
        raise SystemExit(f"no prepared data dir at {args.data}: run bench/cram_vs_hf.py once, "
                         "or `shoestring prep` a corpus there and pass --data")

    bench = Bench("optimizer", args, precision="train.precision=auto (the trainer's choice)")
    builders = {"adamw": build_optimizer,
                "muon": muon_builder(args.muon_adjust, args.muon_lr_mult)}
    runs: list[dict] = []
    for seed in range(args.repeats):
        for name, builder in builders.items():
            cfg = load_config(None, [f"train.budget={args.budget}", "train.steps=null",
                                     f"train.seed={seed}", *args.sets])
            run_dir = args.work / f"{name}-seed{seed}"
            load = (load_average() or [None])[0]
            optim.build_optimizer = builder  # build_optimizers looks it up per call
            try:
                summary = loop.train(cfg, args.data, run_dir, overwrite=True, console=console)
            finally:
                optim.build_optimizer = build_optimizer
            ev = evaluate_run(run_dir, args.data, console=console,
                              overrides=[f"eval.max_sequences={args.eval_sequences}"])
            runs.append({"optimizer": name, "seed": seed, "load_before": load,
                         "steps": summary["steps"], "tokens_per_s": summary["tokens_per_s"],
                         "heldout_loss": ev["mlm_loss"]})
            console.print(runs[-1])
    medians = {n: statistics.median(r["heldout_loss"] for r in runs if r["optimizer"] == n)
               for n in builders}
    result = {"budget": args.budget, "repeats": args.repeats, "sets": args.sets,
              "muon": {"adjust_lr_fn": args.muon_adjust, "lr_mult": args.muon_lr_mult},
              "runs": runs, "median_heldout_loss": medians,
              "muon_lower": medians["muon"] < medians["adamw"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)
    print(f"{'optimizer':10} {'seed':>4} {'steps':>6} {'tok/s':>8} {'held-out loss':>14}")
    for r in runs:
        print(f"{r['optimizer']:10} {r['seed']:4d} {r['steps']:6d} {r['tokens_per_s']:8,.0f} "
              f"{r['heldout_loss']:14.4f}")
    verdict = (f"median held-out loss: adamw {medians['adamw']:.4f}, muon {medians['muon']:.4f} "
               f"({'muon lower' if result['muon_lower'] else 'adamw lower or equal'})")
    print(verdict)
    print(f"wrote {args.out}")
    bench.table([{"optimizer": r["optimizer"], "seed": r["seed"], "steps": r["steps"],
                  "tok/s": r["tokens_per_s"], "held-out loss": r["heldout_loss"],
                  "load before": r["load_before"]} for r in runs],
                formats={"tok/s": ",.0f", "held-out loss": ".4f", "load before": ".2f"},
                notes=[f"budget {args.budget} each; muon {args.muon_adjust}, lr x "
                       f"{args.muon_lr_mult:g}", verdict])
    bench.end()


if __name__ == "__main__":
    main()
