"""datatrove's local executor doing the work of ``shoestring prep --filters gopher --dedup fuzzy``.

Run by bench/prep_scale.py ``--peer datatrove`` with the python of a separate venv that has
``datatrove[processing]`` (this file imports nothing from shoestring). The blocks, as in
datatrove's own MinHash example, with the settings shoestring uses:

1. JsonlReader → GopherQualityFilter → GopherRepetitionFilter → JsonlWriter (the kept
   documents) → MinhashDedupSignature (word 5-grams, ``--bands`` buckets × ``--rows``
   hashes, seed 1; bench/prep_scale.py passes prep's own 28 × 4, datatrove's default is
   14 × 8); one task per input file;
2. MinhashDedupBuckets: one task per bucket;
3. MinhashDedupCluster: one task;
4. JsonlReader (the kept documents) → MinhashDedupFilter → DocumentTokenizer with the
   tokenizer.json shoestring trained on the same corpus (no shuffling: prep's default
   order is none).

There is no separate exact-dedup stage (MinHash finds exact copies: Jaccard 1). Dropped
documents are written by each step's exclusion writer; ``result.json`` in ``--work`` lists
them (id → block, named as shoestring names its blocks) and the token count.

Run on its own, it prints ``bench/common.py``'s machine header (torch None: the venv has
no torch) and records its one row (seconds, tokens, drops per block) with ``--record``;
bench/prep_scale.py passes ``--no-record`` and records the peer's row in its own table
(``common`` imports only the standard library, so it loads in the peer's venv).

    /work/peers/datatrove-venv/bin/python bench/prep_peer_datatrove.py \\
        --input CORPUS/shards --work OUT --tokenizer DATA/tokenizer.json --workers 2
"""

from __future__ import annotations

import glob
import json
import os
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (
    MinhashConfig,
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.pipeline.filters import GopherQualityFilter, GopherRepetitionFilter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
from datatrove.pipeline.writers import JsonlWriter

from common import Bench, parser

BLOCKS = {"gopher_quality": "gopher_quality", "gopher_repetition": "gopher_repetition",
          "minhash": "fuzzy_dedup"}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--input", required=True)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--bands", type=int, default=14)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    bench = Bench("prep_peer_datatrove", args, datatrove=version("datatrove"))
    t = time.perf_counter()
    work = args.work
    files = sorted(glob.glob(os.path.join(args.input, "*.jsonl*")))
    tasks = len(files)
    config = MinhashConfig(n_grams=args.ngram, num_buckets=args.bands,
                           hashes_per_bucket=args.rows, seed=args.seed)

    def excluded(name: str) -> JsonlWriter:
        return JsonlWriter(str(work / "removed" / name), compression=None)

    kept = str(work / "kept")
    stage1 = LocalPipelineExecutor(
        pipeline=[JsonlReader(args.input, glob_pattern="*.jsonl*"),
                  GopherQualityFilter(exclusion_writer=excluded("gopher_quality")),
                  GopherRepetitionFilter(exclusion_writer=excluded("gopher_repetition")),
                  JsonlWriter(kept, output_filename="${rank}.jsonl", compression=None),
                  MinhashDedupSignature(str(work / "signatures"), config=config)],
        tasks=tasks, workers=args.workers, logging_dir=str(work / "logs" / "1"))
    stage2 = LocalPipelineExecutor(
        pipeline=[MinhashDedupBuckets(str(work / "signatures"), str(work / "buckets"),
                                      config=config)],
        tasks=config.num_buckets, workers=args.workers, logging_dir=str(work / "logs" / "2"),
        depends=stage1)
    stage3 = LocalPipelineExecutor(
        pipeline=[MinhashDedupCluster(str(work / "buckets"), str(work / "remove_ids"),
                                      config=config)],
        tasks=1, logging_dir=str(work / "logs" / "3"), depends=stage2)
    stage4 = LocalPipelineExecutor(
        pipeline=[JsonlReader(kept, glob_pattern="*.jsonl"),
                  MinhashDedupFilter(str(work / "remove_ids"), exclusion_writer=excluded("minhash")),
                  DocumentTokenizer(str(work / "tokenized"), tokenizer_name_or_path=args.tokenizer,
                                    shuffle_documents=False)],
        tasks=tasks, workers=args.workers, logging_dir=str(work / "logs" / "4"), depends=stage3)
    stage4.run()
    dropped: dict[str, str] = {}
    for name, block in BLOCKS.items():
        for path in glob.glob(str(work / "removed" / name / "*.jsonl")):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    dropped[json.loads(line)["id"]] = block
    token_bytes = sum(os.path.getsize(p) for p in glob.glob(str(work / "tokenized" / "**" / "*.ds"),
                                                           recursive=True))
    (work / "result.json").write_text(json.dumps({"tokens": token_bytes // 2, "dropped": dropped,
                                                  "tasks": tasks, "workers": args.workers}))
    seconds = time.perf_counter() - t
    drops = Counter(dropped.values())
    print(f"datatrove: {seconds:.1f} s, {token_bytes // 2:,} tokens, dropped "
          + ", ".join(f"{drops[b]:,} by {b}" for b in BLOCKS.values()))
    bench.table([{"seconds": seconds, "tokens": token_bytes // 2, "tasks": tasks,
                  "workers": args.workers, **{f"dropped {b}": drops[b] for b in BLOCKS.values()}}],
                formats={"seconds": ".1f"}, notes=[f"input {args.input}"])
    bench.end()


if __name__ == "__main__":
    main()
