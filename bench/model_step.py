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

from common import Bench, add_repeats, parser
from peers import count_params, hf_llama, hf_modernbert, mlm_labels, modernbert_setup, \
    peer_versions
from shoestring.config import ModelConfig
from shoestring.data.masking import mask_tokens
from shoestring.device import DeviceInfo, precision_name, select_device
from shoestring.model.losses import causal_lm_loss, masked_lm_loss
from shoestring.model.decoder import CausalLM
from shoestring.model.encoder import MaskedLM
from shoestring.model.layers import set_attention_kernel


def time_steps(step: Callable[[], None], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - t


def make_step(model: torch.nn.Module, loss_fn: Callable, dev: DeviceInfo) -> Callable[[], None]:
    """One training step of ``model`` (AdamW foreach, clipping) under the run's autocast."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step() -> None:
        with dev.autocast():
            loss = loss_fn(model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def report(rates: dict[str, list[float]], warm: dict[str, float], setup: dict[str, str],
           peer_rows: list[str], ours_rows: list[str], args: argparse.Namespace,
           precision: str) -> tuple[list[dict], list[str]]:
    """Print each row's median tokens/s (and compile seconds); returns the table's rows and
    the ratio lines (printed by the caller) against the peer at its best."""
    med = {k: statistics.median(v) for k, v in rates.items()}
    best_peer = max(peer_rows, key=med.get)
    table = []
    for name, r in med.items():
        extra, compile_s = "", None
        if "compiled" in name:  # compile time = warm-up beyond what 4 steady steps take
            compile_s = warm[name] - 4 * args.batch * args.seq_len / r
            extra = f"  compile {compile_s:.1f} s"
        print(f"{name:>22}: {r:10,.0f} tokens/s  (blocks: "
              f"{', '.join(f'{x:,.0f}' for x in rates[name])}){extra}  [{setup[name]}]")
        table.append({"row": name, "tokens/s": r, "blocks": rates[name], "compile s": compile_s,
                      "/ best peer": r / med[best_peer], "configuration": setup[name]})
    notes = [f"the peer at its best (uncompiled, HF's own options): {best_peer}"]
    for ours_name in ours_rows:
        notes.append(f"ratio {ours_name} / {best_peer}: {med[ours_name] / med[best_peer]:.2f}x  "
                     f"(peer: {setup[best_peer]}; {precision}, same dims and batch)")
    if args.compile:
        notes.append(f"ratio shoestring compiled / HF compiled: "
                     f"{med['shoestring compiled'] / med['HF compiled']:.2f}x  "
                     f"(peer: {setup['HF compiled']})")
    if "HF ModernBERT dense sdpa" in med:
        notes.append(f"for reference, shoestring sdpa / HF ModernBERT dense sdpa: "
                     f"{med['shoestring sdpa'] / med['HF ModernBERT dense sdpa']:.2f}x  (the "
                     "sparse head's share: ModernBERT with sparse_prediction=False)")
    return table, notes


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=ModelConfig().intermediate_size,
                    help="FFN width after the gate (default: the `tiny` encoder's)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8, help="steps per timed block")
    add_repeats(ap, 3)
    ap.add_argument("--objective", choices=["mlm", "clm"], default="mlm")
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="compute precision for every row (auto: shoestring's measured choice)")
    ap.add_argument("--compile", action="store_true",
                    help="add our model and the HF peer under torch.compile (~40 s each here)")
    ap.add_argument("--compile-attention", choices=["sdpa", "eager"], default="eager",
                    help="attention of both compiled rows (default eager: the faster at "
                    "128 tokens on a CPU; check the eager-mode rows)")
    args = ap.parse_args()

    cfg = ModelConfig(objective=args.objective, hidden_size=args.hidden, num_layers=args.layers,
                      num_heads=args.heads, intermediate_size=args.intermediate)
    dev = select_device(args.precision, measure_peak=False)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, args.vocab, (args.batch, args.seq_len), generator=gen)
    ids[:, 0], ids[:, -1] = 2, 3
    batch = mask_tokens(ids, 0.25, 5, 4, args.vocab, gen)
    labels = mlm_labels(batch.inputs, batch.positions, batch.targets)

    # name -> (model, loss, how it is configured); every model starts from seed 0. Each side
    # runs with both of its attention implementations: a careful user tries both.
    rows: dict[str, tuple[torch.nn.Module, Callable, str]] = {}
    ours_rows: list[str] = []
    peer_rows: list[str] = []  # the peer's configurations that count for "at its best"

    def ours_model(kernel: str) -> torch.nn.Module:
        torch.manual_seed(0)
        m = CausalLM(cfg, args.vocab) if args.objective == "clm" else MaskedLM(cfg, args.vocab)
        set_attention_kernel(m, kernel)
        return m

    if args.objective == "clm":
        ours_loss = lambda m: causal_lm_loss(m(ids), ids)  # noqa: E731  (the trainer's)
        hf_loss = lambda m: m(input_ids=ids, labels=ids).loss  # noqa: E731
        for attn in ("sdpa", "eager"):
            torch.manual_seed(0)
            llama = hf_llama(cfg, args.vocab, args.seq_len, attention=attn)
            rows[f"HF Llama {attn}"] = (llama, hf_loss, f"transformers LlamaForCausalLM, "
                                        f"attention {attn}")
            peer_rows.append(f"HF Llama {attn}")
    else:
        ours_loss = lambda m: masked_lm_loss(  # noqa: E731  (the trainer's)
            m(batch.inputs, batch.positions), batch.targets)
        hf_loss = lambda m: m(input_ids=batch.inputs, labels=labels).loss  # noqa: E731
        for name, sparse, attn in (("HF ModernBERT sparse sdpa", True, "sdpa"),
                                   ("HF ModernBERT sparse eager", True, "eager"),
                                   ("HF ModernBERT dense sdpa", False, "sdpa")):
            torch.manual_seed(0)
            hf = hf_modernbert(cfg, args.vocab, args.seq_len, sparse=sparse, attention=attn)
            rows[name] = (hf, hf_loss, modernbert_setup(hf))
            if sparse:
                peer_rows.append(name)
    for kernel in ("sdpa", "eager"):
        rows[f"shoestring {kernel}"] = (ours_model(kernel), ours_loss,
                                        f"eager mode, train.attention={kernel}")
        ours_rows.append(f"shoestring {kernel}")
    if args.compile:
        # Both compiled rows use --compile-attention (the eager-mode rows show which kernel
        # is faster on each side); ours as the trainer compiles it in one process: model and
        # loss in one graph.
        kernel = args.compile_attention
        rows["shoestring compiled"] = (ours_model(kernel), torch.compile(ours_loss),
                                       f"torch.compile of model + loss (train.compile=true), "
                                       f"attention {kernel}")
        ours_rows.append("shoestring compiled")
        torch.manual_seed(0)
        hf_c = (hf_llama(cfg, args.vocab, args.seq_len, attention=kernel)
                if args.objective == "clm" else
                hf_modernbert(cfg, args.vocab, args.seq_len, sparse=True, attention=kernel))
        own = ("" if args.objective == "clm" else
               " (not HF's own option: ModernBERT's reference_compile refuses CPUs)")
        rows["HF compiled"] = (torch.compile(hf_c), hf_loss,
                               f"torch.compile(model) by hand, attention {kernel}{own}")

    peer = rows[peer_rows[0]][0]
    ours = rows[ours_rows[0]][0]
    steps = {name: make_step(m, fn, dev) for name, (m, fn, _) in rows.items()}
    precision = precision_name(dev.dtype)
    bench = Bench("model_step", args, device=dev.name, **peer_versions(),
                  precision=f"{precision} for every row ({args.precision} requested)")
    dims = (f"dims: hidden {args.hidden}, layers {args.layers}, heads {args.heads}, intermediate "
            f"{args.intermediate}, vocab {args.vocab}; batch {args.batch} x {args.seq_len}; "
            f"params ours {count_params(ours) / 1e6:.2f}M, HF {count_params(peer) / 1e6:.2f}M")
    print(dims)

    # Warm-up: allocator, autocast caches; for a compiled model, the compilation itself.
    warm: dict[str, float] = {name: time_steps(step, 4) for name, step in steps.items()}
    tokens = args.batch * args.seq_len * args.steps
    rates: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.repeats):  # interleaved: drift in load hits every row alike
        for name, step in steps.items():
            rates[name].append(tokens / time_steps(step, args.steps))
    table, notes = report(rates, warm, {k: v[2] for k, v in rows.items()}, peer_rows,
                          ours_rows, args, precision)
    print("\n".join(notes))
    bench.table(table, notes=[dims] + notes, formats={
        "tokens/s": ",.0f", "blocks": ",.0f", "compile s": ".1f", "/ best peer": ".2f"})
    bench.end()


if __name__ == "__main__":
    main()
