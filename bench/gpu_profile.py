"""Where the trainer's GPU step spends its time: the step `train` runs (`time_steps`, the same
build as a run), compiled, in bf16, at a model shape and a sweep of micro-batch sizes, with
the MFU of each and a kernel breakdown of one (torch.profiler, grouped into GEMMs, attention,
the optimizer, elementwise/fused kernels and copies).

bench/gpu.py says how fast a whole run is beside the Hugging Face peer; this says why, so the
next change to the step is aimed (docs/gpu.md). GPU only: on a machine without CUDA it exits 2.

    python bench/gpu_profile.py --preset base --seq-len 128 --vocab 32768 --batches 128,256,512
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any

from common import Bench, parser

GROUPS = (  # first match wins; kernel names lower-cased
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "wgmma", "matmul")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
    ("copy/memset", ("memcpy", "memset", "copy_")),
    ("fused (triton)", ("triton",)),
)


def group(name: str) -> str:
    low = name.lower()
    if low.startswith("triton_"):  # inductor's fused kernels (their names list the ops fused)
        return "fused (triton)"
    for g, keys in GROUPS:
        if any(k in low for k in keys):
            return g
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--preset", default="base", help="model.preset (default: base)")
    ap.add_argument("--objective", default="mlm", choices=("mlm", "clm"))
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--batches", default="128,256,512",
                    help="micro-batch sizes to time, comma-separated (one step = one)")
    ap.add_argument("--profile-batch", type=int, default=None,
                    help="the batch the kernel breakdown is taken at (default: the first)")
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per batch size")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="extra config overrides (key=value)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("error: torch.cuda.is_available() is False: this profile is for a GPU",
              file=sys.stderr)
        return 2
    from shoestring.config import load_config
    from shoestring.train.timing import time_steps

    bench = Bench("gpu_profile", args, precision="bf16", device=torch.cuda.get_device_name(0))
    batches = [int(b) for b in args.batches.split(",")]
    profile_at = args.profile_batch or batches[0]

    def cfg_for(batch: int) -> Any:
        return load_config(None, [
            f"model.preset={args.preset}", f"model.objective={args.objective}",
            f"data.seq_len={args.seq_len}", f"data.vocab_size={args.vocab}",
            "train.budget=null", "train.steps=1", "train.precision=bf16",
            f"train.compile={'true' if args.compile else 'false'}", "train.attention=auto",
            f"train.batch_size={batch}", f"train.micro_batch_size={batch}", *args.sets])

    rows: list[dict[str, Any]] = []
    for batch in batches:
        t = time_steps(cfg_for(batch), args.vocab, args.seq_len, seconds=args.seconds,
                       warmup=3)
        peak = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
        rows.append({"batch": batch, "tokens_per_s": t.tokens_per_s,
                     "mfu_measured_peak": t.mfu, "tflops": t.tokens_per_s * t.flops_per_token
                     / 1e12, "peak_gib": peak, "speed": t.speed})
        print(f"  batch {batch}: {t.tokens_per_s:,.0f} tok/s, {rows[-1]['tflops']:.0f} TFLOP/s, "
              f"MFU {t.mfu:.1%} of the measured peak, peak {peak:.1f} GiB ({t.speed})",
              flush=True)
    bench.table(rows, "sweep", formats={"tokens_per_s": ",.0f", "mfu_measured_peak": ".1%",
                                        "tflops": ".0f", "peak_gib": ".1f"},
                notes=[f"model.preset={args.preset}, {args.objective}, seq {args.seq_len}, "
                       f"vocab {args.vocab}, bf16, compile {args.compile}; one micro-batch "
                       "per step; MFU against the measured bf16 matmul peak"])

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        time_steps(cfg_for(profile_at), args.vocab, args.seq_len, seconds=2.0, warmup=3)
    by_group: dict[str, float] = defaultdict(float)
    kernels: list[tuple[float, str, int]] = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0.0)
        if us <= 0 or e.key.startswith("ProfilerStep"):
            continue
        by_group[group(e.key)] += us
        kernels.append((us, e.key, e.count))
    total = sum(by_group.values()) or 1.0
    groups = [{"group": g, "share": us / total, "ms": us / 1e3}
              for g, us in sorted(by_group.items(), key=lambda kv: -kv[1])]
    for g in groups:
        print(f"  {g['group']:<16} {g['share']:6.1%}  {g['ms']:9.1f} ms")
    for us, key, n in sorted(kernels, reverse=True)[:15]:
        print(f"    {us / total:6.1%} {n:6d}x  {key[:110]}")
    bench.table(groups, "kernels", formats={"share": ".1%", "ms": ".1f"},
                notes=[f"device time by kernel group at batch {profile_at} (warm-up and the "
                       "timed steps together; compile happens on the host)"])
    bench.end()
    return 0


if __name__ == "__main__":
    sys.exit(main())
