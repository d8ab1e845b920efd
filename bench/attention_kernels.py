"""The attention kernels `train.attention=auto` chooses between, timed at a few shapes.

Forward + backward of one layer's attention with `F.scaled_dot_product_attention` (sdpa) and
with `shoestring.model.layers.eager_attention` (two batched matmuls around an fp32 softmax),
through `shoestring.train.speed.time_attention` — the same probe the trainer runs before its
clock starts — interleaved, best of a burst each.

    python bench/attention_kernels.py

Prints, per shape and dtype, both times and their ratio, with the machine and load average.
"""

from __future__ import annotations

import torch

from common import Bench, parser
from shoestring.train.speed import time_attention

# (rows, heads, kv_heads, seq_len, head_dim, causal, what)
SHAPES = [
    (32, 4, 4, 128, 64, False, "the cram encoder's layer (batch 32 x 128)"),
    (32, 4, 4, 128, 64, True, "the clm-tiny decoder's layer (batch 32 x 128)"),
    (8, 8, 2, 512, 64, True, "a 512-token decoder layer, grouped-query (8 heads, 2 kv)"),
]


def main() -> None:
    args = parser(__doc__).parse_args()
    bench = Bench("attention_kernels", args, precision="bf16 and fp32 (each row)")
    rows = []
    for batch, heads, kv, T, hd, causal, what in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            t = time_attention(batch, heads, kv, T, hd, dtype, causal, seconds=1.0)
            name = str(dtype).removeprefix("torch.")
            print(f"{what}, {name}: sdpa {t['sdpa'] * 1e3:6.1f} ms, "
                  f"eager {t['eager'] * 1e3:6.1f} ms, sdpa/eager {t['sdpa'] / t['eager']:.2f}")
            rows.append({"shape": what, "dtype": name, "sdpa ms": t["sdpa"] * 1e3,
                         "eager ms": t["eager"] * 1e3, "sdpa/eager": t["sdpa"] / t["eager"]})
    bench.table(rows, formats={"sdpa ms": ".1f", "eager ms": ".1f", "sdpa/eager": ".2f"})
    bench.end()


if __name__ == "__main__":
    main()
