"""Retrieval and retrieval-augmented LM on a real corpus, with models trained here in one run.

    python bench/retrieval.py [--corpus PATH] [--docs 2500] [--budget 3m] [--ict-budget 2m]

1. Of the first ``--docs`` documents, 5% (by content hash) are held out: never trained on,
   never in the RAG index. An mlm encoder and a clm decoder (the `tiny`
   and `clm-tiny` presets) are pretrained on the rest for ``--budget`` each; a retriever is
   tuned from the encoder with ``model.objective=contrastive`` for ``--ict-budget``.
2. Inverse-cloze recall: every 100-word passage of the held-out documents with three or more
   sentences loses one sentence (seeded) — the query; what is left is its positive. The index
   holds the positives plus ``--distractors`` passages of training documents. Recall@1/@10 for
   BM25, dense with the pretrained encoder, dense with the tuned retriever, and hybrid (RRF of
   BM25 with each). Build throughput (passages/s) and one-query latency p50/p99 per mode.
3. Retrieval-augmented LM: held-out documents cut at a point; the decoder scores the next
   ``TARGET`` tokens after (a) half a context of the document's own preceding text, (b) the
   same plus BM25's top passages from the training documents (queried with the last 48
   tokens) in the other half, (c) the same with random training passages instead (control:
   is it retrieval, or any text?), (d) a whole context of the preceding text. Perplexity each.

Everything runs with ``torch.set_num_threads(--threads)``: on a shared 2-core machine one
thread per process is faster than two contending ones; the load average is printed.
"""

from __future__ import annotations

import io
import json
import math
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from common import SHARED, Bench, parser
from shoestring.config import Config, DataConfig, ModelConfig, TrainConfig
from shoestring.prep.driver import is_validation
from shoestring.prep.prep import prep
from shoestring.data.sources import iter_documents
from shoestring.retrieval.index import RetrievalIndex, build_index
from shoestring.retrieval.passages import split_documents
from shoestring.rundir import RunDir
from shoestring.train.loop import train

DEFAULT_CORPUS = SHARED / "corpora" / "mixed-en.jsonl"
TARGET = 32
HELD_OUT = 0.05  # fraction of documents held out
SENTENCE = re.compile(r"(?<=[.!?])\s+")
QUIET = Console(file=io.StringIO())


def held_out_split(corpus: Path, n_docs: int, work: Path) -> tuple[Path, list]:
    """The first ``n_docs`` documents: the training ones as a JSONL corpus (what prep, the
    models and the RAG index see), and the held-out ones (by content hash, as prep splits)."""
    path = work / "train-docs.jsonl"
    held = []
    with path.open("w", encoding="utf-8") as f:
        for _, doc in zip(range(n_docs), iter_documents([str(corpus)])):
            if is_validation(doc.text, HELD_OUT):
                held.append(doc)
            else:
                f.write(json.dumps({"text": doc.text}) + "\n")
    return path, held


def pretrain(data: Path, out: Path, model: dict, budget: str, **train: object) -> None:
    cfg = Config(model=ModelConfig(**model),
                 train=TrainConfig(budget=budget, checkpoint_every=None, tensorboard=False,
                                   val_every=0, **train))
    t = time.perf_counter()
    s = train_quiet(cfg, data, out)
    print(f"  trained {out.name}: {s['steps']} steps, {s['tokens']:,} tokens in "
          f"{time.perf_counter() - t:.0f}s, loss {s['first_loss']:.3f} → {s['final_train_loss']:.3f}")


def train_quiet(cfg: Config, data: Path, out: Path) -> dict:
    return train(cfg, data, out, console=QUIET)


def ict_pairs(held: list, words: int, seed: int, limit: int) -> tuple[list[str], list[str]]:
    """(queries, positives): one sentence of a held-out passage, and the passage without it."""
    rng = random.Random(seed)
    queries, positives = [], []
    for p in split_documents(held, words):
        sents = [s for s in SENTENCE.split(" ".join(p.text.split())) if s]
        if len(sents) < 3:
            continue
        i = rng.randrange(len(sents))
        queries.append(sents[i])
        positives.append(" ".join(sents[:i] + sents[i + 1:]))
    order = rng.sample(range(len(queries)), min(limit, len(queries)))
    return [queries[i] for i in order], [positives[i] for i in order]


def recall(index: RetrievalIndex, queries: list[str], mode: str) -> tuple[float, float, list[float]]:
    """Recall@1, @10 (positive i is passage row i) and per-query latency in ms."""
    at1 = at10 = 0
    lat = []
    for i, q in enumerate(queries):
        t = time.perf_counter()
        hits = index.search(q, 10, mode)
        lat.append((time.perf_counter() - t) * 1000)
        ids = [h.id for h in hits]
        at1 += ids[:1] == [i]
        at10 += i in ids
    return at1 / len(queries), at10 / len(queries), lat


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q))


def rag_perplexity(clm: Path, index: RetrievalIndex, held: list, k: int, limit: int,
                   seed: int) -> dict[str, float]:
    model, meta = RunDir(clm).load_final()
    from shoestring.inference.engine import load_engine

    tok = load_engine(clm).tokenizer
    eot = meta["special_ids"]["<|endoftext|>"]
    L = int(meta["seq_len"])
    half = (L - 1 - TARGET) // 2
    rng = random.Random(seed)
    train_passages = index.passages
    nll = {"prefix_half": [], "retrieved+prefix_half": [], "random+prefix_half": [],
           "prefix_full": []}
    used = 0
    for doc in held:
        ids = tok.encode(" ".join(doc.text.split())).ids
        if len(ids) < L + TARGET:
            continue
        cut = rng.randrange(L - TARGET, len(ids) - TARGET + 1)
        prefix, target = ids[:cut], ids[cut:cut + TARGET]
        query = tok.decode(prefix[-48:])
        retrieved = [h.passage.text for h in index.search(query, k, "bm25")]
        rand = [train_passages[rng.randrange(len(train_passages))].text for _ in range(k)]

        def extra(texts: list[str]) -> list[int]:
            return tok.encode("\n".join(" ".join(t.split()) for t in texts) + "\n").ids[-half:]

        contexts = {
            "prefix_half": prefix[-half:],
            "retrieved+prefix_half": extra(retrieved) + prefix[-half:],
            "random+prefix_half": extra(rand) + prefix[-half:],
            "prefix_full": prefix[-(L - 1 - TARGET):],
        }
        for name, ctx in contexts.items():
            row = torch.tensor([[eot, *ctx, *target]])
            with torch.no_grad():
                logits = model(row)[0, -TARGET - 1:-1].float()
            nll[name].append(float(torch.nn.functional.cross_entropy(
                logits, torch.tensor(target), reduction="sum")))
        used += 1
        if used >= limit:
            break
    return {name: math.exp(sum(v) / (TARGET * len(v))) for name, v in nll.items()} | {"n": used}


def main() -> None:
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--docs", type=int, default=2500)
    ap.add_argument("--budget", default="3m", help="pretraining budget of each model")
    ap.add_argument("--ict-budget", default="2m", help="retriever tuning budget")
    ap.add_argument("--distractors", type=int, default=1500)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--rag-docs", type=int, default=150)
    ap.add_argument("--k", type=int, default=2, help="passages in the RAG context")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None, help="keep models here (default: temp)")
    args = ap.parse_args()
    if not args.corpus.is_file():
        sys.exit(f"corpus not found: {args.corpus}")
    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench("retrieval", args, precision="fp32 inference, bf16 training where the CPU "
                  "has it")
    print(f"libraries: bm25s (Lucene BM25, k1=1.5, b=0.75, English stopwords, no stemming), "
          f"faiss-cpu IndexFlatIP (exact), RRF c=60; corpus {args.corpus.name}, first "
          f"{args.docs} documents")
    corpus, held = held_out_split(args.corpus, args.docs, work)
    print(f"held out (by content hash, never trained on or indexed for RAG): {len(held)} documents")

    t0 = time.perf_counter()
    if not (work / "data-mlm" / "manifest.json").is_file():
        prep([str(corpus)], work / "data-mlm", DataConfig(), console=QUIET)
        prep([str(corpus)], work / "data-clm", DataConfig(objective="clm", seq_len=256),
             console=QUIET)
    for name, data, model, budget, extra in (
        ("mlm", "data-mlm", {"preset": "tiny"}, args.budget, {}),
        ("clm", "data-clm", {"preset": "clm-tiny"}, args.budget, {}),
        ("ict", "data-mlm", {"preset": "tiny", "objective": "contrastive"}, args.ict_budget,
         {"init_from": str(work / "mlm"), "lr": 5e-4, "schedule": "constant", "warmup": 0.1}),
    ):
        if not (work / name / "final").is_dir():
            pretrain(work / data, work / name, model, budget, **extra)
        else:  # --work kept it from an earlier invocation
            sm = RunDir(work / name).read_summary()
            print(f"  reused {name} from {work}: {sm['steps']} steps, {sm['tokens']:,} tokens in "
                  f"{sm['train_seconds']:.0f}s ({sm['budget']}), loss {sm['first_loss']:.3f} → "
                  f"{sm['final_train_loss']:.3f}")
    print(f"prep + training: {time.perf_counter() - t0:.0f}s")

    # --- inverse-cloze recall ---------------------------------------------------------------
    queries, positives = ict_pairs(held, 100, seed=0, limit=args.queries)
    distract = [p.text for _, p in zip(range(args.distractors),
                                       split_documents(iter_documents([str(corpus)]), 100))]
    ict_corpus = work / "ict.jsonl"
    with ict_corpus.open("w", encoding="utf-8") as f:
        for text in positives + distract:
            f.write(json.dumps({"text": text}) + "\n")
    n = len(positives) + len(distract)
    print(f"\ninverse-cloze: {len(queries)} queries over {n:,} passages "
          f"({len(positives)} positives + {len(distract)} training-document distractors)")
    indexes = {}
    for enc in ("mlm", "ict"):
        m = build_index([str(ict_corpus)], work / f"index-{enc}", encoder=work / enc,
                        passage_words=10_000, overwrite=True)
        s = m["seconds"]
        print(f"  build with {enc} encoder: passages {n / s['passages']:,.0f}/s, "
              f"BM25 {n / s['bm25']:,.0f} passages/s, dense {n / s['dense']:,.0f} passages/s")
        indexes[enc] = RetrievalIndex(work / f"index-{enc}")
    rows = [("BM25", "mlm", "bm25"), ("dense, pretrained encoder", "mlm", "dense"),
            ("dense, tuned retriever (contrastive)", "ict", "dense"),
            ("hybrid BM25 + pretrained", "mlm", "hybrid"),
            ("hybrid BM25 + tuned", "ict", "hybrid")]
    print(f"  {'retriever':<40} {'R@1':>6} {'R@10':>6} {'p50 ms':>8} {'p99 ms':>8}")
    table = []
    for label, enc, mode in rows:
        indexes[enc].search(queries[0], 10, mode)  # load the encoder outside the timing
        r1, r10, lat = recall(indexes[enc], queries, mode)
        print(f"  {label:<40} {r1:6.3f} {r10:6.3f} {pct(lat, 50):8.2f} {pct(lat, 99):8.2f}")
        table.append({"retriever": label, "R@1": r1, "R@10": r10, "p50 ms": pct(lat, 50),
                      "p99 ms": pct(lat, 99)})
    bench.table(table, "recall", formats={"R@1": ".3f", "R@10": ".3f", "p50 ms": ".2f",
                                          "p99 ms": ".2f"},
                notes=[f"inverse-cloze: {len(queries)} queries over {n:,} passages"])

    # --- retrieval-augmented LM ----------------------------------------------------------------
    m = build_index([str(corpus)], work / "index-train", passage_words=100, overwrite=True)
    print(f"\nRAG: BM25 index of the training documents: {m['passages']:,} passages, built at "
          f"{m['passages'] / (m['seconds']['passages'] + m['seconds']['bm25']):,.0f} passages/s")
    ppl = rag_perplexity(work / "clm", RetrievalIndex(work / "index-train"), held, args.k,
                         args.rag_docs, seed=0)
    what = (f"decoder perplexity on the next {TARGET} tokens of {ppl.pop('n')} held-out "
            f"documents (top-{args.k} BM25 passages)")
    print(f"  {what}:")
    for name, v in ppl.items():
        print(f"  {name:<24} {v:8.2f}")
    bench.table([{"context": name, "perplexity": v} for name, v in ppl.items()], "rag",
                formats={"perplexity": ".2f"}, notes=[what])
    bench.end()


if __name__ == "__main__":
    main()
