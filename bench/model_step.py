"""One training step: shoestring's encoder vs Hugging Face ModernBERT (masked LM), or with
``--objective clm`` shoestring's decoder vs Hugging Face Llama (causal LM), same dims.

Both models compute the same function family (ModernBERT layout: pre-LN without biases, GeGLU,
rotary, tied embeddings), built through our exporter, so the difference under test is the
implementation. The HF side is configured as a careful user of it would: ModernBERT's own
sparse head ON (``sparse_prediction=True``: the decoder runs only at the labelled, masked
positions); its dense-head row is printed too, so the head's share is visible. Our side runs
eager and, with ``--compile``, under ``torch.compile`` (``train.compile``); compile seconds
are reported apart from the step time. Same batch, sequence length, precision for every row
(``--precision``, default ``train.precision=auto``'s choice: bf16 autocast where it measurably
beats fp32 on this machine, else fp32), AdamW (foreach), gradient clipping.

    python bench/model_step.py                 # CPU defaults: the `cram` model, batch 32 x 128
    python bench/model_step.py --compile       # + torch.compile rows (~40 s compile per model)
    python bench/model_step.py --hidden 512 --layers 8 --heads 8 --intermediate 1024
    python bench/model_step.py --objective clm --intermediate 704   # decoder vs LlamaForCausalLM

Prints tokens/s for each row (median of --repeats timed blocks, interleaved) and each ratio
with the peer's configuration beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from peers import count_params, hf_llama, hf_modernbert, load_average, machine_info, \
    mlm_labels, modernbert_setup
from shoestring.config import ModelConfig
from shoestring.data.masking import mask_tokens
from shoestring.device import precision_name, select_device
from shoestring.model.decoder import CausalLM
from shoestring.model.encoder import MaskedLM


def time_steps(step: Callable[[], None], n: int) -> float:
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
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="compute precision for every row (auto: shoestring's measured choice)")
    ap.add_argument("--compile", action="store_true",
                    help="add our model under torch.compile (train.compile; ~40 s on this CPU)")
    args = ap.parse_args()

    cfg = ModelConfig(objective=args.objective, hidden_size=args.hidden, num_layers=args.layers,
                      num_heads=args.heads, intermediate_size=args.intermediate)
    dev = select_device(args.precision, measure_peak=False)
    machine = machine_info(dev.name)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, args.vocab, (args.batch, args.seq_len), generator=gen)
    ids[:, 0], ids[:, -1] = 2, 3
    batch = mask_tokens(ids, 0.25, 5, 4, args.vocab, gen)
    labels = mlm_labels(batch.inputs, batch.positions, batch.targets)

    # name -> (model, loss, how it is configured); every model starts from seed 0.
    rows: dict[str, tuple[torch.nn.Module, Callable, str]] = {}
    torch.manual_seed(0)
    if args.objective == "clm":
        ours = CausalLM(cfg, args.vocab)
        ours_loss = lambda m: F.cross_entropy(  # noqa: E731
            m(ids)[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
        llama = hf_llama(cfg, args.vocab, args.seq_len)
        rows["HF Llama"] = (llama, lambda m: m(input_ids=ids, labels=ids).loss,
                            f"transformers LlamaForCausalLM, attention "
                            f"{llama.config._attn_implementation}")
    else:
        ours = MaskedLM(cfg, args.vocab)
        ours_loss = lambda m: F.cross_entropy(  # noqa: E731
            m(batch.inputs, batch.positions).float().flatten(0, 1), batch.targets.flatten())
        for name, sparse in (("HF ModernBERT sparse", True), ("HF ModernBERT dense", False)):
            torch.manual_seed(0)
            hf = hf_modernbert(cfg, args.vocab, args.seq_len, sparse=sparse)
            rows[name] = (hf, lambda m: m(input_ids=batch.inputs, labels=labels).loss,
                          modernbert_setup(hf))
    ours_rows = {"shoestring": (ours, ours_loss, "eager")}
    if args.compile:
        import copy

        ours_rows["shoestring compiled"] = (torch.compile(copy.deepcopy(ours)), ours_loss,
                                            "torch.compile (train.compile=true)")
    rows = {**ours_rows, **rows}

    def make_step(model: torch.nn.Module, loss_fn: Callable) -> Callable[[], None]:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step() -> None:
            with dev.autocast():
                loss = loss_fn(model)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    peer = rows[list(rows)[-1]][0]
    steps = {name: make_step(m, fn) for name, (m, fn, _) in rows.items()}
    precision = precision_name(dev.dtype)
    print(f"machine: {machine['cpu']} ({machine['cores']} cores, {machine['threads']} torch "
          f"threads), torch {machine['torch']}, transformers {machine['transformers']}; "
          f"precision {precision} for every row ({args.precision} requested); load average "
          f"{machine['load_average_start']}")
    print(f"dims: hidden {args.hidden}, layers {args.layers}, heads {args.heads}, intermediate "
          f"{args.intermediate}, vocab {args.vocab}; batch {args.batch} x {args.seq_len}; "
          f"params ours {count_params(ours) / 1e6:.2f}M, HF {count_params(peer) / 1e6:.2f}M")

    # Warm-up: allocator, autocast caches; for a compiled model, the compilation itself.
    warm: dict[str, float] = {name: time_steps(step, 4) for name, step in steps.items()}
    tokens = args.batch * args.seq_len * args.steps
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeats):  # interleaved: drift in load hits every row alike
        for name, step in steps.items():
            rates[name].append(tokens / time_steps(step, args.steps))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for name, r in med.items():
        extra = ""
        if "compiled" in name:  # compile time = warm-up beyond what 4 steady steps take
            compile_s = warm[name] - 4 * args.batch * args.seq_len / r
            extra = f"  compile {compile_s:.1f} s"
        print(f"{name:>22}: {r:10,.0f} tokens/s  (blocks: "
              f"{', '.join(f'{x:,.0f}' for x in rates[name])}){extra}  [{rows[name][2]}]")
    for ours_name in ours_rows:
        for name in rows:
            if name not in ours_rows:
                print(f"ratio {ours_name} / {name}: {med[ours_name] / med[name]:.2f}x  "
                      f"(peer: {rows[name][2]}; {precision}, same dims and batch)")
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
