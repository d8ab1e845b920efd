"""What `train.precision=auto`'s start-up probe costs, and what it measures, per dtype.

Every `train` and `cram` with the default precision on a CPU times dense matmuls in fp32 and
bf16 before its clock starts (`shoestring.device.select_device`). On a CPU without bf16 units
a bf16 product is ~100x slower than fp32, so the probe at a fixed 1024 x 1024 (before
2026-11-29) cost there seconds per product. The probe now grows its operands only while a
product stays under a quarter of its 0.4 s (`device.probe_operands`). This times both, side
by side in one process, fresh (no cache): the probe as `train` runs it, and the fixed-size
probe it replaced (3 warm-up products, then bursts of 4 for 0.4 s, as it was).

    python bench/precision_probe.py

Prints, per dtype and probe: the operand size, the GFLOP/s it measured and the seconds it
took, with the machine and load average; then the dtype `auto` chose.
"""

from __future__ import annotations

import time

import torch

from common import Bench, parser
from shoestring.device import _measure, probe_operands, select_device


def fixed_probe(dtype: torch.dtype, n: int = 1024, seconds: float = 0.4) -> float:
    """The probe before 2026-11-29: FLOP/s of n x n products, best burst of 4."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t))
    return best


def main() -> None:
    args = parser(__doc__).parse_args()
    bench = Bench("precision_probe", args, precision="fp32 and bf16 (each row)")
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        _measure.cache_clear()
        start = time.perf_counter()
        flops = _measure("cpu", dtype, 0.4, torch.get_num_threads())
        now = time.perf_counter() - start
        size = probe_operands("cpu", dtype, 0.4)[0].shape[0]  # the size it grows to (again)
        start = time.perf_counter()
        old = fixed_probe(dtype)
        before = time.perf_counter() - start
        for probe, n, f, s in (("bounded (now)", size, flops, now),
                               ("fixed 1024 (before)", 1024, old, before)):
            print(f"{name:9s} {probe:20s} n={n:5d} {f / 1e9:8.1f} GFLOP/s {s:6.2f} s",
                  flush=True)
            rows.append({"dtype": name, "probe": probe, "n": n, "GFLOP/s": f / 1e9,
                         "seconds": s})
    _measure.cache_clear()
    chosen = select_device("auto").dtype
    print(f"auto chose {chosen}")
    bench.table(rows, formats={"GFLOP/s": ".1f", "seconds": ".2f"},
                notes=[f"`auto` chose {str(chosen).removeprefix('torch.')} "
                       "(bf16 only where it beats fp32 by 30%)"])
    bench.end()


if __name__ == "__main__":
    main()
