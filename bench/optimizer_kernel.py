"""AdamW's implementations on the trainer's parameters: one optimizer step, foreach vs fused.

`train/optim.py` picks ``fused`` for plain CPU/CUDA parameters; this measures the step it
replaces, on a preset's real parameter list (embeddings, matrices, norms; the trainer's
weight-decay groups) with random gradients, interleaved rounds, the median per side.

    python bench/optimizer_kernel.py [--presets tiny,mini] [--repeats 3] [--steps 30]
"""

from __future__ import annotations

import statistics
import sys
import time

from common import Bench, add_repeats, parser


def step_ms(model: object, kind: str, steps: int) -> float:
    """Mean milliseconds of one ``AdamW(kind=True).step()`` after three warm-up steps."""
    import torch

    from shoestring.train.optim import param_groups

    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3, **{kind: True})
    for _ in range(3):
        opt.step()
    t = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t) / steps * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--presets", default="tiny,mini")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=30)
    add_repeats(ap, 3)
    args = ap.parse_args(argv)
    import torch

    from shoestring.config import load_config
    from shoestring.model import build_model

    bench = Bench("optimizer_kernel", args, precision="fp32 (parameters and state)")
    rows = []
    for preset in args.presets.split(","):
        model = build_model(load_config(None, [f"model.preset={preset}"]).model, args.vocab)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        times: dict[str, list[float]] = {"foreach": [], "fused": []}
        for _ in range(args.repeats):
            for kind in times:
                times[kind].append(step_ms(model, kind, args.steps))
        foreach, fused = (statistics.median(times[k]) for k in ("foreach", "fused"))
        rows.append({"preset": preset, "params": sum(p.numel() for p in model.parameters()),
                     "foreach_ms": foreach, "fused_ms": fused, "speedup": foreach / fused})
        print(f"  {preset}: foreach {foreach:.2f} ms, fused {fused:.2f} ms per step "
              f"({foreach / fused:.1f}x); rounds {times}", flush=True)
    bench.table(rows, formats={"params": ",", "foreach_ms": ".2f", "fused_ms": ".2f",
                               "speedup": ".1f"},
                notes=[f"median of {args.repeats} interleaved rounds of {args.steps} steps; "
                       f"vocabulary {args.vocab}; torch.optim.AdamW(foreach=True) vs "
                       "(fused=True), the trainer's param groups"])
    bench.end()
    return 0


if __name__ == "__main__":
    sys.exit(main())
