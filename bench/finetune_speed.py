"""Fine-tuning throughput: shoestring's loop vs Hugging Face ModernBERT, same model, same data.

Real CoLA (or SST-2) training sentences, tokenized once with a real WordPiece tokenizer; the
same architecture on both sides (our encoder + head, and `ModernBertForSequenceClassification`
configured by our exporter's mapping); batch 16, AdamW, bf16 autocast where the CPU has bf16
units. Three ways of feeding batches:

- shoestring: length-bucketed batches padded to their own longest row, key mask (our loop);
- transformers, padded to 128: what the `run_glue.py` example does by default
  (`pad_to_max_length=True`);
- transformers, dynamic padding: random batches padded to their longest row
  (`DataCollatorWithPadding`), the stronger peer setting.

    python bench/finetune_speed.py                       # CoLA, 400 examples, the `cram` size
    python bench/finetune_speed.py --task SST-2 --examples 800

Prints examples/s for each (median of --repeats interleaved blocks) and the ratios. The
machine may be shared: compare the ratio, not the absolute numbers.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common import SHARED, Bench, add_repeats, parser
from peers import peer_versions
from shoestring.config import ModelConfig
from shoestring.families.spec import MLM_SPECIAL_TOKENS
from shoestring.prep.tokenizer_training import train_wordpiece
from shoestring.classifier import SequenceClassifier
from shoestring.eval.finetune import collate, encode_examples, length_bucketed_batches
from shoestring.eval.glue import load_glue_task
from shoestring.model.encoder import MaskedLM
from shoestring.device import precision_name, select_device

GLUE = SHARED / "glue"
NAMES = {"CoLA": "cola", "SST-2": "sst2", "MRPC": "mrpc"}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--glue", type=Path, default=GLUE)
    ap.add_argument("--task", default="CoLA", choices=list(NAMES))
    ap.add_argument("--examples", type=int, default=400, help="training examples per timed block")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--batch", type=int, default=16)
    add_repeats(ap, 3)
    args = ap.parse_args()

    data = load_glue_task(args.glue, NAMES[args.task], max_train=args.examples)
    tok = train_wordpiece((e.a + " " + (e.b or "") for e in data.train), 4096)
    seqs = encode_examples(tok, data.train, 128)
    labels = torch.tensor(data.label_ids(data.train))
    cfg = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                      intermediate_size=args.intermediate)
    vocab = tok.get_vocab_size()
    dev = select_device("auto", measure_peak=False)
    torch.manual_seed(0)
    ours = SequenceClassifier(MaskedLM(cfg, vocab), 2)
    theirs = hf_classifier(cfg, vocab)
    lengths = np.array([len(s) for s in seqs])
    bench = Bench("finetune_speed", args, precision=precision_name(dev.dtype), device=dev.name,
                  **peer_versions())
    print(f"{args.task}: {len(seqs)} examples, mean length {lengths.mean():.1f} tokens "
          f"(max {lengths.max()}); device {dev.name}, autocast {dev.dtype}; "
          f"HF attention: {theirs.config._attn_implementation}")

    def epoch(model, batches, call) -> None:
        opt = torch.optim.AdamW(model.parameters(), lr=4e-5, betas=(0.9, 0.98), eps=1e-6)
        model.train()
        for idx in batches:
            with dev.autocast():
                logits = call(model, idx)
            loss = F.cross_entropy(logits.float(), labels[torch.from_numpy(idx)])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    def ours_call(model, idx):
        ids, mask = collate(seqs, idx, 0)
        return model(ids, mask)

    def hf_call(pad_to: int | None):
        def call(model, idx):
            ids, mask = collate(seqs, idx, 0)
            if pad_to is not None:
                ids = F.pad(ids, (0, pad_to - ids.shape[1]))
                mask = F.pad(mask, (0, pad_to - mask.shape[1]))
            return model(input_ids=ids, attention_mask=mask.long()).logits
        return call

    rng = np.random.default_rng(0)
    runs = {
        "shoestring (length buckets)": (ours, lambda: length_bucketed_batches(lengths, args.batch, rng), ours_call),
        "transformers, pad to 128": (theirs, lambda: _random_batches(len(seqs), args.batch, rng), hf_call(128)),
        "transformers, dynamic padding": (theirs, lambda: _random_batches(len(seqs), args.batch, rng), hf_call(None)),
    }
    for model, batches, call in runs.values():  # warm-up
        epoch(model, batches()[:3], call)
    rates: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, (model, batches, call) in runs.items():
            b = batches()
            t = time.perf_counter()
            epoch(model, b, call)
            rates[name].append(len(seqs) / (time.perf_counter() - t))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for name, r in med.items():
        print(f"{name:>32}: {r:8,.1f} examples/s  (blocks: {', '.join(f'{x:,.1f}' for x in rates[name])})")
    base = med["shoestring (length buckets)"]
    for name in list(runs)[1:]:
        print(f"ratio shoestring / {name}: {base / med[name]:.2f}x")
    bench.table([{"feeding": name, "examples/s": r, "blocks": rates[name],
                  "shoestring / this": base / r} for name, r in med.items()],
                formats={"examples/s": ",.1f", "blocks": ",.1f", "shoestring / this": ".2f"},
                notes=[f"{args.task}: {len(seqs)} examples, mean length {lengths.mean():.1f} "
                       f"tokens; batch {args.batch}; HF attention "
                       f"{theirs.config._attn_implementation}"])
    bench.end()


def _random_batches(n: int, batch: int, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(n)
    return [order[i : i + batch] for i in range(0, n, batch)]


def hf_classifier(cfg: ModelConfig, vocab: int):
    """The same encoder in transformers, configured by our exporter's mapping."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    from shoestring.export.hf import hf_config

    ids = {t: i for i, t in enumerate(MLM_SPECIAL_TOKENS)}
    conf = ModernBertConfig.from_dict({**hf_config(cfg, vocab, 128, ids), "num_labels": 2})
    return ModernBertForSequenceClassification(conf)


if __name__ == "__main__":
    main()
