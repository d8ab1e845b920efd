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

from peers import cpu_name, load_average
from shoestring.train.speed import time_attention

# (rows, heads, kv_heads, seq_len, head_dim, causal, what)
SHAPES = [
    (32, 4, 4, 128, 64, False, "the cram encoder's layer (batch 32 x 128)"),
    (32, 4, 4, 128, 64, True, "the clm-tiny decoder's layer (batch 32 x 128)"),
    (8, 8, 2, 512, 64, True, "a 512-token decoder layer, grouped-query (8 heads, 2 kv)"),
]


def main() -> None:
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, torch "
          f"{torch.__version__}; load average {load_average()}")
    for rows, heads, kv, T, hd, causal, what in SHAPES:
        for dtype in (torch.bfloat16, torch.float32):
            t = time_attention(rows, heads, kv, T, hd, dtype, causal, seconds=1.0)
            print(f"{what}, {str(dtype).removeprefix('torch.')}: sdpa {t['sdpa'] * 1e3:6.1f} ms, "
                  f"eager {t['eager'] * 1e3:6.1f} ms, sdpa/eager {t['sdpa'] / t['eager']:.2f}")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
