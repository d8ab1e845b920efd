"""One training step: shoestring's encoder vs Hugging Face ModernBERT (masked LM), or with
``--objective clm`` shoestring's decoder vs Hugging Face Llama (causal LM), same dims.

Both models compute the same function family (ModernBERT layout: pre-LN without biases, GeGLU,
rotary, tied embeddings); the difference under test is the implementation — chiefly our
sparse prediction head (logits only at the 25% masked positions) against HF's default dense
head, as a user of `ModernBertForMaskedLM(labels=...)` would run it. Same batch, sequence
length, precision (`train.precision=auto`'s choice: bf16 autocast where it measurably beats
fp32 on this machine, else fp32), AdamW, gradient clipping.

    python bench/model_step.py                 # CPU defaults: the `cram` model, batch 32 x 128
    python bench/model_step.py --hidden 512 --layers 8 --heads 8 --intermediate 1024
    python bench/model_step.py --objective clm --intermediate 704   # decoder vs LlamaForCausalLM

Prints tokens/s for each (median of --repeats timed blocks, interleaved) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from shoestring.config import ModelConfig
from shoestring.data.masking import mask_tokens
from shoestring.model.encoder import MaskedLM
from shoestring.device import select_device


def hf_model(cfg: ModelConfig, vocab: int, seq_len: int):
    """The same architecture in transformers, configured by our exporter (exact mapping)."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from shoestring.data.tokenizer import SPECIAL_TOKENS
    from shoestring.model.hf import hf_config

    ids = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    return ModernBertForMaskedLM(ModernBertConfig.from_dict(hf_config(cfg, vocab, seq_len, ids)))


def hf_llama(cfg: ModelConfig, vocab: int, seq_len: int):
    """Our decoder's architecture as transformers' Llama, configured by our exporter."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from shoestring.model.hf_llama import hf_config as llama_config

    ids = {"<|endoftext|>": 0, "<|pad|>": 1}
    return LlamaForCausalLM(LlamaConfig.from_dict(llama_config(cfg, vocab, seq_len, ids)))


def time_steps(step, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=ModelConfig().intermediate_size,
                    help="FFN width after the gate (default: the `tiny` encoder's)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8, help="steps per timed block")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--objective", choices=["mlm", "clm"], default="mlm")
    args = ap.parse_args()

    cfg = ModelConfig(objective=args.objective, hidden_size=args.hidden, num_layers=args.layers,
                      num_heads=args.heads, intermediate_size=args.intermediate)
    dev = select_device("auto", measure_peak=False)
    torch.manual_seed(0)
    if args.objective == "clm":
        from shoestring.model.decoder import CausalLM

        ours, theirs = CausalLM(cfg, args.vocab), hf_llama(cfg, args.vocab, args.seq_len)
        peer = "transformers Llama"
    else:
        ours, theirs = MaskedLM(cfg, args.vocab), hf_model(cfg, args.vocab, args.seq_len)
        peer = "transformers ModernBERT"
    print(f"device: {dev.name}, autocast {dev.dtype}; params ours {ours.num_params() / 1e6:.2f}M, "
          f"HF {sum(p.numel() for p in theirs.parameters()) / 1e6:.2f}M; "
          f"HF attention: {theirs.config._attn_implementation}")

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, args.vocab, (args.batch, args.seq_len), generator=gen)
    ids[:, 0], ids[:, -1] = 2, 3
    batch = mask_tokens(ids, 0.25, 5, 4, args.vocab, gen)
    labels = torch.full_like(ids, -100).scatter_(1, batch.positions, batch.targets)

    def make_step(model, loss_fn):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step() -> None:
            with dev.autocast():
                loss = loss_fn(model)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    if args.objective == "clm":
        ours_step = make_step(ours, lambda m: F.cross_entropy(
            m(ids)[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten()))
        hf_step = make_step(theirs, lambda m: m(input_ids=ids, labels=ids).loss)
    else:
        ours_step = make_step(ours, lambda m: F.cross_entropy(
            m(batch.inputs, batch.positions).float().flatten(0, 1), batch.targets.flatten()))
        hf_step = make_step(theirs, lambda m: m(input_ids=batch.inputs, labels=labels).loss)

    for step in (ours_step, hf_step):  # warm-up: allocator, autocast caches
        time_steps(step, 4)
    tokens = args.batch * args.seq_len * args.steps
    rates: dict[str, list[float]] = {"shoestring": [], peer: []}
    for _ in range(args.repeats):
        rates["shoestring"].append(tokens / time_steps(ours_step, args.steps))
        rates[peer].append(tokens / time_steps(hf_step, args.steps))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for name, r in med.items():
        print(f"{name:>24}: {r:10,.0f} tokens/s  (blocks: {', '.join(f'{x:,.0f}' for x in rates[name])})")
    print(f"ratio shoestring / transformers: {med['shoestring'] / med[peer]:.2f}x")


if __name__ == "__main__":
    main()
