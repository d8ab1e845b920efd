"""End-to-end `shoestring prep` throughput against the bare `tokenizers` batch encoder.

What is compared, on the same text (the documents' text fields, counted in UTF-8 bytes):

* ceiling: `Tokenizer.encode_batch_fast` over all documents already in memory, in batches of
  1,024, with its own thread pool on every core — what tokenizing alone costs;
* prep: the whole pipeline with that same tokenizer given as ``data.tokenizer=PATH`` (read the
  JSON lines, clean, split, spool, tokenize, pack, checksum, write the manifest), with 1 and
  with 2 ``--workers``; runs are interleaved with the ceiling and the median is kept;
* prep including training the tokenizer (the default), for reference;
* peak RSS of a default prep in a fresh process (main process, and the largest worker).

The machine may be shared: the load average is printed before and after (``bench/common.py``'s
header); compare ratios. Each table is recorded (``--record``).

    python bench/prep.py [--corpus PATH] [--repeats 2] [--max-mb 0]

``--ray`` measures the executors instead (``prep --executor local`` vs ``--executor ray`` on
a local Ray instance with all cores, both with Gopher filters + exact + fuzzy dedup), then
the single-core speed of each stage's task function (the code a Ray task runs, timed in this
process without Ray) and, from those, a paper model of 1 TB on a 100-node cluster with the
LSH shuffle volume:

    python bench/prep.py --ray [--max-mb 8] [--node-cores 32] [--nodes 100]
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from shoestring.config import DataConfig
from shoestring.prep.prep import prep

from common import SHARED, Bench, add_repeats, parser

DEFAULT_CORPUS = SHARED / "corpora" / "mixed-en.jsonl"


def subset(corpus: Path, max_mb: float, tmp: Path) -> Path:
    if max_mb <= 0:
        return corpus
    out = tmp / "subset.jsonl"
    budget = int(max_mb * 1e6)
    with corpus.open("rb") as f, out.open("wb") as g:
        for line in f:
            if budget <= 0:
                break
            g.write(line)
            budget -= len(line)
    return out


def texts_of(corpus: Path) -> list[str]:
    with corpus.open(encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def time_ceiling(tokenizer_path: Path, texts: list[str]) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    t = time.perf_counter()
    for i in range(0, len(texts), 1024):
        tok.encode_batch_fast(texts[i : i + 1024], add_special_tokens=False)
    return time.perf_counter() - t


def time_prep(corpus: Path, out: Path, cfg: DataConfig) -> tuple[float, dict]:
    quiet = Console(file=io.StringIO())
    t = time.perf_counter()
    manifest = prep([str(corpus)], out, cfg, console=quiet)
    return time.perf_counter() - t, manifest


_RSS_SCRIPT = """
import json, resource, sys
from shoestring.config import DataConfig
from shoestring.prep.prep import prep
from rich.console import Console
import io
prep([sys.argv[1]], sys.argv[2], DataConfig(workers=int(sys.argv[3])), console=Console(file=io.StringIO()))
print(json.dumps([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))
"""


def peak_rss(corpus: Path, out: Path, workers: int) -> tuple[float, float]:
    proc = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(corpus), str(out), str(workers)],
                          capture_output=True, text=True, check=True)
    main_kb, child_kb = json.loads(proc.stdout.strip().splitlines()[-1])
    return main_kb / 1024, child_kb / 1024


def compare_executors(corpus: Path, tmp: Path, nodes: int, node_cores: int,
                      bench: Bench) -> None:
    """Local vs Ray wall time on the same prep, per-stage speed per core, the 1 TB model."""
    import ray

    from shoestring.config import CurateConfig
    from shoestring.prep.ray.runner import RayOptions

    texts = texts_of(corpus)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    cfg = DataConfig(vocab_size=8192, seq_len=128)
    curate = CurateConfig(filters="gopher", dedup="fuzzy")
    print(f"corpus: {corpus} — {len(texts):,} documents, {mb:.1f} MB of text; "
          f"prep with --filters gopher --dedup fuzzy, 8,192 WordPiece, seq_len 128")
    local_s, local = time_prep_curated(corpus, tmp / "local", cfg, curate)
    print(f"local executor: {local_s:.1f} s; stages {local['stage_seconds']}")
    t = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    init_s = time.perf_counter() - t
    try:
        ray_s, remote = time_prep_curated(corpus, tmp / "ray", cfg, curate, executor="ray",
                                          executor_options=RayOptions(part_docs=1024))
        print(f"ray executor: {ray_s:.1f} s (+ {init_s:.1f} s ray.init); stages "
              f"{remote['stage_seconds']}")
        same = [s["sha256_bin"] for s in local["splits"]["train"]["shards"]] == \
            [s["sha256_bin"] for s in remote["splits"]["train"]["shards"]]
        print(f"identical train shards: {same}")
    finally:
        ray.shutdown()
    runs = {"local (one process)": local_s,
            f"ray, {os.cpu_count()} CPUs, local instance (ray.init not counted)": ray_s,
            f"ray including ray.init ({init_s:.1f} s)": ray_s + init_s}
    rows = [{"executor": name, "seconds": s, "documents/s": len(texts) / s, "MB/s": mb / s,
             "vs local": local_s / s} for name, s in runs.items()]
    print()
    print("| executor | seconds | documents/s | MB/s | vs local |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['executor']} | {r['seconds']:.1f} | {r['documents/s']:,.0f} | "
              f"{r['MB/s']:.2f} | {r['vs local']:.0%} |")
    bench.table(rows, "executors", formats={"seconds": ".1f", "documents/s": ",.0f",
                                            "MB/s": ".2f", "vs local": ".0%"},
                notes=[f"identical train shards: {same}"])
    print()
    stage_speeds(corpus, tmp, local, mb, len(texts), nodes, node_cores, bench)


def time_prep_curated(corpus: Path, out: Path, cfg: DataConfig, curate: Any,
                      **kw: Any) -> tuple[float, dict]:
    quiet = Console(file=io.StringIO())
    t = time.perf_counter()
    manifest = prep([str(corpus)], out, cfg, console=quiet, curate=curate, **kw)
    return time.perf_counter() - t, manifest


def stage_speeds(corpus: Path, tmp: Path, local: dict, mb: float, n_docs: int, nodes: int,
                 node_cores: int, bench: Bench) -> None:
    """Each Ray task function on the whole corpus in this process (one core), and the model."""
    import numpy as np

    from shoestring.config import CurateConfig
    from shoestring.prep.curate import Curator
    from shoestring.prep.ray import remote
    from shoestring.prep.stages import train_on_sample
    from shoestring.prep.ray.shuffle import bucket_firsts, concat_columns

    work = tmp / "stages"
    cfg = DataConfig(vocab_size=8192, seq_len=128)
    curator = Curator.from_config(CurateConfig(filters="gopher", dedup="fuzzy"))
    filters = [b for b in curator.blocks if not b.stateful]
    fuzzy = next(b for b in curator.blocks if b.name == "fuzzy_dedup")
    timings: list[tuple[str, float, int, str]] = []

    def timed(name: str, docs: int, unit: str, fn: Any) -> Any:
        t = time.perf_counter()
        result = fn()
        timings.append((name, time.perf_counter() - t, docs, unit))
        return result

    read = json.loads(timed("read + clean + Gopher filters", n_docs, "documents in", lambda: (
        remote.read_source({"index": 0, "source": str(corpus)}, cfg=cfg, blocks=filters,
                           work=str(work), part_docs=1024, part_chars=64 << 20)))["summary"])
    names = [p["name"] for p in read["parts"]]
    kept = sum(p["rows"] for p in read["parts"])
    paths = [str(work / "parts0" / f"{n}.parquet") for n in names]
    none = np.zeros(0, np.int64)
    exact = timed("exact dedup: text keys (map)", kept, "documents", lambda: [
        remote.exact_rows((p, none, str(work), None)) for p in paths])
    timed("exact dedup: buckets (reduce)", kept, "documents",
          lambda: bucket_firsts(concat_columns(exact)))
    h = fuzzy.hasher
    bands = timed("fuzzy dedup: MinHash + band keys (map)", kept, "documents", lambda: [
        remote.band_rows((p, none, str(work), None, (h.num_perm, h.ngram, 1, h.bands)))
        for p in paths])
    rows = concat_columns(bands)
    timed("fuzzy dedup: band buckets (reduce)", kept, "documents",
          lambda: bucket_firsts(rows))
    timed("split (final map)", kept, "documents", lambda: [
        remote.apply_part({"name": n}, blocks=[], dropped=none, work=str(work), src="parts0",
                          dst="kept", val_fraction=0.05) for n in names])
    kept_paths = [str(work / "kept" / f"{n}.parquet") for n in names]
    train_chars = int(sum(len(t) for p in kept_paths for t, v in zip(
        *remote.read_part(Path(p), ["text", "val"]).values()) if not v))
    t = time.perf_counter()
    train_on_sample(partial(remote.train_texts, [Path(p) for p in kept_paths]), 1 << 30,
                    train_chars, "wordpiece", "mlm", 8192, True)
    train_s = time.perf_counter() - t
    tok = str(tmp / "local" / "tokenizer.json")
    sep = local["tokenizer"]["special_ids"]["[SEP]"]
    encoded = timed("tokenize (WordPiece)", kept, "documents", lambda: [
        json.loads(remote.encode_part({"name": n, "split": "train"}, work=str(work),
                                     tokenizer=tok, sep_id=sep, dtype="<u2",
                                     curate=None)["summary"]) for n in names])
    parts, offset = [], 0
    for e in encoded:
        parts.append({"name": e["name"], "tokens": e["tokens"], "offset": offset})
        offset += e["tokens"]
    n_seq = offset // 126
    timed("pack (shards + sha256)", n_seq, "sequences", lambda: remote.pack_part(
        {"index": 0, "lo": 0, "hi": n_seq}, work=str(work), build=str(tmp / "packed"),
        parts=parts, split="train", cfg=cfg, ids=local["tokenizer"]["special_ids"],
        dtype="<u2"))
    band_bytes = int(sum(c.nbytes for col in bands for c in col.values()))
    exact_bytes = int(sum(c.nbytes for col in exact for c in col.values()))
    print_stages(timings, bench)
    paper_model(timings, mb, n_docs, nodes, node_cores, (train_s, train_chars),
                (band_bytes, exact_bytes, kept), bench)


def print_stages(timings: list[tuple[str, float, int, str]], bench: Bench) -> None:
    """The per-core speed of each stage's task function."""
    print("| stage (the Ray task's function, one core) | seconds | per core |")
    print("|---|---|---|")
    for name, seconds, docs, unit in timings:
        print(f"| {name} | {seconds:.2f} | {docs / seconds:,.0f} {unit}/s |")
    bench.table([{"stage": name, "seconds": seconds, "per core /s": docs / seconds,
                  "unit": unit} for name, seconds, docs, unit in timings], "stages",
                formats={"seconds": ".2f", "per core /s": ",.0f"})


def paper_model(timings: list[tuple[str, float, int, str]], mb: float, n_docs: int, nodes: int,
                node_cores: int, training: tuple[float, int], shuffle: tuple[int, int, int],
                bench: Bench) -> None:
    """1 TB of text like this corpus on ``nodes`` × ``node_cores`` cores, from the measured
    per-core speeds (``training``: tokenizer training seconds and characters; ``shuffle``:
    the LSH and exact map outputs' bytes and the documents they cover)."""
    train_s, train_chars = training
    band_bytes, exact_bytes, kept = shuffle
    scale = 1e12 / (mb * 1e6)  # every stage's work grows with the text
    bytes_per_doc = mb * 1e6 / n_docs
    cores = nodes * node_cores
    print()
    print(f"Paper model: 1 TB of text like this corpus ({bytes_per_doc:,.0f} bytes/document → "
          f"{n_docs * scale / 1e6:,.0f} M documents, {scale:,.0f} × this corpus) on {nodes} nodes "
          f"× {node_cores} cores = {cores:,} cores; per-core speed as measured here, perfect "
          "scaling over tasks (no stragglers; storage and network keep up):")
    print()
    print("| stage | core-hours | hours on the cluster |")
    print("|---|---|---|")
    rows = [{"stage": name, "core-hours": seconds * scale / 3600,
             "hours on the cluster": seconds * scale / 3600 / cores}
            for name, seconds, _, _ in timings]
    for r in rows:
        print(f"| {r['stage']} | {r['core-hours']:,.0f} | {r['hours on the cluster']:.2f} |")
    total = sum(r["core-hours"] for r in rows)
    print(f"| total of the parallel stages | {total:,.0f} | {total / cores:.2f} |")
    sample = min(1 << 30, train_chars * scale)
    serial_h = train_s * sample / train_chars / 3600
    training = (f"tokenizer training: one worker, {sample / 2**30:.0f} GiB sample (measured "
                f"{train_s:.1f} s on {train_chars / 1e6:.1f} M characters here, scaled linearly)")
    print(f"| {training} | {serial_h:,.2f} | {serial_h:.2f} |")
    print(f"| **wall time, parallel + serial** | | **{total / cores + serial_h:.2f}** |")
    rows += [{"stage": "total of the parallel stages", "core-hours": total,
              "hours on the cluster": total / cores},
             {"stage": training, "core-hours": serial_h, "hours on the cluster": serial_h},
             {"stage": "wall time, parallel + serial", "core-hours": None,
              "hours on the cluster": total / cores + serial_h}]
    lsh = band_bytes * scale
    shuffle_note = (f"LSH shuffle volume: {band_bytes / kept:,.0f} bytes per document (bands × (band, key, "
          f"rid) of 8 bytes each, measured from the map output) → {lsh / 1e9:,.0f} GB for 1 TB; "
          f"{lsh / nodes / 1e9:,.1f} GB out of and into each node, {lsh / nodes / 1.25e9:,.0f} s "
          f"at 10 Gbit/s. Exact dedup shuffles {exact_bytes / kept:,.0f} bytes per document "
          f"({exact_bytes * scale / 1e9:,.0f} GB). A reduce task holds its partition: "
          f"{lsh / cores / 1e6:,.0f} MB of the LSH shuffle with one partition per core.")
    print()
    print(shuffle_note)
    bench.table(rows, "model_1tb", formats={"core-hours": ",.2f", "hours on the cluster": ".2f"},
                notes=[f"1 TB on {nodes} nodes × {node_cores} cores = {cores:,} cores; per-core "
                       "speed as measured here, perfect scaling over tasks", shuffle_note])


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    add_repeats(ap, 2, help="interleaved rounds of the ceiling and the preps; the median "
                "is reported")
    ap.add_argument("--max-mb", type=float, default=0.0, help="use only the first N MB (0: all)")
    ap.add_argument("--ray", action="store_true", help="local vs ray executor, stage speeds")
    ap.add_argument("--nodes", type=int, default=100, help="--ray: nodes in the paper model")
    ap.add_argument("--node-cores", type=int, default=32, help="--ray: cores per node")
    args = ap.parse_args()
    if not args.corpus.is_file():
        sys.exit(f"corpus not found: {args.corpus}")
    bench = Bench("prep", args)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        corpus = subset(args.corpus, args.max_mb, tmp)
        if args.ray:
            compare_executors(corpus, tmp, args.nodes, args.node_cores, bench)
        else:
            throughput(corpus, tmp, args.repeats, bench)
    bench.end()


def throughput(corpus: Path, tmp: Path, repeats: int, bench: Bench) -> None:
    """prep (given tokenizer, 1 and 2 workers; and with training) vs the bare encoder, and
    the peak RSS of a default prep."""
    texts = texts_of(corpus)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"corpus: {corpus} — {len(texts):,} documents, {mb:.1f} MB of text")

    full_s, manifest = time_prep(corpus, tmp / "full", DataConfig())
    tok_path = tmp / "full" / "tokenizer.json"
    print(f"prep with tokenizer training: {full_s:.1f} s; stages {manifest['stage_seconds']}")

    times: dict[str, list[float]] = {"ceiling": [], "prep w1": [], "prep w2": []}
    for r in range(repeats):
        times["ceiling"].append(time_ceiling(tok_path, texts))
        for w in (1, 2):
            s, m = time_prep(corpus, tmp / f"w{w}-{r}", DataConfig(tokenizer=str(tok_path),
                                                                   workers=w))
            times[f"prep w{w}"].append(s)
            print(f"  repeat {r}: workers={w} {s:.1f} s, stages {m['stage_seconds']}")
        print(f"  repeat {r}: ceiling {times['ceiling'][-1]:.1f} s")
    main_mb, _ = peak_rss(corpus, tmp / "rss", 1)
    main2_mb, child2_mb = peak_rss(corpus, tmp / "rss2", 2)

    ceiling = statistics.median(times["ceiling"])
    runs = {"bare `tokenizers` encode_batch_fast (ceiling)": (ceiling, times["ceiling"])}
    for w in (1, 2):
        runs[f"prep, given tokenizer, --workers {w}"] = (statistics.median(times[f"prep w{w}"]),
                                                          times[f"prep w{w}"])
    runs["prep incl. WordPiece training, --workers 1 (one run)"] = (full_s, [full_s])
    rows = [{"run": name, "seconds": s, "MB/s of text": mb / s, "vs ceiling": ceiling / s,
             "runs s": all_s} for name, (s, all_s) in runs.items()]
    print()
    print(f"| run | seconds (median of {repeats}) | MB/s of text | vs ceiling |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['seconds']:.1f} | {r['MB/s of text']:.2f} | "
              f"{r['vs ceiling']:.0%} |")
    rss = (f"peak RSS, default prep: {main_mb:.0f} MB (--workers 1); "
           f"{main2_mb:.0f} MB main + {child2_mb:.0f} MB largest worker (--workers 2)")
    print()
    print(rss)
    bench.table(rows, formats={"seconds": ".1f", "MB/s of text": ".2f", "vs ceiling": ".0%",
                               "runs s": ".1f"},
                notes=[f"{len(texts):,} documents, {mb:.1f} MB of text; seconds: median of "
                       f"{repeats} interleaved rounds", rss])


if __name__ == "__main__":
    main()
